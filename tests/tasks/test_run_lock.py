"""One writer per run directory, durable checkpoints and safe loading (issue 23, items 3 and 5)."""

import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from dapo_core.config_loader import resolve
from dapo_core.errors import PipelineError
from flows.cli import app
from tasks.durable import seal_files
from tasks.run_lock import RunDirBusy
from tasks.rundir import COMPLETE, RunDir
from tasks.training import checkpoint
from tasks.training.batches import Group
from tasks.training.run import run_training

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path, name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        PREFECT_HOME=str(tmp_path / f"prefect-{name}"),
        MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}",
    )
    return env


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _holder(run_dir: Path) -> int | None:
    """The pid the lock file names (None before anyone wrote it)."""
    try:
        return json.loads((run_dir / ".lock").read_text() or "{}").get("pid")
    except FileNotFoundError:
        return None


def _steps(run_dir: Path) -> list[int]:
    """The step of every line of metrics.jsonl, duplicates included."""
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _lines(run_dir: Path) -> int:
    """Complete lines in metrics.jsonl (a line being written is not counted)."""
    return (run_dir / "metrics.jsonl").read_text().count("\n")


def _strip(history):  # timings differ between runs; everything else must match exactly
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in history]


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = (load_file(str(p / "final" / "model.safetensors")) for p in (a, b))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_two_concurrent_resumes_one_runs_the_other_is_refused(tiny_cfg, tmp_path):
    """Two `dapo train --resume DIR` at once (real processes): one trains on, the other exits 2
    in one line naming the first's pid, before Prefect or MLflow start, and writes nothing."""
    # enough steps left that the first is still training when the second has started up
    cfg = resolve(tiny_cfg.to_dict(), overrides=["train.steps=2000", "train.max_stalled_steps=0"])
    run = tmp_path / "run"
    run_training(cfg, RunDir(run), progress=False, max_steps=2)
    cmd = [sys.executable, "-m", "flows.cli", "train", "--resume", str(run), "--no-track"]
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen(cmd, cwd=ROOT, env=_env(tmp_path, "first"), stdout=log, stderr=log)
        try:
            _wait_for(lambda: _holder(run) == first.pid, 120, "the first to lock")
            second = subprocess.run(
                cmd,
                cwd=ROOT,
                env=_env(tmp_path, "second"),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            # it trains on past the checkpoint (it takes the lock before its first step)
            _wait_for(lambda: _lines(run) > 2, 120, "the first to train a step")
            first.send_signal(signal.SIGINT)  # stopped as Ctrl-C stops it: no need to finish
            assert first.wait(timeout=120) == 130, (tmp_path / "first.log").read_text()[-3000:]
        finally:
            first.kill()
    assert second.returncode == 2, second.stderr[-3000:]
    errors = [x for x in second.stderr.splitlines() if "error" in x]
    assert len(errors) == 1 and f"pid {first.pid}" in errors[0] and "--resume" in errors[0]
    assert "Traceback" not in second.stderr
    assert not (tmp_path / "prefect-second" / "prefect.db").exists()  # no flow run began
    steps = _steps(run)
    assert len(steps) > 2 and steps == list(range(1, len(steps) + 1))  # one line each, none twice


@pytest.mark.slow
def test_a_live_writer_refuses_others_and_once_killed_blocks_no_resume(tiny_cfg, tmp_path):
    """A run stopped at step 2 (alive, holding its directory): a resume and a new run there are
    refused with its pid and write nothing. SIGKILLed, it leaves no lock behind: the resume
    continues from its checkpoint and ends as the uninterrupted run does."""
    cfg = resolve(tiny_cfg.to_dict(), overrides=["train.steps=4", "train.checkpoint_every=2"])
    params = tmp_path / "params.json"
    params.write_text(json.dumps(cfg.to_dict()))
    run = tmp_path / "run"
    worker = [sys.executable, str(ROOT / "tests/tasks/stall_worker.py"), str(params), str(run)]
    holder = subprocess.Popen(
        [*worker, "2"], cwd=ROOT, env=_env(tmp_path, "w"), stdout=subprocess.PIPE, text=True
    )
    try:
        lines = (x.strip() for x in iter(holder.stdout.readline, ""))
        assert "at step 2" in lines  # before it, DeepSpeed's notices; after it, the stall
        before = (run / "metrics.jsonl").read_text()
        for resume in (True, False):
            with pytest.raises(RunDirBusy, match=f"pid {holder.pid}"):
                run_training(cfg, RunDir(run), resume=resume, progress=False)
        assert (run / "metrics.jsonl").read_text() == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    rest = run_training(cfg, RunDir(run), resume=True, progress=False)
    full = run_training(cfg, RunDir(tmp_path / "full"), progress=False)
    assert rest.start.step == 2 and _steps(run) == [1, 2, 3, 4]
    assert _strip(rest.history) == _strip(full.history)
    assert _same_weights(run, tmp_path / "full")


@pytest.mark.slow
def test_a_corrupt_latest_checkpoint_is_passed_over_with_a_warning(tiny_cfg, tmp_path, caplog):
    over = ["train.steps=4", "train.checkpoint_every=1", "train.keep_checkpoints=3"]
    cfg = resolve(tiny_cfg.to_dict(), overrides=over)
    full = run_training(cfg, RunDir(tmp_path / "full"), progress=False)
    cut = RunDir(tmp_path / "cut")
    run_training(cfg, cut, progress=False, max_steps=3)
    latest = cut.latest_checkpoint()
    tensors = latest / "model" / "model.safetensors"
    os.truncate(tensors, tensors.stat().st_size // 2)
    with caplog.at_level(logging.WARNING, logger="tasks.rundir"):
        rest = run_training(cfg, cut, resume=True, progress=False)
    warned = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warned) == 1 and latest.name in warned[0] and "at step 2" in warned[0]
    assert "model/model.safetensors" in warned[0]
    assert rest.start.step == 2 and rest.start.damaged == (latest,)
    assert (latest.parent / f".damaged-{latest.name}").is_dir()  # set aside, never resumed
    assert _strip(rest.history) == _strip(full.history)
    assert _same_weights(tmp_path / "full", tmp_path / "cut")


class _Payload:
    """Unpickled, it would run a shell command: what a crafted checkpoint carries."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.slow
def test_a_checkpoint_crafted_to_run_code_is_refused(tiny_cfg, tmp_path):
    cfg = resolve(tiny_cfg.to_dict(), overrides=["train.steps=2"])
    rd = RunDir(tmp_path / "run")
    run_training(cfg, rd, progress=False, max_steps=1)
    ckpt, marker = rd.latest_checkpoint(), tmp_path / "pwned"
    state = ckpt / checkpoint.TRAINER_STATE
    torch.save({"step": 1, "world": 1, "evil": _Payload(marker)}, state)
    torch.load(state, weights_only=False)  # the payload works where pickles are trusted
    assert marker.exists()
    marker.unlink()
    # Complete and intact by its record, as whoever crafted it would leave it.
    meta = json.loads((ckpt / COMPLETE).read_text())
    meta["files"].update(seal_files(ckpt, [state]))
    (ckpt / COMPLETE).write_text(json.dumps(meta))
    with pytest.raises(PipelineError, match=re.escape(f"refusing to load {state}")) as refused:
        run_training(cfg, rd, resume=True, progress=False)
    assert "\n" not in str(refused.value) and "posix.system" in str(refused.value)
    assert not marker.exists()


def test_trainer_state_round_trips_as_plain_data(tmp_path):
    """Carried groups, numpy's RNG state and the rest load with weights_only and nothing
    allowed; a state saved before the plain format still loads (numpy arrays, Group)."""
    group = Group("p1", "7", [1, 2], [[3, 4], [5]], [True, False], [True, False], ["a", "b"])
    state = {
        "step": 3,
        "bad_steps": 0,
        "stalled_steps": 1,
        "world": 1,
        "stream": {"epoch": 1, "pos": 5},
        "buffer": {"groups": [(2, group)], "kept_count": 1.5, "generated_count": 2.25},
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        },
    }
    plain, legacy = tmp_path / "plain.pt", tmp_path / "legacy.pt"
    torch.save(checkpoint.plain_trainer_state(state), plain)
    torch.save(state, legacy)
    assert torch.serialization.get_unsafe_globals_in_checkpoint(plain) == []
    back = checkpoint.restore_trainer_state(checkpoint.safe_load(plain))
    old = checkpoint.safe_load(legacy, checkpoint._legacy_types())
    for loaded in (back, old):
        assert loaded["buffer"] == state["buffer"] and loaded["stream"] == state["stream"]
        assert loaded["rng"]["python"] == state["rng"]["python"]
        assert torch.equal(loaded["rng"]["torch"], state["rng"]["torch"])
        name, keys, *rest = loaded["rng"]["numpy"]
        want_name, want_keys, *want_rest = state["rng"]["numpy"]
        assert name == want_name and rest == want_rest and np.array_equal(keys, want_keys)
        assert keys.dtype == np.uint32
    with pytest.raises(PipelineError, match="refusing to load"):
        checkpoint.safe_load(legacy)  # numpy arrays are allowed for old trainer states only


@pytest.mark.parametrize(("host", "warned"), [("0.0.0.0", True), ("127.0.0.1", False)])
def test_ui_on_a_public_interface_warns_it_has_no_authentication(host, warned):
    out = CliRunner().invoke(app, ["ui", "--host", host, "--print-only"])
    assert out.exit_code == 0, out.output
    assert ("no authentication" in out.output) == warned
    assert ("--app-name basic-auth" in out.output) == warned


@pytest.mark.slow
def test_two_ranks_refused_together_when_the_directory_is_held(tiny_cfg, tmp_path):
    """Under a multi-rank launcher rank 0 takes the lock for all: refused, every rank stops
    (none waits at a barrier for it) and the launcher exits with rank 0's message."""
    params = tmp_path / "params.json"
    params.write_text(json.dumps(tiny_cfg.to_dict()))
    run, env = tmp_path / "run", _env(tmp_path, "ranks")
    env.pop("WORLD_SIZE", None)
    hold = "import sys, time\nfrom tasks.rundir import RunDir\nwith RunDir(sys.argv[1]).writer():\n"
    hold += "    print('held', flush=True)\n    time.sleep(600)\n"
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(run)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
        worker = [str(ROOT / "tests/tasks/stall_worker.py"), str(params), str(run), "1"]
        out = subprocess.run(
            [*launch, "--master_port", str(_free_port()), *worker],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        holder.kill()
        holder.wait()
    assert out.returncode != 0
    assert f"being written by another process (pid {holder.pid}" in out.stdout + out.stderr
    assert not (run / "config.json").exists()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_run_directory_holding_only_its_lock_goes_with_it(tmp_path):
    """A run that failed or was stopped before writing anything leaves no directory (a
    `--resume` of it would find nothing to continue, and its stop says to run it again); one
    that wrote keeps its directory, and only the outermost of nested holds removes."""
    failed = RunDir(tmp_path / "failed")
    with pytest.raises(RuntimeError), failed.writer():
        raise RuntimeError("the model path is wrong")
    assert not failed.path.exists()
    assert "nothing to continue, run it again" in failed.describe_stop(5, "unused")
    nested = RunDir(tmp_path / "nested")
    with nested.writer():
        with nested.writer():
            pass
        assert nested.lock_file.exists()  # the outer hold still holds it
    assert not nested.path.exists()
    wrote = RunDir(tmp_path / "wrote")
    with wrote.writer():
        wrote.write_config({"train": {}})
    assert wrote.config_file.exists() and wrote.lock_file.exists()
    assert "--resume" in wrote.describe_stop(5, "dapo train --resume wrote")


def test_a_stop_after_the_last_step_says_the_final_model_was_not_saved(tmp_path):
    """Stopped while it saved its final model, a run has logged every step: its stop says so
    rather than a bare "step 4 of 4" that reads as finished."""
    rd = RunDir(tmp_path / "run")
    with rd.writer():
        rd.write_config({"train": {}})
        for step in (1, 2, 3):
            rd.append_metrics(step, {"loss": 0.0})
    assert "stopped after step 3 of 4;" in rd.describe_stop(4, "dapo train --resume run")
    rd.append_metrics(4, {"loss": 0.0})
    stop = rd.describe_stop(4, "dapo train --resume run")
    assert stop.startswith("stopped after its last step (4 of 4), before its final model")
    assert stop.endswith("last checkpoint: none yet. Continue with: dapo train --resume run; "
                         "steps 1-4 are redone")  # fmt: skip


@pytest.mark.parametrize(
    ("saved", "done", "said"),
    [(0, 0, ""), (0, 1, "; step 1 is redone"), (2, 2, ""), (2, 5, "; steps 3-5 are redone")],
)
def test_a_stop_names_the_steps_a_resume_does_again(saved, done, said):
    from tasks.rundir import _redone

    assert _redone(saved, done) == said


def test_a_folder_of_someone_else_s_keeps_no_lock_and_a_model_is_no_run_dir(tmp_path):
    """A run refused in a folder that holds other files leaves no `.lock` there; a model
    directory (a shipped checkpoint: a lock in it changed its digest, and every run after
    failed) is refused before anything is written, as a new run's directory and on --resume."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError), RunDir(other).writer():
        raise RuntimeError("refused")
    assert [p.name for p in other.iterdir()] == ["notes.txt"]
    torn = tmp_path / "torn"  # a run's config.json, unreadable: refused, as it was left
    torn.mkdir()
    (torn / "config.json").write_text("{bad")
    with pytest.raises(RuntimeError), RunDir(torn).writer():
        raise RuntimeError("refused")
    assert [p.name for p in torn.iterdir()] == ["config.json"]
    with RunDir(torn).writer():  # a run that writes keeps its lock
        (torn / "config.json").write_text("{}")
    assert sorted(p.name for p in torn.iterdir()) == [".lock", "config.json"]
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"weights")
    model_dir = pytest.raises(PipelineError, match="is a model directory, not a run directory")
    with model_dir, RunDir(model).writer():  # refused before it locks
        pass
    out = CliRunner().invoke(app, ["train", "--resume", str(model)])
    assert out.exit_code == 2 and "is a model directory, not a run directory" in out.output
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.safetensors"]
    project = tmp_path / "project"
    (project / "checkpoints" / "tiny").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="holds files not a run's \\(checkpoints\\): pick"):
        RunDir(project).refuse_unless(resume=False)
    # continued by name (`dapo pipeline --run-name c0`), a comparison's or a sweep's folder,
    # which holds no config.json, was trained into too
    comparison = tmp_path / "c0"
    comparison.mkdir()
    (comparison / "comparison.csv").write_text("method,avg@k")
    with pytest.raises(FileExistsError, match="holds files not a run's \\(comparison.csv\\)"):
        RunDir(comparison).refuse_unless(resume=True)
    RunDir(tmp_path / "new").refuse_unless(resume=True)  # a first attempt: nothing there yet


def test_a_new_run_starts_only_in_a_folder_holding_nothing_else(tmp_path):
    """--run-dir data/curated (no config.json, no metrics) was taken: the run wrote its files
    among the curated tables."""
    curated = tmp_path / "curated"
    curated.mkdir()
    for name in ("train.parquet", "val.parquet", "report.json", "rejected.parquet"):
        (curated / name).write_text("x")
    refused = "holds files not a run's \\(rejected.parquet, report.json, train.parquet\\)"
    with pytest.raises(FileExistsError, match=refused):
        RunDir(curated).refuse_unless(resume=False)
    out = CliRunner().invoke(app, ["train", "--no-track", "--run-dir", str(curated)])
    assert out.exit_code == 2 and "holds files not a run's" in out.output, out.output
    assert sorted(p.name for p in curated.iterdir()) == sorted(
        ["train.parquet", "val.parquet", "report.json", "rejected.parquet"]
    )
    # what a run (or `dapo reproduce`) writes before its config is no obstacle, nor an empty one
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    RunDir(fresh).refuse_unless(resume=False)
    for name in (".lock", "logged_config.json", "untracked", "mlflow_run.json"):
        (fresh / name).write_text("{}")
    RunDir(fresh).refuse_unless(resume=False)
    RunDir(tmp_path / "not-yet").refuse_unless(resume=False)


@pytest.mark.parametrize(
    "record", [b'{"step": 2, "fi', b"[2]", b"\xff"], ids=["torn", "list", "binary"]
)
def test_a_checkpoint_whose_record_is_unreadable_is_passed_over(tmp_path, caplog, record):
    """A COMPLETE record that is torn or not a record is damage, like a file not matching it:
    the resume takes the checkpoint before, with a warning, instead of failing."""
    rd = RunDir(tmp_path / "run")
    for step in (1, 2):
        ckpt = rd.checkpoints_dir / f"step_{step:06d}"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer.pt").write_bytes(b"state")
        seal = {"step": step, "files": seal_files(ckpt, [ckpt / "trainer.pt"])}
        (ckpt / COMPLETE).write_text(json.dumps(seal))
    (ckpt / COMPLETE).write_bytes(record)
    with caplog.at_level(logging.WARNING, logger="tasks.rundir"):
        start = rd.resume_point()
    assert start.step == 1 and start.damaged == (ckpt,)
    assert any("COMPLETE record is not readable" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("text", ['{"run_id": "ab', "{}", "[]"], ids=["torn", "empty", "list"])
def test_a_damaged_mlflow_record_is_one_line_that_says_what_to_do(tmp_path, text):
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    rd.mlflow_file.write_text(text)
    with pytest.raises(PipelineError, match=r"mlflow_run\.json is damaged: delete it") as caught:
        rd.mlflow_run()
    assert "\n" not in str(caught.value)


def test_a_resume_with_no_complete_checkpoint_says_it_starts_again(tmp_path, caplog):
    """A run stopped before its first checkpoint restarted from step 0 without a word, while
    its metrics file said it had reached step 3."""
    from tasks.rundir import ResumePoint
    from tasks.training.task import _say_where_it_continues

    with caplog.at_level(logging.INFO, logger="dapo"):
        _say_where_it_continues(RunDir(tmp_path), ResumePoint(0, None, 3))
    assert "has no complete checkpoint: it starts again from step 0 (steps 1-3" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dapo"):
        _say_where_it_continues(RunDir(tmp_path), ResumePoint(0, None, 0))  # a fresh run
    assert caplog.text == ""


def test_a_torn_run_config_is_called_json(tmp_path):
    """`dapo train --resume` of a run whose config.json was cut short said "not valid YAML"."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"train": {"steps": 4')
    out = CliRunner().invoke(app, ["train", "--resume", str(run)])
    assert out.exit_code == 2
    assert f"{run / 'config.json'} is not valid JSON: " in out.output, out.output


def test_a_run_stopped_before_writing_leaves_no_folder_it_made(tmp_path):
    """Ctrl-C before a first run's first step removed its directory but left the `runs/` made
    for it; a folder that was there before stays."""
    with pytest.raises(KeyboardInterrupt), RunDir(tmp_path / "runs" / "a" / "run").writer():
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "runs").mkdir()
    with RunDir(tmp_path / "runs" / "run").writer():
        pass
    assert [p.name for p in tmp_path.iterdir()] == ["runs"] and not any(
        (tmp_path / "runs").iterdir()
    )


def test_a_sweep_keeps_the_settings_it_began_with(tmp_path):
    """A sweep's first attempt records its settings; a later one with the same goes on, one with
    others is refused naming what differs (before it writes anything), a check alone records
    nothing, and a torn record is refused rather than taken as no record."""
    from dapo_core.errors import PipelineError

    first = {"config": {"train": {"steps": 30, "lr": 0.001}}, "tuned": {"grpo": []}}
    sweep = RunDir(tmp_path / "new")
    sweep.keep_sweep_settings(first, record=False)
    assert not sweep.path.exists()  # checked only: nothing made
    sweep.keep_sweep_settings(first)
    assert json.loads(sweep.sweep_settings_file.read_text()) == first
    sweep.keep_sweep_settings(first)  # the same settings: it continues
    sweep.keep_sweep_settings({**first, "tuned": {"grpo": [], "+clip_higher": []}})  # a new rung
    changed = {"config": {"train": {"steps": 5, "lr": 0.001}}, "tuned": {"grpo": []}}
    with pytest.raises(
        PipelineError, match=r"began with other settings \(config.train.steps 30 -> 5\)"
    ):
        sweep.keep_sweep_settings(changed)
    assert json.loads(sweep.sweep_settings_file.read_text()) == first  # left as it was
    sweep.sweep_settings_file.write_text('{"config": {"tr')
    with pytest.raises(PipelineError, match="not valid JSON"):
        sweep.keep_sweep_settings(first)
