"""What one step's rollout and each of its updates produce, as typed records.

``RolloutLog`` is filled by ``tasks.training.rollouts`` over the step's generation batches and
read by ``step_metrics`` (the rollout metrics, the stall check); ``UpdateResult`` is what
``tasks.training.updater`` returns for one gradient update (a critic update adds to it) and
``step_metrics.update_metrics`` turns a step's list of them into ``train/*`` metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from dapo_core.reward import extract_answer

if TYPE_CHECKING:
    from tasks.training.batches import Group


@dataclass
class RolloutLog:
    """Every response one step generated, kept by dynamic sampling or not, in generation order
    (group after group, G responses each), and the time spent generating."""

    gen_time: float = 0.0
    prompts_truncated: int = 0
    acc: list[bool] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)
    parsed: list[bool] = field(default_factory=list)  # an answer was found in the response
    scores: list[float] = field(default_factory=list)  # the reward model's (rollout.reward=model)

    def add(self, groups: list[Group]) -> None:
        self.acc += [a for g in groups for a in g.acc]
        self.lengths += [len(r) for g in groups for r in g.response_ids]
        self.finished += [f for g in groups for f in g.finished]
        self.parsed += [extract_answer(t) is not None for g in groups for t in g.texts]
        self.scores += [s for g in groups if g.scores is not None for s in g.scores]

    def group_tensors(self, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(P, G) correctness, answer-found and finished flags of every group generated."""
        return tuple(
            torch.tensor(flags, dtype=torch.bool).view(-1, group_size)
            for flags in (self.acc, self.parsed, self.finished)
        )


@dataclass(frozen=True)
class UpdateResult:
    """One gradient update over a mini-batch, reduced over its micro-batches and ranks.

    ``entropy`` is the token mean over the update's tokens; ``entries`` holds each algorithm
    entry metric's summed (numerator, denominator), divided once per step (``step_metrics``);
    ``mismatch`` the train/rollout log-prob gap over freshly sampled tokens (``abs_diff``,
    ``kl``, ``max_ratio``), None when the sampler gave no log-probs or no token was fresh."""

    loss: float
    tokens: float
    entropy: float
    entries: dict[str, list[float]] = field(default_factory=dict)
    mismatch: dict[str, float] | None = None
    grad_norm: float = 0.0
    applied: bool = True  # False: a non-finite loss or gradient, the update was skipped
    padding_frac: float = 0.0  # this rank's share of padding in its micro-batches
