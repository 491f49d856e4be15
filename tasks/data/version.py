"""The data version: which curated data a run used, read from ``dvc.lock``.

DVC owns the data (the stages of ``dvc.yaml`` write ``data/eval`` and the curated data of DAPO
section 3.5, arXiv 2503.14476); ``dvc.lock`` records the md5 of every stage output. The data
version derived from those md5s is what every MLflow run records (tag ``data.version``) and what
the curate task reports.

The lock names what DVC produced, not what a run read: ``-S synthetic.num_train=200`` trains on
other problems under the same lock. So each run also records a digest of the problems it actually
trained, validated and was evaluated on (``problems_digest``: ids and answers), and ``dapo
reproduce`` compares those.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from dapo_core.problem import Problem
from tasks.lifetime import start_helper, stop_helper
from tasks.params import REPO_ROOT
from tasks.signals import held_signals

log = logging.getLogger(__name__)


def dvc_outputs(lock: Path | None = None) -> dict[str, str]:
    """``{output path: md5}`` of every stage output recorded in ``lock`` (default: the repo's
    ``dvc.lock``); empty when there is no lock file or it is not valid YAML."""
    lock = lock or REPO_ROOT / "dvc.lock"
    if not lock.exists():
        return {}
    try:
        data = yaml.safe_load(lock.read_text()) or {}
    except yaml.YAMLError:
        log.warning("%s is not valid YAML; data version unknown", lock)
        return {}
    outs: dict[str, str] = {}
    for stage in (data.get("stages") or {}).values():
        outs.update(_out_md5s((stage or {}).get("outs")))
    return outs


def _out_md5s(outs: Any) -> dict[str, str]:
    """``{path: md5}`` of the ``outs:`` list of a stage in ``dvc.lock`` or of a ``.dvc`` file."""
    return {
        str(out["path"]): str(out.get("md5") or out.get("hash") or "")
        for out in outs or []
        if isinstance(out, dict) and "path" in out
    }


def data_version(lock: Path | None = None) -> str:
    """The data version: the md5 of the single output of ``lock``, the md5 of the sorted
    ``path:md5`` lines when there are several, or ``none`` without a lock file."""
    outs = dvc_outputs(lock)
    if not outs:
        return "none"
    if len(outs) == 1:
        return next(iter(outs.values()))
    joined = "\n".join(f"{p}:{m}" for p, m in sorted(outs.items()))
    return hashlib.md5(joined.encode()).hexdigest()


def problems_digest(problems: Iterable[Problem]) -> str:
    """A content hash of a problem set: the sha256 (16 hex digits) of its sorted ids and answers.
    Order-free, so the same set read in another order has the same digest."""
    return pairs_digest((p.id, p.answer) for p in problems)


def pairs_digest(pairs: Iterable[tuple[str, str]]) -> str:
    """``problems_digest`` of (id, answer) pairs (e.g. the columns of a per-problem table)."""
    lines = sorted(f"{i}\t{a}" for i, a in pairs)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def run_dvc(args: list[str], cwd: Path, whole: bool = False) -> subprocess.CompletedProcess:
    """``dvc <args>`` in ``cwd`` with this interpreter's DVC, analytics off; output captured.
    ``whole``: a change that must not stop halfway (a file and its ``.dvc`` record): DVC runs
    in a session of its own, out of reach of the terminal's Ctrl-C, which waits for it (a
    command killed outright takes it along: ``tasks.lifetime``)."""
    env = {"DVC_NO_ANALYTICS": "1", **os.environ}
    cmd = [sys.executable, "-m", "dvc", *args]
    if not whole:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    with held_signals():
        proc = start_helper(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        out, err = proc.communicate()
        stop_helper(proc)  # gone already: the reaper forgets it
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def dvc_add(path: Path, root: Path = REPO_ROOT) -> str | None:
    """Track ``path`` (a directory under ``root``, e.g. a fetched model) with ``dvc add``: DVC
    caches it and writes ``<path>.dvc`` with its md5. Returns that md5; None (and a log line)
    when ``root`` is not a DVC repository, ``path`` lies outside it, or DVC fails: tracking is a
    record, not a precondition."""
    path, root = Path(path).resolve(), Path(root).resolve()
    if not (root / ".dvc").is_dir() or not path.is_relative_to(root):
        return None
    done = run_dvc(["add", "-q", str(path.relative_to(root))], root, whole=True)
    if done.returncode != 0:
        log.warning("dvc add %s failed: %s", path, (done.stderr or done.stdout).strip()[-300:])
        return None
    return tracked_md5(path)


def tracked_md5(path: Path) -> str | None:
    """The md5 DVC recorded for ``path`` in ``<path>.dvc`` (None when it is not DVC-tracked)."""
    dvc_file = Path(path).with_name(Path(path).name + ".dvc")
    if not dvc_file.exists():
        return None
    try:
        outs = _out_md5s((yaml.safe_load(dvc_file.read_text()) or {}).get("outs"))
    except yaml.YAMLError:
        return None
    return next(iter(outs.values()), None)
