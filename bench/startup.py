"""Start-up of ``dapo train`` on the embedded default: ``python -m bench.startup``.

Each trial runs ``dapo train --run-dir <new> -S train.steps=2`` in a scratch Prefect home and
MLflow store (the embedded model is built once, before the trials, so no trial pays for it) and
reads, from the trial's own clock:

- ``import``: seconds until the command has imported its libraries (``python -c 'import
  flows.cli'``, timed separately);
- ``first step``: seconds from the command's start until the run directory's ``metrics.jsonl``
  holds its first row (step 1 trained and logged);
- ``exit``: seconds until the command has exited.

Settings compared in the same run (``--settings``): ``no-server`` (no Prefect server configured
or running: ``dapo train`` runs its flow as a plain function, ``tasks.orchestration.
without_prefect``; before that change it started a temporary server for itself and stopped it),
``server`` (a Prefect server already running, as ``dapo server start`` leaves one: the run is a
Prefect flow run), each with MLflow tracking on and off (``--no-track``). ``--baseline DIR``
measures the same settings with the checkout in DIR (an earlier commit: ``git worktree add DIR
<commit>``) in the same run, trial for trial after ours. Medians of ``--trials`` runs each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
}


def dapo(args: list[str], env: dict[str, str], root: Path = ROOT, **kw) -> subprocess.Popen:
    """``dapo ARGS`` from the checkout at ``root``."""
    env = {**env, "PYTHONPATH": str(root)}
    return subprocess.Popen([sys.executable, "-m", "flows.cli", *args], cwd=root, env=env, **kw)


def trial(
    scratch: Path, env: dict[str, str], track: bool, n: int, root: Path = ROOT, label: str = ""
) -> tuple[float, float]:
    """(first step, exit) in seconds for one ``dapo train`` of the checkout at ``root``."""
    run_dir = scratch / f"run{label.strip()}{n}"
    args = ["train", "--run-dir", str(run_dir), "-S", "train.steps=2"]
    args += [] if track else ["--no-track"]
    metrics = run_dir / "metrics.jsonl"
    start = time.monotonic()
    proc = dapo(args, env, root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = float("nan")
    while proc.poll() is None:
        if first != first and metrics.exists() and metrics.stat().st_size > 0:
            first = time.monotonic() - start
        time.sleep(0.02)
    end = time.monotonic() - start
    if proc.returncode:
        raise SystemExit(f"dapo train failed ({proc.returncode}): {proc.stderr.read()[-2000:]!r}")
    if first != first:  # the whole run fit between two polls
        first = end
    return first, end


def import_seconds(env: dict[str, str]) -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import flows.cli"], cwd=ROOT, env=env, check=True)
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--settings", default="no-server,server")
    parser.add_argument("--baseline", type=Path, help="an earlier checkout, measured alike")
    args = parser.parse_args(argv)
    sides = [("", ROOT)] + ([("baseline ", args.baseline.resolve())] if args.baseline else [])
    with tempfile.TemporaryDirectory(prefix="dapo-startup-") as tmp:
        scratch = Path(tmp)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")},
            **ENV,
            "PREFECT_HOME": str(scratch / "prefect"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{scratch / 'mlflow.db'}",
        }
        for label, root in sides:  # builds the embedded model if needed, creates the stores
            warm = ["train", "--no-track", "--run-dir", str(scratch / f"warm{label.strip()}")]
            dapo([*warm, "-S", "train.steps=1"], env, root).wait()
        imports = [import_seconds(env) for _ in range(args.trials)]
        print(f"import flows.cli: median {statistics.median(imports):.2f}s")
        print(f"{'setting':<34}{'first step':>12}{'exit':>16}  all first steps (medians)")
        for setting in args.settings.split(","):
            if setting == "server":
                subprocess.run(
                    [sys.executable, "-m", "flows.cli", "server", "start"],
                    cwd=ROOT,
                    env=env,
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
            try:
                for track in (True, False):
                    # trial for trial, ours then the baseline's: a slow spell hits both sides
                    runs = {label: [] for label, _ in sides}
                    for n in range(args.trials):
                        for label, root in sides:
                            runs[label].append(trial(scratch, env, track, n, root, label))
                    for label, _ in sides:
                        firsts = [f for f, _ in runs[label]]
                        name = f"{label}{setting}{'' if track else ' --no-track'}"
                        print(
                            f"{name:<34}{statistics.median(firsts):>11.2f}s"
                            f"{statistics.median(e for _, e in runs[label]):>15.2f}s  "
                            + " ".join(f"{f:.1f}" for f in firsts),
                            flush=True,
                        )
                        kept = scratch / name.replace(" ", "")  # next trials' directories are new
                        kept.mkdir()
                        for n in range(args.trials):
                            os.rename(scratch / f"run{label.strip()}{n}", kept / str(n))
            finally:
                if setting == "server":
                    subprocess.run(
                        [sys.executable, "-m", "flows.cli", "server", "stop"],
                        cwd=ROOT,
                        env=env,
                        stdout=subprocess.DEVNULL,
                    )


if __name__ == "__main__":
    main()
