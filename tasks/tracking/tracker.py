"""The tracker: one MLflow run, written through ``MlflowClient`` (the only place, with
``tasks.tracking.store``, that talks to MLflow).

Each run gets the resolved config as flattened params (``algo.loss.eps_high``) and as a
``config.json`` artifact, and the tags of ``tasks.tracking.provenance``. Per-step metrics are
buffered and written with ``log_batch`` every few steps or seconds (one call per value is far
slower).

Tracking is never allowed to kill a training run: every MLflow call goes through one guard that
catches the error, warns once, and keeps going (metrics stay buffered and are retried after a
pause; the run directory's ``metrics.jsonl`` has them in any case). For an HTTP store, MLflow's
retry budget (minutes per call by default) is lowered to seconds unless set already.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dapo_core.config import Config
from tasks import lifetime
from tasks.params import REPO_ROOT
from tasks.rundir import RunDir
from tasks.tracking.artifacts import ArtifactLog
from tasks.tracking.orphans import END_ORPHAN, OWNER_TAG
from tasks.tracking.store import (
    MAX_PARAM_LEN,
    MODEL_PATH_TAG,
    POLICY_MODEL_NAME,
    POLICY_MODEL_TYPE,
    artifact_root,
    experiment_name,
    flatten_config,
    refuse_another_kind,
    sqlite_path,
    tracking_uri,
)

log = logging.getLogger(__name__)

MAX_TAG_LEN = 5000
# MLflow 3 opens an experiment in its GenAI view unless told it holds model training runs.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
PARAMS_PER_BATCH = 100  # MLflow's log_batch limits
METRICS_PER_BATCH = 1000
MAX_BUFFER = 100_000  # metrics held while the store is unreachable; the oldest go first
HTTP_DEFAULTS = {  # a down tracking server costs seconds per attempt, not minutes
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


class Tracker(ArtifactLog):
    """One MLflow run, written through ``MlflowClient`` with an explicit run id (no global active
    run, so flows may run tasks in threads). Every call is guarded: see :meth:`_guard`.

    ``flush_steps``/``flush_seconds``: buffered metrics are written when this many distinct steps
    are waiting or this many seconds have passed since the last write, and on :meth:`flush`/`end`.
    ``retry_after_s``: after a failed call, MLflow is left alone this long (metrics keep buffering).
    """

    def __init__(
        self,
        cfg: Config,
        kind: str,
        uri: str | None = None,
        flush_steps: int = 20,
        flush_seconds: float = 10.0,
        retry_after_s: float = 30.0,
    ):
        self.cfg = cfg
        self.kind = kind
        self.uri = uri or tracking_uri(cfg)
        self.experiment = experiment_name(cfg, kind)
        self.flush_steps, self.flush_seconds = flush_steps, flush_seconds
        self.retry_after_s = retry_after_s
        self.run_id: str | None = None
        self.failures = 0
        self._client: Any = None
        # (key, value, timestamp_ms, step, model_id, dataset name, dataset digest)
        self._buffer: list[tuple[str, float, int, int, str | None, str | None, str | None]] = []
        self._steps_waiting: set[int] = set()
        self._last_flush = time.monotonic()
        self._retry_at = 0.0
        self._warned = False
        self._system_metrics: Any = None
        if self.uri.startswith(("http://", "https://")):
            # MLflow's HTTP defaults retry for ~4 minutes per call when the server is down;
            # a training run should not stall that long (a value already set wins).
            for key, value in HTTP_DEFAULTS.items():
                os.environ.setdefault(key, value)

    # -- the guard ---------------------------------------------------------------------------

    def _guard(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run one MLflow call, whole (a Ctrl-C or SIGTERM is held until it returns); on any error
        warn once, pause MLflow for a while, return None."""
        from tasks.signals import held_signals

        if time.monotonic() < self._retry_at:
            return None
        try:
            with held_signals():  # an interrupt waits for the store write to finish
                return fn()
        except Exception as e:  # noqa: BLE001 - tracking must never kill the run
            self.failures += 1
            self._retry_at = time.monotonic() + self.retry_after_s
            msg = (
                f"MLflow tracking failed while {what} ({type(e).__name__}: {str(e)[:300]}); "
                f"store {self.uri}. The run goes on; its metrics are still written to the run "
                "directory (metrics.jsonl), and tracking is retried later."
            )
            if not self._warned:
                self._warned = True
                log.warning(msg)
            else:
                log.debug(msg)
            return None

    @property
    def client(self) -> Any:
        if self._client is None:
            from mlflow import MlflowClient

            db = sqlite_path(self.uri)
            if db is not None:
                db.parent.mkdir(parents=True, exist_ok=True)
            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    @property
    def active(self) -> bool:
        return self.run_id is not None

    # -- runs --------------------------------------------------------------------------------

    def _experiment_id(self) -> str:
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is not None:
            if exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
                self.client.set_experiment_tag(
                    exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND
                )
            return exp.experiment_id
        root = artifact_root(self.uri)
        location = f"{root}/{self.experiment}" if root else None
        try:
            return self.client.create_experiment(
                self.experiment,
                artifact_location=location,
                tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
            )
        except Exception:  # created meanwhile by another process
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                raise
            return exp.experiment_id

    def start_run(
        self,
        run_name: str,
        tags: Mapping[str, str] | None = None,
        parent_run_id: str | None = None,
        log_config: bool = True,
    ) -> str | None:
        """Create a run (nested under ``parent_run_id`` if given) and log the config to it."""

        def create() -> str:
            all_tags = {"mlflow.runName": run_name, **(tags or {}), OWNER_TAG: _owner()}
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            run = self.client.create_run(
                self._experiment_id(), run_name=run_name, tags=_clip_tags(all_tags)
            )
            # Known before an interrupt held during the call is delivered: it can end the run.
            self.run_id = run.info.run_id
            self._leave_last_words()
            return self.run_id

        lifetime.start_reaper()  # before the run exists: it must never stand without last words
        self.run_id = self._guard(f"creating a run in experiment {self.experiment}", create)
        if self.run_id and log_config:
            self.log_config(self.cfg)
        return self.run_id

    def resume_run(self, run_id: str) -> str | None:
        """Attach to an existing run (a retried or continued task) and mark it running again."""

        def attach() -> str:
            self.client.get_run(run_id)  # raises if it does not exist in this store
            self.client.set_tag(run_id, OWNER_TAG, _owner())  # before anyone sees it running
            self.run_id = run_id  # as in start_run: an interrupt held meanwhile can end it
            self._leave_last_words()  # before it runs again: a kill after it leaves no RUNNING
            self.client.update_run(run_id, status="RUNNING")
            return run_id

        self.run_id = self._guard(f"attaching to run {run_id}", attach)
        return self.run_id

    def start_or_resume(
        self,
        run_dir: RunDir,
        run_name: str,
        tags: Mapping[str, str] | None = None,
        parent_run_id: str | None = None,
    ) -> str | None:
        """The run recorded in ``run_dir`` (a retry or a continued training), else a new one
        that is then recorded there, so that every attempt of a task logs to the same run."""
        saved = run_dir.mlflow_run()
        if saved and saved.get("tracking_uri") == self.uri:  # another kind's folder: refused
            refuse_another_kind(self.client, run_dir.path, saved["run_id"], self.experiment)
        if saved and saved.get("tracking_uri") == self.uri and self.resume_run(saved["run_id"]):
            if tags:
                self.set_tags(tags)
            return self.run_id
        if self.start_run(run_name, tags, parent_run_id) is not None:
            run_dir.record_mlflow_run(self.run_id, self.uri)
        return self.run_id

    def end(self, status: str = "FINISHED") -> None:
        """Flush buffered metrics and set the run's final status (FINISHED, FAILED, KILLED)."""
        if not self.active:
            return
        self._stop_system_metrics()
        self.flush()
        self._retry_at = 0.0  # the last chance to record the status
        ended = self._guard(
            "ending the run", lambda: self.client.set_terminated(self.run_id, status) or True
        )
        if ended:  # else the reaper's words end it KILLED at exit, rather than never
            lifetime.take_back(f"mlflow:{self.run_id}")

    def _leave_last_words(self) -> None:
        """Should this process be killed outright (SIGKILL, the OOM killer), its reaper ends the
        run KILLED, unless another process has resumed it since (``tasks.lifetime``)."""
        argv = [sys.executable, "-c", END_ORPHAN, self.uri, self.run_id, _owner()]
        lifetime.last_words(f"mlflow:{self.run_id}", argv)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        from tasks.orchestration import interrupts

        if exc_type is None:
            self.end("FINISHED")
        elif issubclass(exc_type, interrupts()):
            self.end("KILLED")  # stopped on purpose (Ctrl-C, SIGTERM), not a failure
        else:
            self.end("FAILED")

    def log_datasets(self, datasets: list[tuple[str, str, str, Mapping[str, str]]]) -> None:
        """Each ``(name, digest, context, source)`` as one of the run's MLflow dataset inputs
        (the runs table's Dataset column and filter): ``context`` training, validation or
        evaluation; ``digest`` the content digest of its problems, so two runs on other data
        differ there; ``source`` where they came from (``provenance.data_source``)."""

        def write() -> None:
            from mlflow.data.code_dataset_source import CodeDatasetSource
            from mlflow.data.meta_dataset import MetaDataset
            from mlflow.entities import DatasetInput, InputTag
            from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

            inputs = [
                DatasetInput(
                    MetaDataset(CodeDatasetSource(dict(source)), name, digest)._to_mlflow_entity(),
                    [InputTag(MLFLOW_DATASET_CONTEXT, context)],
                )
                for name, digest, context, source in datasets
            ]
            self.client.log_inputs(self.run_id, datasets=inputs)

        if self.active:
            self._guard("logging the run's datasets", write)

    # -- params and tags ---------------------------------------------------------------------

    def log_params(self, params: Mapping[str, Any]) -> None:
        if not self.active:
            return
        from mlflow.entities import Param

        items = [Param(k, str(v)[:MAX_PARAM_LEN]) for k, v in params.items()]

        def write() -> None:
            for i in range(0, len(items), PARAMS_PER_BATCH):
                self.client.log_batch(self.run_id, params=items[i : i + PARAMS_PER_BATCH])

        self._guard("logging params", write)

    def log_config(self, cfg: Config) -> None:
        """The resolved config as flattened params and as ``config.json`` (what reproduce reads)."""
        self.log_params(flatten_config(cfg))
        self.log_dict(cfg.to_dict(), "config.json")
        lock = REPO_ROOT / "dvc.lock"
        if lock.exists():
            self.log_text(lock.read_text(), "dvc.lock")

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if not self.active:
            return
        from mlflow.entities import RunTag

        items = [RunTag(k, v) for k, v in _clip_tags(tags).items()]
        self._guard("setting tags", lambda: self.client.log_batch(self.run_id, tags=items))

    # -- metrics -----------------------------------------------------------------------------

    def log_metrics(
        self,
        metrics: Mapping[str, float],
        step: int,
        model_id: str | None = None,
        dataset: tuple[str, str] | None = None,
    ) -> None:
        """Buffer one step's metrics; written in batches (see the class docstring). With
        ``model_id`` (:meth:`log_model`) they are that model's too, measured on ``dataset``
        (name, digest): the Models page shows them."""
        now_ms = int(time.time() * 1000)
        name, digest = dataset or (None, None)
        for key, value in metrics.items():
            try:
                self._buffer.append((key, float(value), now_ms, int(step), model_id, name, digest))
            except (TypeError, ValueError):
                continue  # not a number: not a metric
        self._steps_waiting.add(int(step))
        if len(self._buffer) > MAX_BUFFER:
            del self._buffer[: len(self._buffer) - MAX_BUFFER]
        if (
            len(self._steps_waiting) >= self.flush_steps
            or time.monotonic() - self._last_flush >= self.flush_seconds
        ):
            self.flush()

    def flush(self) -> None:
        """Write the buffered metrics with ``log_batch`` (kept for later if the store fails)."""
        self._last_flush = time.monotonic()
        if not self.active or not self._buffer:
            return
        from mlflow.entities import Metric

        pending = list(self._buffer)

        def write() -> bool:
            for i in range(0, len(pending), METRICS_PER_BATCH):
                chunk = [Metric(*m) for m in pending[i : i + METRICS_PER_BATCH]]
                self.client.log_batch(self.run_id, metrics=chunk)
                del self._buffer[: len(chunk)]  # written: never sent twice
            return True

        if self._guard("logging metrics", write):
            self._steps_waiting.clear()

    # -- models and system metrics -----------------------------------------------------------

    def log_model(self, path: str | Path, step: int) -> str | None:
        """The policy directory ``path`` as an MLflow LoggedModel of this run (the Models page,
        the runs table's Model column), by reference: its files stay where they are (tag
        ``dapo.path``), as a 7B model's would. Logged once per run and directory; returns its
        id (``m-...``), which :meth:`log_metrics` links an evaluation of it to."""
        if not self.active:
            return None
        where = str(Path(path).resolve())
        return self._guard(
            f"logging the model at {where}",
            lambda: self._model_at(where) or self._new_model(where, step),
        )

    def registered_model(self, model_uri: str) -> str | None:
        """The id of the LoggedModel a ``models:/`` URI names (``dapo register``), to link an
        evaluation of it to (:meth:`log_metrics`); None when not tracked or not found."""
        if not self.active:
            return None
        from tasks.tracking.registry import logged_model_of

        return self._guard(f"reading {model_uri}", lambda: logged_model_of(model_uri, self.uri))

    def _model_at(self, where: str) -> str | None:
        """This run's LoggedModel of the directory ``where``, if it logged one."""
        query = f"source_run_id = '{self.run_id}' AND tags.`{MODEL_PATH_TAG}` = '{where}'"
        found = self.client.search_logged_models([self._experiment_id()], filter_string=query)
        return found[0].model_id if found else None

    def _new_model(self, where: str, step: int) -> str:
        from tasks.tracking.provenance import variant_of

        model = self.client.create_logged_model(
            self._experiment_id(),
            name=POLICY_MODEL_NAME,
            source_run_id=self.run_id,
            tags={MODEL_PATH_TAG: where},
            params={"step": str(step), "variant": variant_of(self.cfg)},
            model_type=POLICY_MODEL_TYPE,
        )
        self.client.finalize_logged_model(model.model_id, "READY")
        from mlflow.entities import LoggedModelOutput

        # the run's outputs: the runs table's Model column, the run page's Logged models
        self.client.log_outputs(self.run_id, [LoggedModelOutput(model.model_id, step)])
        return model.model_id

    def start_system_metrics(self, interval_s: float) -> None:
        """Sample CPU, memory, disk, network (and GPU where ``nvidia-ml-py`` is installed) every
        ``interval_s`` seconds into the run's System metrics tab, until :meth:`end`; 0 = off."""
        if not self.active or interval_s <= 0 or self._system_metrics is not None:
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        # its four INFO lines a run (started, stopped, no GPU to sample) only interleave the
        # command's own output; warnings still show
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)

        def start() -> Any:
            monitor = SystemMetricsMonitor(
                self.run_id, sampling_interval=interval_s, tracking_uri=self.uri
            )
            monitor.start()
            return monitor

        self._system_metrics = self._guard("starting system metrics", start)

    def _stop_system_metrics(self) -> None:
        monitor, self._system_metrics = self._system_metrics, None
        if monitor is not None:
            self._guard("stopping system metrics", monitor.finish)


def _owner() -> str:
    """This process, as no later process can be: its pid and start time."""
    return f"{os.getpid()}:{lifetime.start_time(os.getpid()) or '-'}"


def _clip_tags(tags: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v)[:MAX_TAG_LEN] for k, v in tags.items() if v is not None}
