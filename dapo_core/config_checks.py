"""The rules a resolved config must keep beyond its types: the least value of each count, size
and rate, and the rules between keys (``check_values``). A broken rule is one ``ConfigError``
that blames where its keys were set (an ``-S`` override, an overlay, the params file)."""

from __future__ import annotations

import re
import typing
from typing import Any

from dapo_core.algorithm import check_critic
from dapo_core.config import UPDATE_SWITCHES, Config, ConfigError

# Counts, sizes and rates: the least value each may take (a run with train.steps=0 trains nothing
# and then fails late, far from the typo). Rules between keys are in _check_values.
AT_LEAST: dict[str, float] = {
    **dict.fromkeys(
        [
            "synthetic.num_train",
            "synthetic.num_test",
            "synthetic.max_operand",
            "synthetic.num_terms",
            "data.decontam_ngram",
            "tiny.hidden_size",
            "tiny.intermediate_size",
            "tiny.num_layers",
            "tiny.num_heads",
            "tiny.num_kv_heads",
            "tiny.warm_start_batch",
            "tiny.warm_start_eval_every",
            "model.warm_start_batch",
            "rollout.max_prompt_len",
            "rollout.max_response_len",
            "algo.max_gen_batches",
            "train.steps",
            "train.prompt_batch",
            "train.gen_batch",
            "train.mini_batch",
            "train.micro_batch_tokens",
            "train.max_bad_steps",
            "train.keep_checkpoints",
            "eval.n_samples",
            "eval.max_response_len",
            "eval.bootstrap_samples",
        ],
        1,
    ),
    "tiny.vocab_size": 259,  # the byte-level BPE's 256 bytes and 3 special tokens, before merges
    **dict.fromkeys(
        [
            "data.val_size",
            "synthetic.seed",  # a seed names folders (seed-1) and numpy refuses a negative one
            "tiny.seed",
            "train.seed",
            "eval.seed",
            "tiny.warm_start_steps",
            "tiny.warm_start_target",
            "tiny.warm_start_window",
            "model.warm_start_steps",
            "algo.overlong_penalty_factor",
            "train.warmup_steps",
            "train.weight_decay",
            "train.checkpoint_every",
            "train.max_stalled_steps",
            "train.preflight_prompts",
            "train.cpu_threads",
            "train.rollout_ranks",
            "rollout.max_staleness",
            "eval.every_n_steps",
            "tracking.log_samples",
            "tracking.system_metrics_s",
        ],
        0,
    ),
}
NOT_EMPTY = [  # an empty path wrote a run's folder into the current directory
    "data.source",
    "data.out_dir",
    "model.name_or_path",
    "tiny.path",
    "train.out_dir",
    "eval.eval_set",
    "tracking.experiment_prefix",
]
POSITIVE = [
    "model.warm_start_lr",
    "tiny.warm_start_lr",
    "train.lr",
    "train.grad_clip",
    "eval.temperature",
]


def _value(cfg: Config, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _check_bounds(cfg: Config, where: typing.Callable[[str], str]) -> None:
    for key, least in AT_LEAST.items():
        value = _value(cfg, key)
        if not value >= least:
            raise ConfigError(f"{where(key)}: {key} must be >= {least:g}, got {value}")
    for key in POSITIVE:
        value = _value(cfg, key)
        if not value > 0:
            raise ConfigError(f"{where(key)}: {key} must be > 0, got {value}")
    for key in NOT_EMPTY:
        if not str(_value(cfg, key)).strip():
            raise ConfigError(f"{where(key)}: {key} must not be empty")


def check_values(cfg: Config, source: str, where: typing.Callable[[str], str]) -> None:
    """Cross-field rules that types cannot express."""

    def need(ok: bool, msg: str) -> None:
        """Fail with ``msg``, blaming where its keys were set: a ``-S`` override of one of the
        keys it names, else an overlay that set one, else ``source``."""
        if not ok:
            origins = [where(k) for k in re.findall(r"\b[a-z]+\.[a-z_]+\b", msg)]
            overrides = [o for o in origins if o.startswith("override")]
            blamed = (overrides or [o for o in origins if o != source] or [source])[0]
            raise ConfigError(f"{blamed}: {msg}")

    _check_bounds(cfg, where)
    a, t, r, e, d = cfg.algo, cfg.train, cfg.rollout, cfg.eval, cfg.data
    try:
        check_critic(a)
    except ConfigError as err:
        need(False, str(err))
    need(
        a.correction.name == "none" or r.backend != "vllm" or (r.temperature == 1 and r.top_p == 1),
        "algo.correction needs the sampler's log-probs, which vLLM gives the trainer's way only "
        "at rollout.temperature=1.0 and rollout.top_p=1.0: set those, or algo.correction.name="
        "none",
    )
    need(
        0 <= a.cache_len < r.max_response_len,
        f"algo.cache_len ({a.cache_len}) must be in [0, rollout.max_response_len) = "
        f"[0, {r.max_response_len}): lower algo.cache_len or raise rollout.max_response_len",
    )
    need(r.group_size >= 2, "rollout.group_size must be >= 2 (advantages need a group)")
    need(0 < r.top_p <= 1, "rollout.top_p must be in (0, 1]")
    need(0 < r.vllm_gpu_memory <= 1, "rollout.vllm_gpu_memory must be in (0, 1]")
    need(r.temperature > 0, "rollout.temperature must be > 0")
    need(
        r.reward == "rule" or bool(r.reward_model),
        "rollout.reward=model needs rollout.reward_model: a directory written by "
        "`dapo reward-model train`",
    )
    need(
        t.prompt_batch % t.mini_batch == 0,
        f"train.prompt_batch ({t.prompt_batch}) must be a multiple of train.mini_batch "
        f"({t.mini_batch})",
    )
    need(t.zero_stage in (1, 2, 3), "train.zero_stage must be 1, 2 or 3")
    need(
        t.rollout_ranks >= 0,
        "train.rollout_ranks must be 0 (the trainer samples) or more: 1 rollout process beside "
        "the trainer, or under a launcher that many of the world's ranks",
    )
    need(
        t.rollout_ranks == 0 or r.backend == "hf",
        "train.rollout_ranks=1 runs the hf sampler in its process; with rollout.backend=vllm "
        "set train.rollout_ranks=0",
    )
    need(0 < d.decontam_threshold <= 1, "data.decontam_threshold must be in (0, 1]")
    need(0 <= t.preflight_min_mixed <= 1, "train.preflight_min_mixed must be in [0, 1]")
    probe = cfg.tracking.switch_probe
    need(
        probe is None or probe in UPDATE_SWITCHES,
        f"tracking.switch_probe must be null or one of {', '.join(UPDATE_SWITCHES)}, got {probe!r}"
        + (
            " (dynamic sampling changes which groups are trained on, not the update made from "
            "them: compare it across runs with dapo ablate)"
            if probe == "dynamic_sampling"
            else ""
        ),
    )
    need(
        cfg.tiny.num_heads % cfg.tiny.num_kv_heads == 0,
        "tiny.num_heads must be a multiple of tiny.num_kv_heads",
    )
    need(
        cfg.tiny.hidden_size % cfg.tiny.num_heads == 0,
        "tiny.hidden_size must be a multiple of tiny.num_heads",
    )
    need(
        cfg.tiny.warm_start_target < 1,
        "tiny.warm_start_target must be below 1 (a validation accuracy to stop at; 0 = none)",
    )
    need(0 < e.top_p <= 1, "eval.top_p must be in (0, 1]")
    need(all(k >= 1 for k in e.pass_ks), "eval.pass_ks must be positive")


def doubtful_settings(cfg: Config, train_problems: int) -> list[str]:
    """Settings a run can go on with but that are probably not meant, each a line that says
    what follows and what to change: a batch larger than the training set (a step then holds
    some problems twice: ``ProblemStream`` starts its next epoch inside the batch), and a
    micro-batch budget below one longest sequence (each sample then gets a micro-batch of its
    own: slow, not wrong)."""
    t, r = cfg.train, cfg.rollout
    said = []
    batch, key = max((t.prompt_batch, "train.prompt_batch"), (t.gen_batch, "train.gen_batch"))
    if batch > train_problems:
        said.append(
            f"{key} is {batch} but the training set has {train_problems} problems: a batch "
            f"holds some problems twice; lower {key}, or curate more problems"
        )
    longest = r.max_prompt_len + r.max_response_len
    if t.micro_batch_tokens < longest:
        said.append(
            f"train.micro_batch_tokens is {t.micro_batch_tokens}, below one longest sequence "
            f"(rollout.max_prompt_len + rollout.max_response_len = {longest}): long samples "
            "get a micro-batch each, which is slow; raise it to at least that"
        )
    return said
