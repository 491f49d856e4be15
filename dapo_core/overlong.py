"""Overlong reward shaping and overlong filtering (DAPO section 3.4).

- Soft overlong punishment (Eq. 13), with L_max the maximum response length and L_cache the buffer:
  R_length(y) = 0                                  if |y| <= L_max - L_cache
              = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
              = -1                                 if |y| > L_max
  scaled by ``factor`` and added to the correctness reward.
- Overlong filtering: a truncated response (no EOS within L_max) is masked out of the loss, so the
  model is not punished for a reasoning that was merely cut off.

Each switch is read in exactly one function below; when it is off, the function is an identity.
"""

from __future__ import annotations

import torch


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, cache_len: int, factor: float = 1.0
) -> torch.Tensor:
    """(B,) response lengths -> (B,) penalties in [-factor, 0], Eq. 13."""
    if cache_len < 0 or cache_len >= max_len:
        raise ValueError(f"need 0 <= cache_len < max_len, got {cache_len}, {max_len}")
    lengths = lengths.to(torch.float32)
    expected = max_len - cache_len
    # (B,), in [-1, 0) inside the buffer; with no buffer, a hard step at L_max
    inside = (expected - lengths) / cache_len if cache_len else torch.zeros_like(lengths)
    penalty = torch.where(lengths <= expected, torch.zeros_like(lengths), inside)
    penalty = torch.where(lengths > max_len, torch.full_like(lengths, -1.0), penalty)
    return factor * penalty


def shaped_rewards(
    acc: torch.Tensor,
    lengths: torch.Tensor,
    *,
    overlong_shaping: bool,
    max_len: int,
    cache_len: int,
    factor: float,
    learned: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. 7 reward (+1 correct, -1 wrong), or the ``learned`` reward (a reward model's score,
    in place of the rule), plus, when ``overlong_shaping``, the Eq. 13 penalty."""
    reward = acc.to(torch.float32) * 2.0 - 1.0 if learned is None else learned.to(torch.float32)
    if not overlong_shaping:
        return reward
    return reward + overlong_penalty(lengths, max_len, cache_len, factor)


def overlong_filter_mask(
    response_mask: torch.Tensor, truncated: torch.Tensor, *, overlong_filtering: bool
) -> torch.Tensor:
    """(B, T) loss mask with truncated responses' tokens zeroed when ``overlong_filtering``."""
    if not overlong_filtering:
        return response_mask
    keep = (~truncated.bool()).to(response_mask.dtype)  # (B,)
    return response_mask * keep[:, None]
