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


def synthetic_splits(cfg: Config) -> tuple[list[Problem], list[Problem], list[Problem]]:
    """(train, val, test) of the synthetic task. The validation split is carved out of the
    training problems exactly as ``dapo curate`` does, so training never sees it; test is the
    generator's disjoint held-out split."""
    from tasks.data.curate import split_validation

    s = cfg.synthetic
    train, test = arith_problems(s.seed, s.num_train, s.num_test, s.max_operand, s.num_terms)
    rows, val = split_validation([{"id": p.id, "problem": p} for p in train], cfg.data.val_size)
    return [r["problem"] for r in rows], [r["problem"] for r in val], test


def eval_problems(cfg: Config, name_or_path: str | None = None) -> tuple[str, list[Problem]]:
    """(name, problems) of an evaluation set: ``synthetic-test``, a name from ``data.eval_sets``
    (its prepared copy under data/eval/), or a path to a parquet/jsonl file."""
    name = name_or_path or cfg.eval.eval_set
    if name == SYNTHETIC_TEST:
        s = cfg.synthetic
        _, test = arith_problems(s.seed, s.num_train, s.num_test, s.max_operand, s.num_terms)
        return name, test
    if name in cfg.data.eval_sets:
        return name, _named_eval_set(name, cfg.data.eval_sets[name])
    path = Path(name)
    if path.exists():
        try:
            return path.stem, load_problems(path)
        except ValueError:  # not a curated file (e.g. the DAPO/verl schema): curate it now
            from tasks.data import curate
            rows, _ = curate.prepare_eval_set(curate.eval_set_name(name), name)
            return curate.eval_set_name(name), curate.rows_to_problems(rows)
    known = [SYNTHETIC_TEST, *cfg.data.eval_sets]
    raise FileNotFoundError(f"unknown eval set {name!r}: not a file, and not one of {known}")


def _named_eval_set(name: str, spec: str) -> list[Problem]:
    """A set from ``data.eval_sets``: its prepared copy (data/eval/<name>.parquet, written by
    ``dapo curate``/``dvc repro`` from this same spec); else, for a local file, the file
    prepared in memory; else an error that says how to prepare it."""
    from tasks.data import curate
    prepared = repo_path(EVAL_DIR) / f"{name}.parquet"
    made_from = curate.read_manifest().get(name, {}).get("spec")
    if prepared.exists() and made_from in (None, spec):
        return load_problems(prepared)
    if curate.local_path(spec) is not None:
        rows, _ = curate.prepare_eval_set(name, spec)
        return curate.rows_to_problems(rows)
    raise FileNotFoundError(curate.missing_eval_set_message(name, spec))
