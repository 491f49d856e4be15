"""Preference pairs (issue 27, item 1): mined from the policy's own rollouts, or read from a file.

The table is the standard ``{prompt, chosen, rejected}`` schema (TRL's and OpenRLHF's): ``prompt``
is the user message (the problem in the task's template, before the chat template), ``chosen``
and ``rejected`` are response texts. Mined tables add ``problem_id``, ``chosen_reward`` and
``rejected_reward``, and carry their provenance in the Parquet file's metadata (the model and its
digest, the sampling settings, the training split's digest): a table says where it came from.

Mining (``dapo_core.preferences.mine_pairs``) samples G responses to training problems with the
run's sampling settings, scores them with the rule-based reward (DAPO Eq. 7), and in each group
with mixed rewards pairs a correct response (chosen) with an incorrect one (rejected). Only the
training split is mined: validation and test problems never reach a pair.

Reading a file (``.parquet``, ``.jsonl`` or ``.json``; a hub dataset id where there is network)
sets malformed rows aside with a count per reason, as curation does: a missing or empty field,
chosen equal to rejected, a line that is not JSON, a prompt that is a validation or test problem.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from dapo_core.config import Config
from dapo_core.errors import PipelineError, TrainingInterrupted
from dapo_core.preferences import mine_pairs
from dapo_core.problem import Problem
from dapo_core.reward import score
from tasks.data.sources import HUB_ID
from tasks.data.version import problems_digest
from tasks.durable import replace_atomically
from tasks.orchestration import interrupts
from tasks.signals import held_signals

COLUMNS = ("prompt", "chosen", "rejected")
MINED = ("problem_id", "chosen_reward", "rejected_reward")
PROVENANCE_KEY = b"dapo.provenance"
SUFFIXES = (".parquet", ".jsonl", ".json")


@dataclasses.dataclass
class PairTable:
    """Pairs (dicts with at least :data:`COLUMNS`), where they came from, and what was set
    aside on reading (reason -> count)."""

    rows: list[dict]
    provenance: dict
    quarantined: Counter = dataclasses.field(default_factory=Counter)

    def digest(self) -> str:
        """The pairs' content (prompt, chosen, rejected, in order), as 16 hex digits: what a
        resumed training checks it still reads, whatever the file's name."""
        h = hashlib.sha256()
        for row in self.rows:
            h.update(json.dumps([row[c] for c in COLUMNS]).encode() + b"\n")
        return h.hexdigest()[:16]

    def summary(self) -> str:
        aside = sum(self.quarantined.values())
        why = ", ".join(f"{n} {reason}" for reason, n in self.quarantined.most_common())
        return f"{len(self.rows)} pairs" + (f"; {aside} rows set aside ({why})" if aside else "")


# -- mining ------------------------------------------------------------------------------------


def mine(
    cfg: Config,
    generate: Callable[[list[Problem]], list[list[str]]],
    problems: list[Problem],
    prompts: int,
    per_group: int = 1,
    seed: int = 0,
    provenance: dict | None = None,
    on_batch: Callable[[int, int], None] = lambda done, pairs: None,
) -> PairTable:
    """Pairs from ``prompts`` training problems drawn with ``seed``: ``generate(problems)``
    returns the G response texts of each; each response is scored by the rule-based reward and
    every group of mixed rewards gives up to ``per_group`` (correct, incorrect) pairs.
    ``on_batch(problems done, pairs so far)`` reports progress."""
    if prompts < 1:
        raise PipelineError(f"--prompts must be >= 1, got {prompts}")
    drawn = random.Random(seed).sample(problems, min(prompts, len(problems)))
    rows: list[dict] = []
    mixed = 0
    step = max(1, cfg.train.gen_batch)
    for start in range(0, len(drawn), step):
        batch = drawn[start : start + step]
        texts = generate(batch)
        # The training reward (DAPO Eq. 7, as the trainer scores rollouts): +1 or -1.
        scored = [
            [score(t, p.answer).score for t in ts] for p, ts in zip(batch, texts, strict=True)
        ]
        rewards = torch.tensor(scored)
        found = mine_pairs(rewards, per_group, seed=seed + start)
        mixed += len({pair.group for pair in found})
        for pair in found:
            p = batch[pair.group]
            rows.append(
                {
                    "prompt": p.prompt,
                    "chosen": texts[pair.group][pair.chosen],
                    "rejected": texts[pair.group][pair.rejected],
                    "problem_id": p.id,
                    "chosen_reward": float(rewards[pair.group, pair.chosen]),
                    "rejected_reward": float(rewards[pair.group, pair.rejected]),
                }
            )
        on_batch(start + len(batch), len(rows))
    r = cfg.rollout
    record = {
        **(provenance or {}),
        "sampling": {
            "group_size": r.group_size,
            "temperature": r.temperature,
            "top_p": r.top_p,
            "max_response_len": r.max_response_len,
        },
        "mining": {"prompts": len(drawn), "per_group": per_group, "seed": seed},
        "data": {"source": cfg.data.source, "train_digest": problems_digest(problems)},
        "groups": len(drawn),
        "mixed_groups": mixed,
        "pairs": len(rows),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return PairTable(rows, record)


def write_pairs(table: PairTable, path: str | Path) -> Path:
    """The table as Parquet with its provenance in the file's metadata, written whole or not
    at all (a temporary file renamed into place: an interrupted write leaves nothing)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if path.suffix != ".parquet":
        raise PipelineError(f"{path}: mined pairs are written as .parquet; name the file so")
    if not table.rows:
        raise PipelineError(
            "no pairs: no group had both a correct and an incorrect response. Sample more "
            "prompts (--prompts), or use a policy that is right on some but not all samples"
        )
    columns = list(COLUMNS) + [c for c in MINED if c in table.rows[0]]
    arrow = pa.Table.from_pylist(table.rows).select(columns)
    meta = {**(arrow.schema.metadata or {}), PROVENANCE_KEY: json.dumps(table.provenance)}
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, lambda tmp: pq.write_table(arrow.replace_schema_metadata(meta), tmp))
    return path


# -- reading -----------------------------------------------------------------------------------


def read_pairs(path: str, held_out: Iterable[str] = ()) -> PairTable:
    """The usable pairs of a file or hub dataset, malformed rows set aside and counted; pairs
    whose prompt is one of ``held_out`` (validation and test prompts) set aside too. A missing
    file, a file of another kind, missing columns or no usable row: one-line errors."""
    raw, provenance, bad_lines = _raw_rows(path)
    held = set(held_out)
    aside: Counter = Counter()
    if bad_lines:
        aside["lines that are not JSON objects"] = bad_lines
    if raw and not isinstance(raw[0], dict):
        raise PipelineError(f"{path}: expected rows with fields {', '.join(COLUMNS)}")
    present = set().union(*(r.keys() for r in raw)) if raw else set()
    if raw and (missing := [c for c in COLUMNS if c not in present]):
        raise PipelineError(
            f"{path}: no {', '.join(missing)} column; a pairs file has {', '.join(COLUMNS)} "
            "(text), one row per pair"
        )
    rows = []
    for r in raw:
        reason = _defect(r, held)
        if reason:
            aside[reason] += 1
        else:
            rows.append(r)
    table = PairTable(rows, provenance, aside)
    if not rows:
        raise PipelineError(
            f"{path}: no usable pairs ({table.summary()}); mine some with `dapo pairs mine`"
        )
    return table


def _defect(row: dict, held: set[str]) -> str | None:
    """Why a row cannot be used, or None."""
    for c in COLUMNS:
        v = row.get(c)
        if not isinstance(v, str) or not v.strip():
            return f"missing or empty {c}"
    if row["chosen"] == row["rejected"]:
        return "chosen equal to rejected"
    if row["prompt"] in held:
        return "a validation or test prompt"
    return None


def _raw_rows(path: str) -> tuple[list, dict, int]:
    """(rows, provenance, unreadable lines) of a file, or of a hub dataset's train split."""
    p = Path(path)
    if not path.strip():  # Path("") is the current folder
        raise PipelineError("no pairs file named; give one (.parquet, .jsonl or .json)")
    if p.is_dir():
        raise PipelineError(f"{path} is a folder; give a pairs file (.parquet, .jsonl or .json)")
    if not p.exists():
        if p.with_name(p.name + ".dvc").exists():  # tracked, but not in this checkout
            raise PipelineError(
                f"pairs file {path} is tracked by DVC but not here: `dvc pull {path}` fetches "
                "it (or `dapo pairs mine` mines it again)"
            )
        hub_id = path.removeprefix("hf://datasets/")
        if p.suffix in SUFFIXES or not HUB_ID.match(hub_id):  # a local path, mistyped
            raise PipelineError(
                f"pairs file {path} not found: mine one with `dapo pairs mine`, or give a "
                ".parquet/.jsonl file with prompt, chosen and rejected columns"
            )
        return _hub_rows(hub_id), {"source": path}, 0
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            arrow = pq.read_table(p)
        except Exception as e:  # noqa: BLE001 - any unreadable file is the same one line
            raise PipelineError(f"{path}: not a readable Parquet file ({e})") from None
        meta = arrow.schema.metadata or {}
        provenance = json.loads(meta[PROVENANCE_KEY]) if PROVENANCE_KEY in meta else {}
        return arrow.to_pylist(), provenance, 0
    if p.suffix in (".jsonl", ".json"):
        return _json_rows(p)
    raise PipelineError(f"{path}: pairs are read from .parquet, .jsonl or .json files")


def _json_rows(p: Path) -> tuple[list, dict, int]:
    text = p.read_text(encoding="utf-8", errors="replace")
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PipelineError(f"{p}: not valid JSON ({e.msg}, line {e.lineno})") from None
        if not isinstance(data, list):
            raise PipelineError(f"{p}: expected a JSON list of pair objects")
        return (
            [r for r in data if isinstance(r, dict)],
            {},
            sum(not isinstance(r, dict) for r in data),
        )
    rows, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, {}, bad


def _hub_rows(name: str) -> list[dict]:
    from tasks import hub

    if why := hub.out_of_reach():
        raise PipelineError(
            f"pairs dataset {name}: the hub at {hub.endpoint()} cannot be reached ({why}); "
            "download it where there is network (HF_HUB_OFFLINE=1 reads a cached copy), or "
            "give a local .parquet/.jsonl file"
        )
    try:
        from datasets import load_dataset

        return list(load_dataset(name, split="train"))
    except Exception as e:  # noqa: BLE001 - offline, unknown id, no train split: one line
        raise PipelineError(
            f"pairs dataset {name} could not be loaded from the hub ({type(e).__name__}); "
            "download it where there is network, or give a local .parquet/.jsonl file"
        ) from None


# -- the command -------------------------------------------------------------------------------


def _check_out(out: Path) -> None:
    """One line for a ``--out`` that mined pairs cannot be written to, or should not replace."""
    from tasks.durable import unwritable

    if out.suffix != ".parquet":
        raise PipelineError(f"{out}: mined pairs are written as .parquet; name the file so")
    if why := unwritable(out.parent):
        raise PipelineError(f"--out {out}: {why}, not a folder you can write; choose another")
    if out.is_dir():
        raise PipelineError(f"--out {out} is a folder; name the .parquet file to write")
    if out.exists() and PROVENANCE_KEY not in _parquet_metadata(out):
        raise PipelineError(
            f"--out {out} holds other data (not pairs that `dapo pairs mine` wrote), which "
            "mining would replace: choose another --out, or remove it"
        )


def _parquet_metadata(path: Path) -> dict:
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path).metadata or {}
    except Exception:  # noqa: BLE001 - unreadable: not a table mining wrote
        return {}


def mine_to_file(
    cfg: Config,
    out: str | Path,
    prompts: int,
    per_group: int = 1,
    seed: int = 0,
    on_batch: Callable[[int, int], None] = lambda done, pairs: None,
    dvc: bool = True,
) -> tuple[PairTable, Path, str | None]:
    """``dapo pairs mine``: the run's policy samples G responses to ``prompts`` training
    problems; the pairs are written to ``out`` and tracked by DVC (``dvc add``, inside the
    project; ``dvc=False``: a sweep's own pairs, inside its run directory). Returns the table,
    its path and its DVC md5 (None outside a DVC repository or untracked)."""
    from tasks.data.splits import splits
    from tasks.data.version import dvc_add
    from tasks.models.build import model_dir_digest
    from tasks.models.loading import chat_prompt, load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.rollout.factory import make_generator
    from tasks.runtime import configure_torch

    out = Path(out)
    _check_out(out)  # before minutes of sampling, not after
    device = configure_torch(cfg.train.cpu_threads)
    path = resolve_model_path(cfg)
    model, tokenizer = load_policy(path, cfg.model.dtype, device)
    generator = make_generator(cfg, model, tokenizer, path)
    r = cfg.rollout

    def generate(problems: list[Problem]) -> list[list[str]]:
        texts = generator.generate(
            [chat_prompt(tokenizer, p.prompt) for p in problems],
            r.group_size,
            r.temperature,
            r.top_p,
            r.max_response_len,
        ).texts
        return [texts[i * r.group_size : (i + 1) * r.group_size] for i in range(len(problems))]

    torch.manual_seed(seed)
    model_record = {"model": {"path": str(path), "digest": model_dir_digest(path)}}
    train = splits(cfg).train
    table = mine(cfg, generate, train, prompts, per_group, seed, model_record, on_batch)
    whole = False
    try:
        with held_signals():  # the table and its DVC record change together: Ctrl-C waits
            written = write_pairs(table, out)
            md5 = dvc_add(written) if dvc else None
            whole = True
    except BaseException as e:
        if whole and isinstance(e, interrupts()):  # held until the write was over
            raise TrainingInterrupted(
                f"stopped once {written} was written{' and tracked by DVC' if dvc else ''}: it "
                "is complete, nothing to run again"
            ) from None
        raise
    return table, written, md5
