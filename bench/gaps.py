"""Where the GPU waits: idle gaps in a profiled timeline, and what the host was doing in each.

    python -m bench.mfu --trace update.json      # on the GPU machine: one profiled update
    python -m bench.gaps update.json [--min-us 200] [--top 15]

Reads a Chrome trace written by torch.profiler (``export_chrome_trace``; ``.json`` or
``.json.gz``). The device's busy time is the union of its kernels, copies and memsets; a gap is
time between them, from the first host operator to the last device event. For each gap above
``--min-us`` it prints the host operators running at its middle (innermost last) and the CUDA
runtime calls inside it: a synchronising call (``cudaStreamSynchronize``, ``cudaMemcpy``
from device memory, ``cudaFree``) means the host waited; none means the host was simply slower
than the device there.
"""

from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import dataclass, field

import bench

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass
class Gap:
    start: float  # us from the timeline's start
    dur: float
    host_ops: list[str] = field(default_factory=list)  # outermost first
    runtime: list[str] = field(default_factory=list)


def _spans(events: list[dict], cats: tuple[str, ...]) -> list[tuple[float, float]]:
    return sorted(
        (e["ts"], e["ts"] + e.get("dur", 0.0))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in cats
    )


def merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) intervals, sorted and non-overlapping."""
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def gaps(events: list[dict], min_us: float = 200.0) -> tuple[dict[str, float], list[Gap]]:
    """({wall_us, busy_us, idle_us}, the gaps above ``min_us``, longest first)."""
    busy = merge(_spans(events, DEVICE_CATS))
    host = _spans(events, ("cpu_op", "user_annotation", "python_function"))
    if not busy:
        return {"wall_us": 0.0, "busy_us": 0.0, "idle_us": 0.0}, []
    t0 = min([busy[0][0]] + [s for s, _ in host[:1]])
    t1 = busy[-1][1]
    edges = [(t0, t0)] + busy
    found = []
    for (_, prev_end), (start, _) in zip(edges, edges[1:], strict=False):
        if start - prev_end >= min_us:
            found.append(Gap(prev_end - t0, start - prev_end))
    ops = [
        e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function")
    ]
    calls = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"]
    for g in found:
        lo, hi = t0 + g.start, t0 + g.start + g.dur
        mid = (lo + hi) / 2
        at = [e for e in ops if e["ts"] <= mid < e["ts"] + e.get("dur", 0.0)]
        g.host_ops = [e["name"] for e in sorted(at, key=lambda e: (e["ts"], -e.get("dur", 0.0)))]
        g.runtime = sorted({e["name"] for e in calls if lo <= e["ts"] < hi})
    total = sum(e - s for s, e in busy)
    summary = {"wall_us": t1 - t0, "busy_us": total, "idle_us": t1 - t0 - total}
    return summary, sorted(found, key=lambda g: -g.dur)


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a Chrome trace from torch.profiler (.json or .json.gz)")
    ap.add_argument("--min-us", type=float, default=200.0, help="report gaps at least this long")
    ap.add_argument("--top", type=int, default=15, help="how many of the longest gaps to print")
    ap.add_argument("--ops", type=int, default=4, help="innermost host operators per gap")
    a = ap.parse_args(argv)
    summary, found = gaps(load(a.trace), a.min_us)
    wall, busy = summary["wall_us"], summary["busy_us"]
    if not wall:
        raise SystemExit(f"{a.trace}: no device kernels in this trace (profiled on a GPU?)")
    print(
        f"wall {wall / 1e3:.1f} ms, device busy {busy / 1e3:.1f} ms ({busy / wall:.0%}), "
        f"idle {summary['idle_us'] / 1e3:.1f} ms; {len(found)} gaps >= {a.min_us:g} us "
        f"hold {sum(g.dur for g in found) / 1e3:.1f} ms"
    )
    for g in found[: a.top]:
        ops = " > ".join(g.host_ops[-a.ops :]) or "(no host op)"
        calls = ", ".join(g.runtime[:6])
        print(f"  at {g.start / 1e3:8.2f} ms  {g.dur / 1e3:6.2f} ms  {ops}  [{calls}]")


if __name__ == "__main__":
    bench.run(main)
