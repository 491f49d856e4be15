"""What a training step is made of: problems in epoch order, scored groups, loss-ready samples,
and their packing into micro-batches under a token budget."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

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
    logprobs: list[torch.Tensor] | None = None  # the sampler's, per response token (float32)
    step: int | None = None  # the training step whose rollout sampled it (carried groups: earlier)
    scores: list[float] | None = None  # a reward model's (rollout.reward=model), per response
    version: int | None = None  # the policy that sampled it: the weights after this many steps


@dataclass(frozen=True, eq=False)
class Sample:
    """One response ready for the loss: its ids, advantage and loss weight, and what its loss
    reads besides the policy's own log-probs. Built whole, never changed: what the step's
    no-grad passes compute for it (log pi_old, log pi_ref, the critic's values) comes back as
    ``Rows`` keyed by the sample (by identity: ``eq=False``)."""

    input_ids: list[int]  # prompt + response
    prompt_len: int
    advantage: float  # the response's advantage (the mean over its tokens of token_advantages)
    keep: bool  # False when overlong filtering masks it out
    rollout_logp: torch.Tensor | None = None  # (response_len,), the sampler's log-probs
    fresh: bool = True  # sampled by this step's policy (not a group carried from an earlier step)
    token_advantages: torch.Tensor | None = None  # (response_len,); None: ``advantage`` on each
    kl: bool = False  # its loss has a KL term, never identically zero (GRPO's KL in the loss)
    old_values: torch.Tensor | None = None  # (response_len,), the critic's before the updates
    returns: torch.Tensor | None = None  # (response_len,), the critic's regression target

    @property
    def response_len(self) -> int:
        return len(self.input_ids) - self.prompt_len

    @property
    def carries_loss(self) -> bool:
        """False when its loss is identically zero: masked out, or every advantage 0 and no
        KL term (which pulls a response toward the reference whatever its advantage)."""
        if not self.keep:
            return False
        if self.kl:
            return True
        if self.token_advantages is None:
            return self.advantage != 0.0
        return bool(self.token_advantages.any())

    def advantages(self) -> torch.Tensor:
        """(response_len,) per-token advantages."""
        if self.token_advantages is not None:
            return self.token_advantages
        return torch.full((self.response_len,), self.advantage)


Rows = dict[Sample, torch.Tensor]
"""A no-grad pass's output: a (response_len,) row per sample it ran on (log pi_old, log pi_ref,
the critic's values), keyed by the sample itself."""


def fed_tokens(
    batch: list[int], prompts: list[int], prompt_lens: list[int], response_lens: list[int]
) -> int:
    """Tokens one micro-batch of sample indices feeds, padding included: its distinct prompts,
    each run once at the longest prompt's width, and its responses at the longest one's."""
    n_prompts = len({prompts[i] for i in batch})
    longest_prompt = max(prompt_lens[i] for i in batch)
    return n_prompts * longest_prompt + len(batch) * max(response_lens[i] for i in batch)


def micro_batches(
    prompts: list[int],
    prompt_lens: list[int],
    response_lens: list[int],
    budget: int,
    packing: Literal["best", "group", "length"] = "best",
) -> list[list[int]]:
    """Sample indices packed into micro-batches of at most ``budget`` padded tokens, counting each
    distinct prompt once (distinct prompts x longest prompt + samples x longest response), as
    ``tasks.training.forward`` runs them; ``prompts[i]`` names sample i's prompt.

    Two packings, and (``packing="best"``) the one that feeds fewer tokens, padding included:

    - group-major: whole groups, longest response first; a group's prompt runs once, but its G
      responses differ in length, so a micro-batch pads up to its longest;
    - length-major: samples longest first whatever their prompt, cut into as many runs of
      consecutive samples as filling each micro-batch to the budget would make, at the cuts that
      feed the fewest tokens (:func:`_cheapest_runs`); responses of one micro-batch have similar
      lengths (little padding), and a prompt may run in several.

    Long, varied responses (real math) favour length-major; short ones with long prompts favour
    group-major. A single sample over budget goes alone."""
    by_prompt: dict[int, list[int]] = {}
    for i, g in enumerate(prompts):
        by_prompt.setdefault(g, []).append(i)
    groups = sorted(by_prompt.values(), key=lambda idx: -max(response_lens[i] for i in idx))

    def cost(batch: list[int]) -> int:
        return fed_tokens(batch, prompts, prompt_lens, response_lens)

    def pack(units: list[list[int]]) -> list[list[int]]:
        batches: list[list[int]] = [[]]
        for unit in units:
            unit = sorted(unit, key=lambda i: -response_lens[i])
            if batches[-1] and cost(batches[-1] + unit) > budget and cost(unit) <= budget:
                batches.append([])  # keep the unit whole in a fresh micro-batch
            for i in unit:
                if batches[-1] and cost(batches[-1] + [i]) > budget:
                    batches.append([])
                batches[-1].append(i)
        return [b for b in batches if b]

    by_length = sorted(range(len(prompts)), key=lambda i: (-response_lens[i], prompts[i]))
    candidates = {
        "group": lambda: pack(groups),
        "length": lambda: _cheapest_runs(
            by_length,
            prompts,
            prompt_lens,
            response_lens,
            budget,
            len(pack([[i] for i in by_length])),
        ),
    }
    if packing != "best":
        return candidates[packing]()
    group_major = candidates["group"]()
    if len(group_major) <= 1:  # everything in one micro-batch: no packing feeds less
        return group_major
    return min(group_major, candidates["length"](), key=lambda bs: sum(cost(b) for b in bs))


def _cheapest_runs(
    order: list[int],
    prompts: list[int],
    prompt_lens: list[int],
    response_lens: list[int],
    budget: int,
    max_runs: int,
) -> list[list[int]]:
    """``order`` (longest response first) cut into at most ``max_runs`` runs of consecutive
    samples, each within ``budget`` (a single sample over it runs alone), feeding the fewest
    tokens: dynamic programming over the cut points, ``least[k][j]`` being the cheapest packing of
    ``order[:j]`` into k runs. Without the cap on runs the cheapest packing is one sample per
    micro-batch (no padding at all), which a GPU pays for in launches; with the greedy fill's
    count, it is as many micro-batches as filling each to the budget, with less padding."""
    n, inf = len(order), float("inf")
    if n == 0:
        return []
    runs_from: list[list[tuple[int, int]]] = []  # per start i: (end j, cost of order[i:j])
    for i in range(n):
        seen: set[int] = set()
        longest_prompt, row = 0, []
        for j in range(i, n):
            seen.add(prompts[order[j]])
            longest_prompt = max(longest_prompt, prompt_lens[order[j]])
            c = len(seen) * longest_prompt + (j - i + 1) * response_lens[order[i]]
            if c > budget and j > i:
                break  # longer runs only cost more
            row.append((j + 1, c))
        runs_from.append(row)
    least = [[0.0] + [inf] * n] + [[inf] * (n + 1) for _ in range(max_runs)]
    cut = [[0] * (n + 1) for _ in range(max_runs + 1)]
    for k in range(1, max_runs + 1):
        prev, cur = least[k - 1], least[k]
        for i in range(n):
            if prev[i] < inf:
                for j, c in runs_from[i]:
                    if prev[i] + c < cur[j]:
                        cur[j], cut[k][j] = prev[i] + c, i
    k = min(range(1, max_runs + 1), key=lambda k: least[k][n])
    runs, j = [], n
    while j > 0:
        runs.append(order[cut[k][j] : j])
        j, k = cut[k][j], k - 1
    return runs[::-1]


def padding_fraction(
    prompts: list[int], prompt_lens: list[int], response_lens: list[int], batches: list[list[int]]
) -> float:
    """Share of the tokens fed in ``batches`` (as :func:`micro_batches` counts them) that are
    padding: 1 - (each micro-batch's distinct prompts' and responses' own lengths) / fed."""
    fed = real = 0
    for b in batches:
        one_each = {prompts[i]: i for i in b}  # one sample per distinct prompt
        fed += fed_tokens(b, prompts, prompt_lens, response_lens)
        real += sum(prompt_lens[i] for i in one_each.values()) + sum(response_lens[i] for i in b)
    return 1.0 - real / fed if fed else 0.0


def sample_padding_fraction(batches: list[list[Sample]]) -> float:
    """:func:`padding_fraction` of micro-batches of samples (a prompt is keyed by its ids)."""
    keys: dict[tuple[int, ...], int] = {}
    prompts, prompt_lens, response_lens, index = [], [], [], []
    for batch in batches:
        index.append([])
        for s in batch:
            index[-1].append(len(prompts))
            prompts.append(keys.setdefault(tuple(s.input_ids[: s.prompt_len]), len(keys)))
            prompt_lens.append(s.prompt_len)
            response_lens.append(len(s.input_ids) - s.prompt_len)
    return padding_fraction(prompts, prompt_lens, response_lens, index)


def distinct_prompts(samples: list[Sample]) -> tuple[list[list[int]], list[int]]:
    """(the distinct prompts in order of first use, each sample's index into them)."""
    index: dict[tuple[int, ...], int] = {}
    owner = [index.setdefault(tuple(s.input_ids[: s.prompt_len]), len(index)) for s in samples]
    return [list(p) for p in index], owner


def pack_samples(samples: list[Sample], budget: int) -> list[list[Sample]]:
    """``samples`` packed into micro-batches of at most ``budget`` padded tokens
    (:func:`micro_batches`, each distinct prompt counted once)."""
    _, keys = distinct_prompts(samples)
    idx = micro_batches(
        keys,
        [s.prompt_len for s in samples],
        [len(s.input_ids) - s.prompt_len for s in samples],
        budget,
    )
    return [[samples[i] for i in b] for b in idx]
