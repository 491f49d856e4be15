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
Prefect flow run), and ``warm`` (``dapo warm start`` left a warm process running: the command
runs through the ``dapo`` script's entry point, which hands it over, ``flows.warm``; a baseline
checkout without one starts cold), each with MLflow tracking on and off (``--no-track``).
``--baseline DIR`` measures the same settings with the checkout in DIR (an earlier commit: ``git
worktree add DIR <commit>``) in the same run, trial for trial after ours. Medians of
``--trials`` runs each.
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

import bench

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
}


ENTRY = "import sys; sys.argv[0] = 'dapo'; from flows.entry import main; main()"
"""The ``dapo`` script's code: the entry point that hands a command to the warm process."""


def dapo(
    args: list[str], env: dict[str, str], root: Path = ROOT, entry: bool = False, **kw
) -> subprocess.Popen:
    """``dapo ARGS`` from the checkout at ``root``: as ``python -m flows.cli`` (always cold), or
    through the ``dapo`` script's entry point (``entry``: warm where a warm process runs)."""
    env = {**env, "PYTHONPATH": str(root)}
    how = ["-c", ENTRY] if entry else ["-m", "flows.cli"]
    return subprocess.Popen([sys.executable, *how, *args], cwd=root, env=env, **kw)


def trial(
    scratch: Path,
    env: dict[str, str],
    track: bool,
    n: int,
    root: Path = ROOT,
    label: str = "",
    entry: bool = False,
) -> tuple[float, float]:
    """(first step, exit) in seconds for one ``dapo train`` of the checkout at ``root``."""
    run_dir = scratch / f"run{label.strip()}{n}"
    args = ["train", "--run-dir", str(run_dir), "-S", "train.steps=2"]
    args += [] if track else ["--no-track"]
    metrics = run_dir / "metrics.jsonl"
    start = time.monotonic()
    proc = dapo(args, env, root, entry, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
    parser.add_argument("--settings", default="no-server,warm,server")
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
            "DAPO_WARM": "0",  # only the warm setting has one
            "DAPO_WARM_DIR": str(scratch),
        }
        for label, root in sides:  # builds the embedded model if needed, creates the stores
            first = ["train", "--no-track", "--run-dir", str(scratch / f"build{label.strip()}")]
            dapo([*first, "-S", "train.steps=1"], env, root).wait()
        imports = [import_seconds(env) for _ in range(args.trials)]
        print(f"import flows.cli: median {statistics.median(imports):.2f}s")
        print(f"{'setting':<34}{'first step':>12}{'exit':>16}  all first steps (medians)")
        for setting in args.settings.split(","):
            # the warm setting's commands may use one (none starts one: no terminal)
            now = {**env, "DAPO_WARM": ""} if setting == "warm" else env
            # started as the trials run, in the same environment
            starts = setting in ("server", "warm")
            if starts and dapo([setting, "start"], now, stdout=subprocess.DEVNULL).wait():
                raise SystemExit(f"dapo {setting} start failed")
            try:
                for track in (True, False):
                    # trial for trial, ours then the baseline's: a slow spell hits both sides
                    runs = {label: [] for label, _ in sides}
                    for n in range(args.trials):
                        for label, root in sides:
                            runs[label].append(
                                trial(scratch, now, track, n, root, label, setting == "warm")
                            )
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
                if setting == "warm":  # a trial that found it stale ran cold: say so
                    log = "\n".join(p.read_text() for p in scratch.glob("dapo-warm-*/*.log"))
                    if (served := log.count(": dapo train")) != 2 * args.trials:
                        print(f"only {served} of {2 * args.trials} warm trials ran warm: {log}")
            finally:
                if setting in ("server", "warm"):
                    dapo([setting, "stop"], now, stdout=subprocess.DEVNULL).wait()


if __name__ == "__main__":
    bench.run(main)
