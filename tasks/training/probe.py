"""What one ``algo`` switch does to an update, all else equal (``tracking.switch_probe``).

Compared across runs, a switch's effect on a quantity such as the policy's entropy is mixed with
each run's own trajectory: after a few steps two runs sample different responses, and their
difference is mostly that. DAPO's clip-higher (section 3.1) moves entropy by acting on the few
tokens whose ratio reaches the clip, an effect far smaller than that noise on short runs.

A probe measures the effect directly. At every step the update is made twice from the same
weights, optimizer state and groups: once with the switch flipped, which is then undone, and once
as the run has it. The policy's token entropy over all of the step's responses is read before and
after each. The run's trajectory is the same with or without a probe (a test checks it); the
probe doubles the cost of the update. Logged per step:

- ``probe/entropy_before``: before the update;
- ``probe/entropy_on`` and ``probe/entropy_off``: after the update with the switch on, and off;
- ``probe/entropy_delta``: on minus off, the switch's effect on entropy in one step (paired:
  same state, same batch, same order of mini-batches).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING

import torch

from dapo_core.errors import PipelineError
from tasks.training.batches import Group, Sample, distinct_prompts, micro_batches

if TYPE_CHECKING:
    from tasks.training.trainer import DAPOTrainer


class SwitchProbe:
    """The flipped update beside the real one, for one switch of ``cfg.algo``."""

    def __init__(self, trainer: DAPOTrainer, switch: str):
        if trainer.world > 1:
            raise PipelineError(
                "tracking.switch_probe runs on one process (it undoes an update, which ZeRO "
                "shards across ranks): set tracking.switch_probe=null, or train on one GPU"
            )
        self.trainer, self.switch = trainer, switch
        self.on = bool(getattr(trainer.cfg.algo, switch))
        self.flipped = dataclasses.replace(trainer.cfg.algo, **{switch: not self.on})

    def updates(
        self, groups: list[Group], samples: list[Sample]
    ) -> tuple[list[dict[str, float]], dict[str, float]]:
        """The step's updates (as ``DAPOTrainer._updates`` makes them) and the probe's metrics."""
        t = self.trainer
        before = mean_entropy(t, samples)
        saved = _snapshot(t)
        # The flipped update draws no random numbers today; forking keeps it so if one ever does.
        with torch.random.fork_rng(devices=_cuda_devices(t.device)):
            flipped, _ = t._samples(groups, self.flipped)
            t._updates(flipped, self.flipped.loss_config())
            after_flipped = mean_entropy(t, samples)
        _restore(t, saved)
        updates = t._updates(samples)
        after = mean_entropy(t, samples)
        on, off = (after, after_flipped) if self.on else (after_flipped, after)
        return updates, {
            "probe/entropy_before": before,
            "probe/entropy_on": on,
            "probe/entropy_off": off,
            "probe/entropy_delta": on - off,
        }


@torch.no_grad()
def mean_entropy(trainer: DAPOTrainer, samples: list[Sample]) -> float:
    """The policy's token-mean entropy over every response in ``samples``, whether or not it
    carries loss (the same tokens whichever switch made the update)."""
    _, keys = distinct_prompts(samples)
    batches = micro_batches(
        keys,
        [s.prompt_len for s in samples],
        [len(s.input_ids) - s.prompt_len for s in samples],
        trainer.cfg.train.micro_batch_tokens,
    )
    total = tokens = 0.0
    for idx in batches:
        _, entropy, mask = trainer.forward([samples[i] for i in idx])
        total += float((entropy * mask).sum())
        tokens += float(mask.sum())
    return total / max(tokens, 1.0)


def _snapshot(trainer: DAPOTrainer) -> tuple[dict[str, torch.Tensor], dict]:
    engine = trainer.engine
    # state_dict() holds references to the live optimizer state: copy it.
    return engine.full_state_dict(), copy.deepcopy(engine.state_dict())


def _restore(trainer: DAPOTrainer, saved: tuple[dict[str, torch.Tensor], dict]) -> None:
    weights, optimizer = saved
    trainer.model.load_state_dict(weights)  # in place: the sampler's views stay bound
    trainer.engine.load_state_dict(optimizer)


def _cuda_devices(device: torch.device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []
