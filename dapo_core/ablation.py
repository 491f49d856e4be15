"""The Table 1 ladder of DAPO (arXiv 2503.14476), defined once.

Naive GRPO -> +overlong filtering -> +clip-higher -> +soft overlong punishment -> +token-level loss
-> +dynamic sampling: each variant is the cumulative switch settings of the ``algo`` section, and
each switch is read in exactly one ``dapo_core`` function.
"""

from __future__ import annotations

import dataclasses

from dapo_core.config import Config, ConfigError

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
