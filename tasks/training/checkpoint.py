"""Checkpoints of a training run: one directory per step that holds everything exact resume needs.

A checkpoint is the model (as an ordinary Hugging Face directory), each rank's optimizer state (a
ZeRO partition under DeepSpeed) and the trainer's loop state (step, data position, carried groups,
RNG states). It is written into a staging directory and moved into place by ``RunDir``, so a save
killed half-way is never picked up.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from dapo_core.errors import PipelineError
from tasks.rundir import RunDir
from tasks.training.distributed import barrier
from tasks.training.trainer import DAPOTrainer

TRAINER_STATE = "trainer.pt"


def save_checkpoint(trainer: DAPOTrainer, run_dir: RunDir) -> Path:
    """Write ``checkpoints/step_N`` for the trainer's current step; keep the last
    ``train.keep_checkpoints``. Every rank calls it (the optimizer state is per rank)."""
    step, rank, world = trainer.step, trainer.rank, trainer.world
    staged = run_dir.staging_checkpoint(step)
    if rank == 0:
        shutil.rmtree(staged, ignore_errors=True)  # left by a save that was killed
        staged.mkdir(parents=True)
    barrier(world)
    torch.save(trainer.engine.state_dict(), staged / f"optimizer_rank{rank}.pt")
    barrier(world)
    weights = trainer.engine.full_state_dict()  # gathered from ZeRO-3 partitions (collective)
    final = run_dir.checkpoints_dir / staged.name.removeprefix(".tmp-")
    if rank == 0:
        trainer.model.save_pretrained(staged / "model", state_dict=weights)
        trainer.tokenizer.save_pretrained(staged / "model")
        torch.save(trainer.state_dict(), staged / TRAINER_STATE)
        final = run_dir.commit_checkpoint(step, trainer.cfg.train.keep_checkpoints)
    barrier(world)
    return final


def load_checkpoint(trainer: DAPOTrainer, ckpt: Path) -> None:
    """Restore the trainer from a checkpoint written with the same number of ranks."""
    state = torch.load(ckpt / TRAINER_STATE, weights_only=False)
    if state["world"] != trainer.world:
        raise PipelineError(
            f"{ckpt} was written by {state['world']} rank(s); resume it with as many"
        )
    # Under ZeRO-3 each rank's optimizer state holds its partition of the fp32 weights, and
    # loading it restores the (partitioned) parameters; otherwise the weights load here.
    if not trainer.engine.partitioned:
        _load_weights(trainer.model, ckpt / "model")
    optim = torch.load(ckpt / f"optimizer_rank{trainer.rank}.pt", weights_only=False)
    trainer.engine.load_state_dict(optim)
    trainer.load_state_dict(state)


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
