"""The Table 1 ladder of DAPO (arXiv 2503.14476), defined once, and the peers' algorithms.

Naive GRPO -> +overlong filtering -> +clip-higher -> +soft overlong punishment -> +token-level loss
-> +dynamic sampling: each variant is the cumulative switch settings of the ``algo`` section, and
each switch is read in exactly one ``dapo_core`` function.

Beside the ladder, :data:`ALGORITHM_PRESETS` are algorithms of the family (docs/design.md,
section 4): each is DAPO's full recipe (every switch on, so the data side stays DAPO's) with
some of the ``algo`` entries replaced; ``dapo`` replaces none. A preset that is not a variant of
DAPO's recipe (``grpo_kl``) also sets switches, by name, to the values its paper uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from dapo_core.algorithm import check_critic, checked_entry
from dapo_core.config import AlgoConfig, Config, ConfigError, did_you_mean
from dapo_core.config_loader import parse_override, resolve

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


MAX_RESPONSE_LEN = "rollout.max_response_len"  # in a preset: the config's value of that key
RUN = "run"  # in a preset: overrides outside ``algo`` (``-S`` form)

ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    "dapo": {},
    # Liu et al. 2025: no std in the advantage, a constant normaliser (B x L_max)
    "dr_grpo": {
        "advantage": {"name": "dr_grpo"},
        "aggregation": {"name": "seq_mean_token_sum_norm", "max_len": MAX_RESPONSE_LEN},
    },
    # Zheng et al. 2025: the sequence ratio; verl pins the sample-level mean for it
    "gspo": {"loss": {"name": "gspo"}, "aggregation": {"name": "seq_mean_token_mean"}},
    # MiniMax-M1: a clipped, constant importance weight on REINFORCE
    "cispo": {"loss": {"name": "cispo"}},
    # Ahmadian et al. 2024: the leave-one-out baseline
    "rloo": {"advantage": {"name": "rloo"}},
    # Hu 2025: discounted returns whitened over the batch
    "reinforce_pp": {"advantage": {"name": "reinforce_pp"}},
    # GRPO as DeepSeekMath writes it (Shao et al. 2024, arXiv 2402.03300, Eq. 3 and section
    # 4.2): group-normalised advantages with the std (Eq. 9 here), the symmetric PPO clip at
    # 0.2, a mean over each response's tokens then over responses, and k3 KL to the initial
    # policy inside the loss with beta = 0.04 (DeepSeekMath's value; docs/design.md section 4:
    # ~1e-3 is later practice). No dynamic sampling, no overlong filtering or shaping: every
    # Table 1 switch off, as the ladder's naive ``grpo`` rung.
    "grpo_kl": {
        **ABLATION_LADDER["grpo"],
        "loss": {"name": "clip", "eps_low": 0.2, "eps_high": 0.2, "dual_clip_c": None},
        "aggregation": {"name": "seq_mean_token_mean"},
        "advantage": {"name": "grpo"},
        "kl": {"name": "k3", "beta": 0.04, "where": "loss"},
    },
    # PPO with a critic (Schulman et al. 2017; Ouyang et al. 2022; verl's default algorithm):
    # GAE advantages from a value model's values, gamma = lam = 1 (verl's defaults for an
    # outcome reward: A_t = R - V_t before whitening), whitened over the batch, the clipped
    # surrogate with DAPO's clip range, and the critic (the policy's transformer with a scalar
    # head, its clipped value loss, its own AdamW) on.
    "ppo": {
        "advantage": {"name": "gae", "gamma": 1.0, "lam": 1.0},
        "loss": {"name": "clip"},
        "critic": {"name": "value"},
    },
    # DAPO with a rollout process sampling ahead of training (tasks.training.async_rollouts):
    # batch k from the policy after step k - 1 (verl's one-step-off), or k - 2; stale tokens
    # reweighted by token_tis (the config loader's default when samples are stale)
    "one_step_off": {RUN: ["train.rollout_ranks=1", "rollout.max_staleness=1"]},
    "staleness_2": {RUN: ["train.rollout_ranks=1", "rollout.max_staleness=2"]},
}
"""Algorithm name -> the ``algo`` entries it replaces in DAPO's full recipe (mappings), the
switches it sets otherwise (booleans, by switch name), and under ``run`` the overrides of other
sections it applies (how rollouts are scheduled)."""


def apply_variant(cfg: Config, variant: str, tuned: Sequence[str] = ()) -> Config:
    """The config of one Table 1 variant (the ladder's switches replace the algo switches) or of
    one algorithm preset (every switch on, its entries replace the config's), then the
    ``tuned`` overrides of the preset's entries (:func:`split_overrides`)."""
    if variant in ABLATION_LADDER:
        return dataclasses.replace(
            cfg, algo=dataclasses.replace(cfg.algo, **ABLATION_LADDER[variant])
        )
    if variant not in ALGORITHM_PRESETS:
        hint = did_you_mean(variant, [*ABLATION_LADDER, *ALGORITHM_PRESETS])
        raise ConfigError(
            f"unknown variant {variant!r}; Table 1 rungs: {', '.join(ABLATION_LADDER)}; "
            f"algorithms: {', '.join(ALGORITHM_PRESETS)}{hint}"
        )
    preset = ALGORITHM_PRESETS[variant]
    algo = _preset_algo(cfg, {k: v for k, v in preset.items() if k != RUN})
    out = dataclasses.replace(cfg, algo=algo)
    overrides = [*preset.get(RUN, []), *tuned]
    if not overrides:
        return out
    return resolve(out.to_dict(), overrides=overrides, source=f"--variant {variant}")


def split_overrides(variant: str | None, overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """``overrides`` (a command's ``-S``) as (those for the config the variant starts from, those
    that tune a parameter of an entry the variant's preset chooses, applied after it):
    ``--variant ppo -S algo.critic.lr=1e-5`` sets the preset critic's learning rate. An override
    that names another entry for it is refused (it would no longer be the preset)."""
    preset = ALGORITHM_PRESETS.get(variant or "", {})
    base, tuned = [], []
    for item in overrides:
        keys, _ = parse_override(item)
        if len(keys) != 3 or keys[0] != "algo" or keys[1] not in preset:
            base.append(item)
        elif keys[2] == "name":
            raise ConfigError(
                f"--variant {variant} chooses algo.{keys[1]}: drop -S {item}, or drop the "
                "variant and set the entries yourself"
            )
        else:
            tuned.append(item)
    return base, tuned


def split_sweep_overrides(
    variants: Sequence[str], overrides: Sequence[str]
) -> tuple[list[str], dict[str, list[str]]]:
    """A sweep's ``-S`` as (those for the config every variant starts from, each variant's
    tuning of the entries its preset chooses): ``--variants dapo,ppo -S algo.critic.lr=1e-5``
    sets ppo's critic, and dapo, whose preset chooses no critic, keeps the config's."""
    tuned = {v: split_overrides(v, overrides)[1] for v in variants}
    chosen = {o for items in tuned.values() for o in items}
    return [o for o in overrides if o not in chosen], tuned


def _preset_algo(cfg: Config, preset: dict[str, Any]) -> AlgoConfig:
    """DAPO's full recipe with the preset's entries in place of the config's (validated by each
    entry) and its switches set."""
    switches = {k: v for k, v in preset.items() if k in ABLATION_SWITCHES}
    entries = {k: v for k, v in preset.items() if k not in switches}
    chosen = {}
    for key, entry in entries.items():
        entry = {
            k: cfg.rollout.max_response_len if v == MAX_RESPONSE_LEN else v
            for k, v in entry.items()
        }
        chosen[key] = checked_entry(key, entry)
    full_recipe = ABLATION_LADDER["+dynamic_sampling"]
    if "advantage" in chosen:  # the critic goes with the advantage: the preset's, else none
        chosen.setdefault("critic", checked_entry("critic", {"name": "none"}))
    algo = dataclasses.replace(cfg.algo, **(full_recipe | switches), **chosen)
    check_critic(algo)
    return algo


def ordered_variants(variants: list[str] | None) -> list[str]:
    """The requested variants: Table 1 rungs alone in the paper's order (all of them by
    default); with an algorithm preset among them, in the order given (the first is the default
    baseline), each once."""
    if not variants:
        return list(ABLATION_LADDER)
    unknown = [v for v in variants if v not in ABLATION_LADDER and v not in ALGORITHM_PRESETS]
    if unknown:
        hint = did_you_mean(unknown[0], [*ABLATION_LADDER, *ALGORITHM_PRESETS])
        raise ConfigError(
            f"unknown variant(s) {', '.join(unknown)}; Table 1 rungs: "
            f"{', '.join(ABLATION_LADDER)}; algorithms: {', '.join(ALGORITHM_PRESETS)}{hint}"
        )
    if all(v in ABLATION_LADDER for v in variants):
        return [v for v in ABLATION_LADDER if v in variants]
    return list(dict.fromkeys(variants))


def comparison_baseline(names: list[str], baseline: str | None) -> str | None:
    """The variant every other one is compared with, or None for the ladder (each rung against
    the one before): ``baseline`` when given (one of ``names``), else the first of ``names``
    when an algorithm preset is among them."""
    if baseline is not None:
        if baseline not in names:
            raise ConfigError(
                f"--baseline {baseline} is not among the variants ({', '.join(names)})"
            )
        return baseline
    if any(v not in ABLATION_LADDER for v in names):
        return names[0]
    return None
