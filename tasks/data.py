"""Loading curated problems and evaluation sets into ``dapo_core.problem.Problem`` records.

Curated files (written by ``dapo curate``) are parquet with at least ``id``, ``problem``,
``answer``, ``source`` (and optionally ``prompt``). Evaluation sets are named in
``data.eval_sets``; their prepared copies live in ``data/eval/<name>.parquet``. The name
``synthetic-test`` is the held-out split of the embedded synthetic task.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dapo_core.config import Config
from dapo_core.curation import apply_template
from dapo_core.problem import Problem
from dapo_core.synthetic import arith_problems
from tasks.params import repo_path

SYNTHETIC_TEST = "synthetic-test"
EVAL_DIR = "data/eval"
REQUIRED = ("id", "problem", "answer")


def load_problems(path: str | Path) -> list[Problem]:
    """Problems from a curated parquet or jsonl file; a clear error when it is missing or wrong."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; run `dapo curate` (or `dvc repro`) to build the curated data"
        )
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


def eval_problems(cfg: Config, name_or_path: str | None = None) -> tuple[str, list[Problem]]:
    """(name, problems) of an evaluation set: ``synthetic-test``, a name from ``data.eval_sets``
    (its prepared copy under data/eval/), or a path to a parquet/jsonl file."""
    name = name_or_path or cfg.eval.eval_set
    if name == SYNTHETIC_TEST:
        s = cfg.synthetic
        _, test = arith_problems(s.seed, s.num_train, s.num_test, s.max_operand, s.num_terms)
        return name, test
    if name in cfg.data.eval_sets:
        prepared = repo_path(EVAL_DIR) / f"{name}.parquet"
        if not prepared.exists():
            raise FileNotFoundError(
                f"eval set {name!r} is not prepared ({prepared} is missing); run `dapo curate` "
                "or `dvc repro` first"
            )
        return name, load_problems(prepared)
    path = Path(name)
    if path.exists():
        return path.stem, load_problems(path)
    known = [SYNTHETIC_TEST, *cfg.data.eval_sets]
    raise FileNotFoundError(f"unknown eval set {name!r}: not a file, and not one of {known}")
