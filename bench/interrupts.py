"""Interrupt the long commands as a terminal and a scheduler do: ``python -m bench.interrupts``.

Each trial starts a ``dapo`` command on the embedded default in a session of its own (as a shell
runs a foreground job), waits for a phase (start-up, training, evaluation), then sends SIGINT
(Ctrl-C: the terminal signals the whole foreground process group) or SIGTERM (Slurm, Kubernetes
and systemd signal the group too) to the group or to the command's process alone. It prints, per
trial: seconds from the signal to the exit, the exit code, whether a traceback was printed, the
processes left behind, and the final MLflow and Prefect records of the runs the command started.

What the command promises (issue 23): exit 128 + the signal's number (130 SIGINT, 143 SIGTERM)
within 10 s, no traceback, nothing left running, MLflow runs KILLED, Prefect flow runs in a final
state. SIGKILL (``--signals KILL``: the OOM
killer, a scheduler after its grace period) runs no handler at all; then the command's reaper
(``tasks.lifetime``) must have left nothing running and no run RUNNING within ``SETTLE_S``.
Each trial has its own Prefect home, so its processes are told apart by their environment;
``--keep`` keeps the scratch directory.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import bench

ROOT = Path(__file__).resolve().parents[1]
PHASE_TIMEOUT_S = 180.0
EXIT_TIMEOUT_S = 60.0
SETTLE_S = 30.0  # after a SIGKILL: the reaper's time to stop the helpers and end the runs
SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "KILL": signal.SIGKILL}
# Long enough that no phase ends before the signal; small enough to start in seconds.
TRAIN_ARGS = ["-S", "train.steps=400", "-S", "eval.every_n_steps=0"]
EVAL_ARGS = ["-S", "eval.n_samples=64"]
COMMANDS = {
    "train": ["train", *TRAIN_ARGS],
    "pipeline": ["pipeline", "--no-curate", *TRAIN_ARGS, "-S", "train.steps=3", *EVAL_ARGS],
    "evaluate": ["evaluate", *EVAL_ARGS],
    "ablate": ["ablate", "--no-curate", "--variants", "grpo,+clip_higher", "--workers", "1"]
    + TRAIN_ARGS,
    "preflight": ["preflight", "--prompts", "512"],
}
STARTUP_DELAY_S = 2.0
"""The start-up phase: this long after the command starts (imports, config, the server)."""
IN_PHASE_S = 1.0
"""How long after a phase's first sign the signal is sent: inside it, not at its edge."""


def _training(home: Path, log: str) -> bool:
    return any(home.rglob("metrics.jsonl"))


def _evaluation(home: Path, log: str) -> bool:
    # the pipeline's evaluation follows its training task; `dapo evaluate` evaluates at once
    return (
        "Task run 'train" in log
        and "Finished" in log.split("Task run 'train")[-1]
        or ("Flow run" in log and "for flow 'evaluate'" in log)
    )


def _build(home: Path, log: str) -> bool:
    return any(home.glob(".tiny.build-*"))  # the model build's staging directory


def _sampling(home: Path, log: str) -> bool:
    return "for flow 'preflight'" in log  # `dapo preflight` samples once its flow has begun


PHASES = {
    "startup": None,
    "build": _build,
    "training": _training,
    "evaluation": _evaluation,
    "sampling": _sampling,
}


@dataclass(frozen=True)
class Trial:
    command: str
    phase: str
    sig: str  # INT, TERM or KILL
    to: str  # group or process

    @property
    def name(self) -> str:
        return f"{self.command:8s} {self.phase:10s} SIG{self.sig:4s} to {self.to}"


@dataclass(frozen=True)
class Outcome:
    sent: int  # the signal
    exit_code: int | None
    seconds: float
    traceback: bool
    left: list[str]
    mlflow: list[str]
    prefect: list[str]
    last_line: str

    def ok(self) -> bool:
        if self.exit_code == -signal.SIGKILL:  # no handler ran: the reaper's work is checked
            return not self.left and not any(s in LIVE for s in self.mlflow + self.prefect)
        return (
            self.exit_code == 128 + self.sent  # the shell's status: 130 SIGINT, 143 SIGTERM
            and self.seconds <= 10.0
            and not self.traceback
            and not self.left
            and all(s == "KILLED" for s in self.mlflow)
            and not any(s in LIVE for s in self.prefect)
        )


LIVE = ("RUNNING", "PENDING", "SCHEDULED")  # a run's record that no process will end


def processes_of(home: Path) -> dict[int, str]:
    """The live processes whose environment names this Prefect home: pid -> command line."""
    marker = f"PREFECT_HOME={home}".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:  # gone meanwhile, or another user's
            continue
    return {pid: cmd.decode()[:80] for pid, cmd in found.items()}


def mlflow_statuses(uri: str, since_ms: int) -> list[str]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"attributes.start_time >= {since_ms}",
    )
    return [r.info.status for r in runs]


def prefect_states(home: Path) -> list[str]:
    db = home / "prefect.db"
    if not db.exists():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return [row[0] for row in conn.execute("select state_type from flow_run")]


def trial_home(scratch: Path, trial: Trial) -> Path:
    """The Prefect home of ``trial`` (its run directories and model build go there too)."""
    return scratch / f"prefect-{trial.command}-{trial.phase}-{trial.sig}-{trial.to}"


def run_trial(
    trial: Trial,
    scratch: Path,
    model: Path,
    uri: str,
    extra: list[str] = (),
    settle_s: float = SETTLE_S,
) -> Outcome:
    """Run ``trial`` (``extra``: arguments every command gets, e.g. ``--params FILE``; after a
    SIGKILL, wait up to ``settle_s`` for the reaper)."""
    home = trial_home(scratch, trial)
    log = home.with_suffix(".log")
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "MLFLOW_TRACKING_URI": uri,
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "200",
    }
    env.pop("PREFECT_API_URL", None)
    args = [*COMMANDS[trial.command], *extra]
    if trial.phase == "build":  # a model of its own to build, as on a fresh clone
        args += ["-S", f"tiny.path={home / 'tiny'}"]
    if trial.command == "train":
        args += ["--run-dir", str(home / "run")]
    elif trial.command in ("pipeline", "ablate"):
        args += ["-S", f"train.out_dir={home / 'runs'}"]
    elif trial.command == "evaluate":
        args += ["--model", str(model)]
    since_ms = int(time.time() * 1000)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for_phase(trial.phase, proc, home, log)
        sig = SIGNALS[trial.sig]
        t0 = time.monotonic()
        if trial.to == "group":
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=EXIT_TIMEOUT_S)
        seconds = time.monotonic() - t0
        time.sleep(0.5)  # what the command stopped is given a moment to go
        if sig == signal.SIGKILL:
            _settle(home, uri, since_ms, settle_s)
        text = log.read_text(errors="replace")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return Outcome(
            sig,
            proc.returncode,
            seconds,
            "Traceback" in text,
            list(processes_of(home).values()),
            mlflow_statuses(uri, since_ms),
            prefect_states(home),
            lines[-1][:160] if lines else "",
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for left in processes_of(home):
            with contextlib.suppress(OSError):
                os.kill(left, signal.SIGKILL)


def _settle(home: Path, uri: str, since_ms: int, settle_s: float) -> None:
    """Wait (up to ``settle_s``) for a killed command's reaper: nothing of it running, no
    MLflow or Prefect run of it left live."""
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        records = mlflow_statuses(uri, since_ms) + prefect_states(home)
        if not processes_of(home) and not any(s in LIVE for s in records):
            return
        time.sleep(0.5)


def _wait_for_phase(phase: str, proc: subprocess.Popen, home: Path, log: Path) -> None:
    begun = PHASES[phase]
    if begun is None:
        time.sleep(STARTUP_DELAY_S)
        return
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while not begun(home, log.read_text(errors="replace")):
        if proc.poll() is not None:
            raise RuntimeError(f"the command exited before its {phase} phase; see {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {phase} phase within {PHASE_TIMEOUT_S:.0f}s; see {log}")
        time.sleep(0.1)
    time.sleep(IN_PHASE_S)


SKIPPED = {("evaluation", "train"), ("training", "evaluate"), ("build", "evaluate")}
SKIPPED |= {("evaluation", "ablate"), ("training", "preflight"), ("evaluation", "preflight")}
SKIPPED |= {("sampling", c) for c in COMMANDS if c != "preflight"}
"""Phases a command does not have (``dapo evaluate`` is given a built model)."""


def trials(commands: list[str], phases: list[str], sigs: list[str], tos: list[str]):
    for command in commands:
        for phase in phases:
            if (phase, command) in SKIPPED:
                continue
            for sig in sigs:
                for to in tos:
                    yield Trial(command, phase, sig, to)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", default=",".join(COMMANDS))
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--signals", default="INT,TERM")
    parser.add_argument("--to", default="group,process")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="dapo-interrupts-"))
    uri = f"sqlite:///{scratch / 'mlflow.db'}"
    from tasks.models.resolve import resolve_model_path
    from tasks.params import load_params

    model = Path(resolve_model_path(load_params()))  # built once here, not inside a trial
    failed = 0
    print(f"{'trial':42s} {'exit':>4s} {'s':>6s}  tb  left  mlflow / prefect")
    matrix = trials(*(getattr(args, k).split(",") for k in ("commands", "phases", "signals", "to")))
    for trial in matrix:
        out = run_trial(trial, scratch, model, uri)
        failed += not out.ok()
        print(
            f"{trial.name:42s} {out.exit_code!s:>4s} {out.seconds:6.1f}  "
            f"{'yes' if out.traceback else 'no ':3s} {len(out.left):4d}  "
            f"{','.join(out.mlflow) or '-'} / {','.join(out.prefect) or '-'}"
            f"{'' if out.ok() else '  FAIL: ' + out.last_line}",
            flush=True,
        )
    if not args.keep:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    else:
        print(f"scratch kept in {scratch}")
    return 1 if failed else 0


if __name__ == "__main__":
    bench.run(main)
