"""Model directories the project builds on first use, built once and safely.

Three kinds are built, not downloaded as they are: the embedded tiny model (tokenizer, random
init, supervised warm start), a format warm start of any model, and a packaged or GGUF model
converted to an ordinary directory. Several processes may ask for the same one at once (two
workers of a sweep, a sweep and a ``dapo train``), and a build may be interrupted. So:

- one builder at a time: an advisory lock (``flock``) on ``.<name>.lock`` beside the directory,
  removed by its holder as it lets go; the others wait, then reuse what it built. The kernel drops
  the lock when its holder dies, so a killed builder never blocks the next one;
- a build is written into a private staging directory and published by a rename, with its build
  record, only when complete: nobody ever loads a half-built model;
- the record (``dapo_build.json``) holds everything the build depends on, including a digest of
  the build's own code (``code_digest``) and the library versions, so a directory built by other
  code is rebuilt, not silently reused; and a digest of the files built (``dir_digest``), which
  every run that trains from the directory records.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from dapo_core.errors import PipelineError
from tasks.durable import fsync_dir, parents_made_for, publish_dir

log = logging.getLogger(__name__)

BUILD_RECORD = "dapo_build.json"  # in a model directory the project built: what from
LIBRARIES = ("torch", "transformers", "tokenizers")  # their numerics shape what a build makes
HASH_LIMIT_BYTES = 1 << 30  # above this a directory's digest is of its file sizes, not contents


def code_digest(*modules: ModuleType) -> str:
    """A digest of the code of ``modules``, blind to comments, docstrings and formatting: a
    build made by other code (another warm-start optimizer, another tokenizer) differs, and a
    reworded comment does not force a rebuild."""
    h = hashlib.sha256()
    for module in sorted(modules, key=lambda m: m.__name__):
        tree = ast.parse(inspect.getsource(module))
        _drop_docstrings(tree)
        h.update(module.__name__.encode() + b"\0" + ast.dump(tree).encode() + b"\0")
    return h.hexdigest()[:16]


def _drop_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list) or not body:
            continue
        first = body[0]
        value = first.value if isinstance(first, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            node.body = body[1:] or [ast.Pass()]


def library_versions() -> dict[str, str]:
    out = {}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def read_record(path: Path) -> dict[str, Any] | None:
    """The build record of ``path``, or None (no record, or not readable as one)."""
    try:
        record = json.loads((path / BUILD_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def is_built(path: Path, spec: dict[str, Any]) -> bool:
    """Whether ``path`` holds a complete build of exactly ``spec`` (what ``ensure_built``
    records besides the spec, its digest, is not compared)."""
    record = read_record(path)
    return record is not None and record.get("spec") == spec


def ensure_built(out: Path, spec: dict[str, Any], build: Callable[[Path], Any], what: str) -> Path:
    """``out`` as built by ``build(staging_dir)`` from ``spec``: reused when its record says so,
    otherwise built (by this process, or by another one this process waits for) and published
    atomically with its record. ``what`` names the model in messages; a dict that ``build``
    returns is kept in the record as ``build`` (how the build went: steps, scores)."""
    if is_built(out, spec):
        return out
    with build_lock(out, what):
        if is_built(out, spec):  # built by the process we waited for
            log.warning("%s: reusing %s, built by another process while this one waited", what, out)
            return out
        _refuse_foreign(out, what)
        _remove_leftovers(out)
        staged = out.with_name(f".{out.name}.build-{os.getpid()}")
        try:
            info = build(staged)
            record = {"spec": spec, "digest": dir_digest(staged)}
            if isinstance(info, dict):
                record["build"] = info
            (staged / BUILD_RECORD).write_text(json.dumps(record, indent=2))
            publish(staged, out)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
    return out


@contextlib.contextmanager
def build_lock(out: Path, what: str) -> Iterator[None]:
    """Hold the build lock of ``out``; say who holds it while waiting for it. The holder removes
    the lock file as it lets go, so a failed build leaves no stray file beside the models."""
    lock = out.with_name(f".{out.name}.lock")
    with parents_made_for(out), _locked(lock, what, out) as f:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}")
        f.flush()
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)  # still held: a waiter re-opens what is there next


@contextlib.contextmanager
def _locked(lock: Path, what: str, out: Path) -> Iterator[Any]:
    """``lock`` opened and flock-ed. A lock file its holder removed while this process waited on
    it locks nothing any more, so the wait ends with a check that the file held is the one at
    ``lock``, and starts again on the new one if not."""
    while True:
        with lock.open("a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
                log.warning("%s: waiting for %s, which is building %s", what, holder, out)
                fcntl.flock(f, fcntl.LOCK_EX)
            try:
                current = os.stat(lock).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(f.fileno()).st_ino:
                try:
                    yield f
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
                return
            fcntl.flock(f, fcntl.LOCK_UN)


def _refuse_foreign(out: Path, what: str) -> None:
    """A build replaces only what a build made: anything else at ``out`` (a directory of the
    user's, a file) may be theirs, and is never deleted for a model."""
    if not out.exists() and not out.is_symlink():
        return
    a_dir = out.is_dir() and not out.is_symlink()
    if a_dir and (read_record(out) is not None or not any(out.iterdir())):
        return  # a build (of another spec: rebuilt), or nothing at all
    raise PipelineError(
        f"{out} exists and is not a model directory the project built, so building {what} "
        "there would replace it: choose another path, or move it away"
    )


def _remove_leftovers(out: Path) -> None:
    """Staging and retired directories of builders that died (we hold the lock: none is live)."""
    for stale in out.parent.glob(f".{out.name}.build-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in out.parent.glob(f".{out.name}.old-*"):
        shutil.rmtree(stale, ignore_errors=True)


def publish(staged: Path, out: Path) -> None:
    """Make ``staged`` appear as ``out`` in one rename, after its files reach the disk."""
    for path in sorted(staged.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    for path in [staged, *(p for p in staged.rglob("*") if p.is_dir())]:
        fsync_dir(path)
    publish_dir(staged, out, out.with_name(f".{out.name}.old-{os.getpid()}"))


def dir_digest(path: Path) -> str:
    """A digest of a model directory's files (names and contents; the build record excluded).
    Above ``HASH_LIMIT_BYTES`` (a 7B model is 15 GB) it digests names and sizes only and says so
    with a ``size:`` prefix, rather than reading the whole model at every run's start."""
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name != BUILD_RECORD)
    total = sum(p.stat().st_size for p in files)
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(path)).encode() + b"\0")
        if total > HASH_LIMIT_BYTES:
            h.update(str(p.stat().st_size).encode() + b"\0")
            continue
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return ("size:" if total > HASH_LIMIT_BYTES else "sha256:") + h.hexdigest()[:16]


def model_dir_digest(path: str | Path) -> str | None:
    """The digest of the model directory a run trains from (computed, not read from its build
    record, so a directory changed after its build still reads true); None for a hub id."""
    path = Path(path)
    return dir_digest(path) if path.is_dir() else None
