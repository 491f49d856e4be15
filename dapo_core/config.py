"""Typed configuration schema for the DAPO pipeline (values live in params.yaml only).

Every field of every section is required: the loader rejects unknown and missing keys and names the
key and the file, so a typo is an error, not a silent default (the nanoGPT rule). Values are never
defaulted here; `params.yaml` at the repository root is the one source of values, and paper-scale
presets are overlay files that change a subset of keys.

Building a validated ``Config`` from nested mappings (merging presets, applying overrides) is
``dapo_core.config_loader``'s job; the Table 1 variants are ``dapo_core.ablation``'s.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal


class ConfigError(ValueError):
    """A config file or override that does not match the schema; the message says what to fix."""


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``; did you mean 'X'?`` for the candidate closest to a mistyped ``name``, else ``""``."""
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticConfig:
    """The embedded synthetic integer-answer task; no download needed."""

    seed: int
    """Seed of the generator; the same seed gives the same problems."""
    num_train: int
    """Number of distinct training problems."""
    num_test: int
    """Number of held-out problems, disjoint from the training problems."""
    max_operand: int
    """Operands are drawn from 0..max_operand: the difficulty knob."""
    num_terms: int
    """Number of operands per problem (2 = a + b); for ``synthetic:chain``, the most (each problem
    has 2..num_terms)."""


@dataclass(frozen=True)
class DataConfig:
    """Data curation (the DAPO-Math-17K dataset, DAPO section 3.5)."""

    source: str
    """Training source: a parquet/jsonl path, a Hugging Face dataset id, or an embedded task,
    ``synthetic:arith`` (bare sums) or ``synthetic:chain`` (worked running sums of varying length,
    the ablation task; ``dapo_core.synthetic``)."""
    out_dir: str
    """Directory (relative to the repo root) the curated train/val/report files are written to."""
    val_size: int
    """Number of curated problems held out as a validation split (0 = none)."""
    eval_sets: dict[str, str]
    """Named evaluation sets (name -> local path or hub id), for decontamination and evaluation."""
    decontam_ngram: int
    """Word n-gram length for near-duplicate detection against the eval sets."""
    decontam_threshold: float
    """Share of a problem's n-grams found in one eval problem above which it is removed."""


@dataclass(frozen=True)
class ModelConfig:
    """The policy model."""

    name_or_path: str
    """Hugging Face model directory or hub id; ``tiny`` = the embedded model (built if missing)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"]
    """Parameter dtype; ``auto`` = bfloat16 on GPU, float32 on CPU. bf16 weights train through
    float32 master copies (one process) or DeepSpeed's bf16 mode (several) and compute under bf16
    autocast on GPU; ``float16`` applies to evaluation only (training keeps float32 weights)."""
    gradient_checkpointing: bool
    """Recompute activations in the backward pass to save memory."""
    compile: Literal["auto", "none", "regions", "layers"]
    """Regional ``torch.compile`` of the training forward (``tasks/training/compiled.py``):
    ``layers`` compiles whole decoder layers and runs whole sequences (each prompt once per
    sample), ``regions`` each layer's MLP and norms (prompts shared by their group); ``auto``:
    ``layers`` on one GPU, ``none`` on CPU and under DeepSpeed. ``none`` also keeps the CUDA
    sampler's decode step and sampling uncompiled (``tasks/rollout/factory.py``)."""
    warm_start_steps: int
    """Supervised format warm start of a pretrained model before RL (0: none; the embedded
    model has its own, ``tiny.*``): steps on training problems answered as ``Answer: N``, so the
    policy writes answers the rule-based reward (Eq. 7) can score and groups can be mixed."""
    warm_start_lr: float
    """AdamW learning rate of that warm start."""
    warm_start_batch: int
    """Problems per warm-start step."""


@dataclass(frozen=True)
class TinyModelConfig:
    """The embedded default model: a tiny Qwen2 built from a config."""

    path: str
    """Model directory (relative to the repo root) the tiny model is built into, when it is built
    rather than taken from a shipped checkpoint (``shipped``)."""
    shipped: bool
    """Start from the checkpoint the project ships for exactly these settings (``checkpoints/``,
    digest-checked), when one matches: every clone then starts from the same bytes, whatever its
    CPU. False, or no match: build one into ``path``."""
    vocab_size: int
    """Byte-level BPE vocabulary size, trained on the synthetic corpus (at least 259: the 256
    bytes and 3 special tokens)."""
    hidden_size: int
    """Transformer width."""
    intermediate_size: int
    """MLP width."""
    num_layers: int
    """Transformer blocks."""
    num_heads: int
    """Attention heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention, as Qwen2)."""
    warm_start_steps: int
    """Supervised steps on the synthetic train split before RL (RL from 0% has no signal); with
    ``warm_start_target``, the most it may take."""
    warm_start_target: float
    """Validation avg@k (``eval`` sampling settings) at which the warm start stops: the model
    then starts RL at the same accuracy whatever its seed or CPU, instead of wherever a fixed
    step count leaves a steep learning curve. 0 runs all ``warm_start_steps``."""
    warm_start_window: float
    """How far above ``warm_start_target`` a check may land and still stop the warm start; a
    check further above goes on training to a later one inside the window. The validation score
    jumps by 0.1 between two checks near the target on a steep curve, and a seed stopped on such
    a jump starts RL well above the others. 0: any check at or above the target stops it."""
    warm_start_eval_every: int
    """Supervised steps between two checks of ``warm_start_target``."""
    warm_start_lr: float
    """Learning rate of the supervised warm start."""
    warm_start_batch: int
    """Examples per supervised step."""
    seed: int
    """Seed of the build (initial weights, warm-start batches), not of RL: runs with other
    ``train.seed`` share the model, whichever of them builds it."""


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling of responses for RL (DAPO section 4.1)."""

    backend: Literal["hf", "vllm"]
    """Generation backend: ``hf``, the project's own sampler on a transformers model (each prompt
    prefilled once, then a decode loop; the portable default), or ``vllm`` (GPU, optional)."""
    group_size: int
    """G: responses sampled per prompt (paper: 16)."""
    temperature: float
    """Sampling temperature for rollouts (paper: 1.0)."""
    top_p: float
    """Nucleus sampling threshold for rollouts (paper: 1.0)."""
    max_prompt_len: int
    """Prompts longer than this many tokens are truncated (and counted)."""
    max_response_len: int
    """L_max: maximum response length in tokens (paper: 20480); longer responses are truncated."""
    vllm_gpu_memory: float
    """Fraction of GPU memory vLLM may take when it shares the GPU with training (backend vllm)."""
    weights: Literal["auto", "policy", "bfloat16"]
    """The HF sampler's weights: ``bfloat16``, a bf16 copy of the policy refreshed in place
    before each rollout (half the memory traffic of fp32 weights, and its buffers never move);
    ``policy``, the trained weights as they are; ``auto``, the bf16 copy on CUDA when the policy
    holds fp32 weights, the policy otherwise. The gap between the two is logged per step
    (``train/mismatch_*``) and ``algo.correction`` can correct for it."""
    reward: Literal["rule", "model"]
    """What a response is rewarded by: ``rule``, DAPO's Eq. 7 (+1 when the answer equals the
    ground truth, -1 otherwise); ``model``, the score of the reward model at
    ``rollout.reward_model`` (RL from a learned reward; the rule's accuracy is still logged as
    ``train/acc_mean``, so reward hacking shows as the two diverging)."""
    reward_model: str
    """The reward model directory (``dapo reward-model train``) for ``rollout.reward: model``."""
    decode_step: Literal["default", "static-shapes", "flex", "flex-static", "flex-static-autotune"]
    """How the HF backend's CUDA-graph sampler computes a decode step (CUDA only; CPU runs decode
    without graphs): ``default``, attention by SDPA and the layers' pointwise work compiled once
    with symbolic sizes; ``static-shapes``, that work compiled for each power-of-two batch a
    rollout passes through (faster steps, and a compilation per batch size the first time);
    ``flex``, attention by FlexAttention's decoding kernel over one window (compiled per batch
    size too); ``flex-static``, both; ``flex-static-autotune``, ``flex-static`` with the matrix
    products' and attention's kernels chosen by timing (Inductor's max-autotune: longer first
    compilations, and a resumed run samples what the uninterrupted one did only with the
    compiler cache it left). ``model.compile: none`` overrides it (the step uncompiled).
    docs/benchmarks.md compares them."""
    max_staleness: int
    """With ``train.rollout_ranks`` >= 1, how many updates older than the trained policy a batch's
    sampler may be: batch k is sampled by the policy after step k - s, so generation of the next
    s batches overlaps training (0: synchronous, 1: one-step-off). Stale samples are reweighted
    by ``algo.correction`` (``token_tis`` unless set). Ignored without rollout ranks."""


class AlgoEntry(dict):
    """One ``algo`` entry as the config writes it: ``{name: <entry>, <parameter>: value, ...}``.

    A plain mapping, so that presets merge into it and ``-S algo.loss.eps_high=0.3`` sets one
    parameter; the loader checks it against the entry's own parameter dataclass
    (``dapo_core.algorithm.checked_entry``) and stores every parameter, defaults included, so a
    logged config does not depend on the code's defaults."""

    @property
    def name(self) -> str:
        return self["name"]

    @property
    def params(self) -> dict[str, Any]:
        return {k: v for k, v in self.items() if k != "name"}


UPDATE_SWITCHES = ("overlong_filtering", "clip_higher", "overlong_shaping", "token_level_loss")
"""The Table 1 switches that act on the update made from a given batch (its rewards, loss mask
or loss); the other, ``dynamic_sampling``, acts on which groups make up the batch."""


@dataclass(frozen=True)
class AlgoConfig:
    """The DAPO algorithm and its ablation switches (DAPO section 3, Table 1)."""

    loss: AlgoEntry
    """The policy loss (``dapo_core.algos.POLICY_LOSSES``) and its parameters, e.g.
    ``{name: clip, eps_low: 0.2, eps_high: 0.28, dual_clip_c: null}`` (Eq. 10; ``gspo``,
    ``cispo``). ``clip_higher=false`` sets its eps_high to its eps_low."""
    aggregation: AlgoEntry
    """How per-token losses become the update's loss, with a count over the whole mini-batch
    (``AGGREGATIONS``): ``token_mean`` (Eq. 12), ``seq_mean_token_mean`` (GRPO),
    ``seq_mean_token_sum_norm`` (Dr.GRPO, ``max_len``). ``token_level_loss=false`` turns
    ``token_mean`` into ``seq_mean_token_mean``."""
    advantage: AlgoEntry
    """The advantage estimator (``ADVANTAGES``): ``grpo`` (Eq. 9), ``dr_grpo``, ``rloo``,
    ``reinforce_pp``, ``reinforce_pp_baseline``, ``gae`` (which needs ``algo.critic``)."""
    kl: AlgoEntry
    """KL to a frozen reference policy (the initial policy): ``{name: none}`` (DAPO removes it,
    section 2.3), or an estimator ``k1``/``k2``/``k3`` with ``beta`` (its weight; 0 is off) and
    ``where``: ``loss`` (GRPO: + beta * kl per token, aggregated with the policy loss) or
    ``reward`` (PPO-RLHF: -beta * kl per token added to the reward), ``dapo_core.algos.kl``."""
    correction: AlgoEntry
    """Rollout correction for the sampler's policy not being pi_old (``CORRECTIONS``):
    ``{name: none}``, or ``token_tis`` (``cap``, truncated importance sampling; what the old
    ``algo.tis_cap`` set), ``seq_tis``, ``token_mask``, ``seq_mask`` (extras, not in the paper;
    ``dapo_core.mismatch``). The tokens ``token_mask``/``seq_mask`` drop leave the numerator but
    stay in the global count (it is fixed before the forward passes that decide them)."""
    critic: AlgoEntry
    """A value model trained beside the policy (PPO), read by ``gae``: ``{name: none}`` (every
    critic-free algorithm), or ``{name: value, cliprange_value: 0.5, lr: null, weight_decay:
    null, grad_clip: null, model: policy}``: the policy's transformer with a scalar head,
    initialised from the run's starting model (or ``model``: a model directory sharing the
    policy's tokenizer), its own AdamW (null: the ``train.*`` value, on the same warm-up), and
    the clipped value loss of ``dapo_core.algos.critic`` (``tasks.training.critic``). An
    advantage that reads values needs it and one that does not refuses it."""
    clip_higher: bool
    """Switch: decoupled clip (section 3.1). Off means eps_high = eps_low (symmetric PPO clip)."""
    token_level_loss: bool
    """Switch: token-level loss (section 3.3, Eq. 12). Off = sample-level GRPO mean."""
    overlong_filtering: bool
    """Switch: mask truncated responses out of the loss (section 3.4, overlong filtering)."""
    overlong_shaping: bool
    """Switch: soft overlong punishment added to the reward (section 3.4, Eq. 13)."""
    cache_len: int
    """L_cache: the soft-punishment buffer in tokens (paper: 4096 of 20480)."""
    overlong_penalty_factor: float
    """Scale of the soft overlong penalty (paper: 1.0)."""
    dynamic_sampling: bool
    """Switch: keep only groups with 0 < #correct < G (section 3.2, Eq. 11)."""
    max_gen_batches: int
    """Cap on generation batches per training step under dynamic sampling."""
    on_gen_cap: Literal["error", "partial"]
    """At the cap: stop with an explanation (``error``) or train on the partial batch."""
    size_gen_batches: bool
    """Size each generation batch to what the step still needs, from the recent kept fraction
    (``train.gen_batch`` becomes the largest batch); off: every batch is ``gen_batch`` (beyond the
    paper; ``dapo_core.sampling.sized_gen_batch``)."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation (DAPO section 4.1 training details)."""

    seed: int
    """Global seed of a run (sampling, data order; the embedded model's build has its own,
    ``tiny.seed``)."""
    steps: int
    """Number of RL steps (one step = one rollout batch and its gradient updates)."""
    prompt_batch: int
    """Prompts per training batch after dynamic sampling (paper: 512)."""
    gen_batch: int
    """Prompts per generation batch (over-sampling under dynamic sampling; paper: 3 x 512)."""
    mini_batch: int
    """Prompts per gradient update; prompt_batch / mini_batch updates per step (paper: 32 -> 16)."""
    micro_batch_tokens: int
    """Token budget of one forward/backward micro-batch (gradient accumulation in a mini-batch)."""
    lr: float
    """AdamW learning rate (paper: 1e-6)."""
    warmup_steps: int
    """Linear warm-up steps to lr, then constant (paper: 20); step 1 already trains at lr/warmup."""
    weight_decay: float
    """AdamW weight decay (paper: 0.1)."""
    grad_clip: float
    """Gradient-norm clipping threshold (paper: 1.0)."""
    max_bad_steps: int
    """Consecutive non-finite losses/gradients tolerated (each skips its update) before stopping."""
    max_stalled_steps: int
    """Consecutive steps with nothing to learn from (not one group of mixed correctness, or not
    one parseable answer: the gradient is zero, Eq. 9 and 11) before stopping; each is warned
    about. 0 never stops."""
    preflight_prompts: int
    """Training prompts the preflight samples (G responses each) before a run starts from
    scratch, to report whether there is anything to learn from; 0 skips it."""
    preflight_min_mixed: float
    """Least share of groups with mixed correctness (what dynamic sampling keeps, Eq. 11) the
    preflight accepts without a warning (``dapo preflight --strict``: an error)."""
    checkpoint_every: int
    """Save a checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int
    """Keep the last K checkpoints."""
    out_dir: str
    """Directory (relative to the repo root) for run directories and checkpoints."""
    zero_stage: int
    """DeepSpeed ZeRO stage (1, 2 or 3) when launched on several ranks; ignored on one process."""
    cpu_threads: int
    """torch threads for host ops (0 = torch's default), on a GPU too. Tiny models run fastest on
    1 thread when the cores are shared: OpenMP threads that compete with another process stall
    each other."""
    concurrency_limit: str | None
    """A Prefect global concurrency limit each training run holds one slot of while it trains
    (e.g. ``gpu``): every sweep, pipeline and schedule on the same Prefect server then shares
    its slots, so two sweeps never train more runs at once than it allows. Create it once
    (``prefect gcl create gpu --limit 1``); null: no limit. Needs a Prefect server; a run
    without one (``dapo train``) says so and trains."""
    rollout_ranks: int
    """Processes that only generate (0: the trainer generates between its updates). 1: a
    rollout process on this machine, started by the trainer, samples the next batches while the
    trainer updates (``rollout.max_staleness``), with the weights sent to it after each step.
    Under a launcher (torchrun): the world's last k ranks sample, the others train."""


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation (DAPO section 4.1: AIME avg@32 at temperature 1.0, top_p 0.7)."""

    eval_set: str
    """Default evaluation set: ``synthetic-test``, a name from data.eval_sets, or a path."""
    n_samples: int
    """Samples per problem (paper: 32)."""
    temperature: float
    """Sampling temperature (paper: 1.0)."""
    top_p: float
    """Nucleus threshold (paper: 0.7)."""
    max_response_len: int
    """Maximum response tokens at evaluation."""
    pass_ks: list[int]
    """k values for unbiased pass@k (only those <= n_samples are reported)."""
    bootstrap_samples: int
    """Bootstrap resamples over problems for the 95% confidence interval."""
    every_n_steps: int
    """Evaluate on the validation set every N training steps (0 = only after training)."""
    seed: int
    """Sampling seed; the same seed gives the same scores."""
    answer_format: Literal["dapo", "boxed", "minerva", "auto"]
    """Where a response's final answer is read (``dapo_core.reward``), as the prompt asked for
    it: ``dapo``, the last ``Answer:`` line, else the last box (DAPO's prompt; training always
    reads this way); ``boxed``, the last ``\\boxed{}`` ("put your final answer within
    \\boxed{}", Qwen2.5-Math, DeepSeek-R1); ``minerva``, X of "The final answer is X. I hope it
    is correct." (Minerva, lm-evaluation-harness); ``auto``, whichever of those markers comes
    last, else a one-line response itself."""


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow tracking: where runs go and what they log."""

    tracking_uri: str
    """MLflow URI (a path, sqlite:///, http(s)://, postgresql://, ...); empty =
    MLFLOW_TRACKING_URI, else the sqlite store in mlflow/ at the repo root."""
    experiment_prefix: str
    """Experiments are named <prefix>-<flow kind> (one per flow kind)."""
    log_samples: int
    """Sample generations logged per step as a table."""
    system_metrics_s: float
    """Seconds between two samples of CPU, memory, disk, network (GPU where ``nvidia-ml-py``
    is installed) that a training run logs to its MLflow System metrics tab; 0 = off."""
    switch_probe: str | None
    """An ``algo`` switch whose effect on each update is measured all else equal (one of
    ``UPDATE_SWITCHES``): every step also makes its update from the same weights, optimizer state
    and batch with the switch flipped, and logs the policy's entropy after each (``probe/*``,
    ``tasks.training.probe``); the run itself is unchanged. It costs a second update per step
    and holds a second copy of the weights and optimizer state on the training device; null =
    off. ``dapo ablate`` sets it for the rungs whose signal is read this way."""


@dataclass(frozen=True)
class Config:
    """The whole resolved configuration (the sections of params.yaml)."""

    synthetic: SyntheticConfig
    data: DataConfig
    model: ModelConfig
    tiny: TinyModelConfig
    rollout: RolloutConfig
    algo: AlgoConfig
    train: TrainConfig
    eval: EvalConfig
    tracking: TrackingConfig

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def flat_settings(cfg: Config | Mapping[str, Any]) -> dict[str, str]:
    """``{"algo.loss.eps_high": "0.28", ...}``: every setting by its dotted name, its value as
    JSON (a string as it is): how MLflow records a run's params, and how a continued run's
    settings are compared with those it began with."""
    raw = cfg.to_dict() if isinstance(cfg, Config) else cfg
    out: dict[str, str] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, Mapping) and value:
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)

    walk(raw, "")
    return out
