"""``dapo reproduce RUN_ID``: re-run a tracked run from what MLflow recorded about it.

The run's ``config.json`` artifact (else its params) is the config; its tags say which flow made
it (``dapo.flow``), on which code (``git.commit``, ``git.dirty``) and data (``data.version``, the
md5 of the ``dvc.lock`` outputs where the run read them; the content digests of its training,
validation and evaluation problems). Before re-running, these and the commit are compared with
the current checkout, and every difference is reported with the command that restores it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from dapo_core import metric_names as metric
from dapo_core.config_loader import from_dict
from dapo_core.errors import PipelineError


def reproduce_checks(info: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(mismatches, notes): how the run's data and code differ from this checkout, each with the
    command that restores it; notes are caveats (e.g. the run's tree had uncommitted changes)."""
    from tasks.data.version import data_version
    from tasks.tracking.provenance import GENERATED, git_commit

    tags = info["tags"]
    mismatches, notes = [], []
    then_commit, now_commit = tags.get("git.commit", "unknown"), git_commit()
    then_data, now_data = tags.get("data.version", "unknown"), data_version()
    # a generated task's problems are compared by their digests below, not by the lock
    if not then_data.startswith(GENERATED) and then_data != now_data:
        mismatches.append(
            f"data version differs: the run used {then_data}, dvc.lock now gives {now_data}, so "
            "the result may differ. To train on the run's data: "
            f"`git checkout {then_commit} -- dvc.lock && dvc checkout` (or `dvc repro`)."
        )
    mismatches += _problem_mismatches(info)
    mismatches += _model_mismatches(info, notes)
    mismatches += _missing_inputs(info["config"])
    if then_commit != now_commit:
        mismatches.append(
            f"code differs: the run was made at commit {then_commit}, this checkout is at "
            f"{now_commit}; `git checkout {then_commit}` gives the run's code."
        )
    if tags.get("git.dirty") == "true":
        notes.append(
            "the run was made from a working tree with uncommitted changes: its exact code is "
            "not in git."
        )
    return mismatches, notes


def _problem_mismatches(info: dict[str, Any]) -> list[str]:
    """The problems the run trained, validated and was evaluated on, against what its config
    reads here now (the content digests; the lock alone does not pin them)."""
    from tasks.data.splits import eval_problems, splits
    from tasks.data.version import problems_digest

    tags = info["tags"]
    cfg = from_dict(info["config"], source="the run's config")
    keys = ("data.train_digest", "data.val_digest", "data.eval_digest")
    wanted = {k: tags.get(k) for k in keys}
    if not any(wanted.values()):
        return []  # a run from before digests were recorded: nothing to compare
    try:
        parts = splits(cfg)
        now = {
            "data.train_digest": problems_digest(parts.train),
            "data.val_digest": problems_digest(parts.val),
        }
        if tags.get("eval.set"):
            now["data.eval_digest"] = problems_digest(eval_problems(cfg, tags["eval.set"])[1])
    except (FileNotFoundError, PipelineError) as e:
        return [f"the run's problems cannot be read here ({e})."]
    what = {"data.train_digest": "training", "data.val_digest": "validation"}
    what["data.eval_digest"] = f"evaluation ({tags.get('eval.set')})"
    return [
        f"the {what[k]} problems differ from the run's (digest {wanted[k]}, now {now[k]}): "
        "the data or the config that selects it changed."
        for k in now
        if wanted.get(k) and wanted[k] != now[k]
    ]


def _model_mismatches(info: dict[str, Any], notes: list[str]) -> list[str]:
    """The model the run started from (``model.digest``) against the one its config gives here
    now; a model not built here yet is a note (the first run builds it from this checkout)."""
    from tasks.models.build import model_dir_digest
    from tasks.models.resolve import existing_model_path

    wanted = info["tags"].get("model.digest")
    if not wanted:
        return []  # a run from before the tag, or from a hub id
    cfg = from_dict(info["config"], source="the run's config")
    path = existing_model_path(cfg)
    if path is None:
        notes.append(
            f"the run started from model {wanted}; no such model is built here yet: a run "
            "builds it from this checkout's code, and a different digest means other code."
        )
        return []
    now = model_dir_digest(path)
    if now == wanted:
        return []
    return [
        f"the starting model differs from the run's (digest {wanted}, now {now} in {path}): it "
        "was built by other code or libraries; `git checkout` the run's commit and rebuild."
    ]


def reproduce_run(
    run_id: str,
    uri: str | None = None,
    run_name: str | None = None,
    check_only: bool = False,
    strict: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Check a run, then (unless ``check_only``) re-run it with its logged config.

    Returns ``{"original": run info, "mismatches": [...], "notes": [...], "result": flow result
    or None, "config_path": path}``. ``strict``: a difference in data or code is an error."""
    from tasks.tracking.store import read_run

    try:
        info = read_run(run_id, uri)
    except LookupError as e:
        raise PipelineError(
            f"{str(e).rstrip('.')}. Pass --tracking-uri if the run is in another store."
        ) from None
    _refuse_unreproducible(run_id, info["tags"])
    cfg = from_dict(info["config"], source=f"run {run_id} config")  # validates the logged config
    mismatches, notes = reproduce_checks(info)
    out: dict[str, Any] = {
        "original": info,
        "mismatches": mismatches,
        "notes": notes,
        "result": None,
    }
    if strict and mismatches:
        raise PipelineError("not reproducible as is (--strict): " + " ".join(mismatches))
    if check_only:
        return out
    if missing := _missing_inputs(info["config"]):  # the re-run would fail once begun
        raise PipelineError(f"cannot re-run {run_id}: {' '.join(missing)}")
    name = run_name or f"reproduce-{run_id[:8]}-{time.strftime('%Y%m%d-%H%M%S')}"
    from flows.stages import run_dir_for
    from tasks.rundir import REPRODUCED_CONFIG

    root = run_dir_for(cfg, name)
    _refuse_other_contents(root, info["config"])
    root.mkdir(parents=True, exist_ok=True)
    config_path = root / REPRODUCED_CONFIG
    config_path.write_text(json.dumps(info["config"], indent=2))
    out["config_path"] = config_path
    tags = info["tags"]
    kind = tags.get("dapo.flow", "pipeline")
    common = {"params": str(config_path), "progress": progress}
    mark = {"reproduces": run_id}
    if kind == "evaluate":
        from flows.pipeline import evaluate_flow

        out["result"] = evaluate_flow(
            **common, model=tags.get("eval.model"), eval_set=tags.get("eval.set"), tags=mark
        )
    elif kind == "ablate" and tags.get("variant") == "ladder":
        from flows.ablate import ablate_flow

        params = info["params"]
        out["result"] = ablate_flow(
            **common,
            variants=params.get("ablate.variants", "").split(",") or None,
            seeds=[int(s) for s in params.get("ablate.seeds", "").split(",") if s] or None,
            eval_set=tags.get("eval.set"),
            run_name=name,
        )
    else:  # train, pipeline, or one variant of an ablation: train and evaluate again
        from flows.pipeline import pipeline_flow

        out["result"] = pipeline_flow(
            **common, run_name=name, eval_set=tags.get("eval.set"), tags=mark
        )
    return out


def _missing_inputs(config: dict[str, Any]) -> list[str]:
    """What the run read from a local path that is gone (its reward model), each a sentence
    with the way back."""
    rollout = config.get("rollout", {})
    reward_model = rollout.get("reward_model") or ""
    if rollout.get("reward") == "model" and not Path(reward_model).expanduser().exists():
        return [
            f"its reward model {reward_model} is gone: put it back, or train it again "
            "(`dapo reward-model train` with the run's rm.* parameters)."
        ]
    return []


def _refuse_other_contents(root: Path, config: dict[str, Any]) -> None:
    """A PipelineError for a ``--run-name`` folder that holds anything but this run's
    reproduction (which it continues): another run there was overwritten in part (its
    config.json, a FINISHED MLflow run that trained nothing), or a folder of other files was
    filled with a run."""
    from tasks.rundir import REPRODUCED_CONFIG

    if not root.exists() or (root.is_dir() and not any(root.iterdir())):
        return
    try:
        same = json.loads((root / REPRODUCED_CONFIG).read_text()) == config
    except (OSError, ValueError):
        same = False
    if not same:
        what = "another run" if (root / "config.json").exists() else "files not a run's"
        raise PipelineError(
            f"{root} holds {what}: pick another --run-name (a reproduction continues only in "
            "the folder it began in)"
        )


# the commands whose runs are not re-run here, and how to make them again
_RERUN_BY_HAND = {
    "dpo": "`dapo dpo train` with its dpo.* parameters",
    "reward_model": "`dapo reward-model train` with its rm.* parameters",
    "compare": "`dapo compare` with its compare.* parameters, or reproduce one of its method runs",
}


def _refuse_unreproducible(run_id: str, tags: dict[str, str]) -> None:
    """One line for a run that is not a training, evaluation, pipeline or ablation run: a
    preference model, or a comparison's parent (its RL method runs are re-run as pipelines)."""
    kind = tags.get("dapo.flow", "pipeline")
    if kind == "compare" and tags.get("method"):
        return  # one RL method of a comparison: trained and evaluated again below
    if kind in _RERUN_BY_HAND:
        raise PipelineError(
            f"run {run_id} was made by `{tags.get('mlflow.source.name', kind)}`; `dapo "
            "reproduce` re-runs training, evaluation, pipeline and ablation runs. Make it again "
            f"with {_RERUN_BY_HAND[kind]} (shown on its MLflow page)."
        )


def original_avg(info: dict[str, Any]) -> float | None:
    value = info["metrics"].get(metric.AVG_AT_K)
    return float(value) if value is not None else None
