"""Data parallelism: one optimizer interface over plain torch (1 process) and DeepSpeed ZeRO.

How a step is split across R ranks (launched by the ``deepspeed`` launcher or torchrun):

- rollouts: every rank draws the same prompts, generates its slice (``prompts[rank::R]``), and the
  scored groups are all-gathered, so every rank holds the same global batch and takes the same
  dynamic-sampling decisions and loss normalizer with no further communication;
- updates: each rank computes the loss of its shard of the mini-batch (divided by the global
  normalizer) and DeepSpeed all-reduces the gradients. DeepSpeed averages over ranks, so the shard
  loss is scaled by R: the update then equals the single-process update of the whole mini-batch.
- ZeRO-3 gathers parameters at every forward, so every rank must run the same number of
  micro-batches: counts are padded to the maximum over ranks with empty micro-batches; and since
  the trainer calls submodules rather than the engine, it calls ``before_forward`` itself.

With ``train.rollout_ranks: k`` the world's last k ranks sample instead (``async_rollouts``): the
world is split (:class:`Layout`), every collective here runs in this rank's side of it, and
DeepSpeed is handed the training ranks' group as its data-parallel group.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dapo_core.errors import PipelineError
from tasks.runtime import env_world_size
from tasks.training.precision import MasterWeights


@dataclass
class Layout:
    """A launcher's world split into ranks 0..trainers-1, which train, and the rest, which sample
    rollouts for them (``train.rollout_ranks``). Every collective of training runs in this
    rank's side of the split, never in the whole world."""

    trainers: int
    peers: Any  # this rank's side: the training ranks' group, or the rollout ranks'
    weights: Any  # rank 0 and the rollout ranks: rank 0 broadcasts the weights in it
    alone: Any  # this rank by itself: DeepSpeed's model-parallel group (no model parallelism)


_layouts: dict[int, Layout] = {}  # by number of training ranks; built once, by every rank
_layout: Layout | None = None  # the one in use; None: every rank trains


def init_distributed(device: str, rollout_ranks: int = 0) -> tuple[int, int]:
    """(rank, number of ranks) on this rank's side; initialises the process group when
    launched with several ranks. Under a launcher the world's last ``rollout_ranks`` ranks
    sample rollouts (``rollout_process.serve_rollout_rank``): a training rank gets (its rank,
    the number of training ranks), a rollout rank (its index among the rollout ranks, their
    number)."""
    global _layout
    if env_world_size() > 1 and device == "cpu":
        _skip_shared_memory_op()  # before DeepSpeed's backend starts, here or in initialize()
    if env_world_size() > 1 and not dist.is_initialized():
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    rank, world = dist.get_rank(), dist.get_world_size()
    trainers = world - rollout_ranks
    _layout = _split(trainers, world) if rollout_ranks else None
    return (rank, trainers) if rank < trainers else (rank - trainers, rollout_ranks)


def _skip_shared_memory_op() -> None:
    """Keep DeepSpeed from compiling its shared-memory all-reduce. Its communication backend
    builds that C++ extension on first use with the system's compiler (a minute or more on 2
    cores, into ~/.cache/torch_extensions, again whenever another virtualenv built it last, with
    concurrent launches queueing on one lock) for ``inference_all_reduce`` alone, which training
    never calls: gradients and our collectives go through torch.distributed. Marked unavailable in
    DeepSpeed's own table of compatible ops, the backend skips it: no compiler needed. Only on
    CPU: on a GPU the backend never asks for it, and reading the table probes every op."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def _split(trainers: int, world: int) -> Layout:
    """The groups of a world with ``trainers`` training ranks (every rank creates every group,
    in the same order, as torch.distributed requires)."""
    if trainers not in _layouts:
        rank = dist.get_rank()
        training, sampling = list(range(trainers)), list(range(trainers, world))
        sides = [dist.new_group(training), dist.new_group(sampling)]
        weights = dist.new_group([0, *sampling])
        alone, _ = dist.new_subgroups_by_enumeration([[r] for r in range(world)])
        _layouts[trainers] = Layout(trainers, sides[rank >= trainers], weights, alone)
    return _layouts[trainers]


def layout() -> Layout | None:
    """The split of the world in use (None: no rollout ranks, every rank trains)."""
    return _layout


def _peers() -> Any:
    """The group of this rank's collectives: its side of the split, or the whole world."""
    return _layout.peers if _layout else None


def sampling_ranks(k: int) -> int:
    """How many of a launcher's ranks sample for ``train.rollout_ranks: k`` (none without a
    launcher: there a rollout process, not a rank, samples). A split that leaves a side with no
    rank is refused by every rank, before any group is formed."""
    world = env_world_size()
    if world == 1 and k > 1:
        raise PipelineError(
            f"train.rollout_ranks={k} needs a launcher: without one a single rollout process "
            f"samples (train.rollout_ranks=1); for {k} rollout ranks and N training ranks run "
            f"torchrun --nproc_per_node N+{k} -m flows.cli train ..."
        )
    if world > 1 and k >= world:
        raise PipelineError(
            f"train.rollout_ranks={k} under a launcher of {world} ranks leaves no rank to train: "
            f"launch more ranks (torchrun --nproc_per_node {k + 1} or more), or lower "
            "train.rollout_ranks"
        )
    return k if world > 1 else 0


def is_rollout_rank(rollout_ranks: int) -> bool:
    """Under a launcher, whether this process is one of the world's last ``rollout_ranks``."""
    world = env_world_size()
    return world > 1 and int(os.environ.get("RANK", "0")) >= world - rollout_ranks


def shutdown_distributed() -> None:
    """Leave the process group together: without it a rank that exits while another still holds
    gloo's threads can abort the whole job ("terminate called without an active exception")."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_gather_objects(obj: Any, world: int) -> list[Any]:
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj, group=_peers())
    return out


def all_reduce_max(value: int | float, world: int) -> int | float:
    """The largest ``value`` over ranks, of the type given (float64 carries ints exactly)."""
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_peers())
    return type(value)(t.item())


def all_ranks_true(flag: bool, world: int) -> bool:
    return all_reduce_max(0 if flag else 1, world) == 0


def all_reduce_sum(values: list[float], world: int) -> list[float]:
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, group=_peers())
    return t.tolist()


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier(group=_peers())


class OptimizerEngine:
    """backward / step / zero_grad for one process (torch) or several (DeepSpeed ZeRO)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        grad_clip: float,
        world: int,
        zero_stage: int,
        bf16: bool,
    ):
        self.model, self.optimizer, self.grad_clip, self.world = model, optimizer, grad_clip, world
        self.ds = None
        self.backwards = 0  # backward passes since the last step
        if world > 1:
            import deepspeed

            config = {
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 1,
                "gradient_clipping": grad_clip,
                "zero_optimization": {"stage": zero_stage},
                # torch AdamW (or a test's SGD) under ZeRO: it only partitions their states.
                "zero_allow_untested_optimizer": True,
                "bf16": {"enabled": bf16},
                "steps_per_print": 10**9,
                "wall_clock_breakdown": False,
            }
            split = _DeepSpeedRanks(_layout) if _layout else None  # rollout ranks in the world
            self.ds, self.optimizer, _, _ = deepspeed.initialize(
                model=model, optimizer=optimizer, config=config, mpu=split
            )
            self.model = self.ds.module

    @property
    def loss_scale(self) -> float:
        """DeepSpeed averages gradients over ranks; each rank's shard loss is scaled back up."""
        return float(self.world)

    def before_forward(self) -> None:
        """What ``DeepSpeedEngine.forward`` does first. We call submodules directly (the decoder,
        then the head on selected positions), so we must do it: ZeRO-3 only accumulates a
        micro-batch's gradients onto the previous ones after this call."""
        if self.ds is not None and hasattr(self.ds.optimizer, "clear_backward_seen_flag"):
            self.ds.optimizer.clear_backward_seen_flag()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters gathered from their ZeRO-3 partitions (plain ``state_dict`` otherwise)."""
        if self.ds is None or self.ds.zero_optimization_stage() < 3:
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.model.parameters())):
            return {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def backward(self, loss: torch.Tensor, boundary: bool) -> None:
        if self.ds is None:
            loss.backward()
            return
        self.ds.set_gradient_accumulation_boundary(boundary)
        self.ds.backward(loss * self.loss_scale, scale_wrt_gas=False)
        self.backwards += 1

    def step(self, finite: bool) -> tuple[float, bool]:
        """Clip and apply the update unless a rank saw a non-finite loss or gradient.

        Returns (gradient norm before clipping, whether the update was applied)."""
        if self.ds is None:
            if isinstance(self.optimizer, MasterWeights):  # bf16 weights, float32 master copies
                params = self.optimizer.master_grads()
            else:
                params = [p for p in self.model.parameters() if p.requires_grad]
            norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip).item()
            applied = finite and math.isfinite(norm)
            if applied:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            return norm, applied
        backwards, self.backwards = self.backwards, 0
        if not backwards:  # no rank had a micro-batch (their counts are padded to the largest):
            return 0.0, True  # no gradient to apply, as a torch optimizer skips them (and
            # DeepSpeed's step has nothing reduced to read)
        if all_ranks_true(finite, self.world):
            self.ds.step()
            norm = self.ds.get_global_grad_norm()
            norm = float(norm) if norm is not None else float("nan")
            return norm, True
        self.ds.zero_grad()
        return float("nan"), False

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    @property
    def partitioned(self) -> bool:
        """ZeRO-3: each rank holds a partition of the parameters."""
        return self.ds is not None and self.ds.zero_optimization_stage() >= 3

    def state_dict(self) -> dict[str, Any]:
        """This rank's optimizer state (its ZeRO partition; under ZeRO-3 with its fp32 weights)."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "master" in state and not isinstance(self.optimizer, MasterWeights):
            raise PipelineError(
                "this checkpoint was trained on bf16 weights with float32 master copies; resume "
                "it with the same model.dtype on one process (e.g. -S model.dtype=bfloat16)"
            )
        if self.ds is None:
            self.optimizer.load_state_dict(state)
            return
        # A ZeRO optimizer reads entry [rank] of a per-rank list (same world size as when saved).
        # Its fp32 master partitions come from the checkpoint, not from the (possibly bf16)
        # weights; under ZeRO-3 the partitioned parameters are restored from them too, and the
        # small ones kept whole on every rank are re-gathered, as DeepSpeedEngine.load_checkpoint
        # does.
        self.optimizer.load_state_dict([state] * self.world, load_from_fp32_weights=True)
        if self.partitioned:
            self.optimizer.checkpoint_event_epilogue()


class _DeepSpeedRanks:
    """The training ranks as DeepSpeed's ``mpu`` (the parallel-state interface Megatron-LM
    defines): data parallelism over the training ranks' group, so that ZeRO partitions over, and
    all-reduces in, the training ranks alone when the world also holds rollout ranks; no model
    parallelism (each rank its own model-parallel group)."""

    def __init__(self, split: Layout):
        self.split = split

    def get_data_parallel_group(self):
        return self.split.peers

    def get_data_parallel_world_size(self) -> int:
        return self.split.trainers

    def get_data_parallel_rank(self) -> int:
        return dist.get_rank(self.split.peers)

    def get_data_parallel_group_ranks(self) -> list[int]:
        return list(range(self.split.trainers))

    def get_model_parallel_group(self):
        return self.split.alone

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0
