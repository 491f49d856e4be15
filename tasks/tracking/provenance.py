"""What identifies a run: the code (git commit, dirty tree), the data (the DVC version where
the run reads DVC's outputs; content digests beside it), the Prefect flow run, and the Table 1
variant; every MLflow run carries these as tags, so that any run can be
reproduced from MLflow alone."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from dapo_core.ablation import (
    ABLATION_LADDER,
    ABLATION_SWITCHES,
    ALGORITHM_PRESETS,
    apply_variant,
)
from dapo_core.config import Config
from tasks.data.version import data_version, dvc_outputs, tracked_md5
from tasks.models.resolve import model_md5
from tasks.params import REPO_ROOT
from tasks.runtime import kernel_tags


def git_commit(root: Path = REPO_ROOT) -> str:
    """``git rev-parse HEAD`` of the repo, or ``unknown`` outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def git_dirty(root: Path = REPO_ROOT) -> str:
    """``true`` when the working tree has uncommitted changes (the commit alone does not pin the
    code then), ``false``, or ``unknown``."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return "unknown" if out.returncode else str(bool(out.stdout.strip())).lower()


def prefect_flow_run_id() -> str | None:
    """The id of the Prefect flow run we are in, if any (no Prefect import outside a flow)."""
    if "prefect" not in sys.modules:
        return None
    try:
        from prefect.runtime import flow_run

        return str(flow_run.id) if flow_run.id else None
    except Exception:  # noqa: BLE001 - a tag is not worth failing for
        return None


def variant_of(cfg: Config) -> str:
    """The algorithm preset whose entries ``cfg.algo`` has (other than ``dapo``'s, which the
    ladder names by its switches), else the Table 1 variant whose switches it has, or
    ``custom``."""
    for name in ALGORITHM_PRESETS:
        if ALGORITHM_PRESETS[name] and apply_variant(cfg, name).algo == cfg.algo:
            return name
    switches = {s: getattr(cfg.algo, s) for s in ABLATION_SWITCHES}
    for name, ladder in ABLATION_LADDER.items():
        if all(switches[s] == ladder[s] for s in ABLATION_SWITCHES):
            return name
    return "custom"


GENERATED = "generated:"  # the prefix of a data.version that is not DVC's


def data_version_of(cfg: Config) -> str:
    """What ``data.version`` says a run read: the DVC data version (``dvc.lock``) when it trains
    on the curated data DVC produces, else ``generated:<source>@<settings digest>`` for an
    embedded task, whose problems come from the ``synthetic.*`` settings and not from any DVC
    output: two runs with other ``synthetic.num_train`` read other problems, and their versions
    differ (as do their content digests, ``data.train_digest`` and the others)."""
    if cfg.data.source.startswith("synthetic:"):
        settings = json.dumps(data_source(cfg), sort_keys=True).encode()
        return f"{GENERATED}{cfg.data.source}@{hashlib.sha256(settings).hexdigest()[:12]}"
    return data_version()


def data_source(cfg: Config) -> dict[str, str]:
    """Where a run's problems come from, as its MLflow datasets record it: the generator and its
    settings for an embedded task, else the DVC-tracked path, its md5 and the data version."""
    if cfg.data.source.startswith("synthetic:"):
        settings = dataclasses.asdict(cfg.synthetic)
        return {
            "generator": cfg.data.source,
            **{f"synthetic.{k}": str(v) for k, v in settings.items()},
        }
    path = Path(cfg.data.source)
    md5 = tracked_md5(path) or dvc_outputs().get(cfg.data.source) or "not tracked by DVC"
    return {"path": cfg.data.source, "dvc.md5": md5, "data.version": data_version()}


def run_tags(cfg: Config, kind: str, variant: str | None = None, **extra: Any) -> dict[str, str]:
    """The tags every run carries: code, data, orchestration and what was run."""
    commit = git_commit()
    tags = {
        "git.commit": commit,
        "git.dirty": git_dirty(),
        "mlflow.source.git.commit": commit,
        # the runs table's Source column: the command that made the run
        "mlflow.source.name": f"dapo {kind.replace('_', '-')}",
        "mlflow.source.type": "LOCAL",
        "data.version": data_version_of(cfg),
        "data.source": cfg.data.source,
        "variant": variant or variant_of(cfg),
        "seed": str(cfg.train.seed),
        "dapo.flow": kind,
        **kernel_tags(),
    }
    md5 = model_md5(cfg)
    if md5:
        tags["model.md5"] = md5
    flow_run_id = prefect_flow_run_id()
    if flow_run_id:
        tags["prefect.flow_run_id"] = flow_run_id
    tags.update({k: str(v) for k, v in extra.items() if v is not None})
    return tags
