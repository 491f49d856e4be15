"""Process-level settings shared by training and evaluation."""

from __future__ import annotations

import torch


def configure_torch(cpu_threads: int) -> str:
    """The device to use and, on CPU, the thread count (0 keeps torch's default)."""
    if torch.cuda.is_available():
        return "cuda"
    if cpu_threads > 0:
        torch.set_num_threads(cpu_threads)
    return "cpu"


def quiet_transformers() -> None:
    """Our own progress bars cover loading and saving; transformers' per-shard bars are noise."""
    from transformers.utils import logging

    logging.disable_progress_bar()
