"""Is there anything to learn from? The learning signal of a set of sampled groups.

DAPO's gradient comes only from groups of mixed correctness: a group whose G responses are all
right or all wrong has zero advantage everywhere (Eq. 9), and dynamic sampling drops it (Eq. 11).
A policy that never writes a parseable answer, or a task that is far too hard or too easy for it,
therefore trains on nothing while the run looks healthy. These functions measure that, for the
preflight before a run and for the stall check during one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dapo_core.sampling import keep_groups


@dataclass(frozen=True)
class GroupSignal:
    """Shares over P groups of G responses (each in [0, 1])."""

    mixed_group_frac: float  # groups with 0 < #correct < G: what dynamic sampling keeps
    all_wrong_frac: float
    all_right_frac: float
    parsed_frac: float  # responses with an extractable final answer
    truncated_frac: float  # responses cut at the length limit
    pass_rate_hist: tuple[int, ...]  # groups with k correct responses, k = 0..G


def group_signal(acc: torch.Tensor, parsed: torch.Tensor, finished: torch.Tensor) -> GroupSignal:
    """(P, G) correctness, answer-found and finished flags -> the group signal."""
    correct = acc.to(torch.int64).sum(dim=1)  # (P,)
    G = acc.shape[1]
    return GroupSignal(
        mixed_group_frac=keep_groups(acc).float().mean().item(),
        all_wrong_frac=(correct == 0).float().mean().item(),
        all_right_frac=(correct == G).float().mean().item(),
        parsed_frac=parsed.float().mean().item(),
        truncated_frac=(~finished).float().mean().item(),
        pass_rate_hist=tuple(torch.bincount(correct, minlength=G + 1).tolist()),
    )


TRUNCATED_MOST = 0.5
"""At least this share of responses cut at the length limit: the limit may be why answers go
unparsed (a policy that writes no answers at all is cut there too)."""


def diagnose(signal: GroupSignal, min_mixed: float) -> str | None:
    """Why there is too little to learn from, and what to do; None when ``mixed_group_frac`` is
    at least ``min_mixed``."""
    if signal.mixed_group_frac >= min_mixed:
        return None
    head = f"only {signal.mixed_group_frac:.0%} of groups have mixed correctness"
    if signal.truncated_frac >= TRUNCATED_MOST and signal.parsed_frac < 0.5:
        return (
            f"{head}: {signal.truncated_frac:.0%} of responses are cut at the length limit and "
            f"just {signal.parsed_frac:.0%} end with a parseable answer. If they stop "
            "mid-answer, raise rollout.max_response_len (keeping algo.cache_len below it); if "
            "they are no answers at all, teach the format first (a supervised format warm start)."
        )
    if signal.parsed_frac < 0.5:
        return (
            f"{head}: just {signal.parsed_frac:.0%} of responses end with a parseable answer "
            "(an 'Answer: N' line or a \\boxed{N}). Teach the format first (a supervised format "
            "warm start), or check the prompt template and the chat template."
        )
    if signal.all_wrong_frac >= signal.all_right_frac:
        return (
            f"{head}; {signal.all_wrong_frac:.0%} of groups are all wrong: the task is too hard "
            "for this policy. Use easier problems, a stronger starting model, or a longer "
            "rollout.max_response_len if many responses are truncated "
            f"({signal.truncated_frac:.0%} now)."
        )
    return (
        f"{head}; {signal.all_right_frac:.0%} of groups are all right: the task is too easy, "
        "there is nothing left to learn. Use harder problems."
    )
