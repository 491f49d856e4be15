"""Evaluation sets: preparing them into ``data/eval/`` and reading them back (DAPO section 4.1).

DAPO (arXiv 2503.14476) reports AIME 2024 avg@32; its training data is decontaminated against the
evaluation problems (section 3.5). The sets are named in ``data.eval_sets`` (name -> local path or
hub id). Preparing one writes ``data/eval/<name>.parquet``; ``data/eval/manifest.json`` lists every
set as ``ready`` (problem and drop counts) or ``unavailable`` (why, e.g. an offline hub id), so
`dvc repro` succeeds offline and `dapo evaluate` can say how to prepare a missing set.

A benchmark is evaluated as its publisher wrote it, so that a score on it compares with published
ones: preparing a set only reads its records and collapses copies of a problem (the DAPO AIME file
holds each problem 32 times). Every problem stays, with its published answer: an integer literal
is written canonically (``023`` -> ``23``, the same number), any other answer verbatim
(``\\frac{14}{3}``, ``(3, \\frac{\\pi}{2})``), for the reward's equivalence to judge. The integer
transformation of section 3.5 (``m/n`` -> ``m+n``) is for training data only.

The name ``synthetic-test`` (the embedded task's held-out split) is resolved by
``tasks.data.splits.eval_problems``, which owns the splits; this module resolves the names of
``data.eval_sets`` and paths.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from dapo_core.answers import canonical_integer
from dapo_core.config import Config, ConfigError
from dapo_core.curation import apply_template, dedupe_key
from dapo_core.curation_pass import DUPLICATE, problem_id
from dapo_core.problem import Problem
from dapo_core.records import Malformed, Row, parse_record
from tasks.data.sources import (
    DATA_SUFFIXES,
    SourceUnavailable,
    console,
    load_source,
    local_path,
)
from tasks.data.tables import (
    TRAIN_SCHEMA,
    load_problems,
    rows_to_problems,
    write_json,
    write_parquet,
)
from tasks.params import repo_path

log = logging.getLogger(__name__)

EVAL_DIR = "data/eval"
MANIFEST = "manifest.json"
SYNTHETIC_TEST = "synthetic-test"
EVAL_NOTES = (
    "Eval sets named in data.eval_sets (or --eval-set). 'ready' sets are in <name>.parquet "
    "(columns id, problem, answer, source, prompt, ...): every problem of the source with its "
    "published answer (integer literals canonical, 023 -> 23; original_answer keeps the text); "
    "'unavailable' ones could not be read here (offline hub id, missing file): see 'reason' for "
    "how to provide them."
)

_warned_files: set[str] = set()  # eval-set files whose left-out rows were warned about
_NAME = re.compile(r"^[\w][\w.-]*$")
_GENERIC_STEMS = {"test", "train", "data", "validation", "val", "dev"}


def default_eval_dir() -> Path:
    """``data/eval`` under the repo root (where `dvc repro` writes and `dapo evaluate` reads)."""
    return repo_path(EVAL_DIR)


# ---------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------


def eval_set_name(spec: str) -> str:
    """A name for an eval-set spec: the file stem (its folder's name for test.jsonl and the
    like), or the hub id's name, lower-cased: BytedTsinghua-SIA/AIME-2024 -> aime-2024."""
    path = Path(spec.removeprefix("hf://datasets/"))
    stem = path.stem if path.suffix in (*DATA_SUFFIXES, ".json") else path.name
    if stem.lower() in _GENERIC_STEMS and path.parent.name:
        stem = path.parent.name
    return stem.lower()


def check_name(name: str) -> str:
    """``name`` if it can name a file under data/eval/, else a ConfigError."""
    if not _NAME.match(name) or name == "manifest":
        raise ConfigError(f"bad eval set name {name!r}: use letters, digits, '.', '_' and '-'")
    return name


def parse_eval_set_args(values: Iterable[str], cfg: Config) -> dict[str, str]:
    """``--eval-set`` values -> {name: spec}: ``NAME=SPEC``, a name from data.eval_sets, or a
    spec (path or hub id) named by :func:`eval_set_name`."""
    specs: dict[str, str] = {}
    for value in values:
        name, sep, spec = value.partition("=")
        if not sep:
            name, spec = value, cfg.data.eval_sets.get(value, value)
            if value not in cfg.data.eval_sets:
                name = eval_set_name(value)
        specs[check_name(name.strip())] = spec.strip()
    return specs


# ---------------------------------------------------------------------------------------------
# Preparing: data/eval/<name>.parquet + manifest.json
# ---------------------------------------------------------------------------------------------


def read_manifest(eval_dir: Path | None = None) -> dict[str, Any]:
    """The manifest's ``{name: entry}`` ({} when there is none or it is unreadable)."""
    path = (eval_dir or default_eval_dir()) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("eval_sets", {}) if isinstance(data, dict) else {}


def prepare_eval_set(name: str, spec: str) -> tuple[list[dict], dict]:
    """(rows, manifest entry) of one eval set, as published (:func:`published_problems`).

    Raises FileNotFoundError / SourceUnavailable when the spec cannot be read here."""
    alternative = (
        f"to use a local file, set data.eval_sets.{name} in params.yaml to its path (then `dvc "
        "repro`), or pass it directly: `dapo evaluate --eval-set PATH`."
    )
    loaded = load_source(spec, None, alternative)
    published = published_problems(loaded.records, loaded.source.name)
    if not published.rows:  # e.g. other columns: a set of nothing is no evaluation
        counts = ", ".join(f"{n} {why}" for why, n in published.dropped.most_common())
        raise SourceUnavailable(
            f"{spec} holds no problem ({published.input_rows} rows: {counts or 'none'}): each "
            "row needs a problem and its answer, in the DAPO or {problem, answer} schema"
        )
    entry = {
        "spec": spec,
        "status": "ready",
        "file": f"{name}.parquet",
        "source": loaded.source.name,
        "sha256": loaded.sha256,
        "input_rows": published.input_rows,
        "problems": len(published.rows),
        "dropped": dict(sorted(published.dropped.items())),
        "answers": dict(sorted(Counter(r["answer_form"] for r in published.rows).items())),
        "copies_disagree": published.disagreeing,
    }
    return published.rows, entry


@dataclass
class Published:
    """An eval set as published: one row per problem, and where every other input row went."""

    input_rows: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)  # duplicate copies; unreadable rows
    disagreeing: list[str] = field(default_factory=list)  # ids whose copies differ in answer


def published_problems(records: Iterable[Any], source_name: str) -> Published:
    """Every problem of ``records`` with its published answer (:func:`published_answer`).

    Copies of a problem (the same text up to whitespace) collapse into the first, which keeps
    its answer; a problem whose copies give different answers stays and is listed in
    ``disagreeing``. An unreadable record is counted under its reason
    (``dapo_core.records.MALFORMED``): it holds no problem to evaluate.
    """
    out = Published()
    first: dict[str, dict[str, Any]] = {}
    answers: dict[str, set[str]] = {}
    for index, record in enumerate(records):
        out.input_rows += 1
        row = parse_record(record)
        if isinstance(row, Malformed):
            out.dropped[row.reason] += 1
            continue
        key = dedupe_key(row.problem)
        answer = published_answer(row.answer)
        if key in first:
            out.dropped[DUPLICATE] += 1
            first[key]["copies"] += 1
            answers[key].add(answer)
            continue
        first[key] = _published_row(row, index, answer, source_name)
        answers[key] = {answer}
    out.rows = list(first.values())
    out.disagreeing = [first[key]["id"] for key, found in answers.items() if len(found) > 1]
    return out


def published_answer(raw: str) -> str:
    """The answer as published: an integer literal canonically (``023`` -> ``23``, ``1,000`` ->
    ``1000``: the same number), anything else verbatim; never transformed into another value."""
    return canonical_integer(raw) or raw.strip()


def _published_row(row: Row, index: int, answer: str, source_name: str) -> dict[str, Any]:
    """An output row (the columns of ``TRAIN_SCHEMA``) of a problem kept as published."""
    return {
        "id": row.fixed_id or problem_id(row.problem),
        "problem": row.problem,
        "answer": answer,
        "source": source_name,
        "prompt": row.prompt if row.prompt is not None else apply_template(row.problem),
        "source_id": row.source_id,
        "source_row": index,
        "original_answer": row.answer,
        "answer_form": "integer" if canonical_integer(row.answer) else "as published",
        "copies": 1,
    }


def prepare_eval_sets(
    specs: Mapping[str, str],
    eval_dir: Path,
    required: Iterable[str] = (),
    progress: bool = True,
) -> dict[str, Any]:
    """Write each eval set that can be prepared to ``eval_dir/<name>.parquet`` and a manifest
    listing every set: ``ready`` (problems, drop counts) or ``unavailable`` (why). A set named
    in ``required`` (given on the command line) that cannot be read is an error instead.
    ``progress`` prints a line per prepared set."""
    required = set(required)
    previous = read_manifest(eval_dir)
    manifest: dict[str, Any] = {}
    tables: dict[str, list[dict]] = {}  # written once every required set is read
    for name, spec in specs.items():
        check_name(name)
        try:
            rows, entry = prepare_eval_set(name, spec)
        except (FileNotFoundError, SourceUnavailable) as e:
            if name in required:
                raise
            reason = getattr(e, "reason", str(e))  # not the error met: the same on every run
            manifest[name] = {"spec": spec, "status": "unavailable", "reason": reason}
            console.print(
                f"[yellow]warning:[/] eval set {name} not prepared ({_headline(e)}); how to "
                f"prepare it: {eval_dir / MANIFEST}"
            )
            continue
        tables[entry["file"]] = rows
        manifest[name] = entry
        if progress:
            console.print(f"eval set {name}: {entry['problems']} problems, answers as published")
    eval_dir.mkdir(parents=True, exist_ok=True)
    for file, rows in tables.items():
        write_parquet(rows, TRAIN_SCHEMA, eval_dir / file)
    for name, entry in previous.items():  # drop files of sets no longer ready
        if manifest.get(name, {}).get("status") != "ready" and entry.get("file"):
            (eval_dir / entry["file"]).unlink(missing_ok=True)
    write_json({"eval_sets": manifest, "notes": EVAL_NOTES}, eval_dir / MANIFEST)
    return manifest


def eval_sets_for_decontamination(
    specs: Mapping[str, str], eval_dir: Path, required: Iterable[str] = ()
) -> tuple[dict[str, list[Problem]], dict[str, str]]:
    """({name: problems}, {name: why unavailable}) as the manifest in ``eval_dir`` records them
    for the same spec (so the result depends on the prepared sets, DVC's dependency, and not
    on whether the hub is reachable now); a set it does not record is read from its spec now."""
    required = set(required)
    manifest = read_manifest(eval_dir)
    ready: dict[str, list[Problem]] = {}
    missing: dict[str, str] = {}
    for name, spec in specs.items():
        entry = manifest.get(check_name(name), {})
        prepared = eval_dir / f"{name}.parquet"
        same = entry.get("spec") == spec
        if same and entry.get("status") == "ready" and prepared.exists():
            ready[name] = rows_to_problems(pq.read_table(prepared).to_pylist())
            continue
        if same and entry.get("status") == "unavailable" and name not in required:
            missing[name] = str(entry.get("reason"))  # warned when it was prepared
            continue
        try:
            rows, _ = prepare_eval_set(name, spec)
            ready[name] = rows_to_problems(rows)
        except (FileNotFoundError, SourceUnavailable) as e:
            if name in required:
                raise
            missing[name] = str(e)
            console.print(
                f"[yellow]warning:[/] not decontaminating against eval set {name} "
                f"({_headline(e)}); the report lists why"
            )
    return ready, missing


def _headline(error: Exception) -> str:
    """The first sentence of an error and the error met, for a one-line warning (the whole
    advice is recorded)."""
    text = getattr(error, "reason", str(error))
    cut = min((i for i in (text.find(". "), text.find(" (")) if i > 0), default=len(text))
    detail = getattr(error, "detail", "")
    return text[:cut] + (f": {detail}" if detail else "")


# ---------------------------------------------------------------------------------------------
# Reading: a name from data.eval_sets or a path -> problems
# ---------------------------------------------------------------------------------------------


def missing_eval_set_message(name: str, spec: str, eval_dir: Path | None = None) -> str:
    """Why eval set ``name`` is not prepared and how to prepare it (for `dapo evaluate`)."""
    eval_dir = eval_dir or default_eval_dir()
    entry = read_manifest(eval_dir).get(name, {})
    head = (
        f"eval set {name!r} ({spec}) is not prepared ({eval_dir / (name + '.parquet')} is missing)"
    )
    if entry.get("status") == "unavailable" and entry.get("spec") == spec:
        return (
            f"{head}: the last preparation ({eval_dir / MANIFEST}) could not read it: "
            f"{entry.get('reason')} With network access, `dvc repro eval_sets` prepares it."
        )
    stale = ""
    if entry.get("spec") not in (None, spec):
        stale = f"; it was prepared from {entry['spec']!r}, params now say {spec!r}"
    return (
        f"{head}{stale}. To prepare it: run `dvc repro eval_sets` (or `dapo curate --step eval`) "
        f"where the Hugging Face Hub is reachable; or download it elsewhere and set "
        f"data.eval_sets.{name} in params.yaml to the local parquet/jsonl path; or evaluate on "
        "the file directly: `dapo evaluate --eval-set /path/to/file.parquet`."
    )


def named_eval_set(name: str, spec: str) -> list[Problem]:
    """A set from ``data.eval_sets``: its prepared copy (data/eval/<name>.parquet, written by
    ``dapo curate``/``dvc repro`` from this same spec); else, for a local file, the file
    prepared in memory; else an error that says how to prepare it."""
    prepared = default_eval_dir() / f"{name}.parquet"
    made_from = read_manifest().get(name, {}).get("spec")
    if prepared.exists() and made_from in (None, spec):
        return load_problems(prepared)
    if local_path(spec) is not None:
        rows, _ = prepare_eval_set(name, spec)
        return rows_to_problems(rows)
    raise FileNotFoundError(missing_eval_set_message(name, spec))


def eval_set_problems(cfg: Config, name_or_path: str) -> tuple[str, list[Problem]]:
    """(name, problems) of a name from ``data.eval_sets`` or a path to a parquet/jsonl file
    (a curated table, else a raw file prepared now); ``synthetic-test``: see splits."""
    check_eval_set(cfg, name_or_path)
    if name_or_path in cfg.data.eval_sets:
        name = name_or_path
        problems = named_eval_set(name, cfg.data.eval_sets[name])
    else:
        name, problems = _file_problems(Path(name_or_path))
    if not problems:  # an evaluation of nothing would report metrics of nothing
        raise ConfigError(
            f"eval set {name_or_path!r} holds no problem: give a parquet or jsonl file with a "
            "problem and its answer on each row"
        )
    return name, problems


def check_eval_set(cfg: Config, name_or_path: str | None) -> None:
    """Refuse an eval set (default ``eval.eval_set``) that is neither a name the config knows
    nor a file: a command checks it before it trains, not after."""
    name = name_or_path or cfg.eval.eval_set
    if name == SYNTHETIC_TEST or name in cfg.data.eval_sets or Path(name).exists():
        return
    known = [SYNTHETIC_TEST, *cfg.data.eval_sets]
    raise FileNotFoundError(f"unknown eval set {name!r}: not a file, and not one of {known}")


def _file_problems(path: Path) -> tuple[str, list[Problem]]:
    """A curated table's problems, else a raw file's, curated now (e.g. the DAPO/verl schema)."""
    try:
        return path.stem, load_problems(path)
    except ValueError:  # not a curated file
        name = eval_set_name(str(path))
        rows, entry = prepare_eval_set(name, str(path))
        # An unreadable row is a problem the evaluation silently lacks: said once per file
        # (a command reads its eval set up front, to refuse a bad one, and again to evaluate).
        if entry["dropped"] and str(path.resolve()) not in _warned_files:
            _warned_files.add(str(path.resolve()))
            counts = ", ".join(f"{n} {reason}" for reason, n in entry["dropped"].items())
            log.warning(
                "eval set %s: %d of %d rows left out (%s)",
                path,
                entry["input_rows"] - len(rows),
                entry["input_rows"],
                counts,
            )
        return name, rows_to_problems(rows)
