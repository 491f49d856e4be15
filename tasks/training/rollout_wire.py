"""What travels between the trainer and its rollout side (``tasks.training.async_rollouts``):
sampled batches as bytes, and torch.distributed point-to-point messages and broadcasts whose
waits do not hold off Ctrl-C.
"""

from __future__ import annotations

import dataclasses
import pickle
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dapo_core.sampling import BatchStats
from tasks.training.batches import Group
from tasks.training.records import RolloutLog

POLL_S = 0.5  # how often a waiting side checks that the other is still alive
CLOSE_S = 5.0  # how long a stopping side waits for the other to take its last message


@dataclass
class Batch:
    """One batch as the rollout process sampled it, and its state after it."""

    index: int  # the training step it is for
    version: int  # the policy version that sampled it: the weights after that many steps
    groups: list[Group]
    stats: BatchStats
    log: RolloutLog
    state: dict  # the rollout side's state after this batch (stream, carried groups)


def broadcast(t: torch.Tensor, group) -> Any:
    """``t`` from rank 0 to the rest of ``group``, without waiting (rank 0 is the group's first)."""
    return dist.broadcast(t, src=0, group=group, async_op=True)


def isend_object(obj: Any, peers: list[int], device: str) -> list:
    """``obj`` pickled once and sent to each of ``peers`` as its length then its bytes; the
    sends and the tensors they read (kept alive until the sends complete)."""
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    return [(dist.isend(t, peer), t) for peer in peers for t in (size, data)]


def recv_object(peer: int, device: str) -> Any:
    size = torch.empty(1, dtype=torch.int64, device=device)
    wait_for([dist.irecv(size, peer)])
    data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    wait_for([dist.irecv(data, peer)])
    return pickle.loads(data.cpu().numpy().tobytes())


def wait_for(works: list, deadline_s: float | None = None) -> bool:
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


def packed(batch: Batch) -> bytes:
    """A batch as bytes, its groups' log-probs as numpy arrays. Hundreds of small tensors cost
    ~0.1 ms each to pickle (and a queue would give each a shared-memory segment of its own):
    longer than sampling the embedded model's batch. The rollout side's own groups (the carried
    ones are in its state) are left as they are."""
    return pickle.dumps(_converted(batch, lambda t: t.numpy()))


def unpacked(data: bytes) -> Batch:
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
