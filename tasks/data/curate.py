"""Curation I/O (DESIGN section 3; DAPO section 3.5): sources in, curated parquet files out.

The pure steps live in ``dapo_core.curation``; this module reads the sources, applies them row by
row and writes the results. Nothing here raises on a bad row: malformed rows are quarantined.

Sources (``data.source``, ``dapo curate --source``; eval sets use the same readers):

- a local parquet / jsonl file (or a directory of them), in either schema:
  DAPO/verl (``prompt`` = chat messages whose user turn carries the DAPO template,
  ``reward_model.ground_truth``, ``extra_info`` with ``index`` and, in the AIME files,
  ``raw_problem``), or plain records (``problem``/``question``, ``answer``, optional ``id``);
- a Hugging Face dataset id such as ``BytedTsinghua-SIA/DAPO-Math-17k``, downloaded with
  ``huggingface_hub`` (offline: a :class:`SourceUnavailable` that names the local-path way);
- ``synthetic:arith``: the embedded task of ``dapo_core.synthetic`` (its train split), built from
  the ``synthetic`` params.

Steps, each input row ending in exactly one place (``report.json`` accounts for all of them):

1. parse: problem (template stripped) and answer, or a malformed-row reason;
2. answer: canonical integer (``"023"`` -> ``"23"``), else ``integerize`` (the problem gets the
   form's instruction appended and the answer becomes the reported integer), else dropped;
3. dedupe: copies of a problem (whitespace-insensitive ``dedupe_key``) collapse into the first;
   a problem whose copies disagree on the (normalised) answer is dropped, every copy of it;
4. decontaminate against every eval set (``Decontaminator`` with the corpus as boilerplate
   filter); for training sources only;
5. split: the ``data.val_size`` problems with the smallest hash of their id form the validation
   set (deterministic, independent of row order); the rest, in source order, the training set.

Outputs of a training source (``data.out_dir``): ``train.parquet``, ``val.parquet`` (when
``val_size > 0``), ``rejected.parquet`` (every dropped row except plain duplicates, with
``reason`` and ``detail``) and ``report.json``. Eval sets: ``data/eval/<name>.parquet`` and
``data/eval/manifest.json`` (which sets are ready, which are unavailable and why).

Ids are stable across runs: the first 16 hex digits of the sha1 of the problem's dedupe key
(the synthetic task keeps its own ``arith-NNNNNN`` ids).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dapo_core.config import Config, ConfigError
from dapo_core.curation import (
    Decontaminator,
    apply_template,
    canonical_integer,
    dedupe_key,
    integerize,
    strip_template,
)
from dapo_core.errors import PipelineError
from dapo_core.problem import Problem
from dapo_core.synthetic import SOURCE_NAME as SYNTHETIC_ARITH
from dapo_core.synthetic import arith_problems
from tasks.data.problems import EVAL_DIR
from tasks.params import REPO_ROOT, repo_path

MANIFEST = "manifest.json"
DATA_SUFFIXES = (".parquet", ".jsonl")
STEPS = ("all", "eval", "train")

# Reasons a row is dropped. Malformed-row reasons come first; all end up in the report.
MALFORMED = (
    "invalid_json",
    "not_a_record",
    "missing_problem",
    "empty_problem",
    "problem_wrong_type",
    "bad_prompt_structure",
    "missing_answer",
    "empty_answer",
    "answer_wrong_type",
)
DUPLICATE = "duplicate"
CONFLICT = "conflicting_answers"
NO_INTEGER = "no_integer_form"
CONTAMINATED = "contaminated"

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
_RECORD_CHARS = 4000  # a rejected row's raw record is kept (as JSON) up to this length

_console = Console(stderr=True)


class SourceUnavailable(PipelineError):
    """A source that cannot be read here (offline hub id, missing file); says what to do."""


# ---------------------------------------------------------------------------------------------
# Resolving a source spec: synthetic task, local file, or Hugging Face dataset id
# ---------------------------------------------------------------------------------------------

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Source:
    kind: str  # "synthetic" | "file" | "hub"
    spec: str  # as given
    path: Path | None = None  # local file or directory ("file")

    @property
    def name(self) -> str:
        """What the ``source`` column says: the hub id, the file name, or the synthetic task."""
        return self.path.name if self.kind == "file" and self.path else self.spec


def local_path(spec: str) -> Path | None:
    """An existing file or directory named by ``spec``: absolute, else relative to the repo root
    (params values; also inside DVC's experiment copies), else to the current directory."""
    for candidate in (repo_path(spec), Path(spec)):
        if candidate.exists():
            return candidate.resolve()
    return None


def resolve_source(spec: str, alternative: str = "data.source") -> Source:
    """Classify ``spec``; a missing local file is a FileNotFoundError that says what is accepted."""
    spec = spec.strip()
    if spec.startswith("synthetic:"):
        if spec != SYNTHETIC_ARITH:
            raise ConfigError(
                f"unknown synthetic task {spec!r}; the embedded one is {SYNTHETIC_ARITH}"
            )
        return Source("synthetic", spec)
    path = local_path(spec)
    if path is not None:
        return Source("file", spec, path)
    hub = spec.removeprefix("hf://datasets/")
    if _HUB_ID.match(hub) and not hub.endswith(DATA_SUFFIXES):
        return Source("hub", hub)
    raise FileNotFoundError(
        f"{spec} does not exist (looked under {REPO_ROOT} and the current directory). A source "
        "is a parquet/jsonl file, a Hugging Face dataset id (owner/name) or synthetic:arith; "
        f"{alternative}"
    )


def download_hub_dataset(repo_id: str, alternative: str) -> Path:
    """The local snapshot of a hub dataset's data files (the HF cache is used when present)."""
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                repo_id, repo_type="dataset", allow_patterns=[f"*{s}" for s in DATA_SUFFIXES]
            )
        )
    except Exception as e:  # noqa: BLE001 - offline, not found, gated: all mean "not here"
        first = (str(e).strip().splitlines() or [""])[0]
        first = first if len(first) <= 300 else first[:300] + "..."
        raise SourceUnavailable(
            f"could not download the dataset {repo_id!r} from the Hugging Face Hub "
            f"({type(e).__name__}: {first}) Offline? Fetch it where there is network "
            f"(`hf download {repo_id} --repo-type dataset --local-dir DIR`); {alternative}"
        ) from None


def data_files(path: Path) -> list[Path]:
    """The parquet/jsonl files of a file or directory (sorted, hidden files skipped)."""
    if path.is_file():
        if path.suffix not in (*DATA_SUFFIXES, ".json"):
            raise ConfigError(f"{path}: expected a .parquet, .jsonl or .json file")
        return [path]
    files = sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and p.suffix in DATA_SUFFIXES and not p.name.startswith(".")
    )
    if not files:
        raise FileNotFoundError(f"{path} holds no .parquet or .jsonl files")
    return files


def sha256_files(files: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Reading records: (row index, record or a Malformed) per input row
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Malformed:
    reason: str
    detail: str


def count_rows(files: list[Path]) -> int:
    total = 0
    for f in files:
        if f.suffix == ".parquet":
            total += pq.ParquetFile(f).metadata.num_rows
        elif f.suffix == ".jsonl":
            with open(f, "rb") as fh:
                total += sum(1 for line in fh if line.strip())
        else:
            total += 1
    return total


def iter_file_records(files: list[Path]) -> Iterator[Any]:
    """Records of the files in order; an unreadable jsonl line is a Malformed, not an error.
    Blank jsonl lines are not rows."""
    for f in files:
        if f.suffix == ".parquet":
            for batch in pq.ParquetFile(f).iter_batches(batch_size=8192):
                yield from batch.to_pylist()
        elif f.suffix == ".jsonl":
            with open(f, encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        yield json.loads(line)
                    except ValueError as e:
                        yield Malformed("invalid_json", f"{f.name} line {n}: {e}")
        else:  # .json: one list of records
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
            except ValueError as e:
                yield Malformed("invalid_json", f"{f.name}: {e}")
                continue
            yield from data if isinstance(data, list) else [data]


# ---------------------------------------------------------------------------------------------
# Parsing one record
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """A well-formed input row: the bare problem and its raw answer."""

    problem: str
    answer: str
    source_id: str | None = None
    prompt: str | None = None  # set by the synthetic task (its own prompt); else the template
    fixed_id: str | None = None  # the synthetic task's own id


@functools.lru_cache(maxsize=1 << 16)
def _strip(content: str) -> str:
    # Cached: the released DAPO file repeats each of ~17.9k prompts 100 times.
    return strip_template(content)


def _problem_from_prompt(prompt: Any) -> str | Malformed:
    """The bare problem of a chat ``prompt`` (the last user turn), or why it cannot be read."""
    if isinstance(prompt, str):
        text = prompt.strip()
        if text.startswith("["):  # a messages list serialised as JSON text
            try:
                prompt = json.loads(text)
            except ValueError:
                return _strip(prompt)
        else:
            return _strip(prompt)
    if not isinstance(prompt, (list, tuple)) or not prompt:
        return Malformed("bad_prompt_structure", f"prompt is {_describe(prompt)}, not messages")
    users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users:
        return Malformed("bad_prompt_structure", "prompt has no message with role 'user'")
    content = users[-1].get("content")
    if not isinstance(content, str):
        return Malformed("bad_prompt_structure", f"user content is {_describe(content)}")
    return _strip(content)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}"


def _first_present(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def parse_record(rec: Any) -> Row | Malformed:
    """One input record -> a Row, or the reason it is malformed (never raises)."""
    if isinstance(rec, Malformed):
        return rec
    if isinstance(rec, Problem):
        return Row(rec.problem, rec.answer, rec.id, prompt=rec.prompt, fixed_id=rec.id)
    if not isinstance(rec, Mapping):
        return Malformed("not_a_record", f"row is {_describe(rec)}")
    extra = rec.get("extra_info")
    extra = extra if isinstance(extra, Mapping) else {}
    reward = rec.get("reward_model")

    # Problem: plain schema first, then the AIME files' raw_problem, then the chat prompt.
    problem = _first_present(rec.get("problem"), rec.get("question"))
    if problem is None and isinstance(extra.get("raw_problem"), str) and extra["raw_problem"]:
        problem = extra["raw_problem"]
    if problem is None and "prompt" in rec:
        if rec["prompt"] is None:
            return Malformed("missing_problem", "prompt is null")
        problem = _problem_from_prompt(rec["prompt"])
        if isinstance(problem, Malformed):
            return problem
    if problem is None:
        return Malformed("missing_problem", "no problem, question or prompt field")
    if not isinstance(problem, str):
        return Malformed("problem_wrong_type", f"problem is {_describe(problem)}")
    problem = _strip(problem)
    if not problem:
        return Malformed("empty_problem", "problem is empty after stripping the template")

    # Answer: plain schema, then the DAPO/verl reward_model.ground_truth, then a label.
    if reward is not None and not isinstance(reward, Mapping) and rec.get("answer") is None:
        return Malformed("answer_wrong_type", f"reward_model is {_describe(reward)}")
    truth = reward.get("ground_truth") if isinstance(reward, Mapping) else None
    answer = _first_present(rec.get("answer"), truth, rec.get("label"), rec.get("ground_truth"))
    if answer is None:
        return Malformed("missing_answer", "no answer, reward_model.ground_truth or label")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        return Malformed("answer_wrong_type", f"answer is {_describe(answer)}")
    if isinstance(answer, float):
        if not answer.is_integer():
            return Malformed("answer_wrong_type", f"answer is a float {answer!r}, not a string")
        answer = int(answer)
    answer = str(answer).strip()
    if not answer:
        return Malformed("empty_answer", "answer is empty")

    source_id = _first_present(extra.get("index"), rec.get("id"), rec.get("unique_id"))
    return Row(problem, answer, None if source_id is None else str(source_id))


# ---------------------------------------------------------------------------------------------
# Answers
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    value: str  # canonical integer string
    form: str  # "integer" or the integerize form
    instruction: str  # appended to the problem ("" for integers)


@functools.lru_cache(maxsize=1 << 16)
def normalize_answer(raw: str) -> Answer | None:
    """Canonical integer, else the integer form of ``integerize``, else None (no integer form)."""
    canonical = canonical_integer(raw)
    if canonical is not None:
        return Answer(canonical, "integer", "")
    found = integerize(raw)
    if found is None:
        return None
    if found.form == "integer":  # "\boxed{5}", "10\%", "x=5": an integer in disguise
        return Answer(str(found.value), "integer", "")
    return Answer(str(found.value), found.form, found.instruction)


def with_instruction(problem: str, answer: Answer) -> str:
    return f"{problem} {answer.instruction}" if answer.instruction else problem


def problem_id(problem: str) -> str:
    """Stable id: the sha1 of the whitespace-free problem text, 16 hex digits."""
    return hashlib.sha1(dedupe_key(problem).encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# The curation pass (no file I/O): rows in, kept problems + rejected rows + counts out
# ---------------------------------------------------------------------------------------------


@dataclass
class _Group:
    first: Row
    first_row: int
    answer: Answer | None
    copies: list[tuple[int, str, str]] = field(default_factory=list)  # (row, raw answer, key)


@dataclass
class Curated:
    """The result of one pass: kept problems (output rows) and where every other row went."""

    input_rows: int = 0
    kept: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    conflicting_problems: int = 0
    converted: Counter = field(default_factory=Counter)  # integerized answers kept, by form
    matches: list[dict[str, Any]] = field(default_factory=list)  # decontamination hits


def _record_json(rec: Any) -> str:
    if isinstance(rec, Malformed):
        return ""
    if isinstance(rec, Problem):
        rec = dataclasses.asdict(rec)
    try:
        text = json.dumps(rec, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(rec)
    return text[:_RECORD_CHARS]


def _reject(out: Curated, row: int, reason: str, detail: str, **extra: Any) -> None:
    out.dropped[reason] += 1
    out.rejected.append(
        {
            "source_row": row,
            "reason": reason,
            "detail": detail,
            "problem": extra.get("problem"),
            "answer": extra.get("answer"),
            "record": extra.get("record", ""),
        }
    )


def curate_records(
    records: Iterable[Any],
    source_name: str,
    eval_problems: Mapping[str, list[Problem]] | None = None,
    *,
    ngram: int = 8,
    threshold: float = 0.5,
    track: Callable[[str, int | None], Callable[[int], None]] | None = None,
) -> Curated:
    """Parse, normalise, dedupe and (when eval problems are given) decontaminate ``records``.

    ``track(description, total)`` returns an ``advance(n)`` callback (a progress bar) for each
    phase. Kept problems come out in source order as output rows (the TRAIN_SCHEMA columns)."""
    out = Curated()
    advance = track("read", None) if track is not None else None
    groups: dict[str, _Group] = {}
    for index, rec in enumerate(records):
        out.input_rows += 1
        if advance is not None and index % 1024 == 1023:
            advance(1024)
        row = parse_record(rec)
        if isinstance(row, Malformed):
            _reject(out, index, row.reason, row.detail, record=_record_json(rec))
            continue
        answer = normalize_answer(row.answer)
        # Copies agree when their normalised answers do ("023" == "23", "1/2" == "\frac12").
        agree_key = f"{answer.value}|{answer.instruction}" if answer else f"raw|{row.answer}"
        key = dedupe_key(row.problem)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(row, index, answer)
        group.copies.append((index, row.answer, agree_key))
    if advance is not None:
        advance(out.input_rows % 1024)

    candidates: list[_Group] = []
    for group in groups.values():
        keys = {k for _, _, k in group.copies}
        if len(keys) > 1:
            out.conflicting_problems += 1
            answers = sorted({a for _, a, _ in group.copies})
            for row, raw, _ in group.copies:
                _reject(
                    out,
                    row,
                    CONFLICT,
                    f"{len(group.copies)} copies with answers {answers}",
                    problem=group.first.problem,
                    answer=raw,
                )
            continue
        out.dropped[DUPLICATE] += len(group.copies) - 1
        if group.answer is None:
            _reject(
                out,
                group.first_row,
                NO_INTEGER,
                "the answer has no integer form",
                problem=group.first.problem,
                answer=group.first.answer,
            )
            continue
        candidates.append(group)

    detector = None
    if eval_problems and any(eval_problems.values()):
        texts = [p.problem for probs in eval_problems.values() for p in probs]
        ids = [f"{name}/{p.id}" for name, probs in eval_problems.items() for p in probs]
        detector = Decontaminator(
            texts, ids, n=ngram, threshold=threshold, corpus=[g.first.problem for g in candidates]
        )
    step = track("decontaminate", len(candidates)) if track and detector else None
    for group in candidates:
        row, answer = group.first, group.answer
        assert answer is not None
        if detector is not None:
            if step is not None:
                step(1)
            found = detector.best(row.problem)
            if found is not None and found[1] >= threshold:
                out.matches.append(
                    {"source_row": group.first_row, "eval": found[0], "score": round(found[1], 4)}
                )
                _reject(
                    out,
                    group.first_row,
                    CONTAMINATED,
                    f"matches {found[0]} (n-gram overlap {found[1]:.2f})",
                    problem=row.problem,
                    answer=row.answer,
                )
                continue
        problem = with_instruction(row.problem, answer)
        if answer.form != "integer":
            out.converted[answer.form] += 1
        out.kept.append(
            {
                "id": row.fixed_id or problem_id(row.problem),
                "problem": problem,
                "answer": answer.value,
                "source": source_name,
                "prompt": row.prompt if row.prompt is not None else apply_template(problem),
                "source_id": row.source_id,
                "source_row": group.first_row,
                "original_answer": row.answer,
                "answer_form": answer.form,
                "copies": len(group.copies),
            }
        )
    return out


def split_validation(kept: list[dict[str, Any]], val_size: int) -> tuple[list, list]:
    """(train, val): val = the ``val_size`` problems with the smallest sha1 of their id."""
    if val_size <= 0:
        return kept, []
    if val_size >= len(kept):
        raise PipelineError(
            f"data.val_size ({val_size}) leaves no training problems: only {len(kept)} were "
            "kept; lower data.val_size (e.g. -S data.val_size=0)"
        )
    order = sorted(range(len(kept)), key=lambda i: hashlib.sha1(kept[i]["id"].encode()).digest())
    chosen = set(order[:val_size])
    val = [kept[i] for i in order[:val_size]]
    train = [r for i, r in enumerate(kept) if i not in chosen]
    return train, val


# ---------------------------------------------------------------------------------------------
# Reading a source end to end
# ---------------------------------------------------------------------------------------------


@dataclass
class Loaded:
    source: Source
    records: Iterable[Any]
    total: int
    sha256: str | None


def load_source(spec: str, cfg: Config | None, alternative: str) -> Loaded:
    """Open a source spec for reading (downloads a hub dataset; synthetic needs ``cfg``)."""
    src = resolve_source(spec, alternative)
    if src.kind == "synthetic":
        if cfg is None:
            raise ConfigError("the synthetic source needs the synthetic params")
        s = cfg.synthetic
        train, _ = arith_problems(s.seed, s.num_train, s.num_test, s.max_operand, s.num_terms)
        return Loaded(src, train, len(train), None)
    path = src.path if src.kind == "file" else download_hub_dataset(src.spec, alternative)
    assert path is not None
    files = data_files(path)
    return Loaded(src, iter_file_records(files), count_rows(files), sha256_files(files))


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_console,
        disable=not enabled,
    )


def _read_and_curate(
    loaded: Loaded,
    label: str,
    eval_problems: Mapping[str, list[Problem]] | None,
    ngram: int,
    threshold: float,
    progress: bool,
) -> Curated:
    with _progress(progress) as bar:
        tasks: list[Any] = []

        def track(phase: str, total: int | None) -> Callable[[int], None]:
            if tasks:  # the previous phase is complete
                bar.update(tasks[-1], total=bar.tasks[-1].completed)
            tasks.append(bar.add_task(f"{label}: {phase}", total=total or loaded.total))
            task = tasks[-1]
            return lambda n: bar.advance(task, n)

        result = curate_records(
            loaded.records,
            loaded.source.name,
            eval_problems,
            ngram=ngram,
            threshold=threshold,
            track=track,
        )
        for task in bar.tasks:
            bar.update(task.id, total=task.completed)
    return result


# ---------------------------------------------------------------------------------------------
# Eval sets: data/eval/<name>.parquet + manifest.json
# ---------------------------------------------------------------------------------------------

_NAME = re.compile(r"^[\w][\w.-]*$")
_GENERIC_STEMS = {"test", "train", "data", "validation", "val", "dev"}


def eval_set_name(spec: str) -> str:
    """A name for an eval-set spec: the file stem (its folder's name for test.jsonl and the
    like), or the hub id's name, lower-cased: BytedTsinghua-SIA/AIME-2024 -> aime-2024."""
    path = Path(spec.removeprefix("hf://datasets/"))
    stem = path.stem if path.suffix in (*DATA_SUFFIXES, ".json") else path.name
    if stem.lower() in _GENERIC_STEMS and path.parent.name:
        stem = path.parent.name
    return stem.lower()


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


def check_name(name: str) -> str:
    if not _NAME.match(name) or name == "manifest":
        raise ConfigError(f"bad eval set name {name!r}: use letters, digits, '.', '_' and '-'")
    return name


def read_manifest(eval_dir: Path | None = None) -> dict[str, Any]:
    path = (eval_dir or repo_path(EVAL_DIR)) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("eval_sets", {}) if isinstance(data, dict) else {}


def prepare_eval_set(name: str, spec: str, progress: bool = False) -> tuple[list[dict], dict]:
    """(rows, manifest entry) of one eval set: the curation steps without decontamination.

    Raises FileNotFoundError / SourceUnavailable when the spec cannot be read here."""
    alternative = (
        f"to use a local file, set data.eval_sets.{name} in params.yaml to its path (then `dvc "
        "repro`), or pass it directly: `dapo evaluate --eval-set PATH`."
    )
    loaded = load_source(spec, None, alternative)
    result = _read_and_curate(loaded, f"eval set {name}", None, 8, 0.5, progress)
    entry = {
        "spec": spec,
        "status": "ready",
        "file": f"{name}.parquet",
        "source": loaded.source.name,
        "sha256": loaded.sha256,
        "input_rows": result.input_rows,
        "problems": len(result.kept),
        "dropped": {k: v for k, v in sorted(result.dropped.items()) if v},
        "converted": dict(sorted(result.converted.items())),
    }
    return result.kept, entry


def rows_to_problems(rows: Iterable[Mapping[str, Any]]) -> list[Problem]:
    return [Problem(r["id"], r["problem"], r["answer"], r["prompt"], r["source"]) for r in rows]


def prepare_eval_sets(
    specs: Mapping[str, str],
    eval_dir: Path,
    required: Iterable[str] = (),
    progress: bool = True,
) -> dict[str, Any]:
    """Write each eval set that can be prepared to ``eval_dir/<name>.parquet`` and a manifest
    listing every set: ``ready`` (problems, drop counts) or ``unavailable`` (why). A set named
    in ``required`` (given on the command line) that cannot be read is an error instead."""
    required = set(required)
    eval_dir.mkdir(parents=True, exist_ok=True)
    previous = read_manifest(eval_dir)
    manifest: dict[str, Any] = {}
    for name, spec in specs.items():
        check_name(name)
        try:
            rows, entry = prepare_eval_set(name, spec, progress)
        except (FileNotFoundError, SourceUnavailable) as e:
            if name in required:
                raise
            manifest[name] = {"spec": spec, "status": "unavailable", "reason": str(e)}
            _console.print(f"[yellow]warning:[/] eval set {name} not prepared: {e}")
            continue
        _write_parquet(rows, TRAIN_SCHEMA, eval_dir / entry["file"])
        manifest[name] = entry
    for name, entry in previous.items():  # drop files of sets no longer ready
        if manifest.get(name, {}).get("status") != "ready" and entry.get("file"):
            (eval_dir / entry["file"]).unlink(missing_ok=True)
    _write_json({"eval_sets": manifest, "notes": EVAL_NOTES}, eval_dir / MANIFEST)
    return manifest


EVAL_NOTES = (
    "Eval sets named in data.eval_sets (or --eval-set). 'ready' sets are in <name>.parquet "
    "(columns id, problem, answer, source, prompt, ...); 'unavailable' ones could not be read "
    "here (offline hub id, missing file): see 'reason' for how to provide them."
)


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
            missing[name] = str(entry.get("reason"))
            _console.print(
                f"[yellow]warning:[/] not decontaminating against eval set {name}: "
                f"unavailable ({eval_dir / MANIFEST})"
            )
            continue
        try:
            rows, _ = prepare_eval_set(name, spec)
            ready[name] = rows_to_problems(rows)
        except (FileNotFoundError, SourceUnavailable) as e:
            if name in required:
                raise
            missing[name] = str(e)
            _console.print(f"[yellow]warning:[/] not decontaminating against eval set {name}: {e}")
    return ready, missing


def missing_eval_set_message(name: str, spec: str, eval_dir: Path | None = None) -> str:
    """Why eval set ``name`` is not prepared and how to prepare it (for `dapo evaluate`)."""
    eval_dir = eval_dir or repo_path(EVAL_DIR)
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


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def _write_parquet(rows: list[dict[str, Any]], schema: pa.Schema, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def _write_json(data: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# The command: dapo curate
# ---------------------------------------------------------------------------------------------


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
    d = cfg.data
    required = set(eval_sets or ())
    specs = dict(eval_sets) if eval_sets is not None else dict(d.eval_sets)
    edir = Path(eval_dir) if eval_dir is not None else repo_path(EVAL_DIR)
    manifest: dict[str, Any] = {}
    if step in ("all", "eval"):
        manifest = prepare_eval_sets(specs, edir, required, progress)
    if step == "eval":
        return CurateSummary(None, edir, None, manifest)

    out_dir = Path(out) if out is not None else repo_path(d.out_dir)
    loaded = load_source(
        source or d.source,
        cfg,
        "to use a local file, pass `dapo curate --source PATH` or set data.source in "
        "params.yaml to its path (a parquet/jsonl file in the DAPO or {problem, answer} schema).",
    )
    ready, missing = eval_sets_for_decontamination(specs, edir, required)
    result = _read_and_curate(
        loaded,
        f"curate {loaded.source.name}",
        ready,
        d.decontam_ngram,
        d.decontam_threshold,
        progress,
    )
    train, val = split_validation(result.kept, d.val_size)
    report = {
        "source": loaded.source.name,
        "source_kind": loaded.source.kind,
        "source_sha256": loaded.sha256,
        "input_rows": result.input_rows,
        "kept": len(result.kept),
        "train": len(train),
        "val": len(val),
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
        "notes": (
            "kept = train + val (the validation rows count as kept), and kept + sum(dropped) "
            "= input_rows. 'duplicate' counts the extra copies of a problem whose copies agree "
            "(the first copy is kept or dropped for its own reason); 'conflicting_answers' "
            "counts every copy of a problem whose copies disagree. rejected.parquet holds every "
            "dropped row except plain duplicates. 'converted' counts kept problems whose answer "
            "was rewritten into integer form (instruction appended to the problem)."
        ),
    }
    assert report["kept"] + sum(report["dropped"].values()) == report["input_rows"]
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_parquet(train, TRAIN_SCHEMA, out_dir / "train.parquet")
    if val:
        _write_parquet(val, TRAIN_SCHEMA, out_dir / "val.parquet")
    else:
        (out_dir / "val.parquet").unlink(missing_ok=True)
    _write_parquet(result.rejected, REJECTED_SCHEMA, out_dir / "rejected.parquet")
    _write_json(report, out_dir / "report.json")
    return CurateSummary(out_dir, edir, report, manifest)


# ---------------------------------------------------------------------------------------------
# The data version that runs record
# ---------------------------------------------------------------------------------------------


def data_version(root: str | Path = REPO_ROOT) -> str:
    """The data version of the checkout at ``root``: derived from the md5s of the stage outputs
    in its ``dvc.lock`` ("none" without one). One definition, shared with the MLflow tag
    ``data.version`` (``tasks.tracking.tracker.data_version``): the single output's md5, or the md5 of
    the sorted ``path:md5`` lines when there are several."""
    from tasks.tracking.tracker import data_version as from_lock

    return from_lock(Path(root) / "dvc.lock")
