"""Rollouts that overlap training, against the synchronous step: steps per minute, each side's
wait, and held-out avg@8 after the same number of steps.

    python -m bench.async                              # embedded default, 50 steps, 1 seed
    python -m bench.async --seeds 5 --settings sync,s1,s2 -S rollout.max_response_len=32
    python -m bench.async -c configs/chain.yaml --steps 30   # a preset (-c as dapo train's)

Settings: ``sync`` (the trainer samples its own batches, ``train.rollout_ranks=0``), ``sync-all``
(the same with torch's threads on every core, ``train.cpu_threads=0``: the fair baseline where a
model is large enough to use them; the asynchronous settings give each process one), ``s0`` (a
rollout process, staleness 0: serial, the synchronous run bit for bit), ``s1`` (one-step-off)
and ``s2`` (bounded staleness 2). On a machine of 2 cores each process has one
(``train.cpu_threads=1``): the synchronous run leaves the second core idle, which is what the
rollout process uses.

Per setting, medians over steps 2.. (step 1 also starts the rollout process): the step's wall
time, the rollout's generation time, the trainer's update time (loss inputs and updates), the
trainer's wait for its batch, the rollout process's idle time (step - generation), the mean
response length and the tokens (generated and trained) per second: a policy that writes longer
responses makes every step more work, so compare steps per minute at similar lengths. The
overlap check: an overlapped step should take no more than 1.15x max(generation, update)
measured in the same run. avg@8 is ``eval.n_samples`` samples a problem on the held-out split
after the last step, averaged over seeds, with a 95% bootstrap CI over problems (one seed) or
the seeds' mean +/- 1.96 standard errors (several).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import bench
from dapo_core import metric_names as metric
from tasks.params import load_params

SETTINGS = {
    "sync": [],
    "sync-all": ["train.cpu_threads=0"],  # the synchronous step on every core (torch's default)
    "s0": ["train.rollout_ranks=1", "rollout.max_staleness=0"],
    "s1": ["train.rollout_ranks=1", "rollout.max_staleness=1"],
    "s2": ["train.rollout_ranks=1", "rollout.max_staleness=2"],
}
OVERLAP_TARGET = 1.15  # an overlapped step within 15% of max(generation, update)


def run_once(
    setting: str, seed: int, steps: int, extra: list[str], scratch: Path, presets: list[str] = ()
) -> dict:
    """Train one setting for ``steps`` steps, then evaluate the final policy."""
    from tasks.evaluation.evaluate import evaluate_model
    from tasks.rundir import RunDir
    from tasks.training.run import run_training

    overrides = [f"train.seed={seed}", f"train.steps={steps}", "train.checkpoint_every=0"]
    # the setting's keys last: they are what is compared
    cfg = load_params(overlays=presets, overrides=[*overrides, *extra, *SETTINGS[setting]])
    result = run_training(cfg, RunDir(scratch / f"{setting}-seed{seed}"), progress=False)
    later = result.history[1:] or result.history

    def med(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in later)

    _, ev = evaluate_model(cfg, str(result.final_model), progress=False)
    return {
        "step_s": med(metric.STEP_TIME),
        "gen_s": med(metric.GEN_TIME),
        "update_s": med(metric.TRAIN_TIME),
        "wait_s": med(metric.ROLLOUT_WAIT),
        "staleness": med(metric.STALENESS_MEAN),
        "resp_len": med(metric.RESPONSE_LEN_MEAN),  # a step's work grows with it
        "tokens_s": med(metric.TOKENS_PER_S),
        "avg": ev.metrics["eval/avg_at_k"],
        "ci": (ev.metrics["eval/avg_at_k_ci_low"], ev.metrics["eval/avg_at_k_ci_high"]),
    }


def summarize(runs: list[dict]) -> dict:
    """One setting over its seeds: medians of the timings, avg@8's mean and its 95% interval."""
    out = {k: statistics.median(r[k] for r in runs) for k in ("step_s", "gen_s", "update_s")}
    more = ("wait_s", "staleness", "resp_len", "tokens_s")
    out |= {k: statistics.median(r.get(k, 0.0) for r in runs) for k in more}
    out["idle_s"] = max(out["step_s"] - out["gen_s"], 0.0)
    out["overlap"] = out["step_s"] / max(out["gen_s"], out["update_s"])
    avgs = [r["avg"] for r in runs]
    out["avg"] = statistics.fmean(avgs)
    if len(avgs) == 1:
        out["ci"] = runs[0]["ci"]
    else:
        half = 1.96 * statistics.stdev(avgs) / len(avgs) ** 0.5
        out["ci"] = (out["avg"] - half, out["avg"] + half)
    return out


def table(rows: dict[str, dict]) -> str:
    base = rows.get("sync")
    head = f"{'setting':8s} {'steps/min':>9s} {'vs sync':>7s} {'step s':>7s} {'gen s':>6s}"
    head += f" {'update s':>8s} {'trainer waits':>13s} {'rollout idles':>13s} {'overlap':>7s}"
    head += f" {'staleness':>9s} {'resp len':>8s} {'tokens/s':>8s}  avg@8 [95% CI]"
    lines = [head]
    for name, r in rows.items():
        speed = 60 / r["step_s"]
        ratio = f"{(base['step_s'] / r['step_s']):.2f}x" if base else "-"
        overlap = f"{r['overlap']:.2f}" if name in ("s1", "s2") else "-"
        lines.append(
            f"{name:8s} {speed:9.1f} {ratio:>7s} {r['step_s']:7.3f} {r['gen_s']:6.3f} "
            f"{r['update_s']:8.3f} {r['wait_s']:13.3f} {r['idle_s']:13.3f} {overlap:>7s} "
            f"{r['staleness']:9.2f} {r['resp_len']:8.1f} {r['tokens_s']:8.0f}  "
            f"{r['avg']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50, help="training steps per run")
    ap.add_argument("--seeds", type=int, default=1, help="runs per setting (train.seed 0..n-1)")
    ap.add_argument("--settings", default="sync,s1,s2", help=f"of {', '.join(SETTINGS)}")
    ap.add_argument("-S", dest="overrides", action="append", default=[], help="a config override")
    ap.add_argument("-c", dest="presets", action="append", default=[], help="a preset overlay")
    a = ap.parse_args(argv)
    names = a.settings.split(",")
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        ap.error(f"unknown setting {unknown[0]!r}: choose from {', '.join(SETTINGS)}")
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench-async-") as scratch:
        for name in names:
            runs = []
            for seed in range(a.seeds):
                runs.append(run_once(name, seed, a.steps, a.overrides, Path(scratch), a.presets))
                print(f"  {name} seed {seed}: {runs[-1]['step_s']:.3f} s/step", flush=True)
            rows[name] = summarize(runs)
    print(table(rows))
    if "sync-all" in rows:  # against the synchronous step that has both cores to itself
        wide = rows["sync-all"]["step_s"]
        for name in [n for n in rows if n not in ("sync", "sync-all")]:
            print(f"{name} vs sync-all: {wide / rows[name]['step_s']:.2f}x the steps per minute")
    for name in ("s1", "s2"):
        if name in rows:
            ok = rows[name]["overlap"] <= OVERLAP_TARGET
            print(
                f"{name}: step {rows[name]['overlap']:.2f}x max(generation, update); target <= "
                f"{OVERLAP_TARGET}: {'PASS' if ok else 'FAIL'}"
            )


if __name__ == "__main__":
    bench.run(main)
