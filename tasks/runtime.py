"""Process-level settings shared by training and evaluation."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from tasks.determinism import kernels_in_effect


def env_world_size() -> int:
    """Processes in a launcher's job (torchrun, deepspeed), 1 outside one."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def configure_torch(cpu_threads: int) -> str:
    """The device to use; and torch's thread count for host ops (``train.cpu_threads``; 0 keeps
    torch's default, one per core). On a GPU too: there a process's host ops are small (index
    tensors, masks), and each one big enough to be split over a pool of many threads paid
    milliseconds to wake them, while the GPU waited for its next kernel (docs/benchmarks.md)."""
    if cpu_threads > 0:
        torch.set_num_threads(cpu_threads)
    if torch.cuda.is_available():
        return "cuda"
    # DeepSpeed (imported by some paths even on one process) then knows it is on CPU, without
    # warning that it "was unable to detect" a GPU on every command.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return "cpu"


def kernel_tags() -> dict[str, str]:
    """The kernels this process computes with (``tasks.determinism``) and torch's version: two
    runs compare bit for bit only when both match."""
    cpu = torch.backends.cpu.get_cpu_capability()
    return {**kernels_in_effect(cpu), "runtime.torch": torch.__version__}


def quiet_transformers() -> None:
    """Our own progress bars cover loading and saving; transformers' per-shard bars are noise."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def seed_everything(seed: int) -> None:
    """Python's, numpy's and torch's generators, as a training step (or its rollout) starts."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
