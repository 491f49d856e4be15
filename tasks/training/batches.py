"""What a training step is made of: problems in epoch order, scored groups, loss-ready samples,
and their packing into micro-batches under a token budget."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from dapo_core.problem import Problem


class ProblemStream:
    """Problems in a reshuffled order each epoch; its position is part of a checkpoint."""

    def __init__(self, problems: list[Problem], seed: int):
        if not problems:
            raise ValueError("the training set is empty")
        self.problems, self.seed = problems, seed
        self.epoch, self.pos = 0, 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[Problem]:
        out = []
        while len(out) < n:
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._shuffled(self.epoch)
            out.append(self.problems[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._shuffled(self.epoch)


@dataclass
class Group:
    """One prompt and its G scored responses."""

    problem_id: str
    answer: str
    prompt_ids: list[int]
    response_ids: list[list[int]]
    finished: list[bool]
    acc: list[bool]
    texts: list[str]


@dataclass
class Sample:
    """One response ready for the loss: its ids, advantage and loss weight."""

    input_ids: list[int]  # prompt + response
    prompt_len: int
    advantage: float
    keep: bool  # False when overlong filtering masks it out
    old_logp: torch.Tensor | None = None  # (response_len,), when several updates per rollout


def micro_batches(
    prompts: list[int], prompt_lens: list[int], response_lens: list[int], budget: int
) -> list[list[int]]:
    """Sample indices packed into micro-batches of at most ``budget`` padded tokens, counting each
    distinct prompt once (distinct prompts x longest prompt + samples x longest response), as
    ``DAPOTrainer._forward_logprobs`` runs them. ``prompts[i]`` names sample i's prompt; a group
    of samples sharing one is split only when it alone exceeds the budget. Groups go longest
    response first, so each micro-batch pads little. A single sample over budget goes alone."""
    by_prompt: dict[int, list[int]] = {}
    for i, g in enumerate(prompts):
        by_prompt.setdefault(g, []).append(i)
    groups = sorted(by_prompt.values(), key=lambda idx: -max(response_lens[i] for i in idx))

    def cost(batch: list[int]) -> int:
        n_prompts = len({prompts[i] for i in batch})
        longest_prompt = max(prompt_lens[i] for i in batch)
        return n_prompts * longest_prompt + len(batch) * max(response_lens[i] for i in batch)

    batches: list[list[int]] = [[]]
    for group in groups:
        group = sorted(group, key=lambda i: -response_lens[i])
        if batches[-1] and cost(batches[-1] + group) > budget and cost(group) <= budget:
            batches.append([])  # keep the group whole in a fresh micro-batch
        for i in group:
            if batches[-1] and cost(batches[-1] + [i]) > budget:
                batches.append([])
            batches[-1].append(i)
    return [b for b in batches if b]


def distinct_prompts(samples: list[Sample]) -> tuple[list[list[int]], list[int]]:
    """(the distinct prompts in order of first use, each sample's index into them)."""
    index: dict[tuple[int, ...], int] = {}
    owner = [index.setdefault(tuple(s.input_ids[: s.prompt_len]), len(index)) for s in samples]
    return [list(p) for p in index], owner
