"""Loss aggregations with a global normaliser (DAPO section 3.3, Eq. 12; GRPO; Dr.GRPO).

Every entry is ``fn(loss_t (B, T), mask (B, T), p) -> (numerator, count)``, two 0-dim tensors. The
trainer sums ``count`` over all micro-batches of a mini-batch and over all data-parallel ranks
first (the global count), then each micro-batch's loss is ``numerator / global_count``
(:func:`aggregate`). Since the numerators add up, the sum of the micro-batch losses equals the
full-batch loss by construction, whatever the split: the denominator must be global (verl's
per-micro-batch token mean is a known bug, docs/design.md section 2).

- ``token_mean`` (DAPO Eq. 12): sum_i sum_t l_it / sum_i |o_i|; a long response weighs in
  proportion to its length.
- ``seq_mean_token_mean`` (GRPO): (1/N) sum_i (1/|o_i|) sum_t l_it over the N non-empty
  sequences; every response weighs the same.
- ``seq_mean_token_sum_norm`` (Dr.GRPO, Liu et al. 2025, arXiv 2503.20783): sum_i sum_t l_it /
  (B * max_len), a constant normaliser so that neither length nor batch content rescales a
  token's gradient. ``max_len`` is the configured maximum response length (TRL:
  ``max_completion_length``; verl: ``loss_scale_factor``). B counts every row, an entirely
  masked (overlong-filtered) one included, as TRL and the Dr.GRPO code do: rows of a batch that
  hold no response at all must not be passed in.

Masked tokens count in neither the numerator nor the denominator (``where``, not a product, so an
inf at a masked position cannot become NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dapo_core.algos.registry import AGGREGATIONS, Entry, NoParams, Params
from dapo_core.algos.types import masked


@dataclass(frozen=True)
class SumNormParams(Params):
    max_len: int  # required: the maximum response length (rollout.max_response_len)

    def __post_init__(self) -> None:
        self.require(self.max_len > 0, "max_len", "must be > 0")


def _sums(loss_t: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(B,) per-sequence loss sums and (B,) valid-token counts, in the loss dtype."""
    mask = mask.bool()
    return masked(loss_t, mask).sum(dim=1), mask.sum(dim=1).to(loss_t.dtype)


@AGGREGATIONS.register("token_mean", NoParams)
def token_mean(loss_t: Tensor, mask: Tensor, p: NoParams) -> tuple[Tensor, Tensor]:
    """Token-level: numerator sum_i sum_t l_it, count = number of valid tokens.
    Source: DAPO section 3.3, Eq. 12."""
    mask = mask.bool()
    # One sum over every token, not per row then over rows: the order of a flat sum, so DAPO's
    # loss is bitwise what the trainer computed before the registries.
    return masked(loss_t, mask).sum(), mask.sum().to(loss_t.dtype)


@AGGREGATIONS.register("seq_mean_token_mean", NoParams)
def seq_mean_token_mean(loss_t: Tensor, mask: Tensor, p: NoParams) -> tuple[Tensor, Tensor]:
    """Sample-level: numerator sum_i mean_t l_it over non-empty rows, count = number of
    non-empty rows. Source: GRPO (Shao et al. 2024, Eq. 3); verl ``seq-mean-token-mean``."""
    seq_sum, lengths = _sums(loss_t, mask)
    seq_mean = seq_sum / lengths.clamp(min=1)  # (B,); an empty row's sum is 0
    return seq_mean.sum(), (lengths > 0).sum().to(loss_t.dtype)


@AGGREGATIONS.register("seq_mean_token_sum_norm", SumNormParams)
def seq_mean_token_sum_norm(
    loss_t: Tensor, mask: Tensor, p: SumNormParams
) -> tuple[Tensor, Tensor]:
    """Dr.GRPO: numerator sum_i sum_t l_it, count = rows x max_len (a constant normaliser).
    Source: Liu et al. 2025 ("Understanding R1-Zero-Like Training"); TRL ``loss_type="dr_grpo"``."""
    seq_sum, _ = _sums(loss_t, mask)
    count = torch.tensor(loss_t.shape[0] * p.max_len, dtype=loss_t.dtype, device=loss_t.device)
    return seq_sum.sum(), count


def aggregate(
    entry: Entry | str,
    params: Params,
    loss_t: Tensor,
    mask: Tensor,
    global_count: Tensor | float | None = None,
) -> Tensor:
    """numerator / (global_count, else this batch's own count); 0 when the count is 0.

    ``entry``: an :data:`AGGREGATIONS` entry or its name."""
    if isinstance(entry, str):
        entry = AGGREGATIONS.get(entry)
    numerator, count = entry.fn(loss_t, mask, params)
    if global_count is not None:
        count = torch.as_tensor(global_count, dtype=numerator.dtype, device=numerator.device)
    # An empty batch contributes 0 (not 0/0 = NaN); a nonzero count divides as it is.
    return numerator / torch.where(count != 0, count, torch.ones_like(count))
