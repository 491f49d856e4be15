"""Algorithms as plug-ins: one registry per kind of entry (issue 24).

- :data:`POLICY_LOSSES` (``clip``, ``gspo``, ``cispo``):
  ``fn(batch, p) -> (loss_t (B, T), metrics)``
- :data:`AGGREGATIONS` (``token_mean``, ``seq_mean_token_mean``, ``seq_mean_token_sum_norm``):
  ``fn(loss_t, mask, p) -> (numerator, count)``, reduced with a global count (:func:`aggregate`)
- :data:`ADVANTAGES` (``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp``,
  ``reinforce_pp_baseline``, ``gae``): ``fn(inp, p) -> (Advantages, metrics)``
- :data:`KL_ESTIMATORS` (``k1``, ``k2``, ``k3``): ``fn(logp, ref_logp) -> (B, T)``, used through
  :class:`KLParams` and :func:`kl_loss` / :func:`kl_reward_penalty`
- :data:`CORRECTIONS` (``token_tis``, ``seq_tis``, ``token_mask``, ``seq_mask``):
  ``fn(batch, p) -> (weights (B, T), keep_mask (B, T), metrics)``
- :data:`CRITICS` (``value``): ``fn(values, old_values, returns, mask, p) -> (loss_t (B, T),
  metrics)``, the clipped value loss of a critic (``algo.critic``, read by ``gae``), with
  :func:`explained_variance`

Metrics are ``{name: (numerator, denominator)}`` (:func:`reduce_metrics`). A config picks an entry
by name and sets its parameters with ``REGISTRY.make_params(name, mapping)``. Pure: the standard
library, numpy and torch only. Importing this package registers every built-in entry.
"""

from dapo_core.algos import advantages, aggregations, corrections, critic, kl, losses
from dapo_core.algos.aggregations import aggregate
from dapo_core.algos.critic import ValueParams, explained_variance
from dapo_core.algos.kl import KLParams, kl_loss, kl_per_token, kl_reward_penalty, make_kl_params
from dapo_core.algos.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    CORRECTIONS,
    CRITICS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    Entry,
    NoParams,
    Params,
    Registry,
    build_params,
)
from dapo_core.algos.types import (
    AdvantageInput,
    Advantages,
    Metric,
    Metrics,
    TokenBatch,
    reduce_metrics,
)

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "CORRECTIONS",
    "CRITICS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageInput",
    "Advantages",
    "Entry",
    "KLParams",
    "Metric",
    "Metrics",
    "NoParams",
    "Params",
    "Registry",
    "TokenBatch",
    "ValueParams",
    "advantages",
    "aggregate",
    "aggregations",
    "build_params",
    "corrections",
    "critic",
    "explained_variance",
    "kl",
    "kl_loss",
    "kl_per_token",
    "kl_reward_penalty",
    "losses",
    "make_kl_params",
    "reduce_metrics",
]
