"""Check the chain tables of docs/results.md from a fresh clone: ``python -m bench.ladder_check``
(the Table 1 ladder) or ``python -m bench.ladder_check --table algorithms`` (the eight
algorithms).

Does what a new user would, in a scratch directory with its own MLflow store, run directory and
Prefect home, so nothing cached here (queued runs, an earlier build) takes part:

1. the reference run (``dapo model check``'s: 5 RL steps from the shipped chain checkpoint),
   whose final weights this machine reproduces bit for bit when its kernels are pinned
   (``tasks.determinism``); it says which if not;
2. the page's sweep (``dapo ablate -c configs/chain.yaml --seeds 0,1,2,3,4``, with the
   table's variants) from the same shipped checkpoint: nothing is built;
3. each row beside the page's value, whether that value lies in the sweep's 95% CI, and
   whether it is the same value (it is, on pinned kernels: the same bits).

Exits 0 when every published value lies in the sweep's CI. Ctrl-C (or SIGTERM) stops the sweep as
Ctrl-C stops ``dapo ablate`` (its runs end KILLED, its workers and server stop) and exits 130
(143 for SIGTERM); ``--keep`` keeps the scratch directory.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

import bench
from tasks import signals

ROOT = Path(__file__).resolve().parents[1]
CHAIN = ROOT / "configs" / "chain.yaml"
RESULTS = ROOT / "docs" / "results.md"  # the published tables
RESULTS_ROW = re.compile(
    r"^\| `([+\w]+)` \| (?:\*\*)?([0-9.]+) \(([0-9.]+)-([0-9.]+)\)(?:\*\*)? \|"
)
STOP_WAIT_S = 120.0  # what the sweep's own clean-up may take before it is killed
PR_SET_PDEATHSIG = 1


def results_tables(page: Path = RESULTS) -> list[dict[str, float]]:
    """Every table of ``page`` with rows of the form ``| `variant` | 0.802 (0.772-0.834) |``:
    ``{variant: avg@8}`` each, in the page's order."""
    tables: list[dict[str, float]] = [{}]
    for line in page.read_text().splitlines():
        m = RESULTS_ROW.match(line)
        if m:
            tables[-1][m.group(1)] = float(m.group(2))
        elif tables[-1]:
            tables.append({})
    return [t for t in tables if t]


def results_table(which: str, page: Path = RESULTS) -> dict[str, float]:
    """The first chain table of ``which`` kind on ``page``: ``ladder`` (its variants are the
    Table 1 rungs) or ``algorithms`` (its variants are algorithm presets, ``dapo`` first)."""
    from dapo_core.ablation import ABLATION_LADDER, ALGORITHM_PRESETS

    for rows in results_tables(page):
        if which == "ladder" and list(rows) == list(ABLATION_LADDER):
            return rows
        if which == "algorithms" and len(rows) > 1 and set(rows) <= set(ALGORITHM_PRESETS):
            return rows
    raise SystemExit(f"no {which} table found in {page}")


def _die_with_parent() -> None:
    """In the sweep's process: SIGTERM when this check dies, however it dies (Linux), so a
    killed check never leaves a sweep training headless."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def run_sweep(scratch: Path, variants: list[str], seeds: str, workers: int) -> Path:
    """The published sweep in ``scratch``; returns the sweep's directory (ablation.csv)."""
    env = {
        **os.environ,
        "PREFECT_HOME": str(scratch / "prefect"),  # the rest of dapo's defaults: flows.environment
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [
        str(Path(sys.executable).with_name("dapo")),
        *("ablate", "-c", str(CHAIN), "--seeds", seeds, "--workers", str(workers)),
        *("--variants", ",".join(variants), "--run-name", "ladder-check"),
        *("-S", f"tracking.tracking_uri=sqlite:///{scratch / 'mlflow.db'}"),
        *("-S", f"train.out_dir={scratch / 'runs'}"),
    ]
    print("running:", " ".join(cmd), flush=True)
    # A session of its own: a terminal's Ctrl-C reaches this process only, which passes one
    # interrupt on and waits for the sweep's clean-up (subprocess.run would SIGKILL it).
    child = subprocess.Popen(
        cmd, cwd=ROOT, env=env, start_new_session=True, preexec_fn=_die_with_parent
    )
    try:
        code = child.wait()
    except KeyboardInterrupt:
        stop(child)
        raise
    if code:
        raise SystemExit(f"the sweep failed (exit {code}); its output is above")
    return scratch / "runs" / "ladder-check"


def stop(child: subprocess.Popen) -> None:
    """Interrupt the sweep once, as Ctrl-C would, and wait for its clean-up; kill its process
    group if the clean-up outlasts ``STOP_WAIT_S``."""
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signal.SIGINT)
    try:
        child.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def compare(table: pd.DataFrame, published: dict[str, float]) -> int:
    """Print the sweep against the published table; the number of its values outside the
    sweep's CI."""
    misses = 0
    print(f"{'variant':22} {'results':>8} {'this sweep [95% CI]':>26}  within  same to 3 d.p.")
    for row in table.to_dict("records"):
        want = published.get(row["variant"])
        inside = want is not None and row["ci_low"] <= want <= row["ci_high"]
        same = want is not None and f"{row['avg_at_k']:.3f}" == f"{want:.3f}"
        misses += not inside
        ci = f"{row['avg_at_k']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
        shown = "-" if want is None else f"{want:.3f}"
        verdict = f"{'yes' if inside else 'NO':6}  {'yes' if same else 'no'}"
        print(f"{row['variant']:22} {shown:>8} {ci:>26}  {verdict}")
    return misses


TABLES_ROUNDING = {"ladder": "COMPATIBLE", "algorithms": "AVX2@AuthenticAMD"}
"""What decided the bits of each table of the page (``tasks.determinism.rounding``): the ladder
was measured again under the portable pins (every x86-64 CPU with AVX2 computes its bits); the
algorithms' table is from AMD CPUs under MKL's ``AVX2`` branch, the pin before session 36, which
only AMD CPUs given ``MKL_CBWR=AVX2`` compute."""


def reference(scratch: Path, table: str = "ladder") -> None:
    """Run the reference run in ``scratch`` and say whether this machine computes ``table``'s
    bits."""
    from flows.models import check_reference
    from tasks.params import load_params

    want = TABLES_ROUNDING[table]
    branch, _, maker = want.partition("@")
    how = f" (an {maker} CPU computes them with MKL_CBWR={branch} set)" if maker else ""
    r = check_reference(load_params(None, [CHAIN]), scratch)
    if r.reproduced and r.key == want:
        print(f"reference run: {r.got}, the shipped one: this machine computes the same bits")
    elif r.reproduced:
        print(
            f"reference run: {r.got}, the release's under {r.key}; the table was measured "
            f"under {want}, which computes other bits{how}, so runs here are other draws of the "
            "same experiment; the table below is still the test"
        )
    elif r.want is None:
        print(
            f"reference run: {r.got}; the release records none for this machine's kernels "
            f"({r.key or 'unpinned'}), which compute other bits than the table's ({want}), so "
            "runs here are other draws of the same experiment; the table below is still the test"
        )
    else:
        print(
            f"reference run: {r.got}, the release recorded {r.want}: this machine rounds "
            f"differently (kernels {r.kernels}), so runs here are other draws of the same "
            "experiment; the table below is still the test"
        )


def _terminate(signum, frame) -> None:
    signals.note_interrupt(signum)  # SIGTERM stops the sweep as Ctrl-C does, and exits 143
    raise KeyboardInterrupt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", choices=("ladder", "algorithms"), default="ladder")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _terminate)
    published = results_table(args.table)
    scratch = Path(tempfile.mkdtemp(prefix="dapo-ladder-"))
    t0 = time.perf_counter()
    try:
        reference(scratch, args.table)
        sweep = run_sweep(scratch, list(published), args.seeds, args.workers)
        table = pd.read_csv(sweep / "ablation.csv")
    except KeyboardInterrupt:
        print("interrupted: the sweep stopped; run the same command to start again")
        sys.exit(signals.interrupted_status())  # 130 for Ctrl-C, 143 for SIGTERM
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"sweep: {(time.perf_counter() - t0) / 60:.1f} min")
    misses = compare(table, published)
    print(
        "the published table holds" if not misses else f"{misses} published values outside the CI"
    )
    sys.exit(1 if misses else 0)


if __name__ == "__main__":
    from tasks.determinism import pin_kernels

    pin_kernels()  # the reference run runs in this process, as `dapo` would run it
    bench.run(main)
