"""Interrupts as a terminal and a scheduler send them (issue 23, item 2): SIGINT or SIGTERM to
the command's whole process group, which held Prefect's temporary server too. Real commands in
sessions of their own, real signals; the full matrix (every phase, to the group and to the
process) is ``python -m bench.interrupts``."""

import json

import pytest

from bench.interrupts import Trial, run_trial
from dapo_core.config_loader import resolve
from tasks.models.resolve import resolve_model_path

# Long enough that the signal lands inside the phase: more problems to evaluate.
LONGER_EVAL = ["-S", "synthetic.num_test=200", "-S", "eval.n_samples=32"]


@pytest.fixture(scope="module")
def setting(flow_cfg, mlflow_uri, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("interrupts")
    # the test model learns nothing: the stall guard would end training before the signal
    overrides = [f"train.out_dir={scratch / 'runs'}", "train.max_stalled_steps=0"]
    cfg = resolve(flow_cfg.to_dict(), overrides=overrides)
    params = scratch / "params.json"
    params.write_text(json.dumps(cfg.to_dict()))
    return scratch, resolve_model_path(cfg), mlflow_uri, ["--params", str(params)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "trial",
    [
        Trial("train", "training", "INT", "group"),
        Trial("pipeline", "evaluation", "TERM", "group"),
        Trial("ablate", "training", "INT", "group"),
    ],
    ids=lambda t: f"{t.command}-{t.phase}-SIG{t.sig}-{t.to}",
)
def test_a_signal_to_the_group_ends_the_command_with_its_records(setting, trial):
    scratch, model, uri, params = setting
    extra = params + (LONGER_EVAL if trial.phase == "evaluation" else [])
    out = run_trial(trial, scratch, model, uri, extra)
    assert out.exit_code == 130, out.last_line
    assert out.last_line.startswith("interrupted:"), out.last_line
    assert out.seconds < 10, out
    assert not out.traceback and not out.left, out
    # the runs it started: MLflow KILLED, Prefect CANCELLED (written while the server was up)
    assert out.mlflow and set(out.mlflow) == {"KILLED"}, out
    assert out.prefect and set(out.prefect) == {"CANCELLED"}, out
    if trial.command == "train":
        assert "dapo train --resume" in out.last_line
    if trial.command == "pipeline":
        assert "dapo pipeline --run-name" in out.last_line


@pytest.mark.parametrize("delay_s", [0.1, 0.4, 0.8])
def test_a_signal_while_the_command_imports_ends_it_at_once(tmp_path, delay_s):
    """Before the command has loaded its config it has started nothing: Ctrl-C ends it at once.
    (A KeyboardInterrupt raised inside an import was swallowed by a library: the command ran to
    the end.)"""
    import os
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "train", "--run-dir", str(run)],
        env={**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    time.sleep(delay_s)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, out[-2000:]
    assert out.strip().endswith("interrupted before anything had started"), out[-2000:]
    assert not run.exists() and not (tmp_path / "prefect").exists()
