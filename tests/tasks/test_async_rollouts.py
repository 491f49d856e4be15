"""Rollouts in a rollout process (train.rollout_ranks=1), s batches ahead of training."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dapo_core.config_loader import resolve
from tasks.rundir import RunDir
from tasks.training.async_rollouts import version_for
from tasks.training.run import run_training


def strip(history):  # timings differ between runs; everything else must match exactly
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in history]


def _weights(run: RunDir):
    return load_file(str(run.final / "model.safetensors"))


def test_batch_k_is_sampled_s_updates_behind_never_before_the_start():
    assert [version_for(k, 1, 0) for k in range(4)] == [0, 0, 1, 2]
    assert [version_for(k, 0, 0) for k in range(3)] == [0, 1, 2]
    assert [version_for(k, 2, 5) for k in range(5, 9)] == [5, 5, 5, 6]


def test_stale_batches_are_corrected_by_token_tis_unless_the_user_chose(tiny_cfg):
    base = tiny_cfg.to_dict()
    assert resolve(base, overrides=["train.rollout_ranks=1"]).algo.correction.name == "token_tis"
    chosen = ["train.rollout_ranks=1", "algo.correction.name=none"]
    assert resolve(base, overrides=chosen).algo.correction.name == "none"
    sync = ["train.rollout_ranks=1", "rollout.max_staleness=0"]
    assert resolve(base, overrides=sync).algo.correction.name == "none"
    assert resolve(base).algo.correction.name == "none"  # no rollout process: nothing stale


@pytest.mark.slow
def test_staleness_0_in_a_rollout_process_is_the_synchronous_run_bit_for_bit(tiny_cfg, tmp_path):
    """The rollout process samples batch k from the weights after step k, seeded as the
    trainer's step: the same metrics and final weights as sampling in the trainer."""
    base = tiny_cfg.to_dict()
    sync = resolve(base, overrides=["train.steps=3"])
    proc = resolve(
        base, overrides=["train.steps=3", "train.rollout_ranks=1", "rollout.max_staleness=0"]
    )
    a = run_training(sync, RunDir(tmp_path / "sync"), progress=False)
    b = run_training(proc, RunDir(tmp_path / "proc"), progress=False)
    staleness = [r.pop("rollout/staleness_max") for r in b.history]
    for r in b.history:
        r.pop("rollout/staleness_mean")
    assert staleness == [0.0, 0.0, 0.0]
    assert strip(a.history) == strip(b.history)
    wa, wb = _weights(a.run_dir), _weights(b.run_dir)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_one_step_off_resumes_exactly_with_its_batches_in_flight(tiny_cfg, tmp_path):
    """s = 1: batch k comes from the weights after step k - 1 (staleness 1 from step 1 on); a
    run cut after 2 steps checkpoints the batch already sampled for step 2 and continues as
    the uninterrupted run, metric for metric and weight for weight."""
    over = ["train.steps=4", "train.rollout_ranks=1", "rollout.max_staleness=1"]
    # every group trained on: the overlong penalty's spread of rewards moves the weights
    over += ["algo.dynamic_sampling=false"]
    cfg = resolve(tiny_cfg.to_dict(), overrides=over)
    assert cfg.algo.correction.name == "token_tis"
    full = run_training(cfg, RunDir(tmp_path / "full"), progress=False)
    assert [r["rollout/staleness_mean"] for r in full.history] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["train/grad_norm"] > 0 for r in full.history)
    assert all("train/is_weight_mean" in r for r in full.history)  # stale tokens reweighted
    first = run_training(cfg, RunDir(tmp_path / "cut"), progress=False, max_steps=2)
    assert first.steps == 2
    rest = run_training(cfg, RunDir(tmp_path / "cut"), resume=True, progress=False)
    assert strip(rest.history) == strip(full.history)
    wa, wb = _weights(full.run_dir), _weights(rest.run_dir)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def _stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields after the name: state, parent, process group, ...; None: gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _processes(field: int, value: int) -> list[int]:
    """Processes whose stat ``field`` (1: parent, 2: process group) is ``value``, zombies too."""
    pids = [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]
    return [pid for pid in pids if (f := _stat(pid)) is not None and int(f[field]) == value]


def _children(pid: int) -> list[int]:
    return _processes(1, pid)


@pytest.mark.slow
def test_a_killed_trainer_leaves_no_rollout_process(tiny_cfg, tmp_path):
    """SIGKILL gives the trainer no chance to stop its rollout process: the rollout process
    sees its parent gone and ends by itself, within seconds."""
    over = ["train.steps=500", "train.rollout_ranks=1", "train.checkpoint_every=0"]
    params = tmp_path / "params.json"
    params.write_text(json.dumps(resolve(tiny_cfg.to_dict(), overrides=over).to_dict()))
    run = tmp_path / "run"
    worker = Path(__file__).with_name("async_worker.py")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.Popen(
        [sys.executable, str(worker), str(params), str(run)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        children = _children(proc.pid)
        assert children, "no rollout process"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60  # a hang guard: they go within a second or two
        while any(Path(f"/proc/{c}").exists() and _alive(c) for c in children):
            assert time.monotonic() < deadline, f"left running: {children}"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        for c in _children(proc.pid):
            with contextlib.suppress(OSError):
                os.kill(c, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that is gone."""
    f = _stat(pid)
    return f is not None and f[0] != "Z"


def test_the_rollout_presets_are_dapo_with_a_rollout_process(tiny_cfg):
    """--variant one_step_off / staleness_2 (dapo train, dapo ablate): DAPO's recipe with a
    rollout process 1 or 2 updates behind, and its stale tokens reweighted by token_tis."""
    from dapo_core.ablation import apply_variant

    dapo = apply_variant(tiny_cfg, "dapo")
    for name, s in (("one_step_off", 1), ("staleness_2", 2)):
        cfg = apply_variant(tiny_cfg, name)
        assert (cfg.train.rollout_ranks, cfg.rollout.max_staleness) == (1, s)
        assert cfg.algo.correction.name == "token_tis"
        rest = {**cfg.to_dict()["algo"], "correction": None}
        assert rest == {**dapo.to_dict()["algo"], "correction": None}


def test_a_reward_that_cannot_reach_the_rollout_process_is_a_one_line_error(tiny_cfg, tmp_path):
    """A lambda cannot be pickled into a spawned process: said in one line, before any step."""
    from dapo_core.errors import PipelineError
    from dapo_core.problem import Problem
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.training.rollout_process import RolloutSpec
    from tasks.training.trainer import DAPOTrainer

    cfg = resolve(tiny_cfg.to_dict(), overrides=["train.rollout_ranks=1"])
    path = resolve_model_path(cfg)
    model, tok = load_policy(path, "float32", "cpu")
    problems = [Problem("p", "1+1", "2", "1+1", "test")]
    spec = RolloutSpec(cfg, path, "float32", "cpu", problems)
    trainer = DAPOTrainer(
        cfg, model, tok, None, problems, rollout_spec=spec, reward_fn=lambda r, a: True
    )
    with pytest.raises(PipelineError, match="module-level function"):
        trainer.train_step()
    trainer.close()


@pytest.mark.slow
def test_rollout_ranks_under_torchrun(tiny_cfg, tmp_path, subtests):
    """Rollout ranks (``train.rollout_ranks``) in two launches: 2 ranks, then 4. The 2-rank
    launch also trains the synchronous 2-rank DeepSpeed run the 4-rank one is compared with: one
    launch less to start (each rank imports torch and DeepSpeed). One test item, the checks as
    subtests, so that the suite's workers never split the launches."""
    base = tiny_cfg.to_dict()
    common = ["train.steps=4", "algo.dynamic_sampling=false"]
    runs = {
        "sync": resolve(base, overrides=common),
        **{
            f"s{s}-{k}": resolve(
                base,
                overrides=[
                    *common,
                    f"train.rollout_ranks={k}",
                    f"rollout.max_staleness={s}",
                ],
            )
            for s in (0, 1)
            for k in (1, 2)
        },
    }
    for name, cfg in runs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(cfg.to_dict()))

    def triple(params: str, run: str, steps: int = 0) -> list[str]:
        return [str(tmp_path / f"{params}.json"), str(tmp_path / run), str(steps)]

    root = Path(__file__).parents[2]
    one_rank = [
        *triple("s0-1", "s0-1"),
        *triple("s1-1", "s1-1"),
        *triple("s1-1", "cut-1", 2),
        *triple("s1-1", "cut-1"),
    ]
    _launch(2, [*one_rank, *triple("sync", "sync-2")], root)
    two_ranks = [
        *triple("s0-2", "s0-2"),
        *triple("s1-2", "s1-2"),
        *triple("s1-2", "cut-2", 2),
        *triple("s1-2", "cut-2"),
    ]
    _launch(4, two_ranks, root)
    with subtests.test(rollout_ranks=1):
        _a_rollout_rank_is_the_rollout_process(runs, tmp_path)
    with subtests.test(rollout_ranks=2):
        _two_rollout_ranks_sample_for_two_training_ranks(tmp_path)


def _a_rollout_rank_is_the_rollout_process(runs, tmp_path):
    """torchrun, 2 ranks, train.rollout_ranks=1: rank 1 samples for rank 0 through
    torch.distributed (the weights after each update sent to it). With s = 0 the run is the
    synchronous one bit for bit; with s = 1 it is the run with a local rollout process, and a
    run cut after 2 steps resumes to it exactly."""
    ranked = {n: RunDir(tmp_path / f"{n}-1") for n in ("s0", "s1", "cut")}
    # the references, in this process: sampling in the trainer, and in a rollout process
    a = run_training(runs["sync"], RunDir(tmp_path / "sync"), progress=False)
    b = run_training(runs["s1-1"], RunDir(tmp_path / "local"), progress=False)

    def rows(run):
        return strip(run.read_metrics() if isinstance(run, RunDir) else run.history)

    s0_rows = rows(ranked["s0"])
    assert [r.pop("rollout/staleness_max") for r in s0_rows] == [0.0] * 4
    for r in s0_rows:
        r.pop("rollout/staleness_mean")
    assert s0_rows == rows(a)
    assert [r["rollout/staleness_mean"] for r in rows(ranked["s1"])] == [0.0, 1.0, 1.0, 1.0]
    assert rows(ranked["s1"]) == rows(b) == rows(ranked["cut"])
    for run, ref in (
        (ranked["s0"], a.run_dir),
        (ranked["s1"], b.run_dir),
        (ranked["cut"], b.run_dir),
    ):
        wa, wb = _weights(ref), _weights(run)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def _two_rollout_ranks_sample_for_two_training_ranks(tmp_path):
    """torchrun, 4 ranks, train.rollout_ranks=2: ranks 0-1 train with DeepSpeed over their own
    group, ranks 2-3 sample each batch together (half the prompts each) from the weights rank 0
    broadcasts. With s = 0 the run is the synchronous 2-rank run bit for bit; with s = 1 a run
    cut after 2 steps resumes to the uninterrupted one exactly."""
    names = {"sync": "sync-2", "s0": "s0-2", "s1": "s1-2", "cut": "cut-2"}
    rows = {n: strip(RunDir(tmp_path / d).read_metrics()) for n, d in names.items()}
    assert [r.pop("rollout/staleness_max") for r in rows["s0"]] == [0.0] * 4
    assert [r.pop("rollout/staleness_mean") for r in rows["s0"]] == [0.0] * 4
    assert rows["s0"] == rows["sync"] and len(rows["sync"]) == 4
    assert [r["rollout/staleness_mean"] for r in rows["s1"]] == [0.0, 1.0, 1.0, 1.0]
    assert rows["cut"] == rows["s1"]
    assert rows["s1"] != rows["s0"]  # one-step-off trains on other batches
    for run, ref in (("s0", "sync"), ("cut", "s1")):
        wa, wb = _weights(RunDir(tmp_path / names[ref])), _weights(RunDir(tmp_path / names[run]))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(nproc: int, args: list[str], cwd: Path) -> None:
    """rollout_rank_worker.py under torchrun with ``nproc`` ranks, in a session of its own (a
    hang ends with every rank, not with torchrun alone)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(cwd)}
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    launch += ["--master_port", str(_free_port())]
    worker = str(Path(__file__).with_name("rollout_rank_worker.py"))
    with subprocess.Popen(
        [*launch, worker, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            output = proc.communicate(timeout=600)[0]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-5000:]


def test_a_split_with_no_training_rank_is_refused_in_one_line(monkeypatch, tiny_cfg, tmp_path):
    from dapo_core.errors import PipelineError
    from tasks.training.distributed import sampling_ranks

    monkeypatch.setenv("WORLD_SIZE", "3")  # 2 training ranks under ZeRO-3: partitioned weights
    cfg = resolve(tiny_cfg.to_dict(), overrides=["train.rollout_ranks=1", "train.zero_stage=3"])
    with pytest.raises(PipelineError, match="set train.zero_stage=2"):
        run_training(cfg, RunDir(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run").exists()  # refused before anything was written

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert sampling_ranks(1) == 1
    with pytest.raises(PipelineError, match="leaves no rank to train"):
        sampling_ranks(2)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert sampling_ranks(1) == 0  # a rollout process, not a rank
    with pytest.raises(PipelineError, match="needs a launcher"):
        sampling_ranks(3)


def _group_alive(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``."""
    return [pid for pid in _processes(2, pgid) if _alive(pid)]


@pytest.mark.slow
def test_ctrl_c_under_torchrun_ends_training_and_rollout_ranks(tiny_cfg, tmp_path):
    """`torchrun --nproc_per_node 3 -m flows.cli train -S train.rollout_ranks=1`, then Ctrl-C
    (SIGINT to the terminal's process group) mid-run: every rank says it was interrupted and
    ends, and nothing of the job is left running (how fast: ``python -m bench.interrupts``)."""
    root = Path(__file__).parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3"]
    cmd += ["--master_port", str(_free_port()), "-m", "flows.cli", "train", "--run-dir", str(run)]
    cmd += ["-S", f"tiny.path={tiny_cfg.tiny.path}", "-S", "train.rollout_ranks=1"]
    cmd += ["-S", "train.steps=500", "-S", "train.checkpoint_every=0"]
    log = tmp_path / "log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 300
        while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)  # a hang guard: a clean stop takes seconds
        deadline = time.monotonic() + 60
        while _group_alive(proc.pid):
            assert time.monotonic() < deadline, f"left running: {_group_alive(proc.pid)}"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert text.count("interrupted: stopped by a signal") == 3, text[-3000:]
