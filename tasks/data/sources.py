"""Data sources: resolving a source spec, downloading it, and reading its records (DAPO 3.5).

DAPO (arXiv 2503.14476, section 3.5) trains on DAPO-Math-17K and evaluates on AIME; here a source
(``data.source``, ``dapo curate --source``, each of ``data.eval_sets``) is one of

- a local parquet / jsonl / json file, or a directory of them (a path relative to the repo root,
  else to the current directory);
- a Hugging Face dataset id such as ``BytedTsinghua-SIA/DAPO-Math-17k``, downloaded with
  ``huggingface_hub`` (offline: a :class:`SourceUnavailable` that names the local-path way);
- ``synthetic:arith`` or ``synthetic:chain``: an embedded task of ``dapo_core.synthetic``, built
  from the ``synthetic`` params by :func:`synthetic_problems`.

Records come out one per input row, in order; an unreadable jsonl line is a
``dapo_core.records.Malformed`` rather than an error, so the curation pass can account for it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dapo_core.config import Config, ConfigError
from dapo_core.curation_pass import Curated, curate_records
from dapo_core.errors import PipelineError, first_line
from dapo_core.problem import Problem
from dapo_core.records import Malformed
from dapo_core.synthetic import TASKS as SYNTHETIC_TASKS
from dapo_core.synthetic import synthetic_task
from tasks.params import REPO_ROOT, repo_path

DATA_SUFFIXES = (".parquet", ".jsonl")

# soft_wrap: a message is one line (the terminal wraps it), so logs and tests see it whole.
console = Console(stderr=True, soft_wrap=True)

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class SourceUnavailable(PipelineError):
    """A source that cannot be read here (offline hub id, missing file); says what to do.
    ``reason`` is that advice alone; the message adds ``detail``, the error met here (which
    varies with the network: the eval sets' manifest, a DVC output, records the reason only)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason} [{detail}]" if detail else reason)
        self.reason, self.detail = reason, detail


def synthetic_problems(cfg: Config, task: str | None = None) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out test) of the embedded task with the ``synthetic`` params; the one call of
    the generator, so every caller sees the same problems. Which of the train problems are
    validation is decided by ``tasks.data.splits``."""
    s = cfg.synthetic
    task = (task or cfg.data.source).strip()
    return synthetic_task(task, s.seed, s.num_train, s.num_test, s.max_operand, s.num_terms)


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
        if spec not in SYNTHETIC_TASKS:
            raise ConfigError(
                f"unknown synthetic task {spec!r}; the embedded ones are "
                f"{', '.join(SYNTHETIC_TASKS)}"
            )
        return Source("synthetic", spec)
    path = local_path(spec)
    if path is not None:
        return Source("file", spec, path)
    hub = spec.removeprefix("hf://datasets/")
    if HUB_ID.match(hub) and not hub.endswith(DATA_SUFFIXES):
        return Source("hub", hub)
    raise FileNotFoundError(
        f"{spec} does not exist (looked under {REPO_ROOT} and the current directory). A source "
        "is a parquet/jsonl file, a Hugging Face dataset id (owner/name) or "
        f"{' / '.join(SYNTHETIC_TASKS)}; {alternative}"
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
        first = first_line(e, 300)
        raise SourceUnavailable(
            f"could not download the dataset {repo_id!r} from the Hugging Face Hub. Offline? "
            f"Fetch it where there is network (`hf download {repo_id} --repo-type dataset "
            f"--local-dir DIR`); {alternative}",
            f"{type(e).__name__}: {first}",
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


def _parquet(f: Path) -> pq.ParquetFile:
    """An open parquet file, or a one-line error for a corrupt or truncated one."""
    try:
        return pq.ParquetFile(f)
    except (pa.ArrowException, OSError) as e:
        raise SourceUnavailable(
            f"{f} is not a readable parquet file ({str(e).split('. ')[0]}); replace it with a "
            "good copy (re-download or re-export it)"
        ) from None


def count_rows(files: list[Path]) -> int:
    """Input rows of the files (a blank jsonl line is not a row; a .json file counts as one)."""
    total = 0
    for f in files:
        if f.suffix == ".parquet":
            total += _parquet(f).metadata.num_rows
        elif f.suffix == ".jsonl":
            with open(f, "rb") as fh:
                total += sum(1 for line in fh if line.strip())
        else:
            total += 1
    return total


def _jsonl_records(f: Path) -> Iterator[Any]:
    with open(f, encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError as e:
                yield Malformed("invalid_json", f"{f.name} line {n}: {e}")


def iter_file_records(files: list[Path]) -> Iterator[Any]:
    """Records of the files in order; an unreadable jsonl line is a Malformed, not an error.
    Blank jsonl lines are not rows."""
    for f in files:
        if f.suffix == ".parquet":
            for batch in _parquet(f).iter_batches(batch_size=8192):
                yield from batch.to_pylist()
        elif f.suffix == ".jsonl":
            yield from _jsonl_records(f)
        else:  # .json: one list of records
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
            except ValueError as e:
                yield Malformed("invalid_json", f"{f.name}: {e}")
                continue
            yield from data if isinstance(data, list) else [data]


@dataclass
class Loaded:
    """A source opened for reading: its records (lazily), their count and the files' sha256."""

    source: Source
    records: Iterable[Any]
    total: int
    sha256: str | None


def load_source(spec: str, cfg: Config | None, alternative: str) -> Loaded:
    """Open a source spec for reading (downloads a hub dataset; synthetic needs ``cfg``).

    The synthetic source is the generator's whole train split: curation then carves validation
    out of it with the same rule as ``tasks.data.splits``."""
    src = resolve_source(spec, alternative)
    if src.kind == "synthetic":
        if cfg is None:
            raise ConfigError("the synthetic source needs the synthetic params")
        train, _ = synthetic_problems(cfg, src.spec)
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
        console=console,
        disable=not enabled,
    )


def read_and_curate(
    loaded: Loaded,
    label: str,
    eval_problems: Mapping[str, list[Problem]] | None,
    ngram: int,
    threshold: float,
    progress: bool,
) -> Curated:
    """Run the pure curation pass over a loaded source, with a progress bar per phase."""
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
