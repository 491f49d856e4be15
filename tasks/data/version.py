"""The data version: which curated data a run used, read from ``dvc.lock``.

DVC owns the data (the stages of ``dvc.yaml`` write ``data/eval`` and the curated data of DAPO
section 3.5, arXiv 2503.14476); ``dvc.lock`` records the md5 of every stage output. The data
version derived from those md5s is what every MLflow run records (tag ``data.version``) and what
the curate task reports, so a run can be matched to the exact data it trained on.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import yaml

from tasks.params import REPO_ROOT

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
        for out in (stage or {}).get("outs") or []:
            if isinstance(out, dict) and "path" in out:
                outs[str(out["path"])] = str(out.get("md5") or out.get("hash") or "")
    return outs


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
