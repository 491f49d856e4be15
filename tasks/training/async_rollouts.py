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
rollout process to finish reading it. Batches come back through a queue, as bytes (``_packed``),
with the rollout side's state after each one (the problem stream and the groups carried by
dynamic sampling), so that a checkpoint holds the batches still in flight and the state after
them: a resumed run continues exactly as the uninterrupted one.

The rollout process is this module's ``_serve``: it loads the policy the trainer loaded, with the
same drop-in kernels (``tasks.training.kernels``), and builds the same sampler. It ends on a stop
message, when the trainer's process is gone, or on Ctrl-C (quietly: the trainer reports).

Under a launcher (torchrun, deepspeed: several ranks, on one machine or many) the rollout side is
the world's last ``train.rollout_ranks`` ranks instead (:func:`serve_rollout_rank`), and the
others train (DeepSpeed over their own group, ``distributed.Layout``): requests and batches
travel as torch.distributed point-to-point messages (gloo on CPU, NCCL on GPU), the weights
after each update are broadcast from training rank 0's s + 1 send buffers without waiting for
the rollout ranks to receive them (``_RankLink``). The rollout ranks sample each batch together,
each its share of the prompts, as training ranks do in a synchronous step. The protocol is the
same for both links, so a run is the same run on either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import pickle
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dapo_core.config import Config
from dapo_core.errors import PipelineError
from dapo_core.problem import Problem
from dapo_core.sampling import BatchStats
from tasks.models.loading import load_policy
from tasks.rollout.factory import make_generator
from tasks.runtime import configure_torch, env_world_size, seed_everything
from tasks.training.batches import Group
from tasks.training.distributed import layout
from tasks.training.kernels import install_rms_norm, use_cpu_sdpa
from tasks.training.records import RolloutLog
from tasks.training.rollouts import make_collector

POLL_S = 0.5  # how often a waiting side checks that the other is still alive
CLOSE_S = 5.0  # how long a stopping side waits for the other to take its last message


@dataclass
class RolloutSpec:
    """What the rollout process needs to build the trainer's sampler (all picklable)."""

    cfg: Config
    model_path: str
    dtype: str  # the trainer's weights dtype (``weights_dtype``)
    device: str
    problems: list[Problem]
    is_correct: Any = None  # a picklable (response, answer) -> bool; None: the rule-based reward


@dataclass
class Batch:
    """One batch as the rollout process sampled it, and its state after it."""

    index: int  # the training step it is for
    version: int  # the policy version that sampled it: the weights after that many steps
    groups: list[Group]
    stats: BatchStats
    log: RolloutLog
    state: dict  # the rollout side's state after this batch (stream, carried groups)


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
        batch = _unpacked(msg[1])
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
            target=_serve,
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
            self.messages += _isend_object(msg, self.samplers, self.device)

    def write(self, policy, version: int) -> None:
        if not self.leader:
            return
        # The rollout ranks read messages in order, and have read every one sent before the
        # request of the batch just trained on (they sampled it): these waits end at once.
        _wait([work for work, _ in self.messages])
        self.messages = []
        i = version % len(self.buffers)
        _wait(self.sending[i])
        with torch.no_grad():
            for name, t in policy.state_dict().items():
                self.buffers[i][name].copy_(t)
        self.send(("weights", version))
        self.sending[i] = [_broadcast(t, self.group) for t in self.buffers[i].values()]

    def receive(self) -> tuple:
        return _recv_object(self.source, self.device)

    def close(self) -> None:
        """Tell the rollout ranks to stop, and wait until they have the message: a send not yet
        received when this process moves on is lost. Where they are gone already (Ctrl-C, an
        error) the wait fails at once, and the launcher ends what is left."""
        with contextlib.suppress(Exception):
            self.send(("stop",))
            _wait([work for work, _ in self.messages], deadline_s=CLOSE_S)


def _broadcast(t: torch.Tensor, group) -> Any:
    """``t`` from rank 0 to the rest of ``group``, without waiting (rank 0 is the group's first)."""
    return dist.broadcast(t, src=0, group=group, async_op=True)


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


def _isend_object(obj: Any, peers: list[int], device: str) -> list:
    """``obj`` pickled once and sent to each of ``peers`` as its length then its bytes; the
    sends and the tensors they read (kept alive until the sends complete)."""
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    return [(dist.isend(t, peer), t) for peer in peers for t in (size, data)]


def _recv_object(peer: int, device: str) -> Any:
    size = torch.empty(1, dtype=torch.int64, device=device)
    _wait([dist.irecv(size, peer)])
    data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _wait([dist.irecv(data, peer)])
    return pickle.loads(data.cpu().numpy().tobytes())


def _wait(works: list, deadline_s: float | None = None) -> bool:
    """Wait for point-to-point operations in a helper thread: waited for in this (the main)
    thread, a silent peer would hold off Ctrl-C and SIGTERM for as long as it is silent (Python
    runs signal handlers between bytecodes; gloo's ``is_completed`` is only true after a wait).
    False when ``deadline_s`` passed first; a failed operation's error (the peer gone) raised."""
    done, errors = threading.Event(), []

    def wait_all() -> None:
        try:
            for w in works:
                w.wait()
        except Exception as e:  # noqa: BLE001 - raised in the caller's thread
            errors.append(e)
        finally:
            done.set()

    threading.Thread(target=wait_all, name="dapo-p2p-wait", daemon=True).start()
    t0 = time.monotonic()
    while not done.wait(POLL_S):  # a signal interrupts this wait
        if deadline_s is not None and time.monotonic() - t0 > deadline_s:
            return False
    if errors:
        raise errors[0]
    return True


def _packed(batch: Batch) -> bytes:
    """A batch as bytes, its groups' log-probs as numpy arrays. Hundreds of small tensors cost
    ~0.1 ms each to pickle (and a queue would give each a shared-memory segment of its own):
    longer than sampling the embedded model's batch. The rollout side's own groups (the carried
    ones are in its state) are left as they are."""
    return pickle.dumps(_converted(batch, lambda t: t.numpy()))


def _unpacked(data: bytes) -> Batch:
    return _converted(pickle.loads(data), torch.from_numpy)


def _converted(batch: Batch, convert) -> Batch:
    """The batch with every group's log-probs converted (groups copied, not changed)."""

    def group(g: Group) -> Group:
        lps = None if g.logprobs is None else [convert(t) for t in g.logprobs]
        return dataclasses.replace(g, logprobs=lps)

    buffer = batch.state["buffer"]
    carried = [(born, group(g)) for born, g in buffer["groups"]]
    state = {**batch.state, "buffer": {**buffer, "groups": carried}}
    return dataclasses.replace(batch, groups=[group(g) for g in batch.groups], state=state)


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


def _serve(spec: RolloutSpec, slots: list[dict], requests, results) -> None:
    """The rollout process: build the sampler, then answer requests until told to stop or the
    trainer's process is gone. An error goes to the trainer, which raises it."""
    try:
        sampler = _Sampler(spec, functools.partial(_slot_weights, slots))
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


def _serving(sampler: _Sampler, requests, results) -> bool:
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
        results.put(("batch", _packed(sampler.batch(*msg[1:]))))
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
    kind, spec = _recv_object(leader, device)
    assert kind == "spec", kind
    versions: dict[int, dict[str, torch.Tensor]] = {}
    sending: dict[int, list] = {}  # each batch's sends in flight, with the tensors they read
    s = spec.cfg.rollout.max_staleness
    try:
        sampler = _Sampler(spec, versions.__getitem__, index_here, dist.get_world_size(split.peers))
        while True:
            msg = _recv_object(leader, device)
            if msg[0] == "stop":
                break
            if msg[0] == "state":
                sampler.collector.load_state_dict(msg[1])
            elif msg[0] == "weights":
                versions[msg[1]] = _recv_weights(sampler.model, split.weights)
            else:
                _, index, version = msg
                batch = _packed(sampler.batch(index, version))
                for older in [v for v in versions if v < version]:  # no later batch needs it
                    del versions[older]
                # batch index asked for after the training ranks trained on batch index - s - 1:
                # they have every batch up to that one, so those sends are done (the waits end
                # at once)
                done = [k for k in sending if k <= index - s - 1]
                _wait([work for k in done for work, _ in sending.pop(k)])
                sending[index] = _isend_object(("batch", batch), trainers, device)
    except Exception as e:  # noqa: BLE001 - handed to the training ranks, which raise it
        # (Ctrl-C is not caught: it reaches every rank, and each ends by it)
        with contextlib.suppress(Exception):
            error = _isend_object(("error", _picklable(e)), trainers, device)
            _wait([w for w, _ in error], CLOSE_S)
        raise
    _wait([work for sends in sending.values() for work, _ in sends])


def _recv_weights(model, group) -> dict[str, torch.Tensor]:
    """One version of the weights, received in the order the trainer sends its state dict."""
    weights = {k: torch.empty_like(v) for k, v in model.state_dict().items()}
    _wait([_broadcast(t, group) for t in weights.values()])
    return weights


def _picklable(error: Exception) -> Exception | str:
    try:
        pickle.dumps(error)
        return error
    except Exception:  # noqa: BLE001 - its text instead
        return f"rollout rank: {traceback.format_exc(limit=3)}"


class _Sampler:
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
