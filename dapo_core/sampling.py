"""Dynamic sampling (DAPO section 3.2, Eq. 11).

A group whose G responses are all correct or all wrong has zero advantage everywhere and gives no
gradient; DAPO over-samples and keeps only groups with 0 < #correct < G until the training batch
holds the configured number of prompts. The filter reads the raw accuracy, never the shaped reward
(filtering on shaped reward lets all-wrong groups with different length penalties through).

Beyond the paper:
- surplus kept groups are not thrown away but carried to the next step by :class:`GroupAccumulator`
  (they are slightly off-policy, so each carries the step it was generated at, and the batch
  reports their age). Every step still generates at least one fresh batch, and at most one batch
  worth of groups is carried (the oldest beyond that are dropped and counted), so the carried
  groups stay at most a step or two old even when almost every group is kept;
- generation batches can be sized to what the step still needs (``sized=True``): about
  (needed + 2 standard deviations) / f prompts, with f the kept fraction estimated over recent
  batches, instead of a fixed ``gen_batch`` (which then only bounds a batch). Each step must
  generate at least one batch, so a fixed batch larger than prompt_batch / f leaves a surplus every
  step that the carry cap ends up dropping; sized batches stay close to the 1/f bound in samples
  generated per sample trained on (``python -m bench.dynamic_sampling`` measures both;
  docs/benchmarks.md has the figures);
- at the cap on generation batches the caller chooses the outcome: an error that explains what
  happened (:class:`GenerationCapReached`) or training on the partial batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dapo_core.errors import PipelineError


class GenerationCapReached(PipelineError):
    """Dynamic sampling hit max_gen_batches before filling the batch (and on_gen_cap=error)."""


def keep_groups(acc: torch.Tensor) -> torch.Tensor:
    """(P, G) raw correctness -> (P,) bool: groups with 0 < #correct < G (Eq. 11)."""
    correct = acc.to(torch.int64).sum(dim=1)  # (P,)
    return (correct > 0) & (correct < acc.shape[1])


@dataclass
class GroupAccumulator:
    """Kept groups waiting to be trained on, oldest first, each with the step that generated it."""

    groups: list[tuple[int, Any]] = field(default_factory=list)
    # Decayed counts of groups kept and generated: the kept-fraction estimate that sizes batches.
    kept_count: float = 0.0
    generated_count: float = 0.0

    DECAY = 0.8  # per step: the estimate follows the policy as it learns

    def observe(self, kept: int, generated: int) -> None:
        self.kept_count += kept
        self.generated_count += generated

    def decay(self) -> None:
        self.kept_count *= self.DECAY
        self.generated_count *= self.DECAY

    @property
    def kept_frac(self) -> float | None:
        """Estimated fraction of generated groups that dynamic sampling keeps (None: no data)."""
        return self.kept_count / self.generated_count if self.generated_count else None

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, groups: Sequence[Any], step: int) -> None:
        self.groups.extend((step, g) for g in groups)

    def take(self, n: int, step: int) -> tuple[list[Any], list[int]]:
        """Up to ``n`` groups (oldest first, so none grows stale) and their ages in steps."""
        taken, self.groups = self.groups[:n], self.groups[n:]
        return [g for _, g in taken], [step - born for born, _ in taken]

    def trim(self, capacity: int) -> int:
        """Drop the oldest groups beyond ``capacity``; returns how many were dropped."""
        dropped = max(0, len(self.groups) - capacity)
        self.groups = self.groups[dropped:]
        return dropped

    def state_dict(self) -> dict[str, Any]:
        return {
            "groups": list(self.groups),
            "kept_count": self.kept_count,
            "generated_count": self.generated_count,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.groups = [(int(born), g) for born, g in state["groups"]]
        self.kept_count = float(state.get("kept_count", 0.0))  # absent in older checkpoints
        self.generated_count = float(state.get("generated_count", 0.0))


def sized_gen_batch(needed: int, kept_frac: float | None, gen_batch: int) -> int:
    """Prompts to generate so that at least ``needed`` groups are kept with ~97% probability:
    (needed + 2 sd) / f, where the kept count of n prompts is ~Binomial(n, f). At least 1 (every
    step generates), at most ``gen_batch``; ``gen_batch`` while f is unknown."""
    if not kept_frac:  # unknown, or nothing kept lately
        return gen_batch
    needed = max(needed, 0)
    n = (needed + 2.0 * math.sqrt(needed * (1.0 - kept_frac))) / kept_frac
    return max(1, min(gen_batch, math.ceil(n)))


@dataclass(frozen=True)
class BatchStats:
    """What dynamic sampling did in one step (logged per step)."""

    num_gen_batches: int
    groups_generated: int
    groups_kept: int
    groups_in_batch: int
    carried_over: int
    mean_age: float
    hit_cap: bool
    dropped: int = 0

    @property
    def kept_group_frac(self) -> float:
        return self.groups_kept / self.groups_generated if self.groups_generated else 0.0

    @property
    def samples_per_kept(self) -> float:
        """Generated groups per kept group (= samples per kept sample); 1 / kept fraction."""
        return self.groups_generated / self.groups_kept if self.groups_kept else float("inf")


GenerateFn = Callable[[int], tuple[Sequence[Any], torch.Tensor]]
"""n_prompts -> (groups, (n_prompts, G) raw accuracy)."""


def fill_batch(
    generate: GenerateFn,
    buffer: GroupAccumulator,
    *,
    step: int,
    prompt_batch: int,
    gen_batch: int,
    max_gen_batches: int,
    on_gen_cap: str,
    dynamic_sampling: bool,
    sized: bool = False,
) -> tuple[list[Any], BatchStats]:
    """Build one training batch of ``prompt_batch`` groups.

    With ``dynamic_sampling`` off (naive GRPO) this is one generation batch of exactly
    ``prompt_batch`` prompts, all kept. With it on, generation batches of ``gen_batch`` prompts are
    drawn and filtered (at least one per step) until the buffer, which may hold groups carried
    from the last step, holds enough, or ``max_gen_batches`` is reached. At most ``prompt_batch``
    surplus groups are carried to the next step. With ``sized`` each generation batch holds
    :func:`sized_gen_batch` prompts (at most ``gen_batch``), and the cap counts prompts:
    ``max_gen_batches * gen_batch`` of them.
    """
    if not dynamic_sampling:
        groups, acc = generate(prompt_batch)
        stats = BatchStats(1, len(groups), len(groups), len(groups), 0, 0.0, False)
        return list(groups), stats

    generated = kept = batches = 0
    budget = max_gen_batches * gen_batch  # prompts
    buffer.decay()
    while (len(buffer) < prompt_batch or batches == 0) and generated < budget:
        n = gen_batch
        if sized:
            n = sized_gen_batch(prompt_batch - len(buffer), buffer.kept_frac, gen_batch)
        groups, acc = generate(min(n, budget - generated))
        mask = keep_groups(acc).tolist()
        buffer.add([g for g, k in zip(groups, mask, strict=True) if k], step)
        buffer.observe(sum(mask), len(groups))
        batches += 1
        generated += len(groups)
        kept += sum(mask)
    hit_cap = len(buffer) < prompt_batch
    if hit_cap and on_gen_cap == "error":
        raise GenerationCapReached(
            f"dynamic sampling kept {len(buffer)} of the {prompt_batch} groups a batch needs after "
            f"{batches} generation batches ({kept}/{generated} groups had mixed correctness). "
            "Most groups are all-correct or all-wrong: the task is too easy or too hard for this "
            "policy. Raise algo.max_gen_batches or train.gen_batch, or set "
            "algo.on_gen_cap=partial to train on the partial batch."
        )
    batch, ages = buffer.take(prompt_batch, step)
    dropped = buffer.trim(prompt_batch)
    stats = BatchStats(
        num_gen_batches=batches,
        groups_generated=generated,
        groups_kept=kept,
        groups_in_batch=len(batch),
        carried_over=len(buffer),
        mean_age=sum(ages) / len(ages) if ages else 0.0,
        hit_cap=hit_cap,
        dropped=dropped,
    )
    return batch, stats
