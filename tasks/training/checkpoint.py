"""Checkpoints of a training run: one directory per step that holds everything exact resume needs.

A checkpoint is the model (as an ordinary Hugging Face directory), each rank's optimizer state (a
ZeRO partition under DeepSpeed) and the trainer's loop state (step, data position, carried groups,
RNG states); with a critic (``algo.critic``) also its weights (``critic/model.safetensors``) and
each rank's optimizer state for it (``critic_optimizer_rank<r>.pt``). A run without a critic
writes exactly the files it wrote before critics existed. It is written into a staging directory,
flushed to the disk and moved into place by ``RunDir``, so a save killed half-way is never picked
up.

Loading runs no code from the files: they are read with ``torch.load(weights_only=True)``, which
rebuilds tensors and plain data (dicts, lists, tuples, numbers, strings) only. The trainer's state
is saved in that form (its carried groups as dicts of fields, numpy's RNG state as a tensor);
DeepSpeed's optimizer state holds a few DeepSpeed types, allowed by name for those files only. A
file that needs anything else is refused.
"""

from __future__ import annotations

import dataclasses
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from dapo_core.errors import PipelineError
from dapo_core.sampling import BatchStats
from tasks.durable import seal_files
from tasks.models.loading import readable_weights, save_model_dir
from tasks.rundir import RunDir, checkpoint_step
from tasks.training.batches import Group
from tasks.training.distributed import all_gather_objects, barrier
from tasks.training.records import RolloutLog
from tasks.training.rollout_wire import Batch
from tasks.training.trainer import DAPOTrainer

TRAINER_STATE = "trainer.pt"
CRITIC_WEIGHTS = "critic/model.safetensors"
STATE_FORMAT = 2  # 2: plain data; absent: the pickled objects of earlier versions


def save_checkpoint(trainer: DAPOTrainer, run_dir: RunDir) -> Path:
    """Write ``checkpoints/step_N`` for the trainer's current step; keep the last
    ``train.keep_checkpoints``. Every rank calls it (the optimizer state is per rank)."""
    step, rank = trainer.step, trainer.rank
    staged = run_dir.staging_checkpoint(step)
    try:
        return _write_checkpoint(trainer, run_dir, staged)
    except OSError as e:  # a full disk, a quota: the previous checkpoint is untouched
        if rank == 0:
            shutil.rmtree(staged, ignore_errors=True)  # what fit would only fill the disk more
        latest = run_dir.latest_checkpoint()
        kept = f"the checkpoint at step {checkpoint_step(latest)}" if latest else "no checkpoint"
        raise PipelineError(
            f"could not write the checkpoint of step {step} in {run_dir}: "
            f"{e.strerror or e}; {kept} is intact: free space, then resume the run"
        ) from None


def _write_checkpoint(trainer: DAPOTrainer, run_dir: RunDir, staged: Path) -> Path:
    step, rank, world = trainer.step, trainer.rank, trainer.world
    if rank == 0:
        shutil.rmtree(staged, ignore_errors=True)  # left by a save that was killed
        staged.mkdir(parents=True)
    barrier(world)
    optim = [staged / f"optimizer_rank{rank}.pt"]
    torch.save(trainer.engine.state_dict(), optim[0])
    if trainer.critic is not None:
        optim.append(staged / f"critic_optimizer_rank{rank}.pt")
        torch.save(trainer.critic.engine.state_dict(), optim[1])
    sealed = _seal_on_every_rank(staged, optim, world)
    weights = trainer.engine.full_state_dict()  # gathered from ZeRO-3 partitions (collective)
    critic = trainer.critic.full_state_dict() if trainer.critic is not None else None
    # every rank takes the state: with rollout ranks each training rank receives the batches
    # sampled ahead (sent to every one, so a rank that left them unread would stall the next run)
    state = plain_trainer_state(trainer.state_dict())
    final = run_dir.checkpoints_dir / staged.name.removeprefix(".tmp-")
    if rank == 0:
        save_model_dir(trainer.model, trainer.tokenizer, staged / "model", weights)
        if critic is not None:
            (staged / CRITIC_WEIGHTS).parent.mkdir()
            save_file({k: v.contiguous() for k, v in critic.items()}, staged / CRITIC_WEIGHTS)
            readable_weights((staged / CRITIC_WEIGHTS).parent)
        torch.save(state, staged / TRAINER_STATE)
        final = run_dir.commit_checkpoint(step, trainer.cfg.train.keep_checkpoints, sealed)
    barrier(world)
    return final


def _seal_on_every_rank(staged: Path, own: list[Path], world: int) -> dict[str, dict[str, int]]:
    """Each rank flushes and checksums the files it wrote (in parallel, from its page cache);
    rank 0 records them all in the checkpoint's COMPLETE."""
    parts = all_gather_objects(seal_files(staged, own), world)
    return {name: record for part in parts for name, record in part.items()}


def load_checkpoint(trainer: DAPOTrainer, ckpt: Path) -> None:
    """Restore the trainer from a checkpoint written with the same number of ranks."""
    state = safe_load(ckpt / TRAINER_STATE, _legacy_types())
    if state["world"] != trainer.world:
        raise PipelineError(
            f"{ckpt} was written by {state['world']} rank(s); resume it with as many"
        )
    # Under ZeRO-3 each rank's optimizer state holds its partition of the fp32 weights, and
    # loading it restores the (partitioned) parameters; otherwise the weights load here.
    if not trainer.engine.partitioned:
        _load_weights(trainer.model, ckpt / "model")
    allowed = _deepspeed_types() if trainer.engine.ds is not None else []
    optim = safe_load(ckpt / f"optimizer_rank{trainer.rank}.pt", allowed)
    trainer.engine.load_state_dict(optim)
    if trainer.critic is not None:
        _load_critic(trainer, ckpt, allowed)
    trainer.load_state_dict(restore_trainer_state(state))


def _load_critic(trainer: DAPOTrainer, ckpt: Path, allowed: list) -> None:
    """The critic's weights and this rank's optimizer state for it, as the policy's are."""
    if not (ckpt / CRITIC_WEIGHTS).exists():
        raise PipelineError(
            f"{ckpt} holds no critic (it was written by a run without algo.critic); resume it "
            "with the algo it was trained with"
        )
    if not trainer.critic.engine.partitioned:
        trainer.critic.load_weights(load_file(ckpt / CRITIC_WEIGHTS))
    optim = safe_load(ckpt / f"critic_optimizer_rank{trainer.rank}.pt", allowed)
    trainer.critic.engine.load_state_dict(optim)


def safe_load(path: Path, allowed: list | None = None) -> Any:
    """``torch.load`` without running code from the file: tensors, plain data and the types in
    ``allowed`` only. A file that needs more is refused (PipelineError naming it)."""
    try:
        with torch.serialization.safe_globals(allowed or []):
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        raise PipelineError(
            f"refusing to load {path}: it holds {_unsafe_globals(path)} besides tensors and plain "
            "data, and unpickling it could run code; it was not written by this version of dapo "
            "(delete that checkpoint, or resume from another)"
        ) from None
    except (RuntimeError, EOFError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PipelineError(f"cannot read {path} ({first}): the file is damaged") from None


def _unsafe_globals(path: Path) -> str:
    """The globals a checkpoint file would import, read without unpickling it."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a zip checkpoint (a bare pickle): nothing more to say safely
        return "objects other than tensors"
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "") if names else "objects"


# -- the trainer's state as plain data ---------------------------------------------------------


def plain_trainer_state(state: dict[str, Any]) -> dict[str, Any]:
    """``DAPOTrainer.state_dict()`` in the types ``weights_only`` loading rebuilds: carried
    groups as dicts of their fields, numpy's RNG state as a dict with its keys in a tensor."""
    name, keys, pos, has_gauss, gauss = state["rng"]["numpy"]
    numpy_rng = {
        "name": name,
        "keys": torch.from_numpy(keys.astype(np.int64)),  # uint32 keys, exact in int64
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(gauss),
    }
    out = {
        **state,
        "format": STATE_FORMAT,
        "rng": {**state["rng"], "numpy": numpy_rng},
        "buffer": _plain_buffer(state["buffer"]),
    }
    if "in_flight" in state:  # a rollout process's batches sampled ahead (async_rollouts.py)
        out["in_flight"] = [_plain_batch(b) for b in state["in_flight"]]
    return out


def restore_trainer_state(state: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`plain_trainer_state` (a state saved before it passes unchanged)."""
    if state.get("format") != STATE_FORMAT:
        return state
    rng = state["rng"]["numpy"]
    keys = rng["keys"].numpy().astype(np.uint32)
    numpy_rng = (rng["name"], keys, rng["pos"], rng["has_gauss"], rng["cached_gaussian"])
    out = {
        **state,
        "rng": {**state["rng"], "numpy": numpy_rng},
        "buffer": _restored_buffer(state["buffer"]),
    }
    if "in_flight" in state:
        out["in_flight"] = [_restored_batch(b) for b in state["in_flight"]]
    return out


def _plain_buffer(buffer: dict[str, Any]) -> dict[str, Any]:
    return {**buffer, "groups": [(int(born), _plain_group(g)) for born, g in buffer["groups"]]}


def _restored_buffer(buffer: dict[str, Any]) -> dict[str, Any]:
    return {**buffer, "groups": [(born, Group(**fields)) for born, fields in buffer["groups"]]}


def _plain_batch(batch: Batch) -> dict[str, Any]:
    """A batch in flight as plain data: its groups, statistics and log as dicts of fields."""
    return {
        "index": batch.index,
        "version": batch.version,
        "groups": [_plain_group(g) for g in batch.groups],
        "stats": dataclasses.asdict(batch.stats),
        "log": dataclasses.asdict(batch.log),
        "state": {**batch.state, "buffer": _plain_buffer(batch.state["buffer"])},
    }


def _restored_batch(plain: dict[str, Any]) -> Batch:
    state = plain["state"]
    return Batch(
        plain["index"],
        plain["version"],
        [Group(**fields) for fields in plain["groups"]],
        BatchStats(**plain["stats"]),
        RolloutLog(**plain["log"]),
        {**state, "buffer": _restored_buffer(state["buffer"])},
    )


def _plain_group(group: Group) -> dict[str, Any]:
    if not isinstance(group, Group):  # a type we could not rebuild without unpickling it
        raise TypeError(f"cannot checkpoint a carried {type(group).__name__}, only a Group")
    return {f.name: getattr(group, f.name) for f in dataclasses.fields(group)}


def _legacy_types() -> list:
    """What trainer states saved before the plain format hold: numpy's RNG keys (a uint32 array,
    rebuilt from its bytes, no code run) and carried groups (a dataclass of plain fields)."""
    from numpy._core.multiarray import _reconstruct

    return [np.ndarray, np.dtype, type(np.dtype(np.uint32)), _reconstruct, Group]


def _deepspeed_types() -> list:
    """What a ZeRO optimizer's ``state_dict`` holds besides tensors and plain data (DeepSpeed
    0.19): its stage, its loss scaler and, under ZeRO-1/2, where each parameter's slice lies."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


def _load_weights(model: torch.nn.Module, model_dir: Path) -> None:
    weights = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(f))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # Tied embeddings are saved once; anything else missing means a different model.
    if unexpected or any("lm_head" not in k for k in missing):
        raise PipelineError(
            f"checkpoint {model_dir.parent} does not match the model ({missing[:3]})"
        )
