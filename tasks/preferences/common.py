"""What the preference trainers (reward model, DPO) share: their checks before any work, the
held-out split of a pairs table, and writing a model directory whole or not at all."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from dapo_core.config import Config
from dapo_core.errors import PipelineError
from tasks.preferences.pairs import PairTable, read_pairs


def check_settings(command: str, out_dir: Path, checks: list[tuple[str, object, bool]]) -> None:
    """One-line errors, before anything loads: an output directory that holds files, or a
    setting (name, value, whether it is in range) out of range."""
    if out_dir.exists() and any(out_dir.iterdir()):
        raise PipelineError(f"{out_dir} already holds files: choose another --out, or remove it")
    for name, value, ok in checks:
        if not ok:
            raise PipelineError(f"{name} {value} is out of range; see `dapo {command} -h`")


def split_by_prompt(rows: list[dict], heldout: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows: a prompt goes to the held-out set when the hash of (seed, prompt)
    falls in the first ``heldout`` of its range, so a prompt's pairs stay together."""

    def unit(prompt: str) -> float:
        digest = hashlib.sha256(f"{seed}\0{prompt}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    held = [r for r in rows if unit(r["prompt"]) < heldout]
    train = [r for r in rows if unit(r["prompt"]) >= heldout]
    return train, held


def read_split(
    cfg: Config, pairs_path: str, heldout: float, seed: int
) -> tuple[PairTable, list[dict], list[dict]]:
    """The usable pairs (validation and test prompts set aside) and their split by prompt."""
    from tasks.data.splits import splits

    s = splits(cfg)
    held_prompts = [p.prompt for p in s.val] + [p.prompt for p in s.read_test()]
    table = read_pairs(pairs_path, held_out=held_prompts)
    train, held = split_by_prompt(table.rows, heldout, seed)
    if not train or not held:
        raise PipelineError(
            f"{pairs_path}: {len(table.rows)} pairs are too few to hold some out by prompt; "
            "mine more (`dapo pairs mine --prompts N`)"
        )
    return table, train, held


def save_model_dir(model, tokenizer, record_name: str, record: dict, out_dir: Path) -> None:
    """The model, its tokenizer and ``record`` as ``out_dir``, whole or not at all: written in
    a staging directory beside it, then renamed into place."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.partial")
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / record_name).write_text(json.dumps(record, indent=2))
        if out_dir.exists():  # empty: check_settings refused one with files
            out_dir.rmdir()
        os.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
