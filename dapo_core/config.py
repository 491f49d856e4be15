"""Typed configuration schema for the DAPO pipeline (values live in params.yaml only).

Every field of every section is required: the loader rejects unknown and missing keys and names the
key and the file, so a typo is an error, not a silent default (the nanoGPT rule). Values are never
defaulted here; `params.yaml` at the repository root is the one source of values, and paper-scale
presets are overlay files that change a subset of keys.

Overrides use DVC's dotted convention: ``-S algo.eps_high=0.3`` (the value is parsed as JSON, so
``1e-6`` is a float and ``true``/``null`` work; anything else is taken as a string). Reading
files is the caller's job (``tasks/params.py``): this module only validates nested mappings.

The Table 1 ladder of the paper (naive GRPO -> +overlong filtering -> +clip-higher -> +soft
overlong punishment -> +token-level loss -> +dynamic sampling) is defined once, in
:data:`ABLATION_LADDER`, as the cumulative switch settings of each variant.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


class ConfigError(ValueError):
    """A config file or override that does not match the schema; the message says what to fix."""


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticConfig:
    """The embedded synthetic integer-answer task (DESIGN section 4); no download needed."""

    seed: int
    """Seed of the generator; the same seed gives the same problems."""
    num_train: int
    """Number of distinct training problems."""
    num_test: int
    """Number of held-out problems, disjoint from the training problems."""
    max_operand: int
    """Operands are drawn from 0..max_operand: the difficulty knob."""
    num_terms: int
    """Number of operands per problem (2 = a + b)."""


@dataclass(frozen=True)
class DataConfig:
    """Data curation (DAPO section 3.1 dataset; DESIGN section 3)."""

    source: str
    """Training source: a parquet/jsonl path, a Hugging Face dataset id, or ``synthetic:arith``."""
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
    """Parameter dtype for training; ``auto`` = bfloat16 on GPU, float32 on CPU."""
    gradient_checkpointing: bool
    """Recompute activations in the backward pass to save memory."""


@dataclass(frozen=True)
class TinyModelConfig:
    """The embedded default model: a tiny Qwen2 built from a config (DESIGN section 4)."""

    path: str
    """Model directory (relative to the repo root) the tiny model is built into."""
    vocab_size: int
    """Byte-level BPE vocabulary size, trained on the synthetic corpus."""
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
    """Supervised steps on the synthetic train split before RL (RL from 0% has no signal)."""
    warm_start_lr: float
    """Learning rate of the supervised warm start."""
    warm_start_batch: int
    """Examples per supervised step."""


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling of responses for RL (DAPO section 4.1)."""

    backend: Literal["hf", "vllm"]
    """Generation backend: transformers ``generate`` (portable default) or vLLM (GPU, optional)."""
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


@dataclass(frozen=True)
class AlgoConfig:
    """The DAPO algorithm and its ablation switches (DAPO section 3, Table 1)."""

    eps_low: float
    """Lower clip range epsilon_low of the importance ratio (Eq. 10; paper: 0.2)."""
    eps_high: float
    """Upper clip range epsilon_high (Clip-Higher, section 3.1; paper: 0.28)."""
    dual_clip_c: float | None
    """Dual-clip constant c for negative advantages (extra, not in the paper); null = off."""
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

    def loss_config(self) -> LossConfig:
        """The subset of switches the policy loss reads."""
        return LossConfig(
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            clip_higher=self.clip_higher,
            token_level_loss=self.token_level_loss,
            dual_clip_c=self.dual_clip_c,
        )


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation (DAPO section 4.1 training details)."""

    seed: int
    """Global seed (sampling, data order, initialisation of the embedded model)."""
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
    checkpoint_every: int
    """Save a checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int
    """Keep the last K checkpoints."""
    out_dir: str
    """Directory (relative to the repo root) for run directories and checkpoints."""
    zero_stage: int
    """DeepSpeed ZeRO stage (1, 2 or 3) when launched on several ranks; ignored on one process."""
    cpu_threads: int
    """torch threads on CPU (0 = torch's default). Tiny models run fastest on 1 thread when the
    cores are shared: measured 12x faster than 2 OpenMP threads competing with another process."""


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation (DAPO section 4.1: AIME avg@32 at temperature 1.0, top_p 0.7)."""

    eval_set: str
    """Default evaluation set: a name from data.eval_sets or a path."""
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


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow tracking (DESIGN section 1 and 6)."""

    tracking_uri: str
    """MLflow URI; empty = sqlite store in mlflow/ at the repo root. MLFLOW_TRACKING_URI wins."""
    experiment_prefix: str
    """Experiments are named <prefix>-<flow kind> (one per flow kind)."""
    log_samples: int
    """Sample generations logged per step as a table."""


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


@dataclass(frozen=True)
class LossConfig:
    """What :func:`dapo_core.loss.policy_loss` reads (Eq. 10 and 12)."""

    eps_low: float
    eps_high: float
    clip_higher: bool
    token_level_loss: bool
    dual_clip_c: float | None = None  # off unless a caller asks; the loader always passes it


# --------------------------------------------------------------------------------------------
# The Table 1 ladder (cumulative), defined once
# --------------------------------------------------------------------------------------------

ABLATION_SWITCHES: tuple[str, ...] = (
    "overlong_filtering",
    "clip_higher",
    "overlong_shaping",
    "token_level_loss",
    "dynamic_sampling",
)
"""The five paper components in the order Table 1 adds them."""

ABLATION_LADDER: dict[str, dict[str, bool]] = {
    name: {s: i < rung for i, s in enumerate(ABLATION_SWITCHES)}
    for rung, name in enumerate(
        [
            "grpo",
            "+overlong_filtering",
            "+clip_higher",
            "+overlong_shaping",
            "+token_level_loss",
            "+dynamic_sampling",
        ]
    )
}
"""Variant name -> algo switch values; each rung adds one component to the previous one."""

PAPER_TABLE1_AIME24: dict[str, float] = {
    "grpo": 30.0,
    "+overlong_filtering": 36.0,
    "+clip_higher": 38.0,
    "+overlong_shaping": 41.0,
    "+token_level_loss": 42.0,
    "+dynamic_sampling": 50.0,
}
"""AIME 2024 avg@32 of Qwen2.5-32B per variant, from DAPO Table 1."""


def apply_variant(cfg: Config, variant: str) -> Config:
    """The config of one Table 1 variant: the ladder's switches replace the algo switches."""
    if variant not in ABLATION_LADDER:
        raise ConfigError(f"unknown variant {variant!r}; choose one of {list(ABLATION_LADDER)}")
    algo = dataclasses.replace(cfg.algo, **ABLATION_LADDER[variant])
    return dataclasses.replace(cfg, algo=algo)


# --------------------------------------------------------------------------------------------
# Loading and validation
# --------------------------------------------------------------------------------------------


def resolve(
    base: Mapping[str, Any],
    overlays: typing.Sequence[tuple[str, Mapping[str, Any]]] = (),
    overrides: typing.Sequence[str] = (),
    source: str = "params.yaml",
) -> Config:
    """Merge overlays (``(name, mapping)``, each a subset of keys), apply ``a.b=value`` overrides,
    then validate. ``base`` is not modified."""
    raw = json.loads(json.dumps(base))  # a deep copy that also rejects non-plain values
    for name, overlay in overlays:
        _merge(raw, overlay, source=name)
    for item in overrides:
        _apply_override(raw, item)
    return from_dict(raw, source=source)


def from_dict(raw: Mapping[str, Any], source: str = "<dict>") -> Config:
    """Build and validate a :class:`Config` from nested mappings (e.g. a logged config)."""
    cfg = _build(Config, raw, prefix="", source=source)
    _check_values(cfg, source)
    return cfg


def parse_override(item: str) -> tuple[list[str], Any]:
    """``algo.eps_high=0.3`` -> (["algo", "eps_high"], 0.3); the value is JSON, else a str."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must look like section.key=value")
    value = value.strip()
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    return key.strip().split("."), parsed


def _merge(base: dict[str, Any], overlay: Mapping[str, Any], source: str, prefix: str = "") -> None:
    for key, value in overlay.items():
        if key not in base:
            raise ConfigError(f"{source}: unknown key '{prefix}{key}' (not in the base config)")
        if isinstance(value, Mapping) and isinstance(base[key], dict) and _is_section(base[key]):
            _merge(base[key], value, source, prefix=f"{prefix}{key}.")
        else:
            base[key] = value


def _is_section(value: dict[str, Any]) -> bool:
    # eval_sets is a free-form mapping that an overlay replaces whole; sections are merged.
    return not all(isinstance(v, str) for v in value.values())


def _apply_override(raw: dict[str, Any], item: str) -> None:
    keys, value = parse_override(item)
    node: Any = raw
    for i, k in enumerate(keys[:-1]):
        if not isinstance(node, dict) or k not in node:
            raise ConfigError(f"override {item!r}: unknown key '{'.'.join(keys[: i + 1])}'")
        node = node[k]
    if not isinstance(node, dict) or keys[-1] not in node:
        raise ConfigError(f"override {item!r}: unknown key '{'.'.join(keys)}'")
    node[keys[-1]] = value


def _build(cls: type, raw: Any, prefix: str, source: str) -> Any:
    if not isinstance(raw, Mapping):
        where = prefix.rstrip(".") or "the top level"
        raise ConfigError(f"{source}: '{where}' must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ConfigError(
            f"{source}: unknown key '{prefix}{unknown[0]}'"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
            + f"; valid keys here: {', '.join(names)}"
        )
    missing = [n for n in names if n not in raw]
    if missing:
        raise ConfigError(f"{source}: missing key '{prefix}{missing[0]}'")
    values = {}
    for name in names:
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = _build(hint, raw[name], f"{prefix}{name}.", source)
        else:
            values[name] = _coerce(raw[name], hint, f"{prefix}{name}", source)
    return cls(**values)


def _coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    """Check ``value`` against a type hint; ints are accepted where floats are expected."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    bad = ConfigError(f"{source}: '{key}' must be {_describe(hint)}, got {value!r}")
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            try:
                return _coerce(value, arm, key, source)
            except ConfigError:
                continue
        raise bad
    if hint is type(None):
        if value is None:
            return None
        raise bad
    if origin is Literal:
        if value in args:
            return value
        raise bad
    if origin is list:
        if not isinstance(value, list):
            raise bad
        return [_coerce(v, args[0], f"{key}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise bad
        return {
            _coerce(k, args[0], key, source): _coerce(v, args[1], f"{key}.{k}", source)
            for k, v in value.items()
        }
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-6` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if hint is str:
        if isinstance(value, str):
            return value
        raise bad
    raise ConfigError(f"{source}: '{key}' has an unsupported type {hint!r}")  # schema bug


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(hint, "__name__", str(hint))


def _check_values(cfg: Config, source: str) -> None:
    """Cross-field rules that types cannot express."""

    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(f"{source}: {msg}")

    a, t, r, e = cfg.algo, cfg.train, cfg.rollout, cfg.eval
    need(0 < a.eps_low < 1, f"algo.eps_low must be in (0, 1), got {a.eps_low}")
    need(a.eps_high > 0, f"algo.eps_high must be > 0, got {a.eps_high}")
    need(a.dual_clip_c is None or a.dual_clip_c > 1, "algo.dual_clip_c must be > 1 or null")
    need(0 <= a.cache_len < r.max_response_len, "algo.cache_len must be in [0, max_response_len)")
    need(a.max_gen_batches >= 1, "algo.max_gen_batches must be >= 1")
    need(r.group_size >= 2, "rollout.group_size must be >= 2 (advantages need a group)")
    need(0 < r.top_p <= 1, "rollout.top_p must be in (0, 1]")
    need(0 < r.vllm_gpu_memory <= 1, "rollout.vllm_gpu_memory must be in (0, 1]")
    need(r.temperature > 0, "rollout.temperature must be > 0")
    need(t.prompt_batch >= 1 and t.gen_batch >= 1, "train.prompt_batch, gen_batch must be >= 1")
    need(t.mini_batch >= 1, "train.mini_batch must be >= 1")
    need(
        t.prompt_batch % t.mini_batch == 0,
        f"train.prompt_batch ({t.prompt_batch}) must be a multiple of train.mini_batch "
        f"({t.mini_batch})",
    )
    need(t.warmup_steps >= 0 and t.lr > 0, "train.lr must be > 0 and warmup_steps >= 0")
    need(t.keep_checkpoints >= 1, "train.keep_checkpoints must be >= 1")
    need(t.zero_stage in (1, 2, 3), "train.zero_stage must be 1, 2 or 3")
    need(e.n_samples >= 1, "eval.n_samples must be >= 1")
    need(0 < e.top_p <= 1, "eval.top_p must be in (0, 1]")
    need(all(k >= 1 for k in e.pass_ks), "eval.pass_ks must be positive")
