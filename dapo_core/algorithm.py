"""The algorithm an update runs: the ``algo`` entries, with DAPO's switches applied (issue 24).

``algo.loss``, ``algo.aggregation``, ``algo.advantage``, ``algo.kl`` and ``algo.correction`` each
name an entry of a ``dapo_core.algos`` registry with its parameters (:func:`checked_entry`
validates one from the entry's own parameter dataclass). The Table 1 switches stay the ladder's
vocabulary; :func:`algorithm` is the one place two of them become entries (section 3.1, 3.3):

- ``clip_higher=false``: the loss's eps_high = eps_low (the symmetric PPO/GRPO clip);
- ``token_level_loss=false``: ``token_mean`` (Eq. 12) becomes ``seq_mean_token_mean`` (GRPO's
  sample-level mean); any other aggregation is left as it is.

A switch that is on is an identity there, so the trainer calls the entries and never reads a
switch (or an entry's name) to choose what to compute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dapo_core.algos import (
    ADVANTAGES,
    AGGREGATIONS,
    CORRECTIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageInput,
    Entry,
    Metrics,
    Params,
    Registry,
    TokenBatch,
)
from dapo_core.config import AlgoConfig, AlgoEntry, ConfigError

REGISTRIES: dict[str, Registry] = {
    "loss": POLICY_LOSSES,
    "aggregation": AGGREGATIONS,
    "advantage": ADVANTAGES,
    "correction": CORRECTIONS,
}
"""``algo.<key>`` -> the registry its entry is chosen from (``kl`` is checked apart)."""

NO_KL = "none"


def checked_entry(key: str, value: Any) -> AlgoEntry:
    """``algo.<key>``'s mapping validated by its entry; every parameter filled in (defaults
    included), so the stored config says what ran."""
    if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
        raise ConfigError(f"algo.{key} must be a mapping with a 'name', got {value!r}")
    name, params = value["name"], {k: v for k, v in value.items() if k != "name"}
    if key == "kl":
        return _checked_kl(name, params)
    if key not in REGISTRIES:
        raise ConfigError(f"algo.{key} is not an algorithm entry")
    p = REGISTRIES[key].make_params(name, params)
    return AlgoEntry(name=name, **dataclasses.asdict(p))


def _checked_kl(name: str, params: Mapping[str, Any]) -> AlgoEntry:
    """Only ``none``: the estimators exist, but the trainer keeps no frozen reference policy."""
    if name != NO_KL:
        known = ", ".join([NO_KL, *KL_ESTIMATORS.names()])
        wired = "; the trainer keeps no reference policy yet" if name in KL_ESTIMATORS else ""
        raise ConfigError(f"algo.kl: '{name}' is not available{wired} (use {NO_KL}; of {known})")
    if params:
        raise ConfigError(f"algo.kl none: takes no parameters, got {sorted(params)}")
    return AlgoEntry(name=NO_KL)


@dataclass(frozen=True)
class Chosen:
    """An entry with its validated parameters; calling it passes them last."""

    entry: Entry
    params: Params

    def __call__(self, *args: Any) -> Any:
        return self.entry.fn(*args, self.params)


def choose(key: str, name: str, params: Mapping[str, Any]) -> Chosen:
    registry = REGISTRIES[key]
    return Chosen(registry.get(name), registry.make_params(name, params))


@dataclass(frozen=True)
class Algorithm:
    """What an update calls, in order: advantage -> correction -> loss -> aggregation."""

    advantage: Chosen
    correction: Chosen
    loss: Chosen
    aggregation: Chosen

    def metric_names(self) -> list[str]:
        """The names of the metrics the correction and the loss emit, read off a one-token
        batch: a step whose updates had no token to measure still logs each (as 0)."""
        zero = torch.zeros(1, 1)
        batch = TokenBatch(zero, zero, zero, torch.ones(1, 1, dtype=torch.bool), rollout_logp=zero)
        _, _, corr = self.correction(batch)
        return sorted(corr.keys() | self.loss(batch)[1].keys())

    @property
    def corrects(self) -> bool:
        """Whether the correction reads the sampler's log-probs (all but the identity do)."""
        return self.correction.entry.name != "none"


def algorithm(algo: AlgoConfig) -> Algorithm:
    """The entries of ``algo`` with the clip-higher and token-level-loss switches applied."""
    loss = dict(algo.loss.params)
    if not algo.clip_higher and {"eps_low", "eps_high"} <= loss.keys():
        loss["eps_high"] = loss["eps_low"]  # section 3.1: the symmetric clip
    aggregation = algo.aggregation.name
    if not algo.token_level_loss and aggregation == "token_mean":
        aggregation = "seq_mean_token_mean"  # GRPO's sample-level mean (section 3.3)
    return Algorithm(
        advantage=choose("advantage", algo.advantage.name, algo.advantage.params),
        correction=choose("correction", algo.correction.name, algo.correction.params),
        loss=choose("loss", algo.loss.name, loss),
        aggregation=choose("aggregation", aggregation, algo.aggregation.params),
    )


def response_mask(lengths: Tensor) -> Tensor:
    """(N, T) bool: the first ``lengths[i]`` tokens of row i, T = the longest."""
    width = int(lengths.max()) if lengths.numel() else 0
    return torch.arange(width)[None, :] < lengths[:, None]


def token_advantages(chosen: Chosen, rewards: Tensor, lengths: Tensor) -> tuple[Tensor, Metrics]:
    """(P*G, T) per-token advantages of P groups of G responses from their (P, G) sequence
    rewards and (P, G) lengths, through the advantage entry, and its metrics. Every response
    token counts here (the overlong filter acts on the loss, not on the group's baseline)."""
    inp = AdvantageInput(rewards, response_mask(lengths.flatten()))
    out, metrics = chosen(inp)
    return out.advantages, metrics


def global_count(aggregation: Chosen, lengths: list[int]) -> float:
    """The aggregation's count over a whole mini-batch of responses of these lengths (summed
    before any backward, so every micro-batch divides by the same number, Eq. 12); at least 1.
    float64, so a token count is exact at any size."""
    if not lengths:
        return 1.0
    mask = response_mask(torch.tensor(lengths))
    _, count = aggregation(torch.zeros(mask.shape, dtype=torch.float64), mask)
    return max(float(count), 1.0)


def response_weights(aggregation: Chosen, lengths: list[int]) -> list[float]:
    """Each response's weight in the aggregated loss were every token's loss 1: its length under
    ``token_mean`` and Dr.GRPO's sum, 1 under ``seq_mean_token_mean``."""
    ones = [
        aggregation(torch.ones(1, n, dtype=torch.float64), torch.ones(1, n, dtype=torch.bool))[0]
        for n in lengths
    ]
    return [float(w) for w in ones]
