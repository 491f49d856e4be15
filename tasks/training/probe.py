"""What one ``algo`` switch does to an update, all else equal (``tracking.switch_probe``).

Compared across runs, a switch's effect on a quantity such as the policy's entropy is mixed with
each run's own trajectory: after a few steps two runs sample different responses, and their
difference is mostly that. DAPO's clip-higher (section 3.1) moves entropy by acting on the few
tokens whose ratio reaches the clip, an effect far smaller than that noise on short runs.

A probe measures the effect directly. At every step the update is made twice from the same
weights, optimizer state and groups: once with the switch flipped, which is then undone, and once
as the run has it. The policy's token entropy over all of the step's responses is read before and
after each. The run's trajectory is the same with or without a probe (a test checks it); the
probe costs a second update and three forward passes over the step's responses. Per step:

- ``probe/entropy_before``: before the update;
- ``probe/entropy_on`` and ``probe/entropy_off``: after the update with the switch on, and off;
- ``probe/entropy_delta``: on minus off, the switch's effect on entropy in one step (paired:
  same state, same batch, same order of mini-batches);
- ``perf/probe_time_s``: what the probe added to the step's time.

``SwitchProbe`` wraps the trainer's learning half (groups -> samples -> updates) with it; the
trainer calls it in place of its own ``learn`` and knows nothing else of the probe.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable

import torch

from dapo_core import metric_names as metric
from dapo_core.algorithm import algorithm
from dapo_core.config import AlgoConfig
from dapo_core.errors import PipelineError
from tasks.training.batches import Group, Sample, pack_samples
from tasks.training.distributed import OptimizerEngine
from tasks.training.records import UpdateResult

Prepare = Callable[[list[Group], AlgoConfig | None], tuple[list[Sample], dict[str, float]]]

Saved = tuple[dict[str, torch.Tensor], dict]


def check_world(switch: str | None, world: int) -> None:
    """Refuse a probe on several ranks: it undoes an update, whose state ZeRO shards."""
    if switch and world > 1:
        raise PipelineError(
            "tracking.switch_probe runs on one process (it undoes an update, which ZeRO "
            "shards across ranks): set tracking.switch_probe=null, or train on one GPU"
        )


def flipped(algo: AlgoConfig, switch: str) -> AlgoConfig:
    """``algo`` with ``switch`` turned the other way."""
    return dataclasses.replace(algo, **{switch: not getattr(algo, switch)})


def probe_metrics(
    switch_on: bool, before: float, after: float, after_flipped: float
) -> dict[str, float]:
    """The step's ``probe/*`` metrics from the entropy before the update, after it, and after the
    flipped one; ``switch_on``: whether the run's own update has the switch on."""
    on, off = (after, after_flipped) if switch_on else (after_flipped, after)
    return {
        metric.ENTROPY_BEFORE: before,
        metric.ENTROPY_ON: on,
        metric.ENTROPY_OFF: off,
        metric.ENTROPY_DELTA: on - off,
    }


@torch.no_grad()
def mean_entropy(
    forward: Callable[[list[Sample]], tuple[torch.Tensor, ...]],
    samples: list[Sample],
    micro_batch_tokens: int,
) -> float:
    """The policy's token-mean entropy over every response in ``samples``, whether or not it
    carries loss (the same tokens whichever switch made the update). ``forward`` is the
    trainer's ``PolicyForward``."""
    total = tokens = 0.0
    for batch in pack_samples(samples, micro_batch_tokens):
        _, entropy, mask = forward(batch)
        total += float((entropy * mask).sum())
        tokens += float(mask.sum())
    return total / max(tokens, 1.0)


def snapshot(engine: OptimizerEngine) -> Saved:
    """The weights and optimizer state an update changes (one process)."""
    # state_dict() holds references to the live optimizer state: copy it.
    return engine.full_state_dict(), copy.deepcopy(engine.state_dict())


def restore(engine: OptimizerEngine, saved: Saved) -> None:
    weights, optimizer = saved
    engine.model.load_state_dict(weights)  # in place: the sampler's views stay bound
    engine.load_state_dict(optimizer)


def cuda_devices(device: torch.device) -> list[int]:
    """The devices whose random state ``torch.random.fork_rng`` must keep."""
    return [device.index or 0] if device.type == "cuda" else []


class SwitchProbe:
    """The trainer's ``learn`` (groups -> samples, their statistics, the updates) with the probe
    around it: the update made with ``switch`` flipped, from the same weights, optimizer state
    and groups, then undone; then the run's own update. Returns what ``learn`` does, with the
    ``probe/*`` readings among the statistics."""

    def __init__(self, prepare: Prepare, updater, algo: AlgoConfig, switch: str, micro_tokens: int):
        self.prepare, self.updater, self.algo, self.switch = prepare, updater, algo, switch
        self.micro_tokens = micro_tokens

    def __call__(
        self, groups: list[Group]
    ) -> tuple[list[Sample], dict[str, float], list[UpdateResult]]:
        samples, stats = self.prepare(groups, None)
        engine, other = self.updater.engine, flipped(self.algo, self.switch)
        t0 = time.perf_counter()
        before, saved = self._entropy(samples), snapshot(engine)
        # The flipped update draws no random numbers today; forking keeps it so if one ever does.
        device = next(engine.model.parameters()).device
        with torch.random.fork_rng(devices=cuda_devices(device)):
            self.updater.updates(self.prepare(groups, other)[0], algorithm(other))
            after_flipped = self._entropy(samples)
        restore(engine, saved)
        t_real = time.perf_counter()
        updates = self.updater.updates(samples)
        real = time.perf_counter() - t_real
        on = bool(getattr(self.algo, self.switch))
        readings = probe_metrics(on, before, self._entropy(samples), after_flipped)
        # What the probe added to the step's time (perf/train_time_s includes it)
        readings[metric.PROBE_TIME] = time.perf_counter() - t0 - real
        return samples, stats | readings, updates

    def _entropy(self, samples: list[Sample]) -> float:
        return mean_entropy(self.updater.forward, samples, self.micro_tokens)
