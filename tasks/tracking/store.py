"""Where runs are tracked, and reading them back: the MLflow store, its experiments, and the
queries ``dapo reproduce`` and the tests make.

The store is ``sqlite:///<repo>/mlflow/mlflow.db`` with artifacts in ``<repo>/mlflow/artifacts``
(anchored at the repo root, never the cwd; MLflow's file store is in maintenance mode), unless
``tracking.tracking_uri`` is set in the config or ``MLFLOW_TRACKING_URI`` in the environment (in
that order). One experiment per flow kind: ``<tracking.experiment_prefix>-train``, ``-evaluate``,
``-pipeline``, ``-ablate``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dapo_core.config import Config, ConfigError, flat_settings
from dapo_core.errors import PipelineError, first_line
from tasks.params import REPO_ROOT

KINDS = ("train", "evaluate", "pipeline", "ablate", "reward_model", "dpo", "compare")
STORE_DIR = REPO_ROOT / "mlflow"
MAX_PARAM_LEN = 6000  # MLflow's limit on a param value
# A policy logged as an MLflow model (LoggedModel): by reference to its directory.
POLICY_MODEL_NAME, POLICY_MODEL_TYPE, MODEL_PATH_TAG = "policy", "dapo-policy", "dapo.path"


def tracking_uri(cfg: Config | None = None) -> str:
    """The tracking store: ``tracking.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else the
    project's SQLite store under ``<repo>/mlflow``."""
    if cfg is not None and cfg.tracking.tracking_uri:
        return cfg.tracking.tracking_uri
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{STORE_DIR / 'mlflow.db'}"


# The schemes MLflow has a tracking store for without a plugin (a database's "+driver" aside)
BUILT_IN_SCHEMES = frozenset(
    {"", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "uc"}
    | {"databricks-uc"}
)


def refuse_unknown_store(cfg: Config) -> None:
    """ConfigError, before any work, for a tracking URI MLflow will not open: a scheme no store
    takes (built in or a plugin's), or a folder store (a path, ``file:``), which MLflow 3 opens
    only with ``MLFLOW_ALLOW_FILE_STORE=true``. MLflow found out when the run began, and the run
    went on untracked."""
    uri = tracking_uri(cfg)
    where = "tracking.tracking_uri" if cfg.tracking.tracking_uri else "MLFLOW_TRACKING_URI"
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    folder = scheme == "file" or not (scheme or uri.startswith(("databricks", "uc")))
    if folder and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        raise ConfigError(
            f"{where} {uri}: MLflow 3 opens a folder store only with MLFLOW_ALLOW_FILE_STORE=true; "
            f"set {where} to a database such as sqlite:///PATH/mlflow.db"
        )
    if scheme in BUILT_IN_SCHEMES:
        return
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    try:  # the registry holds the plugins' schemes too
        _tracking_store_registry.get_store_builder(uri)
    except Exception:  # noqa: BLE001 - MLflow's refusal, of one exception class or another
        raise ConfigError(
            f"{where} {uri}: MLflow has no tracking store for {scheme}:// (sqlite:///, "
            "http(s)://, postgresql://, mysql://, mssql://, databricks, or a plugin's scheme); "
            f"set {where} to one"
        ) from None


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for other stores)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///") :].split("?", 1)[0])


def refuse_missing_store(uri: str) -> None:
    """LookupError, before MLflow opens ``uri``, for a SQLite store that does not exist (a
    command that reads runs would create an empty database at a mistyped path, then find
    nothing in it) or a tracking server that does not answer (MLflow retries each call for
    minutes, then reports the run missing)."""
    db = sqlite_path(uri)
    if db is not None and not db.exists():
        raise LookupError(
            f"no MLflow store at {db} (tracking URI {uri}): check the path; the project's runs "
            f"are in sqlite:///{STORE_DIR / 'mlflow.db'} unless tracking.tracking_uri says else"
        )
    if uri.startswith(("http://", "https://")) and (why := _unanswered(uri)):
        raise LookupError(
            f"the MLflow server at {uri} does not answer ({why}): start it, or name a running "
            "one with --tracking-uri or -S tracking.tracking_uri"
        )


def _unanswered(url: str, timeout_s: float = 5.0) -> str | None:
    """Why the server at ``url`` cannot be reached, or None once it answers at all (an HTTP
    error is an answer: a server that has no ``/health`` is still there)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as e:
        return first_line(getattr(e, "reason", None) or e, 120)
    return None


def artifact_root(uri: str) -> str | None:
    """Where experiments created in ``uri`` keep their artifacts: ``artifacts/`` beside a SQLite
    database (MLflow would otherwise use ``./mlruns`` of the cwd); the server's choice otherwise."""
    db = sqlite_path(uri)
    return (db.resolve().parent / "artifacts").as_uri() if db else None


def experiment_name(cfg: Config, kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown flow kind {kind!r}; one of {KINDS}")
    return f"{cfg.tracking.experiment_prefix}-{kind}"


def flatten_config(cfg: Config | Mapping[str, Any]) -> dict[str, str]:
    """The resolved config as MLflow params (``flat_settings``, each value cut to MLflow's
    longest)."""
    return {k: v[:MAX_PARAM_LEN] for k, v in flat_settings(cfg).items()}


# ---------------------------------------------------------------------------------------------
# Reading runs back (dapo reproduce)
# ---------------------------------------------------------------------------------------------


def read_run(run_id: str, uri: str | None = None) -> dict[str, Any]:
    """A logged run: ``{"run_id", "experiment", "status", "tags", "params", "metrics",
    "config"}``, the config from its ``config.json`` artifact (else rebuilt from its params).
    Raises LookupError when the run is not in the store."""
    from mlflow.exceptions import MlflowException

    from mlflow import MlflowClient

    uri = uri or tracking_uri()
    refuse_missing_store(uri)
    try:
        client = MlflowClient(tracking_uri=uri)
    except MlflowException:  # a scheme MLflow has no store for
        raise LookupError(
            f"MLflow cannot open a tracking store at {uri!r} (its schemes: a path, file:, "
            "sqlite:, http(s):, postgresql:, mysql:)"
        ) from None
    try:
        run = client.get_run(run_id)
    except MlflowException as e:
        raise LookupError(f"run {run_id} is not in the tracking store {uri}: {e.message}") from None
    exp = client.get_experiment(run.info.experiment_id)
    config = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, "config.json", tmp)
            config = json.loads(Path(path).read_text())
        except Exception:  # noqa: BLE001 - fall back on the params
            config = unflatten_params(run.data.params)
    return {
        "run_id": run_id,
        "experiment": exp.name if exp else run.info.experiment_id,
        "status": run.info.status,
        "tags": dict(run.data.tags),
        "params": dict(run.data.params),
        "metrics": dict(run.data.metrics),
        "config": config,
    }


def end_abandoned_run(run_dir: Path, status: str = "KILLED") -> bool:
    """End the MLflow run recorded in ``run_dir`` (``RunDir.record_mlflow_run``) with ``status``
    if it is still RUNNING: the backstop for a process killed before it could end its own run.
    Call it only once that process is gone. True when a run was ended."""
    from mlflow import MlflowClient
    from tasks.rundir import RunDir

    try:
        saved = RunDir(run_dir).mlflow_run()
        if not saved:
            return False
        client = MlflowClient(tracking_uri=saved["tracking_uri"])
        if client.get_run(saved["run_id"]).info.status != "RUNNING":
            return False
        client.set_terminated(saved["run_id"], status)
    except Exception:  # noqa: BLE001 - no record, a torn one, or a store that is away
        return False
    return True


def unflatten_params(params: Mapping[str, str]) -> dict[str, Any]:
    """The inverse of :func:`flatten_config` (values parsed as JSON where they are JSON)."""
    out: dict[str, Any] = {}
    for key, text in params.items():
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        section, *rest = key.split(".")
        node = out.setdefault(section, {})
        if rest[:1] == ["eval_sets"] and section == "data":  # its names may hold dots
            node.setdefault("eval_sets", {})[".".join(rest[1:])] = text
            continue
        for part in rest[:-1]:
            node = node.setdefault(part, {})
        node[rest[-1]] = value
    return out


def search_runs(
    cfg: Config, kind: str, filter_string: str = "", uri: str | None = None
) -> list[dict[str, Any]]:
    """Runs of one flow kind as plain dicts (run_id, name, status, tags, params, metrics)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri or tracking_uri(cfg))
    exp = client.get_experiment_by_name(experiment_name(cfg, kind))
    if exp is None:
        return []
    runs = client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=1000)
    return [
        {
            "run_id": r.info.run_id,
            "name": r.info.run_name,
            "status": r.info.status,
            "tags": dict(r.data.tags),
            "params": dict(r.data.params),
            "metrics": dict(r.data.metrics),
        }
        for r in runs
    ]


def metric_history(run_id: str, key: str, uri: str | None = None) -> list[tuple[int, float]]:
    """``[(step, value), ...]`` of one metric of a run."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri or tracking_uri())
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def list_artifacts(run_id: str, path: str | None = None, uri: str | None = None) -> list[str]:
    """Artifact paths of a run (recursively)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri or tracking_uri())
    out: list[str] = []

    def walk(p: str | None) -> None:
        for f in client.list_artifacts(run_id, p):
            if f.is_dir:
                walk(f.path)
            else:
                out.append(f.path)

    walk(path)
    return out


def read_artifact_text(run_id: str, path: str, uri: str | None = None) -> str:
    """The text of one artifact of a run."""
    from mlflow import MlflowClient

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one small file
    client = MlflowClient(tracking_uri=uri or tracking_uri())
    with tempfile.TemporaryDirectory() as tmp:
        return Path(client.download_artifacts(run_id, path, tmp)).read_text()


def ui_command(uri: str, port: int = 5000, host: str = "127.0.0.1") -> list[str]:
    """The ``mlflow ui`` command line for a store (run by ``dapo ui``)."""
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri]
    root = artifact_root(uri)
    if root:  # for experiments created by MLflow itself (ours set their own location)
        cmd += ["--default-artifact-root", root]
    # one worker: a UI for one person (MLflow's default of 4 holds ~0.25 GB each)
    return [*cmd, "--host", host, "--port", str(port), "--workers", "1"]


TRAINING_VIEW = {"workflowType": "machine_learning"}
"""MLflow's own URL switch to its model-training pages: from 3.x its UI opens every experiment in
the GenAI mode (Traces, Judges, Prompts) unless the browser has chosen otherwise, whatever the
experiment's ``mlflow.experimentKind`` tag says."""
UI_DEFAULT = "http://127.0.0.1:5000"  # where ``dapo ui`` serves by default


def ui_url(
    uri: str, experiment_id: str, run_id: str | None = None, ui: str = UI_DEFAULT, **query: str
) -> str:
    """The address of an experiment's runs table (or a run's metric charts) in the MLflow UI, in
    the training view: on the tracking server itself for an ``http(s)`` store, else where ``dapo
    ui`` serves. A saved view (``viewStateShareKey``) applies on the runs table only."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else ui
    path = f"/experiments/{experiment_id}/runs" + (f"/{run_id}/model-metrics" if run_id else "")
    args = "&".join(f"{k}={v}" for k, v in {**query, **TRAINING_VIEW}.items())
    return f"{base}/#{path}?{args}"


def experiment_urls(cfg: Config, uri: str | None = None, ui: str = UI_DEFAULT) -> dict[str, str]:
    """``{experiment name: training-view address}`` of the project's experiments that exist."""
    from mlflow import MlflowClient

    uri = uri or tracking_uri(cfg)
    client = MlflowClient(tracking_uri=uri)
    out = {}
    for kind in KINDS:
        exp = client.get_experiment_by_name(experiment_name(cfg, kind))
        if exp is not None:
            out[exp.name] = ui_url(uri, exp.experiment_id, ui=ui)
    return out


def mlflow_env() -> dict[str, str]:
    """Environment for MLflow subprocesses: telemetry off, no job-execution consumers (a
    pool of processes per server for MLflow's GenAI jobs, which this project does not run;
    a user's own setting wins), and no warning at start-up about the server's own imports (a
    Starlette deprecation that is MLflow's to act on)."""
    warnings = [w for w in (os.environ.get("PYTHONWARNINGS"), _SERVER_IMPORT_WARNING) if w]
    return {
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        **os.environ,
        "DO_NOT_TRACK": "true",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "PYTHONWARNINGS": ",".join(warnings),
    }


_SERVER_IMPORT_WARNING = "ignore::UserWarning:mlflow.server.fastapi_app"


def refuse_another_kind(client: Any, folder: Path, run_id: str, experiment: str) -> None:
    """A folder whose MLflow run is in another experiment than ``experiment`` holds another
    kind of run (a comparison's, a sweep's, a pipeline's): ``--run-name`` of one there logged
    this run into that one and mixed their files. A PipelineError that says to pick another."""
    try:
        theirs = client.get_experiment(client.get_run(run_id).info.experiment_id).name
    except Exception:  # noqa: BLE001 - gone, or unreachable: resuming it says so
        return
    if theirs != experiment:
        raise PipelineError(
            f"{folder} holds a run of MLflow experiment {theirs}, not {experiment}: pick another "
            "--run-name (or --run-dir), or continue it with the command that began it"
        )
