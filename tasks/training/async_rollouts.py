"""Rollouts that overlap training: a rollout process samples the next batches while the trainer
updates (``train.rollout_ranks: 1``, ``rollout.max_staleness: s``).

Batch k is always sampled by the policy after max(k - s, start) steps: a fixed lag, not "whatever
weights are newest", so a run does not depend on which process was faster, and s = 0 is the
synchronous step bit for bit (the rollout process seeds each batch as the trainer does). With
s >= 1, while the trainer updates on batch k the rollout process samples batch k + 1 (one-step-off,
verl's pipeline) up to k + s.

Weights travel through s + 1 shared-memory slots (``torch.multiprocessing``): after step t the
trainer writes version t + 1 into slot (t + 1) mod (s + 1) and asks for batch t + 1 + s. That slot
last held version t - s, which only batch t (now trained on) needed, so nothing waits for the
rollout process to finish reading it. Batches come back through a queue, as bytes
(``rollout_wire.packed``), with the rollout side's state after each one (the problem stream and
the groups carried by dynamic sampling), so that a checkpoint holds the batches still in flight
and the state after them: a resumed run continues exactly as the uninterrupted one.

The rollout process is ``rollout_process.serve``: it loads the policy the trainer loaded, with the
same drop-in kernels (``tasks.training.kernels``), and builds the same sampler. It ends on a stop
message, when the trainer's process is gone, or on Ctrl-C (quietly: the trainer reports).

Under a launcher (torchrun, deepspeed: several ranks, on one machine or many) the rollout side is
the world's last ``train.rollout_ranks`` ranks instead (``rollout_process.serve_rollout_rank``),
and the others train (DeepSpeed over their own group, ``distributed.Layout``): requests and
batches travel as torch.distributed point-to-point messages (gloo on CPU, NCCL on GPU), the weights
after each update are broadcast from training rank 0's s + 1 send buffers without waiting for
the rollout ranks to receive them (``_RankLink``). The rollout ranks sample each batch together,
each its share of the prompts, as training ranks do in a synchronous step. The protocol is the
same for both links, so a run is the same run on either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import queue
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dapo_core.errors import PipelineError
from tasks.runtime import env_world_size
from tasks.training.distributed import layout
from tasks.training.rollout_process import RolloutSpec, serve
from tasks.training.rollout_wire import (
    CLOSE_S,
    POLL_S,
    Batch,
    broadcast,
    isend_object,
    recv_object,
    unpacked,
    wait_for,
)


def version_for(index: int, staleness: int, start: int) -> int:
    """The policy version that samples batch ``index``: ``staleness`` updates behind it, never
    before the version the rollout process started from."""
    return max(index - staleness, start)


class AsyncRollouts:
    """The trainer's side: ``collect(policy, step)`` returns batch ``step`` (waiting for it if
    the rollout side is behind), ``publish(policy, version)`` sends the weights after a step.
    ``state_dict`` / ``load_state_dict`` hold the in-flight batches (exact resume)."""

    def __init__(self, spec: RolloutSpec, state: dict):
        self.spec, self.cfg = spec, spec.cfg
        self.s = spec.cfg.rollout.max_staleness
        self.state = state  # the rollout side's state before the first batch not yet received
        self.ready: dict[int, Batch] = {}  # received (or restored), not yet trained on
        self.requested = 0  # batches below this one were asked for (or restored)
        self.consumed = 0  # batches below this one were trained on
        self.start = 0  # the first version the rollout side samples from
        self.link: _LocalLink | _RankLink | None = None

    # -- the trainer's calls ---------------------------------------------------------------------

    def collect(self, policy, step: int) -> tuple[Batch, float]:
        """Batch ``step`` and the seconds the trainer waited for it."""
        if self.link is None:
            self._launch(policy, step)
        t0 = time.perf_counter()
        while step not in self.ready:
            self._receive()
        batch = self.ready.pop(step)
        self.consumed = step + 1
        return batch, time.perf_counter() - t0

    def publish(self, policy, version: int) -> None:
        """The weights after ``version`` steps sent, and the batch that waits for them asked
        for (none past ``train.steps``)."""
        if self.link is None:
            return
        self.link.write(policy, version)
        self._request_through(version + self.s)

    def state_dict(self) -> dict:
        """The rollout side's state after the last batch received, and every batch received but
        not trained on; waits for the ones asked for (they were sampled from versions that no
        checkpoint keeps)."""
        if self.link is not None:
            while any(i not in self.ready for i in range(self.consumed, self.requested)):
                self._receive()
        return {**self.state, "in_flight": sorted(self.ready.values(), key=lambda b: b.index)}

    def load_state_dict(self, state: dict) -> None:
        self.state = {"stream": state["stream"], "buffer": state["buffer"]}
        self.ready = {b.index: b for b in state.get("in_flight", [])}

    def close(self) -> None:
        """Stop the rollout side (within seconds; a rollout process that does not answer is
        killed)."""
        link, self.link = self.link, None
        if link is not None:
            link.close()

    # -- the rollout side ----------------------------------------------------------------------

    def _launch(self, policy, step: int) -> None:
        """Start the rollout side at training step ``step``: restored batches are trained on
        first; new ones are sampled from this step's weights onwards."""
        self.start = self.consumed = step
        self.requested = max([b.index + 1 for b in self.ready.values()], default=step)
        ranked = env_world_size() > 1  # under a launcher: the world's last ranks sample
        self.link = (_RankLink if ranked else _LocalLink)(self.spec, policy, self.s + 1)
        self.link.send(("state", self.state))
        self.link.write(policy, step)
        self._request_through(step + self.s)

    def _request_through(self, last: int) -> None:
        for index in range(self.requested, min(last, self.cfg.train.steps - 1) + 1):
            version = version_for(index, self.s, self.start)
            self.link.send(("batch", index, version))
            self.requested = index + 1

    def _receive(self) -> None:
        """One batch from the rollout side; its error as this process's."""
        msg = self.link.receive()
        if msg[0] == "error":
            self.close()
            raise msg[1] if isinstance(msg[1], Exception) else PipelineError(msg[1])
        batch = unpacked(msg[1])
        self.ready[batch.index] = batch
        self.state = batch.state


class _LocalLink:
    """The trainer's end of a rollout process on this machine: weights through ``n`` slots in
    shared memory, messages through queues."""

    def __init__(self, spec: RolloutSpec, policy, n: int):
        ctx = mp.get_context("spawn")
        self.slots = _slots(policy, n)
        self.requests, self.results = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(
            target=serve,
            args=(spec, self.slots, self.requests, self.results),
            name="dapo-rollout",
            daemon=True,
        )
        try:
            self.proc.start()
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise PipelineError(
                f"the rollout process cannot be given its reward function or config ({e}): "
                "pass a module-level function, or set train.rollout_ranks=0"
            ) from None

    def send(self, msg: tuple) -> None:
        self.requests.put(msg)

    def write(self, policy, version: int) -> None:
        slot = self.slots[version % len(self.slots)]
        with torch.no_grad():
            for name, t in policy.state_dict().items():
                slot["weights"][name].copy_(t)
        slot["version"].fill_(version)

    def receive(self) -> tuple:
        while True:
            try:
                return self.results.get(timeout=POLL_S)
            except queue.Empty:
                if not self.proc.is_alive():
                    raise PipelineError(
                        f"the rollout process ended (exit code {self.proc.exitcode}) without "
                        "sending its batch: see its message above, or set train.rollout_ranks=0"
                    ) from None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.requests.put(("stop",))
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)


class _RankLink:
    """A training rank's end of the rollout ranks (the world's last ``train.rollout_ranks``)
    under a launcher: messages by torch.distributed point-to-point sends, weights by broadcast.

    Training rank 0 speaks for the training ranks: it sends the requests to every rollout rank,
    and after each step copies its weights into one of ``n`` send buffers and broadcasts them to
    the rollout ranks without waiting (it goes on updating). A buffer is reused only once its
    broadcast completed, which the rollout ranks' receiving the version s + 1 steps older
    guarantees soon after. The first rollout rank sends each batch to every training rank, which
    all train on it (each on its shard, as in a synchronous step)."""

    def __init__(self, spec: RolloutSpec, policy, n: int):
        split = layout()
        self.device, self.leader = spec.device, dist.get_rank() == 0
        self.source = split.trainers  # the first rollout rank: it sends the batches
        self.samplers = list(range(split.trainers, dist.get_world_size()))
        self.group = split.weights
        self.buffers, self.sending = [], [[] for _ in range(n)]  # each buffer's sends in flight
        if self.leader:
            self.buffers = [
                {k: v.detach().clone() for k, v in policy.state_dict().items()} for _ in range(n)
            ]
        self.messages: list = []  # object sends in flight, with the tensors they read
        spec = dataclasses.replace(spec, is_correct=_checked_reward(spec.is_correct))
        self.send(("spec", spec))

    def send(self, msg: tuple) -> None:
        if self.leader:
            self.messages += isend_object(msg, self.samplers, self.device)

    def write(self, policy, version: int) -> None:
        if not self.leader:
            return
        # The rollout ranks read messages in order, and have read every one sent before the
        # request of the batch just trained on (they sampled it): these waits end at once.
        wait_for([work for work, _ in self.messages])
        self.messages = []
        i = version % len(self.buffers)
        wait_for(self.sending[i])
        with torch.no_grad():
            for name, t in policy.state_dict().items():
                self.buffers[i][name].copy_(t)
        self.send(("weights", version))
        self.sending[i] = [broadcast(t, self.group) for t in self.buffers[i].values()]

    def receive(self) -> tuple:
        return recv_object(self.source, self.device)

    def close(self) -> None:
        """Tell the rollout ranks to stop, and wait until they have the message: a send not yet
        received when this process moves on is lost. Where they are gone already (Ctrl-C, an
        error) the wait fails at once, and the launcher ends what is left."""
        with contextlib.suppress(Exception):
            self.send(("stop",))
            wait_for([work for work, _ in self.messages], deadline_s=CLOSE_S)


def _checked_reward(is_correct: Any) -> Any:
    """A custom reward goes to the rollout rank pickled, by reference: it must be importable
    there (a module-level function of an installed module)."""
    try:
        pickle.dumps(is_correct)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise PipelineError(
            f"the rollout rank cannot be given its reward function ({e}): pass a module-level "
            "function, or set train.rollout_ranks=0"
        ) from None
    return is_correct


def _slots(policy, n: int) -> list[dict]:
    """``n`` weight slots in shared memory; a one-line error when the host has too little."""
    try:
        return [_shared_copy(policy) for _ in range(n)]
    except RuntimeError as e:
        size = sum(t.numel() * t.element_size() for t in policy.state_dict().values())
        raise PipelineError(
            f"the rollout process's {n} weight slots need {n * size / 2**20:.0f} MiB of shared "
            f"memory (/dev/shm) and could not get it ({str(e).splitlines()[0]}): enlarge it "
            "(docker run --shm-size), lower rollout.max_staleness, or set train.rollout_ranks=0"
        ) from None


def _shared_copy(policy) -> dict:
    """A slot: the policy's state on the host in shared memory, and the version it holds."""
    weights = {
        k: v.detach().to("cpu", copy=True).share_memory_() for k, v in policy.state_dict().items()
    }
    return {"weights": weights, "version": torch.full((), -1, dtype=torch.long).share_memory_()}
