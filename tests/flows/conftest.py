"""Flow smoke tests: one Prefect test harness and one MLflow store for the whole session.

The embedded Prefect server takes 10-20 s to start and a new MLflow SQLite store several seconds
to migrate, so both are session-scoped; PREFECT_HOME (and the results path) point at a temp dir.
Flows read a params file written from the session's tiny config (``flow_params``).
"""

import json
import logging
import os
import shutil

import pytest

from dapo_core.config_loader import resolve

# Prefect's console handler keeps the stream it first saw; under CliRunner that stream is closed
# after the invocation, and each later record would print a logging error with a call stack.
logging.raiseExceptions = False

# Telemetry off, offline; set before Prefect or MLflow are imported.
for _k, _v in {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}.items():
    os.environ.setdefault(_k, _v)


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory, empty_stores):
    """Prefect's test harness (a server on a temporary SQLite database), its database copied
    from the run's migrated one: the harness would otherwise migrate a new one itself."""
    from unittest import mock

    import prefect.settings as settings
    import prefect.testing.utilities as harness

    home = tmp_path_factory.mktemp("prefect_home")
    database = tmp_path_factory.mktemp("prefect_harness")
    # the harness keeps its database as prefect-test.db in a directory it asks mkdtemp for
    shutil.copyfile(empty_stores / "prefect" / "prefect.db", database / "prefect-test.db")
    updates = {
        settings.PREFECT_HOME: str(home),
        settings.PREFECT_LOCAL_STORAGE_PATH: str(home / "storage"),
        # Off: the services no test here uses, which poll the database all session long in
        # each worker's server (schedules, late runs, worker health, automations, vacuums).
        # On: what records runs and their events, cancels a cancelled run's children, and
        # expires concurrency leases.
        **dict.fromkeys(
            (
                settings.PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED,
                settings.PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED,
                settings.PREFECT_SERVER_SERVICES_FOREMAN_ENABLED,
                settings.PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED,
                settings.PREFECT_SERVER_SERVICES_PAUSE_EXPIRATIONS_ENABLED,
                settings.PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED,
                settings.PREFECT_SERVER_SERVICES_CLEANUP_RECONCILER_ENABLED,
            ),
            False,
        ),
    }
    with (
        settings.temporary_settings(updates=updates),
        mock.patch.object(harness, "mkdtemp", lambda: str(database)),
        harness.prefect_test_harness(server_startup_timeout=90),
    ):
        yield


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory, empty_stores):
    """A temp SQLite tracking store for the session (MLFLOW_TRACKING_URI points at it), there
    from the start, as a store that has runs is (a copy of the migrated empty one)."""
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    shutil.copyfile(empty_stores / "mlflow.db", db)
    uri = f"sqlite:///{db}"
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    yield uri
    if old is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = old


FLOW_OVERRIDES = [
    "train.steps=2",
    "eval.n_samples=2",
    "eval.every_n_steps=1",
    "data.val_size=4",
    "synthetic.num_test=12",
]


@pytest.fixture(scope="session")
def flow_cfg(tiny_cfg, tmp_path_factory):
    """The tiny config the flows run: 2 steps, validation every step, 2 samples per problem.

    Its model is built here, once, into a directory of its own: fewer validation and test
    problems are other build settings than ``tiny_cfg``'s, and two settings sharing one
    directory would rebuild it back and forth (in every command a flow test starts)."""
    from tasks.models.resolve import resolve_model_path

    runs = tmp_path_factory.mktemp("runs")
    model = tmp_path_factory.mktemp("flow_tiny") / "model"
    overrides = [*FLOW_OVERRIDES, f"train.out_dir={runs}", f"tiny.path={model}"]
    cfg = resolve(tiny_cfg.to_dict(), overrides=overrides)
    resolve_model_path(cfg)
    return cfg


def write_params(cfg, path) -> str:
    path.write_text(json.dumps(cfg.to_dict(), indent=2))
    return str(path)


@pytest.fixture(scope="session")
def flow_params(flow_cfg, tmp_path_factory):
    """Path of a params file holding ``flow_cfg`` (what the flows' ``params`` argument takes)."""
    return write_params(flow_cfg, tmp_path_factory.mktemp("params") / "params.json")


@pytest.fixture(scope="session")
def flows_env(prefect_harness, mlflow_uri):
    """The Prefect harness and the temp MLflow store together."""
    return mlflow_uri


@pytest.fixture(scope="session")
def pipeline_run(flows_env, flow_cfg, tmp_path_factory):
    """One pipeline flow run (curate -> train -> evaluate) shared by the tests that read it."""
    import time

    from flows.pipeline import pipeline_flow

    params = write_params(
        resolve(flow_cfg.to_dict(), overrides=["algo.dynamic_sampling=false"]),
        tmp_path_factory.mktemp("pipeline") / "params.json",
    )
    t0 = time.perf_counter()
    state = pipeline_flow(params=params, progress=False, return_state=True)
    out = state.result()
    out["wall_s"] = time.perf_counter() - t0
    out["flow_run_id"] = str(state.state_details.flow_run_id)
    out["params"] = params
    return out
