"""``dapo curate``: one curate run, sources in, curated files out (DAPO section 3.5).

DAPO (arXiv 2503.14476, section 3.5) trains on math problems whose answers are integers. A curate
run prepares the eval sets (``tasks.data.eval_sets``), reads the training source
(``tasks.data.sources``), runs the pure pass of ``dapo_core.curation_pass`` (parse, integer form,
dedupe, decontaminate against the eval sets, split off validation) and writes, in ``data.out_dir``:

- ``train.parquet`` and ``val.parquet`` (when ``data.val_size > 0``), the
  ``tasks.data.tables.TRAIN_SCHEMA`` columns;
- ``rejected.parquet``: every dropped row except plain duplicates, with ``reason`` and ``detail``;
- ``report.json``: counts that account for every input row (kept + dropped = input rows).

Nothing here raises on a bad row: malformed rows are quarantined. `dvc repro` runs this module
through the CLI as two stages (``--step eval`` and ``--step train``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_core.config import Config, ConfigError
from dapo_core.curation_pass import Curated, split_validation
from dapo_core.errors import PipelineError
from dapo_core.problem import Problem
from tasks.data.eval_sets import (
    default_eval_dir,
    eval_sets_for_decontamination,
    parse_eval_set_args,
    prepare_eval_sets,
)
from tasks.data.sources import (
    Loaded,
    data_files,
    load_source,
    read_and_curate,
    resolve_source,
    sha256_files,
)
from tasks.data.tables import REJECTED_SCHEMA, TRAIN_SCHEMA, write_json, write_parquet
from tasks.durable import unwritable
from tasks.params import repo_path
from tasks.signals import held_signals

__all__ = ["STEPS", "CurateSummary", "curate", "curated_dir", "parse_eval_set_args"]

STEPS = ("all", "eval", "train")
TRAIN_FILE, VAL_FILE, REPORT_FILE = "train.parquet", "val.parquet", "report.json"

REPORT_NOTES = (
    "kept = train + val (the validation rows count as kept), and kept + sum(dropped) "
    "= input_rows. 'duplicate' counts the extra copies of a problem whose copies agree "
    "(the first copy is kept or dropped for its own reason); 'conflicting_answers' "
    "counts every copy of a problem whose copies disagree. rejected.parquet holds every "
    "dropped row except plain duplicates. 'converted' counts kept problems whose answer "
    "was rewritten into integer form (instruction appended to the problem)."
)


@dataclass
class CurateSummary:
    out_dir: Path | None
    eval_dir: Path
    report: dict[str, Any] | None
    eval_manifest: dict[str, Any]


def curate(
    cfg: Config,
    source: str | None = None,
    out: str | Path | None = None,
    eval_sets: Mapping[str, str] | None = None,
    eval_dir: str | Path | None = None,
    step: str = "all",
    progress: bool = True,
) -> CurateSummary:
    """``dapo curate``: prepare the eval sets (step ``eval``), curate the source (step
    ``train``), or both (``all``). Defaults come from ``data.*``; relative paths from params
    are anchored at the repo root. ``eval_sets`` given here are required (a missing one is an
    error); those from params that cannot be read are reported and skipped."""
    if step not in STEPS:
        raise ConfigError(f"--step must be one of {', '.join(STEPS)}; got {step!r}")
    required = set(eval_sets or ())
    specs = dict(eval_sets) if eval_sets is not None else dict(cfg.data.eval_sets)
    # With --out, nothing is written in the repository: the eval sets go beside the output.
    if eval_dir is not None:
        edir = Path(eval_dir)
    else:
        edir = Path(out) / "eval" if out is not None else default_eval_dir()
    out_dir = Path(out) if out is not None else repo_path(cfg.data.out_dir)
    _check_writable(edir if step != "train" else None, out_dir if step != "eval" else None)
    # The source first: a wrong path is reported before any eval set is fetched.
    loaded = open_source(cfg, source) if step != "eval" else None
    if loaded is not None and not loaded.total:  # and an empty one before, too
        raise PipelineError(_no_rows(loaded))
    manifest: dict[str, Any] = {}
    made = [d for d in (out_dir, edir) if not d.exists()]
    try:
        if step in ("all", "eval"):
            manifest = prepare_eval_sets(specs, edir, required, progress)
        if loaded is None:
            return CurateSummary(None, edir, None, manifest)
        report = curate_source(cfg, loaded, out_dir, specs, edir, required, progress)
    except BaseException:  # stopped or failed: no folder of half the outputs (--out's eval/)
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return CurateSummary(out_dir, edir, report, manifest)


def _check_writable(eval_dir: Path | None, out_dir: Path | None) -> None:
    """One line, before any work, for an output folder that cannot be written (an Errno after
    minutes of curation)."""
    for what, folder in (("the eval sets' folder", eval_dir), ("data.out_dir", out_dir)):
        if folder is not None and (why := unwritable(folder)):
            raise PipelineError(f"{what} {folder}: {why}; give a folder for the curated data")


def open_source(cfg: Config, source: str | None) -> Loaded:
    """The source to curate (default ``data.source``), opened; a clear error if it cannot be."""
    return load_source(
        source or cfg.data.source,
        cfg,
        "to use a local file, pass `dapo curate --source PATH` or set data.source in "
        "params.yaml to its path (a parquet/jsonl file in the DAPO or {problem, answer} schema).",
    )


def curate_source(
    cfg: Config,
    loaded: Loaded,
    out_dir: Path,
    specs: dict[str, str],
    eval_dir: Path,
    required: set[str],
    progress: bool,
) -> dict[str, Any]:
    """Curate an opened source into ``out_dir``; returns the report."""
    d = cfg.data
    ready, missing = eval_sets_for_decontamination(specs, eval_dir, required)
    label = f"curate {loaded.source.name}"
    result = read_and_curate(loaded, label, ready, d.decontam_ngram, d.decontam_threshold, progress)
    if not result.kept:
        raise PipelineError(_nothing_kept(loaded, result))
    train, val = split_validation(result.kept, d.val_size)
    report = _report(cfg, loaded, result, len(train), len(val), ready, missing)
    _write_outputs(out_dir, train, val, result.rejected, report)
    return report


def _nothing_kept(loaded: Loaded, result: Curated) -> str:
    """Why no row of the source was kept, as one line: the reasons counted, the first one shown."""
    name = loaded.source.name
    if not result.input_rows:
        return _no_rows(loaded)
    reasons = ", ".join(f"{n} {why}" for why, n in result.dropped.most_common() if n)
    first = result.rejected[0] if result.rejected else None
    example = f" (row {first['source_row']}: {first['detail']})" if first else ""
    return (
        f"no problem of {name} was kept out of {result.input_rows} rows: {reasons}{example}; "
        "each row needs a problem and an answer with an integer form, in the DAPO or "
        "{problem, answer} schema"
    )


def _no_rows(loaded: Loaded) -> str:
    return f"{loaded.source.name} has no rows: give a file with problems to curate"


def _report(
    cfg: Config,
    loaded: Loaded,
    result: Curated,
    n_train: int,
    n_val: int,
    ready: dict[str, list[Problem]],
    missing: dict[str, str],
) -> dict[str, Any]:
    """report.json: where every input row went."""
    d = cfg.data
    report = {
        "source": loaded.source.name,
        "source_kind": loaded.source.kind,
        "source_sha256": loaded.sha256,
        "input_rows": result.input_rows,
        "kept": len(result.kept),
        "train": n_train,
        "val": n_val,
        "dropped": {k: v for k, v in sorted(result.dropped.items()) if v},
        "conflicting_problems": result.conflicting_problems,
        "converted": {
            "total": sum(result.converted.values()),
            "by_form": dict(sorted(result.converted.items())),
        },
        "decontamination": {
            "eval_sets": {name: len(p) for name, p in ready.items()},
            "unavailable": missing,
            "ngram": d.decontam_ngram,
            "threshold": d.decontam_threshold,
            "matches": result.matches,
        },
        "notes": REPORT_NOTES,
    }
    assert report["kept"] + sum(report["dropped"].values()) == report["input_rows"]
    return report


def _write_outputs(
    out_dir: Path,
    train: list[dict[str, Any]],
    val: list[dict[str, Any]],
    rejected: list[dict[str, Any]],
    report: dict[str, Any],
) -> None:
    """Write the outputs beside ``out_dir`` first, then rename them in: a stop while writing
    leaves the old outputs as they were (it left a stray .tmp, or a new train.parquet beside an
    old val.parquet and report). report.json goes last: it marks a finished curation, which
    :func:`curated_dir` requires."""
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)  # left by a run killed (-9) while writing
    staging.mkdir()
    try:
        write_parquet(train, TRAIN_SCHEMA, staging / TRAIN_FILE)
        if val:
            write_parquet(val, TRAIN_SCHEMA, staging / VAL_FILE)
        write_parquet(rejected, REJECTED_SCHEMA, staging / "rejected.parquet")
        write_json(report, staging / REPORT_FILE)
        with held_signals():  # a few renames: Ctrl-C waits for them
            (out_dir / REPORT_FILE).unlink(missing_ok=True)
            # An old val.parquet (an earlier run with val_size > 0) would be read as validation.
            (out_dir / VAL_FILE).unlink(missing_ok=True)
            for name in (TRAIN_FILE, VAL_FILE, "rejected.parquet", REPORT_FILE):
                if (staging / name).exists():
                    os.replace(staging / name, out_dir / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def curated_dir(cfg: Config) -> Path:
    """``data.out_dir``, once it is known to hold what a finished ``dapo curate`` of
    ``data.source`` wrote; else a one-line error saying to curate (training on the data of
    another source, or half of an interrupted curation, would go unnoticed)."""
    out_dir = repo_path(cfg.data.out_dir)
    # `dapo curate` alone curates params.yaml's source: the one asked for takes the same options
    redo = (
        f"run `dapo curate` with the same -c and -S to curate {cfg.data.source} into {out_dir} "
        "(or `dvc repro`, for params.yaml's settings)"
    )
    if not (out_dir / TRAIN_FILE).exists():
        _refuse_missing_source(cfg)
        raise FileNotFoundError(f"{out_dir / TRAIN_FILE} does not exist; {redo}")
    try:
        report = json.loads((out_dir / REPORT_FILE).read_text(encoding="utf-8"))
        made_from = (report["source_kind"], report["source"], report["source_sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        raise PipelineError(
            f"{out_dir} holds no readable {REPORT_FILE}: no `dapo curate` finished writing it; "
            f"{redo}"
        ) from None
    if (why := _other_source(made_from, cfg.data.source)) is not None:
        _refuse_missing_source(cfg)
        raise PipelineError(f"{out_dir} was curated from {why}; {redo}")
    return out_dir


def _refuse_missing_source(cfg: Config) -> None:
    """Where the data must be curated again: a source that is not there is said first (the
    curation would fail on it). Data curated from a source since removed is still read."""
    resolve_source(cfg.data.source, "set data.source (-S data.source=...) to one that is")


def _other_source(made_from: tuple[str, str, str | None], spec: str) -> str | None:
    """What the curated data was made from, when that is not ``spec`` as it is now; else None.
    A local source is compared by content too: a file replaced under the same name."""
    kind, name, sha256 = made_from
    try:
        src = resolve_source(spec)
    except (FileNotFoundError, ConfigError):  # the source is gone: its name must agree
        return None if name == Path(spec).name else f"{name}, not {spec}"
    if (kind, name) != (src.kind, src.name):
        return f"{name} ({kind}), not {spec}"
    if src.kind == "file" and src.path and sha256 not in (None, sha256_files(data_files(src.path))):
        return f"an earlier version of {spec} (its sha256 differs)"
    return None
