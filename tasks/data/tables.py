"""The curated tables on disk: their parquet schemas, atomic writers, and reading them as Problems.

``dapo curate`` (DAPO section 3.5, arXiv 2503.14476) writes ``train.parquet``, ``val.parquet`` and
each prepared eval set with :data:`TRAIN_SCHEMA` (the columns of the kept rows of
``dapo_core.curation_pass``), ``rejected.parquet`` with :data:`REJECTED_SCHEMA`, and JSON reports.
Training and evaluation read them back as ``dapo_core.problem.Problem`` records; a table needs at
least ``id``, ``problem`` and ``answer`` (``source`` and ``prompt`` are filled in when absent).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dapo_core.curation import apply_template
from dapo_core.problem import Problem
from tasks.durable import replace_atomically

TRAIN_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("problem", pa.string()),
        ("answer", pa.string()),
        ("source", pa.string()),
        ("prompt", pa.string()),
        ("source_id", pa.string()),
        ("source_row", pa.int64()),
        ("original_answer", pa.string()),
        ("answer_form", pa.string()),
        ("copies", pa.int64()),
    ]
)
REJECTED_SCHEMA = pa.schema(
    [
        ("source_row", pa.int64()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("problem", pa.string()),
        ("answer", pa.string()),
        ("record", pa.string()),
    ]
)
REQUIRED = ("id", "problem", "answer")


def write_parquet(rows: list[dict[str, Any]], schema: pa.Schema, path: Path) -> None:
    """Write ``rows`` to ``path`` atomically (a reader never sees half a file)."""
    table = pa.Table.from_pylist(rows, schema=schema)
    replace_atomically(path, lambda tmp: pq.write_table(table, tmp))


def write_json(data: Any, path: Path) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically."""
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    replace_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def rows_to_problems(rows: Iterable[Mapping[str, Any]]) -> list[Problem]:
    """Problems from curated output rows (dicts with the :data:`TRAIN_SCHEMA` columns)."""
    return [Problem(r["id"], r["problem"], r["answer"], r["prompt"], r["source"]) for r in rows]


def load_problems(path: str | Path) -> list[Problem]:
    """Problems from a curated parquet or jsonl file; a clear error when it is missing or wrong."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; run `dapo curate` (or `dvc repro`) to build the curated data"
        )
    import pandas as pd  # here: a run on the synthetic task reads no table (~0.5 s to import)

    frame = pd.read_json(path, lines=True) if path.suffix == ".jsonl" else pd.read_parquet(path)
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise ValueError(f"{path} lacks the column(s) {missing}; expected {list(REQUIRED)}")
    source = frame["source"] if "source" in frame.columns else pd.Series([path.name] * len(frame))
    prompts = frame["prompt"] if "prompt" in frame.columns else frame["problem"].map(apply_template)
    return [
        Problem(str(i), str(p), str(a), str(q), str(s))
        for i, p, a, q, s in zip(
            frame["id"], frame["problem"], frame["answer"], prompts, source, strict=True
        )
    ]
