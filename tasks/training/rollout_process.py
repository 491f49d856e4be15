"""The rollout side of asynchronous rollouts (``tasks.training.async_rollouts``): a process that
loads the policy the trainer loaded, with the same drop-in kernels (``tasks.training.kernels``),
builds the same sampler, and samples each batch it is asked for from the weights version it is
told, seeded as the trainer's step would be.

On one machine it is ``serve``, started by the trainer, with the weights in shared-memory slots;
it ends on a stop message, when the trainer's process is gone, or on Ctrl-C (quietly: the trainer
reports). Under a launcher it is ``serve_rollout_rank`` on each of the world's last
``train.rollout_ranks`` ranks, with the weights broadcast to it.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import queue
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dapo_core.config import Config
from dapo_core.errors import PipelineError
from dapo_core.problem import Problem
from tasks.models.loading import load_policy
from tasks.rollout.factory import make_generator
from tasks.runtime import configure_torch, seed_everything
from tasks.training.distributed import layout
from tasks.training.kernels import install_rms_norm, use_cpu_sdpa
from tasks.training.rollout_wire import (
    CLOSE_S,
    POLL_S,
    Batch,
    broadcast,
    isend_object,
    packed,
    recv_object,
    wait_for,
)
from tasks.training.rollouts import make_collector


@dataclass
class RolloutSpec:
    """What the rollout process needs to build the trainer's sampler (all picklable)."""

    cfg: Config
    model_path: str
    dtype: str  # the trainer's weights dtype (``weights_dtype``)
    device: str
    problems: list[Problem]
    is_correct: Any = None  # a picklable (response, answer) -> bool; None: the rule-based reward


def serve(spec: RolloutSpec, slots: list[dict], requests, results) -> None:
    """The rollout process: build the sampler, then answer requests until told to stop or the
    trainer's process is gone. An error goes to the trainer, which raises it."""
    try:
        sampler = Sampler(spec, functools.partial(_slot_weights, slots))
        while _serving(sampler, requests, results):
            pass
    except KeyboardInterrupt:
        pass  # Ctrl-C reaches the whole process group: the trainer reports it
    except Exception as e:  # noqa: BLE001 - handed to the trainer, which raises it
        try:
            results.put(("error", e))
        except Exception:  # noqa: BLE001 - an unpicklable error: its text
            results.put(("error", f"rollout process: {traceback.format_exc(limit=3)}"))
        if mp.parent_process().is_alive():
            return  # the error is flushed to the trainer before this process ends
    results.cancel_join_thread()  # batches nobody will read: do not wait to flush them


def _serving(sampler: Sampler, requests, results) -> bool:
    """Answer one request; False when it is time to stop."""
    try:
        msg = requests.get(timeout=POLL_S)
    except queue.Empty:
        return mp.parent_process().is_alive()  # the trainer died without stopping us
    except (EOFError, OSError):
        return False  # the trainer's end of the queue is gone
    if msg[0] == "stop":
        return False
    if msg[0] == "state":
        sampler.collector.load_state_dict(msg[1])
    else:
        results.put(("batch", packed(sampler.batch(*msg[1:]))))
    return True


def _slot_weights(slots: list[dict], version: int) -> dict[str, torch.Tensor]:
    slot = slots[version % len(slots)]
    if int(slot["version"]) != version:  # the trainer writes a slot before asking for it
        raise PipelineError(
            f"rollout process: slot holds version {int(slot['version'])}, not {version}"
        )
    return slot["weights"]


def serve_rollout_rank(device: str) -> None:
    """A rollout rank under a launcher (one of the world's last ``train.rollout_ranks``): build
    the sampler training rank 0 describes, then answer its messages until it says stop. The
    rollout ranks sample each batch together, each its share of the prompts (gathered among
    them, as training ranks do in a synchronous step); the first sends it to every training
    rank. An error goes to the training ranks, which raise it; if they are gone, the receive
    fails and this rank ends."""
    split, leader = layout(), 0
    index_here = dist.get_rank() - split.trainers  # among the rollout ranks
    trainers = list(range(split.trainers)) if index_here == 0 else []  # whom this rank sends to
    kind, spec = recv_object(leader, device)
    assert kind == "spec", kind
    versions: dict[int, dict[str, torch.Tensor]] = {}
    sending: dict[int, list] = {}  # each batch's sends in flight, with the tensors they read
    s = spec.cfg.rollout.max_staleness
    try:
        sampler = Sampler(spec, versions.__getitem__, index_here, dist.get_world_size(split.peers))
        while True:
            msg = recv_object(leader, device)
            if msg[0] == "stop":
                break
            if msg[0] == "state":
                sampler.collector.load_state_dict(msg[1])
            elif msg[0] == "weights":
                versions[msg[1]] = _recv_weights(sampler.model, split.weights)
            else:
                _, index, version = msg
                batch = packed(sampler.batch(index, version))
                for older in [v for v in versions if v < version]:  # no later batch needs it
                    del versions[older]
                # batch index asked for after the training ranks trained on batch index - s - 1:
                # they have every batch up to that one, so those sends are done (the waits end
                # at once)
                done = [k for k in sending if k <= index - s - 1]
                wait_for([work for k in done for work, _ in sending.pop(k)])
                sending[index] = isend_object(("batch", batch), trainers, device)
    except Exception as e:  # noqa: BLE001 - handed to the training ranks, which raise it
        # (Ctrl-C is not caught: it reaches every rank, and each ends by it)
        with contextlib.suppress(Exception):
            error = isend_object(("error", _picklable(e)), trainers, device)
            wait_for([w for w, _ in error], CLOSE_S)
        raise
    wait_for([work for sends in sending.values() for work, _ in sends])


def _recv_weights(model, group) -> dict[str, torch.Tensor]:
    """One version of the weights, received in the order the trainer sends its state dict."""
    weights = {k: torch.empty_like(v) for k, v in model.state_dict().items()}
    wait_for([broadcast(t, group) for t in weights.values()])
    return weights


def _picklable(error: Exception) -> Exception | str:
    try:
        pickle.dumps(error)
        return error
    except Exception:  # noqa: BLE001 - its text instead
        return f"rollout rank: {traceback.format_exc(limit=3)}"


class Sampler:
    """The rollout side's policy copy, sampler and rollout state; ``weights(version)`` gives
    the policy's weights after that many steps."""

    def __init__(self, spec: RolloutSpec, weights: Any, rank: int = 0, world: int = 1):
        cfg = spec.cfg
        configure_torch(cfg.train.cpu_threads)
        self.cfg, self.weights, self.loaded = cfg, weights, None
        self.model, tokenizer = load_policy(spec.model_path, spec.dtype, spec.device)
        install_rms_norm(self.model)  # the trainer's sampler runs these drop-ins too
        use_cpu_sdpa(self.model)
        generator = make_generator(cfg, self.model, tokenizer, spec.model_path)
        device = torch.device(spec.device)
        self.collector = make_collector(  # rank, world: among the rollout ranks
            cfg, tokenizer, generator, spec.problems, device, spec.is_correct, rank, world
        )

    def batch(self, index: int, version: int) -> Batch:
        if version != self.loaded:
            self._load(version)
        seed_everything(self.cfg.train.seed * 1_000_003 + index)  # as the trainer's step does
        self.collector.version = version
        groups, stats, log = self.collector.collect(self.model, index)
        return Batch(index, version, groups, stats, log, self.collector.state_dict())

    def _load(self, version: int) -> None:
        weights = self.weights(version)
        with torch.no_grad():
            for name, t in self.model.state_dict().items():
                t.copy_(weights[name])
        self.loaded = version
