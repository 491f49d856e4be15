"""The MLflow tracker: params, batching, tags, data version, and that a tracking failure never
stops a training run."""

import ast
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dapo_core.config_loader import from_dict, resolve
from tasks.data import version
from tasks.params import REPO_ROOT
from tasks.rundir import RunDir
from tasks.tracking import orphans, provenance
from tasks.tracking import store as tracking_store
from tasks.tracking import tracker as tracking
from tasks.tracking.tracker import Tracker

os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------


def test_flatten_config_round_trips(tiny_cfg):
    flat = tracking_store.flatten_config(tiny_cfg)
    assert flat["algo.loss.eps_high"] == "0.28" and flat["algo.clip_higher"] == "true"
    assert flat["algo.loss.dual_clip_c"] == "null" and flat["data.source"] == "synthetic:arith"
    assert flat["eval.pass_ks"] == "[1, 4, 16, 32]"
    assert all(len(v) <= tracking_store.MAX_PARAM_LEN for v in flat.values())
    back = from_dict(tracking_store.unflatten_params(flat))
    assert back == tiny_cfg


def test_flatten_config_truncates_long_values(tiny_cfg):
    cfg = resolve(tiny_cfg.to_dict(), overrides=["data.source=" + "x" * 7000])
    assert len(tracking_store.flatten_config(cfg)["data.source"]) == tracking_store.MAX_PARAM_LEN


def test_tracking_uri_precedence(tiny_cfg, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    default = tracking_store.tracking_uri(tiny_cfg)
    assert default == f"sqlite:///{REPO_ROOT / 'mlflow' / 'mlflow.db'}"  # anchored, not the cwd
    assert tracking_store.artifact_root(default) == (REPO_ROOT / "mlflow" / "artifacts").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://example:5000")
    assert tracking_store.tracking_uri(tiny_cfg) == "http://example:5000"
    assert tracking_store.artifact_root("http://example:5000") is None  # the server decides
    cfg = resolve(tiny_cfg.to_dict(), overrides=["tracking.tracking_uri=sqlite:////tmp/x.db"])
    assert tracking_store.tracking_uri(cfg) == "sqlite:////tmp/x.db"
    assert tracking_store.experiment_name(cfg, "ablate") == "dapo-ablate"
    with pytest.raises(ValueError, match="unknown flow kind"):
        tracking_store.experiment_name(cfg, "sweep")


LOCK = """schema: '2.0'
stages:
  curate:
    cmd: python -m tasks.data.curate
    outs:
    - path: data/curated
      hash: md5
      md5: {a}.dir
      size: 10
  eval_sets:
    cmd: python -m tasks.eval_sets
    outs:
    - path: data/eval/aime-2024.parquet
      md5: {b}
"""


def test_data_version_from_dvc_lock(tmp_path):
    lock = tmp_path / "dvc.lock"
    assert version.data_version(lock) == "none"
    lock.write_text(LOCK.format(a="1" * 32, b="2" * 32))
    v1 = version.data_version(lock)
    assert version.dvc_outputs(lock) == {
        "data/curated": "1" * 32 + ".dir",
        "data/eval/aime-2024.parquet": "2" * 32,
    }
    lock.write_text(LOCK.format(a="1" * 32, b="3" * 32))
    assert version.data_version(lock) != v1  # any output's change changes the version
    single = tmp_path / "one.lock"
    single.write_text("stages:\n  s:\n    outs:\n    - path: x\n      md5: abc\n")
    assert version.data_version(single) == "abc"


def test_git_commit_outside_a_repo(tmp_path):
    assert provenance.git_commit(tmp_path) == "unknown"
    assert provenance.git_dirty(tmp_path) == "unknown"


def test_tags_name_variant_seed_and_flow(tiny_cfg):
    from dapo_core.ablation import apply_variant

    tags = provenance.run_tags(apply_variant(tiny_cfg, "grpo"), "train", run_dir="/x")
    assert tags["variant"] == "grpo" and tags["seed"] == str(tiny_cfg.train.seed)
    assert tags["dapo.flow"] == "train" and tags["run_dir"] == "/x"
    assert {"git.commit", "data.version", "mlflow.source.git.commit"} <= set(tags)
    assert provenance.variant_of(tiny_cfg) == "+dynamic_sampling"  # params.yaml = full DAPO


def test_generated_data_versions_name_the_settings_the_problems_came_from(tiny_cfg):
    from dapo_core.config_loader import resolve

    version = provenance.data_version_of(tiny_cfg)
    assert version.startswith("generated:synthetic:arith@")
    assert provenance.data_version_of(resolve(tiny_cfg.to_dict())) == version  # same settings
    fewer = resolve(tiny_cfg.to_dict(), overrides=["synthetic.num_train=20"])
    assert provenance.data_version_of(fewer) != version  # other problems, another version


def test_only_tracking_imports_mlflow():
    """Layering: one room of the product (``tasks/tracking``) talks to MLflow."""
    offenders = []
    for pkg in ("dapo_core", "tasks", "flows"):
        for path in (REPO_ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
                    offenders.append(str(path.relative_to(REPO_ROOT)))
    assert offenders and all(p.startswith("tasks/tracking/") for p in offenders), offenders


# ---------------------------------------------------------------------------------------------
# Batching, against a recording client
# ---------------------------------------------------------------------------------------------


class RecordingClient:
    """Stands in for MlflowClient: records calls; ``fail`` makes chosen methods raise."""

    def __init__(self, fail=(), fail_times=10**9):
        self.calls: list[tuple[str, dict]] = []
        self.fail, self.fail_times = set(fail), fail_times

    def _record(self, method, **kw):
        if method in self.fail and self.fail_times > 0:
            self.fail_times -= 1
            raise OSError(f"database is locked ({method})")
        self.calls.append((method, kw))

    def get_experiment_by_name(self, name):
        self._record("get_experiment_by_name", experiment=name)
        return type("E", (), {"experiment_id": "1", "tags": {}})()

    def set_experiment_tag(self, experiment_id, key, value):
        self._record("set_experiment_tag", key=key, value=value)

    def create_run(self, experiment_id, run_name=None, tags=None):
        self._record("create_run", tags=tags)
        return type("R", (), {"info": type("I", (), {"run_id": "run1"})()})()

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self._record("log_batch", metrics=list(metrics), params=list(params), tags=list(tags))

    def log_metric(self, *a, **k):
        self._record("log_metric")

    def log_text(self, run_id, text, artifact_file):
        self._record("log_text", artifact_file=artifact_file)

    def set_terminated(self, run_id, status):
        self._record("set_terminated", status=status)

    def batches(self):
        return [kw["metrics"] for n, kw in self.calls if n == "log_batch" and kw["metrics"]]


def _tracker(cfg, client, **kw):
    t = Tracker(cfg, "train", uri="sqlite:////nonexistent/never-opened.db", **kw)
    t._client = client
    return t


def test_metrics_are_batched_never_one_call_per_value(tiny_cfg):
    client = RecordingClient()
    t = _tracker(tiny_cfg, client, flush_steps=20, flush_seconds=3600)
    assert t.start_run("r") == "run1"
    for step in range(1, 46):
        t.log_metrics({"train/loss": 0.1 * step, "train/acc_mean": 0.5, "not/a/number": "x"}, step)
    assert len(client.batches()) == 2  # steps 1-20 and 21-40; 41-45 still buffered
    t.end()
    batches = client.batches()
    assert len(batches) == 3 and not [c for c in client.calls if c[0] == "log_metric"]
    logged = [(m.key, m.step) for b in batches for m in b]
    assert len(logged) == 90 and ("train/loss", 45) in logged
    assert client.calls[-1] == ("set_terminated", {"status": "FINISHED"})
    # the config went in as params (<= 100 per batch) and as config.json
    params = [p for n, kw in client.calls if n == "log_batch" for p in kw["params"]]
    assert {p.key for p in params} == set(tracking_store.flatten_config(tiny_cfg))
    assert ("log_text", {"artifact_file": "config.json"}) in client.calls


def test_flush_on_time(tiny_cfg):
    client = RecordingClient()
    t = _tracker(tiny_cfg, client, flush_steps=1000, flush_seconds=0.0)
    t.start_run("r", log_config=False)
    t.log_metrics({"a": 1.0}, 1)
    assert len(client.batches()) == 1


def test_sink_skips_steps_already_logged(tiny_cfg, tmp_path):
    """The run directory's resume rule: steps an earlier attempt recorded are not sent again."""
    from tasks.training.run import recording_sink

    client = RecordingClient()
    t = _tracker(tiny_cfg, client, flush_steps=1)
    t.start_run("r", log_config=False)
    sink = recording_sink(RunDir(tmp_path), after=2, forward=t.log_metrics)
    for step in (1, 2, 3):
        sink({"train/loss": 1.0}, step)
    assert [m.step for b in client.batches() for m in b] == [3]
    assert [r["step"] for r in RunDir(tmp_path).read_metrics()] == [3]


# ---------------------------------------------------------------------------------------------
# Tracking failures never stop the run
# ---------------------------------------------------------------------------------------------


def test_failure_warns_once_keeps_metrics_and_recovers(tiny_cfg, caplog):
    client = RecordingClient(fail={"log_batch"}, fail_times=2)
    t = _tracker(tiny_cfg, client, flush_steps=1, retry_after_s=0.0)
    t.start_run("r", log_config=False)
    with caplog.at_level(logging.WARNING, logger="tasks.tracking.tracker"):
        t.log_metrics({"a": 1.0}, 1)  # fails: kept in the buffer
        t.log_metrics({"a": 2.0}, 2)  # fails again: one warning only
        t.log_metrics({"a": 3.0}, 3)  # the store is back: everything is written
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "database is locked" in warnings[0].getMessage()
    assert "The run goes on" in warnings[0].getMessage()
    assert [m.step for b in client.batches() for m in b] == [1, 2, 3]
    assert t.failures == 2


def test_paused_after_failure(tiny_cfg):
    client = RecordingClient(fail={"log_batch"}, fail_times=1)
    t = _tracker(tiny_cfg, client, flush_steps=1, retry_after_s=3600)
    t.start_run("r", log_config=False)
    t.log_metrics({"a": 1.0}, 1)
    t.log_metrics({"a": 2.0}, 2)  # within the pause: not even tried
    assert t.failures == 1 and client.batches() == []


def test_unwritable_store_does_not_raise(tiny_cfg, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    t = Tracker(tiny_cfg, "train", uri=f"sqlite:///{blocker}/sub/mlflow.db")
    with caplog.at_level(logging.WARNING, logger="tasks.tracking.tracker"):
        assert t.start_run("r") is None
        t.log_metrics({"a": 1.0}, 1)
        t.log_text("x", "x.txt")
        t.end()
    assert not t.active
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_server_down_does_not_stall_or_raise(tiny_cfg, monkeypatch):
    import time

    for key in tracking.HTTP_DEFAULTS:  # MLflow's own defaults would retry for ~4 minutes
        monkeypatch.delenv(key, raising=False)
    # what stalls is the retries' back-off: count the seconds the HTTP client asks to sleep
    asked, real_sleep = [], time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: (asked.append(s), real_sleep(s))[-1])
    t = Tracker(tiny_cfg, "train", uri=f"http://127.0.0.1:{_free_port()}")
    assert t.start_run("r") is None and t.failures == 1
    t.log_metrics({"a": 1.0}, 1)
    t.end()
    assert 0 < sum(asked) < 10, asked  # it did back off (so the count sees it), briefly


@pytest.mark.slow
def test_training_survives_a_broken_tracker(tiny_cfg, tmp_path, caplog):
    """A real (tiny) training run whose every MLflow call raises still finishes."""
    from tasks.training.run import run_training

    cfg = resolve(tiny_cfg.to_dict(), overrides=["train.steps=3"])
    client = RecordingClient()
    t = _tracker(cfg, client, flush_steps=1, retry_after_s=0.0)
    t.start_run("r", log_config=False)
    client.fail = {"log_batch", "set_terminated", "log_text"}  # the store breaks mid-run
    with caplog.at_level(logging.WARNING, logger="tasks.tracking.tracker"):
        result = run_training(cfg, RunDir(tmp_path / "run"), sink=t.log_metrics, progress=False)
        t.end()
    assert result.steps == 3 and (tmp_path / "run" / "final").exists()
    warned = [r for r in caplog.records if r.name == "tasks.tracking.tracker"]
    assert len([r for r in warned if r.levelno == logging.WARNING]) == 1  # once, not per call
    assert t.failures >= 3


# ---------------------------------------------------------------------------------------------
# A real SQLite store
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def store(empty_stores, tmp_path):
    """A fresh store in its own directory (its artifacts beside it), copied from the run's
    empty migrated one (creating one takes seconds)."""
    db = tmp_path / "mlflow" / "mlflow.db"
    db.parent.mkdir()
    shutil.copy(empty_stores / "mlflow.db", db)
    return f"sqlite:///{db}"


@pytest.mark.slow
def test_real_store_round_trip(tiny_cfg, store, tmp_path, monkeypatch):
    from dapo_core.errors import PipelineError
    from tasks.tracking.plots import eval_curve

    monkeypatch.chdir(tmp_path)
    cfg = resolve(tiny_cfg.to_dict(), overrides=["train.seed=7"])
    t = Tracker(cfg, "ablate", uri=store)
    parent = t.start_run("parent", provenance.run_tags(cfg, "ablate"))
    child = Tracker(cfg, "ablate", uri=store)
    run_dir = RunDir(tmp_path / "run")
    child_id = child.start_or_resume(run_dir, "child", {"variant": "grpo"}, parent_run_id=parent)
    for step in range(1, 4):
        child.log_metrics({"train/loss": float(step)}, step)
    child.log_figure(eval_curve([{"step": 1, "val/avg_at_k": 0.5}]), "plots/eval_curve.png")
    child.log_table([{"step": 1, "response": "Answer: 3"}], "samples/train_samples.json")
    child.end("FAILED")
    t.end()
    # a retry finds the same run through the run directory and continues its metrics
    again = Tracker(cfg, "ablate", uri=store)
    # another kind of run under the same name (`dapo pipeline --run-name` of a sweep's folder)
    # is refused: it logged itself into the sweep's run
    with pytest.raises(PipelineError, match="holds a run of MLflow experiment dapo-ablate, not "
                       "dapo-pipeline: pick another --run-name"):  # fmt: skip
        Tracker(cfg, "pipeline", uri=store).start_or_resume(run_dir, "other")
    assert again.start_or_resume(run_dir, "child") == child_id
    assert [s for s, _ in tracking_store.metric_history(child_id, "train/loss", store)] == [1, 2, 3]
    again.end()

    info = tracking_store.read_run(child_id, store)
    assert info["status"] == "FINISHED" and info["experiment"] == "dapo-ablate"
    assert info["tags"]["mlflow.parentRunId"] == parent
    assert from_dict(info["config"]) == cfg and info["params"]["train.seed"] == "7"
    arts = set(tracking_store.list_artifacts(child_id, uri=store))
    assert {"config.json", "plots/eval_curve.png", "samples/train_samples.json"} <= arts
    # artifacts live beside the database, not in ./mlruns of the cwd
    art_dir = Path(store[len("sqlite:///") :]).parent / "artifacts" / "dapo-ablate"
    assert any(art_dir.rglob("eval_curve.png"))
    assert not (tmp_path / "mlruns").exists()


def test_buffered_metrics_reach_mlflow_in_few_batched_calls(tiny_cfg, store, monkeypatch):
    """Batching, the reason for the buffer: 200 values logged one step at a time reach MLflow
    whole, in one log_batch call (a per-value call costs a store round trip each; timings
    belong in benchmarks, so this counts calls)."""
    t = Tracker(tiny_cfg, "train", uri=store, flush_steps=10**9, flush_seconds=10**9)
    run_id = t.start_run("bench", log_config=False)
    calls = []
    log_batch = t.client.log_batch
    monkeypatch.setattr(
        t.client, "log_batch", lambda *a, **kw: (calls.append(kw), log_batch(*a, **kw))[1]
    )
    for i in range(200):
        t.log_metrics({"batched": float(i)}, i)
    assert not calls  # buffered until the flush
    t.flush()
    assert len(calls) == 1 and len(calls[0]["metrics"]) == 200
    history = tracking_store.metric_history(run_id, "batched", store)
    assert [v for _, v in sorted(history)] == [float(i) for i in range(200)]


def test_an_abandoned_run_is_ended_killed_once(tiny_cfg, store, tmp_path):
    """A process killed before it could end its MLflow run leaves it RUNNING; the backstop ends
    the run recorded in its run directory KILLED, and leaves an ended run as it was."""
    run_dir = RunDir(tmp_path / "run")
    assert not tracking_store.end_abandoned_run(run_dir.path)  # nothing recorded there
    abandoned = Tracker(tiny_cfg, "ablate", uri=store)
    run_id = abandoned.start_or_resume(run_dir, "killed child")
    assert tracking_store.read_run(run_id, store)["status"] == "RUNNING"
    assert tracking_store.end_abandoned_run(run_dir.path)
    assert tracking_store.read_run(run_id, store)["status"] == "KILLED"
    assert not tracking_store.end_abandoned_run(run_dir.path, "FAILED")  # already ended
    assert tracking_store.read_run(run_id, store)["status"] == "KILLED"
    run_dir.mlflow_file.write_text('{"run_id": ')  # torn by a kill mid-write: no error
    assert not tracking_store.end_abandoned_run(run_dir.path)


def test_ui_addresses_open_the_training_view(tiny_cfg, store):
    """Every address we print opens MLflow's model-training pages (its UI defaults to GenAI):
    a run's page, an experiment, a saved view; on the tracking server itself when there is one,
    else where `dapo ui` serves; only the experiments that exist are listed."""
    from urllib.parse import parse_qs, urlsplit

    def parts(url):
        split = urlsplit(url)
        path, _, query = split.fragment.partition("?")
        return f"{split.scheme}://{split.netloc}", path, parse_qs(query)

    assert tracking_store.experiment_urls(tiny_cfg, store) == {}  # nothing made yet
    t = Tracker(tiny_cfg, "train", uri=store)
    run_id = t.start_run("linked", log_config=False)
    base, path, query = parts(t.run_url())
    exp_id = t.client.get_run(run_id).info.experiment_id
    assert (
        base == "http://127.0.0.1:5000"
        and path == f"/experiments/{exp_id}/runs/{run_id}/model-metrics"
    )
    assert query == {"workflowType": ["machine_learning"]}
    view = t.save_runs_view("v1", "a view", {"searchFilter": ""})
    assert parts(view)[1] == f"/experiments/{exp_id}/runs"  # where MLflow applies a saved view
    assert parts(view)[2] == {"viewStateShareKey": ["v1"], "workflowType": ["machine_learning"]}
    t.end()
    assert tracking_store.experiment_urls(tiny_cfg, store) == {
        "dapo-train": f"http://127.0.0.1:5000/#/experiments/{exp_id}/runs?workflowType=machine_learning"
    }
    remote = tracking_store.ui_url("https://mlflow.example.org/", "7", "abc")
    assert parts(remote)[:2] == (
        "https://mlflow.example.org",
        "/experiments/7/runs/abc/model-metrics",
    )
    assert Tracker(tiny_cfg, "train", uri=store).run_url() is None  # no run started


class _Stop(BaseException):
    """What this test's SIGINT handler raises (as Ctrl-C raises KeyboardInterrupt)."""


def test_an_interrupt_waits_for_the_store_write_it_arrives_in(tiny_cfg, tmp_path):
    """A Ctrl-C during an MLflow call is delivered when the call returns, so the write is never
    cut in the middle (cut inside SQLAlchemy's commit, it left the SQLite store locked: ending
    the run KILLED then failed, with a traceback, and the run stayed RUNNING). A second Ctrl-C
    is delivered at once."""
    import signal
    import time

    def stop(signum, frame):
        raise _Stop

    previous = signal.signal(signal.SIGINT, stop)
    try:
        t = Tracker(tiny_cfg, "train", uri=f"sqlite:///{tmp_path}/mlflow.db")
        done = []

        def write(times: int):
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # an unheld handler would run here
            done.append(times)
            return "written"

        with pytest.raises(_Stop):
            t._guard("writing", lambda: write(1))
        assert done == [1]  # the write finished first
        with pytest.raises(_Stop):
            t._guard("writing", lambda: write(2))
        assert done == [1]  # the second signal cut it
        assert t._guard("writing", lambda: write(0)) == "written"  # no signal, nothing held
        assert signal.getsignal(signal.SIGINT) is stop
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_interrupt_held_while_a_run_is_created_can_end_it(tiny_cfg, tmp_path):
    """The signal held during ``create_run`` is delivered as the call returns: the tracker knows
    the run by then, so the interrupt's clean-up ends it KILLED (it was left RUNNING: a sweep
    child SIGTERMed as it opened its run)."""
    import signal

    from mlflow import MlflowClient

    def stop(signum, frame):
        raise _Stop

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    previous = signal.signal(signal.SIGINT, stop)
    try:
        t = Tracker(tiny_cfg, "train", uri=uri)
        create = t.client.create_run

        def create_then_interrupted(*args, **kwargs):
            run = create(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGINT)
            return run

        t.client.create_run = create_then_interrupted
        with pytest.raises(_Stop):
            t.start_run("cut", log_config=False)
        assert t.run_id is not None
        t.end("KILLED")
        assert MlflowClient(tracking_uri=uri).get_run(t.run_id).info.status == "KILLED"
    finally:
        signal.signal(signal.SIGINT, previous)


TRACKED = (
    "import sys, time\n"
    "from tasks.params import load_params\n"
    "from tasks.tracking.tracker import Tracker\n"
    "cfg = load_params(overrides=[f'tracking.tracking_uri={sys.argv[1]}'])\n"
    "tracker = Tracker(cfg, 'train')\n"
    "print(tracker.start_run('killed', log_config=False), flush=True)\n"
    "while True:\n"
    "    time.sleep(0.1)\n"
)


@pytest.mark.slow
def test_a_run_whose_process_is_killed_outright_ends_killed(tmp_path):
    """SIGKILL (the OOM killer, a scheduler past its grace period) runs no handler: the
    reaper's last words end the run KILLED; a run another process resumed since is left be."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", TRACKED, uri], stdout=subprocess.PIPE, text=True, cwd=root
    )
    run_id = proc.stdout.readline().strip()
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING"
    owner = run.data.tags[orphans.OWNER_TAG]
    assert owner.startswith(f"{proc.pid}:")
    assert not orphans.end_orphaned_run(uri, run_id, "another:owner")  # resumed since
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 180  # a hang guard: the words import MLflow, on busy cores
    while client.get_run(run_id).info.status == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.get_run(run_id).info.status == "KILLED"


def test_the_last_words_import_mlflow_and_nothing_heavy_of_ours():
    """The reaper's process for a killed run imports MLflow only: not torch, not the config (a
    second or more on 2 cores before the run can be ended)."""
    imports = orphans.END_ORPHAN.split(";")[1].strip()  # what the reaper's process runs
    probe = f"{imports}; from mlflow import MlflowClient; import sys; print(sorted(" + (
        "m for m in ('torch', 'transformers', 'dapo_core', 'tasks.params') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_run_s_data_source_names_the_generator_or_the_dvc_tracked_file(tiny_cfg, tmp_path):
    generated = provenance.data_source(tiny_cfg)
    assert generated["generator"] == tiny_cfg.data.source
    assert generated["synthetic.num_train"] == str(tiny_cfg.synthetic.num_train)
    data = tmp_path / "curated.parquet"
    data.write_bytes(b"rows")
    cfg = resolve(tiny_cfg.to_dict(), overrides=[f"data.source={data}"])
    assert provenance.data_source(cfg)["dvc.md5"] == "not tracked by DVC"
    (tmp_path / "curated.parquet.dvc").write_text(
        f"outs:\n- md5: 0123456789abcdef0123456789abcdef\n  path: {data.name}\n"
    )
    tracked = provenance.data_source(cfg)
    assert tracked["path"] == str(data) and tracked["dvc.md5"] == "0123456789abcdef0123456789abcdef"


def test_a_store_mlflow_cannot_open_is_a_lookup_error_naming_it():
    """`dapo reproduce RUN --tracking-uri bogus://x` says what MLflow opens, not a traceback
    from its registry (LookupError is what the command turns into one line)."""
    from tasks.tracking.store import read_run

    with pytest.raises(LookupError, match=r"cannot open a tracking store at 'bogus://x'"):
        read_run("deadbeef", "bogus://x")


def test_a_mistyped_sqlite_store_is_refused_and_not_created(tmp_path):
    """`dapo reproduce RUN --tracking-uri sqlite:///typo.db` (or `dapo register`) made an empty
    database at the typo and then found no run in it."""
    from dapo_core.errors import PipelineError
    from tasks.tracking import registry
    from tasks.tracking.store import read_run

    typo = f"sqlite:///{tmp_path / 'mlfow.db'}"
    with pytest.raises(LookupError, match=r"no MLflow store at .*mlfow\.db .*: check the path"):
        read_run("0" * 32, typo)
    with pytest.raises(PipelineError, match="no MLflow store at"):
        registry.register("0" * 32, uri=typo)
    assert list(tmp_path.iterdir()) == []


def test_a_tracking_server_that_does_not_answer_is_refused_in_seconds():
    """`dapo register/reproduce` against a server that is down retried each call for ~4
    minutes, then said the run was not in the store."""
    import socket
    import time

    from dapo_core.errors import PipelineError
    from tasks.tracking import registry
    from tasks.tracking.store import read_run

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}"
    t0 = time.monotonic()
    with pytest.raises(LookupError, match=f"the MLflow server at {down} does not answer \\("):
        read_run("0" * 32, down)
    with pytest.raises(PipelineError, match="does not answer .*: start it, or name a running"):
        registry.register("0" * 32, uri=down)
    assert time.monotonic() - t0 < 30


def test_a_tracking_uri_of_a_scheme_no_store_takes_is_refused_a_plugin_s_is_not(
    tiny_cfg, monkeypatch
):
    """ftp://, or a folder store MLflow 3 refuses unless opted in, was found out when the run
    began (and the run went on untracked); a scheme an installed plugin registers is MLflow's
    to open."""
    from dataclasses import replace

    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    from dapo_core.config import ConfigError
    from tasks.tracking.store import refuse_unknown_store

    def with_uri(uri):
        return replace(tiny_cfg, tracking=replace(tiny_cfg.tracking, tracking_uri=uri))

    for uri in ("sqlite:///x.db", "http://h:5000", "databricks", "postgresql+psycopg2://u@h/d"):
        refuse_unknown_store(with_uri(uri))
    for uri in ("/a/path", "file:///a/path", "mlruns"):  # MLflow 3's folder store: opted in
        with pytest.raises(ConfigError, match="only with MLFLOW_ALLOW_FILE_STORE=true; set"):
            refuse_unknown_store(with_uri(uri))
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        refuse_unknown_store(with_uri(uri))
        monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    with pytest.raises(ConfigError, match=r"^tracking.tracking_uri ftp://h/x: MLflow has no"):
        refuse_unknown_store(with_uri("ftp://h/x"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "ftp://h/x")
    with pytest.raises(ConfigError, match=r"set MLFLOW_TRACKING_URI to one$"):
        refuse_unknown_store(with_uri(""))
    monkeypatch.setitem(_tracking_store_registry._registry, "myplugin", lambda **kw: None)
    refuse_unknown_store(with_uri("myplugin://somewhere"))


def test_mlflow_subprocesses_keep_a_users_warning_filters_and_drop_the_servers_import_one(
    monkeypatch,
):
    """`dapo ui` printed a Starlette deprecation warning from MLflow's own imports at every
    start; a user's PYTHONWARNINGS still applies."""
    from tasks.tracking import store

    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    assert store.mlflow_env()["PYTHONWARNINGS"] == "ignore::UserWarning:mlflow.server.fastapi_app"
    monkeypatch.setenv("PYTHONWARNINGS", "error")
    warnings = store.mlflow_env()["PYTHONWARNINGS"].split(",")
    assert warnings == ["error", "ignore::UserWarning:mlflow.server.fastapi_app"]


def test_the_evaluation_curve_shows_the_evaluation_before_training_beside_the_final_one():
    """The pipeline evaluates at step 0 too; its curve showed only validation and the final
    point, so a run that lifted the score 0.35 -> 0.66 looked as if it fell (0.53 -> 0.43 on
    validation) with no start to compare with."""
    from tasks.tracking.plots import eval_curve

    validation = [{"step": 20, "val/avg_at_k": 0.53}, {"step": 40, "val/avg_at_k": 0.43}]
    start = {"step": 0, "eval/avg_at_k": 0.35, "eval/avg_at_k_ci_low": 0.3}
    final = {"step": 50, "eval/avg_at_k": 0.66, "eval/avg_at_k_ci_high": 0.7}
    ax = eval_curve(validation, final, start).axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["validation avg@k", "before training", "final evaluation"]
    points = {tuple(line.get_xydata()[0]) for line in ax.lines if len(line.get_xydata()) == 1}
    assert {(0.0, 0.35), (50.0, 0.66)} <= points
    assert (
        "before training"
        not in eval_curve(validation, final).axes[0].get_legend_handles_labels()[1]
    )
