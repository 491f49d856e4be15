"""The algorithm an update runs: the ``algo`` entries, with DAPO's switches applied (issue 24).

``algo.loss``, ``algo.aggregation``, ``algo.advantage``, ``algo.kl``, ``algo.correction`` and
``algo.critic`` each name an entry of a ``dapo_core.algos`` registry with its parameters
(:func:`checked_entry` validates one from the entry's own parameter dataclass; ``algo.kl`` names
an estimator, or ``none``, with ``beta`` and ``where`` of :class:`~dapo_core.algos.KLParams`;
``algo.critic`` is ``none`` or ``value``, :class:`~dapo_core.algos.ValueParams`). The Table 1
switches stay the ladder's vocabulary; :func:`algorithm` is the one place two of them become
entries (section 3.1, 3.3):

- ``clip_higher=false``: the loss's eps_high = eps_low (the symmetric PPO/GRPO clip);
- ``token_level_loss=false``: ``token_mean`` (Eq. 12) becomes ``seq_mean_token_mean`` (GRPO's
  sample-level mean); any other aggregation is left as it is.

A switch that is on is an identity there, so the trainer calls the entries and never reads a
switch (or an entry's name) to choose what to compute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dapo_core.algos import (
    ADVANTAGES,
    AGGREGATIONS,
    CORRECTIONS,
    CRITICS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageInput,
    Advantages,
    Entry,
    KLParams,
    Metrics,
    Params,
    Registry,
    TokenBatch,
    explained_variance,
    kl_loss,
    kl_reward_penalty,
    make_kl_params,
)
from dapo_core.config import AlgoConfig, AlgoEntry, ConfigError
from dapo_core.overlong import overlong_filter_mask, shaped_rewards

REGISTRIES: dict[str, Registry] = {
    "loss": POLICY_LOSSES,
    "aggregation": AGGREGATIONS,
    "advantage": ADVANTAGES,
    "correction": CORRECTIONS,
    "critic": CRITICS,
}
"""``algo.<key>`` -> the registry its entry is chosen from (``kl`` is checked apart; ``critic``
also takes ``none``)."""

NO_KL = "none"
NO_CRITIC = "none"


def checked_entry(key: str, value: Any) -> AlgoEntry:
    """``algo.<key>``'s mapping validated by its entry; every parameter filled in (defaults
    included), so the stored config says what ran."""
    if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
        raise ConfigError(f"algo.{key} must be a mapping with a 'name', got {value!r}")
    name, params = value["name"], {k: v for k, v in value.items() if k != "name"}
    if key == "kl":
        return _checked_kl(name, params)
    if key == "critic" and name == NO_CRITIC:
        if params:
            raise ConfigError(f"algo.critic none: takes no parameters, got {sorted(params)}")
        return AlgoEntry(name=NO_CRITIC)
    if key not in REGISTRIES:
        raise ConfigError(f"algo.{key} is not an algorithm entry")
    p = REGISTRIES[key].make_params(name, params)
    return AlgoEntry(name=name, **dataclasses.asdict(p))


def _checked_kl(name: str, params: Mapping[str, Any]) -> AlgoEntry:
    """``{name: none}`` (off, DAPO section 2.3), or ``{name: <estimator>, beta, where}``: the
    entry's name is the estimator (k1, k2, k3), its parameters :class:`KLParams`' others."""
    if name == NO_KL:
        if params:
            raise ConfigError(f"algo.kl none: takes no parameters, got {sorted(params)}")
        return AlgoEntry(name=NO_KL)
    if name not in KL_ESTIMATORS:
        known = ", ".join([NO_KL, *KL_ESTIMATORS.names()])
        raise ConfigError(f"algo.kl: unknown estimator '{name}' (known: {known})")
    if "estimator" in params:
        raise ConfigError(f"algo.kl {name}: the estimator is the entry's name, not a parameter")
    p = make_kl_params({**params, "estimator": name})
    return AlgoEntry(name=name, beta=p.beta, where=p.where)


def kl_term(entry: AlgoEntry) -> KLParams | None:
    """The KL term ``algo.kl`` asks for, or None: ``none``, or beta = 0, which would add exactly
    nothing, so the trainer keeps no reference copy and runs no reference forward for it."""
    if entry.name == NO_KL or entry.params["beta"] == 0:
        return None
    return KLParams(estimator=entry.name, beta=entry.params["beta"], where=entry.params["where"])


def check_critic(algo: AlgoConfig) -> None:
    """A critic exactly when the advantage estimator reads one: ``gae`` without a critic would
    have no values, and a critic beside an estimator that ignores it would train for nothing.
    One ConfigError naming the keys, raised where the config is checked (before anything
    runs)."""
    needs = ADVANTAGES.get(algo.advantage.name).params_cls.needs_critic
    has = algo.critic.name != NO_CRITIC
    if needs and not has:
        raise ConfigError(
            f"algo.advantage {algo.advantage.name} needs a critic's values: set "
            'algo.critic={"name": "value"} (or train --variant ppo), or pick an advantage '
            "that needs none (grpo, rloo, reinforce_pp, ...)"
        )
    if has and not needs:
        raise ConfigError(
            f"algo.critic {algo.critic.name}: algo.advantage {algo.advantage.name} does not read "
            'a critic\'s values (gae does): set algo.critic={"name": "none"}, or '
            'algo.advantage={"name": "gae"}'
        )


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


def critic_term(entry: AlgoEntry) -> Chosen | None:
    """The critic ``algo.critic`` asks for (its value loss with its validated parameters,
    :class:`~dapo_core.algos.ValueParams`), or None (``none``)."""
    if entry.name == NO_CRITIC:
        return None
    return choose("critic", entry.name, entry.params)


@dataclass(frozen=True)
class Algorithm:
    """What an update calls, in order: advantage -> correction -> loss (+ KL) -> aggregation."""

    advantage: Chosen
    correction: Chosen
    loss: Chosen
    aggregation: Chosen
    kl: KLParams | None = None  # the KL term to a frozen reference policy; None: none
    critic: Chosen | None = None  # the critic's value loss (``algo.critic``); None: no critic

    def metric_names(self) -> list[str]:
        """The names of the metrics the correction, the loss, the KL term and the critic's value
        loss emit, read off a one-token batch: a step whose updates had no token to measure
        still logs each (as 0)."""
        zero = torch.zeros(1, 1)
        one = torch.ones(1, 1, dtype=torch.bool)
        batch = TokenBatch(zero, zero, zero, one, rollout_logp=zero, ref_logp=zero)
        names = set(token_losses(self, batch)[2])
        if self.critic is not None:
            names |= set(value_losses(self, zero, zero, zero, one)[1])
        return sorted(names)

    def batch_metric_names(self) -> list[str]:
        """The names of the metrics the advantage entry, the KL term in the reward and the
        critic's explained variance emit once per step (before the updates), read off a group
        of two one-token responses."""
        rewards, lengths, zero = (
            torch.tensor([[1.0, -1.0]]),
            torch.ones(1, 2, dtype=torch.long),
            torch.zeros(2, 1),
        )
        names = set()
        token_rewards = None
        if self.kl_in_reward:
            token_rewards, m_kl = reward_kl(self.kl, zero, zero, lengths)
            names |= set(m_kl)
        values = zero if self.critic is not None else None
        names |= set(estimate(self.advantage, rewards, lengths, token_rewards, values)[1])
        if values is not None:
            names |= set(explained_variance(zero, zero, torch.ones(2, 1, dtype=torch.bool)))
        return sorted(names)

    @property
    def corrects(self) -> bool:
        """Whether the correction reads the sampler's log-probs (all but the identity do)."""
        return self.correction.entry.name != "none"

    @property
    def kl_in_loss(self) -> bool:
        """Whether each update needs the reference's log-probs (GRPO's KL in the loss)."""
        return self.kl is not None and self.kl.where == "loss"

    @property
    def kl_in_reward(self) -> bool:
        """Whether the advantages need the reference's log-probs (PPO-RLHF's KL penalty)."""
        return self.kl is not None and self.kl.where == "reward"

    @property
    def needs_reference(self) -> bool:
        return self.kl is not None


def algorithm(algo: AlgoConfig) -> Algorithm:
    """The entries of ``algo`` with the clip-higher and token-level-loss switches applied."""
    check_critic(algo)
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
        kl=kl_term(algo.kl),
        critic=critic_term(algo.critic),
    )


def token_losses(alg: Algorithm, tokens: TokenBatch) -> tuple[Tensor, Tensor, Metrics]:
    """One micro-batch's (B, T) per-token loss, the (B, T) mask of the tokens it keeps, and the
    entries' metrics: correction -> policy loss, weighted by the correction -> + beta * kl when
    the KL term is in the loss (GRPO, Shao et al. 2024, Eq. 3: beta * D_KL per token inside
    the same mean as the surrogate, so the aggregation treats both alike). The KL term is not
    weighted by the correction (as verl adds its KL loss apart from the policy loss)."""
    weights, keep, metrics = alg.correction(tokens)
    loss_t, m_loss = alg.loss(dataclasses.replace(tokens, mask=keep))
    loss_t = loss_t * weights
    if alg.kl_in_loss:
        kl_t, m_kl = kl_loss(alg.kl, tokens.logp, tokens.ref_logp, keep)
        loss_t, m_loss = loss_t + kl_t, m_loss | m_kl
    return loss_t, keep, metrics | m_loss


def value_losses(
    alg: Algorithm, values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor
) -> tuple[Tensor, Metrics]:
    """One micro-batch's (B, T) clipped value loss of the critic and its metrics
    (``dapo_core.algos.critic``), to be aggregated as a token mean with the mini-batch's count."""
    return alg.critic(values, old_values, returns, mask)


def response_mask(lengths: Tensor) -> Tensor:
    """(N, T) bool: the first ``lengths[i]`` tokens of row i, T = the longest."""
    width = int(lengths.max()) if lengths.numel() else 0
    return torch.arange(width)[None, :] < lengths[:, None]


def estimate(
    chosen: Chosen,
    rewards: Tensor,
    lengths: Tensor,
    token_rewards: Tensor | None = None,
    values: Tensor | None = None,
) -> tuple[Advantages, Metrics]:
    """(P*G, T) per-token advantages and returns of P groups of G responses from their (P, G)
    sequence rewards and (P, G) lengths, through the advantage entry, and its metrics. Every
    response token counts here (the overlong filter acts on the loss, not on the group's
    baseline). ``token_rewards``: (P*G, T) per-token rewards, e.g. the KL penalty
    (:func:`reward_kl`); ``values``: (P*G, T) the critic's values (``gae``)."""
    mask = response_mask(lengths.flatten())
    return chosen(AdvantageInput(rewards, mask, values=values, token_rewards=token_rewards))


def rewards(
    algo: AlgoConfig, acc: Tensor, lengths: Tensor, max_len: int, learned: Tensor | None = None
) -> Tensor:
    """Responses' rewards (any shape): Eq. 7 (or the ``learned`` reward, a reward model's
    score) plus, under ``algo.overlong_shaping``, Eq. 13."""
    return shaped_rewards(
        acc,
        lengths,
        overlong_shaping=algo.overlong_shaping,
        max_len=max_len,
        cache_len=algo.cache_len,
        factor=algo.overlong_penalty_factor,
        learned=learned,
    )


@dataclass(frozen=True)
class LossInputs:
    """What the loss reads of P groups of G responses, computed once per step."""

    rewards: Tensor  # (P, G) sequence rewards
    advantages: Tensor  # (P*G, T) per-token advantages, 0 past each response
    returns: Tensor | None  # (P*G, T) the critic's targets (``gae``), else None
    keep: Tensor  # (P*G,) bool: the response carries loss (overlong filtering drops truncated)
    metrics: Metrics  # the advantage entry's


def loss_inputs(
    alg: Algorithm,
    algo: AlgoConfig,
    max_len: int,
    acc: Tensor,
    lengths: Tensor,
    finished: Tensor,
    token_rewards: Tensor | None = None,
    values: Tensor | None = None,
    learned: Tensor | None = None,
) -> LossInputs:
    """Rewards, advantages and the loss mask of (P, G) responses (correct, length, finished)
    under ``algo``'s switches and ``alg``'s advantage entry (:func:`estimate` for
    ``token_rewards`` and ``values``); ``learned`` (P, G) replaces the rule's reward."""
    learned = None if learned is None else learned.flatten()
    r = rewards(algo, acc.flatten(), lengths.flatten(), max_len, learned).view_as(acc)
    adv, metrics = estimate(alg.advantage, r, lengths, token_rewards, values)
    everything = torch.ones(acc.numel(), 1)
    truncated = ~finished.flatten()
    keep = overlong_filter_mask(everything, truncated, overlong_filtering=algo.overlong_filtering)
    return LossInputs(r, adv.advantages, adv.returns, keep[:, 0].bool(), metrics)


def token_advantages(
    chosen: Chosen, rewards: Tensor, lengths: Tensor, token_rewards: Tensor | None = None
) -> tuple[Tensor, Metrics]:
    """:func:`estimate`'s (P*G, T) advantages and metrics, for an estimator without a critic."""
    out, metrics = estimate(chosen, rewards, lengths, token_rewards)
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


def reward_kl(kl: KLParams, old_logp: Tensor, ref_logp: Tensor, lengths: Tensor):
    """(P*G, T) per-token rewards -beta * kl(pi_old || ref) of responses of (P, G) ``lengths``,
    from their (P*G, T) log-probs under the policy that sampled them and the reference (PPO-RLHF,
    Ouyang et al. 2022), and the ``kl_mean`` metric."""
    return kl_reward_penalty(kl, old_logp, ref_logp, response_mask(lengths.flatten()))


def long_weight_share(
    lengths: Sequence[int], token_level: bool = True, weights: Sequence[float] | None = None
) -> float:
    """Share of a batch's loss weight carried by its responses longer than the median length.

    Under the token-level loss (Eq. 12) each token weighs the same, so a response weighs in
    proportion to its length; under the sample-level loss (GRPO) each response weighs the same
    whatever its length. ``weights``, when given, are each response's weight as the configured
    aggregation gives it (``dapo_core.algorithm.response_weights``) and ``token_level`` is
    ignored. 0.0 for an empty batch."""
    n = np.asarray(lengths, dtype=np.float64)
    if weights is None:
        weight = n if token_level else np.ones_like(n)
    else:
        weight = np.asarray(weights, dtype=np.float64)
    weight = weight[n > 0]
    n = n[n > 0]
    if n.size == 0:
        return 0.0
    return float(weight[n > np.median(n)].sum() / weight.sum())
