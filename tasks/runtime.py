"""Process-level settings shared by training and evaluation."""

from __future__ import annotations

import os

import torch


def configure_torch(cpu_threads: int) -> str:
    """The device to use and, on CPU, the thread count (0 keeps torch's default)."""
    if torch.cuda.is_available():
        return "cuda"
    # DeepSpeed (imported by some paths even on one process) then knows it is on CPU, without
    # warning that it "was unable to detect" a GPU on every command.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if cpu_threads > 0:
        torch.set_num_threads(cpu_threads)
    return "cpu"


def quiet_transformers() -> None:
    """Our own progress bars cover loading and saving; transformers' per-shard bars are noise."""
    from transformers.utils import logging

    logging.disable_progress_bar()
