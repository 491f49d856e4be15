"""The Prefect task of the data stage: ``dvc repro`` of the stages in ``dvc.yaml``.

DVC owns the data: the task runs its stages, so DVC's cache and skip logic apply,
and reports the data version of the resulting ``dvc.lock``.
"""

from __future__ import annotations

import time
from pathlib import Path

from dapo_core.config import Config
from dapo_core.errors import PipelineError
from tasks.data.version import data_version, run_dvc
from tasks.orchestration import run_logger, stage_task
from tasks.params import REPO_ROOT, load_params


@stage_task("curate", retries=2, retry_delay_seconds=10)
def curate_task(cfg: Config, stages: list[str] | None = None, root: str | None = None) -> dict:
    """Run the DVC data stages (``dvc repro``), so DVC's cache and skip logic apply.

    Skipped, with a log line saying why, when nothing needs curating (a ``synthetic:`` source
    evaluated on ``synthetic-test``) or when the repository has no ``dvc.yaml`` yet."""
    log = run_logger()
    root_path = Path(root) if root else REPO_ROOT
    lock = root_path / "dvc.lock"
    needs_data = not cfg.data.source.startswith("synthetic:") or cfg.eval.eval_set in (
        cfg.data.eval_sets
    )
    if not needs_data and not stages:
        log.info(
            "curate: skipped; the source is %s: its problems are generated from synthetic.* (the "
            "ones `dvc repro` writes to data/curated), and runs record their digest",
            cfg.data.source,
        )
        return {
            "status": "skipped",
            "reason": "synthetic source",
            "data_version": data_version(lock),
        }
    if not (root_path / "dvc.yaml").exists():
        log.warning(
            "curate: skipped; %s has no dvc.yaml, so there are no data stages to run. The curated "
            "data under %s must already exist.",
            root_path,
            cfg.data.out_dir,
        )
        return {"status": "skipped", "reason": "no dvc.yaml", "data_version": data_version(lock)}
    if cfg.data != load_params().data:
        log.warning(
            "curate: DVC stages read params.yaml, so this run's changes to data.* do not reach "
            "them; edit params.yaml or use `dvc exp run -S data.key=value` to curate differently."
        )
    args = ["repro", *(stages or [])]
    log.info("curate: dvc %s (in %s)", " ".join(args), root_path)
    t0 = time.perf_counter()
    out = run_dvc(args, root_path)
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip()[-2000:]
        raise PipelineError(f"`dvc repro` failed (exit {out.returncode}):\n{tail}")
    for line in out.stdout.strip().splitlines()[-20:]:
        log.info("dvc: %s", line)
    version = data_version(lock)
    log.info("curate: done in %.1fs; data version %s", time.perf_counter() - t0, version)
    return {"status": "ran", "data_version": version, "wall_time_s": time.perf_counter() - t0}
