"""The starting checkpoints the project ships: the embedded models its presets start from, built
once and committed under ``checkpoints/``, so every clone starts from the same bytes.

A build of the embedded model is deterministic on one machine but not across machines: another
CPU rounds differently and a steep supervised learning curve turns that into another model (and,
from there, another experiment). Researchers share a released base model for the same reason;
these checkpoints are ours. Git tracks them (a few MB; a fresh clone has no DVC cache to pull a
model from, and needs none): ``dvc status`` does not list them, and DVC's data stages never
read them.

``checkpoints/<name>/`` is an ordinary model directory plus its build record
(``dapo_build.json``), whose ``release`` section says what it serves: the settings and training
split it was built for (``key``), the digest of its files, and how it was made and chosen (commit,
kernels, starting score, the rule). :func:`find` returns the checkpoint whose key is a config's,
after checking its files against the digest; ``dapo model build`` rebuilds one and compares.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from dapo_core.errors import PipelineError
from tasks.durable import publish_dir, replace_atomically
from tasks.models.build import BUILD_RECORD, dir_digest, read_record
from tasks.params import REPO_ROOT

SHIPPED_ROOT = REPO_ROOT / "checkpoints"
SELECTION_RULE = (
    "build seed 0 (tiny.seed) of the preset's settings, on portable kernels; chosen before any "
    "RL ran from it, never by how RL does from it"
)


def find(key: dict[str, Any], root: Path | None = None) -> Path | None:
    """The shipped checkpoint built for ``key`` (``tasks.models.tiny.shipped_key``), its files
    checked against their digest; None when none ships for it."""
    root = root or SHIPPED_ROOT
    for path in sorted(root.glob("*/")):
        release = (read_record(path) or {}).get("release")
        if isinstance(release, dict) and release.get("key") == key:
            verify(path, release["digest"])
            return path
    return None


def is_shipped(path: str | Path) -> bool:
    """Whether ``path`` is one of the shipped checkpoints."""
    p = Path(path)
    return p.is_dir() and p.resolve().parent == SHIPPED_ROOT.resolve()


def verify(path: Path, digest: str) -> None:
    """Refuse a shipped checkpoint whose files are not the ones released."""
    found = dir_digest(path)
    if found != digest:
        raise PipelineError(
            f"{path} is not the checkpoint that was shipped (its files digest to {found}, the "
            f"release says {digest}): restore it with `git checkout -- {_shown(path)}`, or "
            "build one with -S tiny.shipped=false"
        )


def ship(built: Path, name: str, key: dict[str, Any], about: dict[str, Any]) -> Path:
    """Copy the model directory ``built`` to ``checkpoints/<name>`` with its release record
    (``key``, its digest, and ``about``: how it was built and what it scores), replacing what
    shipped under that name."""
    SHIPPED_ROOT.mkdir(exist_ok=True)
    out = SHIPPED_ROOT / name
    staged = SHIPPED_ROOT / f".{name}.ship"
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(built, staged)
    record = read_record(staged) or {}
    record["release"] = {"key": key, "digest": dir_digest(staged), "rule": SELECTION_RULE, **about}
    _write_record(staged, record)
    publish_dir(staged, out, SHIPPED_ROOT / f".{name}.old")
    return out


def annotate(path: Path, **fields: Any) -> None:
    """Add ``fields`` to the release record of the shipped checkpoint ``path`` (what was measured
    from it after it shipped, such as its reference run)."""
    record = read_record(path) or {}
    record.setdefault("release", {}).update(fields)
    _write_record(path, record)


def _write_record(path: Path, record: dict[str, Any]) -> None:
    """The build record, replaced whole (never read half-written)."""
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    replace_atomically(path / BUILD_RECORD, lambda tmp: tmp.write_text(text))


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
