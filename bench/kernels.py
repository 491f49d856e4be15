"""What the portable kernels cost: ``python -m bench.kernels [--trials 5]``.

Runs the same work under the kernels each library picks for this CPU (``native``), under the
portable pins every ``dapo`` command uses (``pinned``, ``tasks.determinism``: MKL's
``COMPATIBLE`` branch), and under the same pins with MKL's ``AVX2`` branch (``mkl-avx2``, the
pins before session 36: faster, but the CPU maker's bits), each trial in a fresh process (torch
reads the pins once, at import), the settings interleaved so that a slow spell of a shared
machine hits all of them:

- ``warm start``: 40 supervised steps of the chain preset's embedded model (batch 64);
- ``rl step``: 5 RL steps of the chain preset from its shipped checkpoint, as the reference run.

Prints each setting's median seconds and the ratios pinned / native and pinned / mkl-avx2. One
thread per process, as the presets run (``train.cpu_threads``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import bench
from tasks.determinism import PORTABLE_KERNELS, SWITCH

ROOT = Path(__file__).resolve().parents[1]
WORK = r"""
import json, random, sys, tempfile, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from tasks.params import load_params
from tasks.data.splits import splits
from tasks.models.loading import transformers_quietly
from tasks.models.resolve import resolve_model_path
from tasks.models.warm_start import sft_batch

cfg = load_params(None, ["configs/chain.yaml"])
path = resolve_model_path(cfg)
tr = transformers_quietly()
tok = tr.AutoTokenizer.from_pretrained(path)
model = tr.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
train, rng = splits(cfg).train, random.Random(0)
t0 = time.perf_counter()
for _ in range(40):
    loss = model(**sft_batch(tok, rng.sample(train, 64))).loss
    opt.zero_grad(); loss.backward(); opt.step()
sft = time.perf_counter() - t0

from dapo_core.config_loader import resolve
from tasks.rundir import RunDir
from tasks.training.run import run_training
rl_cfg = resolve(cfg.to_dict(), overrides=["train.steps=5", "train.checkpoint_every=0"])
with tempfile.TemporaryDirectory() as d:
    t0 = time.perf_counter()
    run_training(rl_cfg, RunDir(Path(d) / "run"), progress=False)
    rl = time.perf_counter() - t0
print(json.dumps({"cpu": torch.backends.cpu.get_cpu_capability(), "sft": sft, "rl": rl}))
"""


SETTINGS = {
    "native": {SWITCH: "0"},
    "pinned": PORTABLE_KERNELS,
    "mkl-avx2": {**PORTABLE_KERNELS, "MKL_CBWR": "AVX2"},
}


def trial(setting: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PORTABLE_KERNELS}
    env.update(SETTINGS[setting])
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", WORK], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(f"a {setting} trial failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args(argv)
    runs: dict[str, list[dict]] = {setting: [] for setting in SETTINGS}
    for i in range(args.trials):
        for setting in runs:
            runs[setting].append(trial(setting))
            print(f"trial {i + 1}/{args.trials} {setting}: {runs[setting][-1]}", flush=True)
    heads = " ".join(f"{setting + ' s':>10}" for setting in SETTINGS)
    print(f"\n{'work':12} {heads} {'pinned/native':>14} {'pinned/mkl-avx2':>16}")
    for work, label in (("sft", "warm start"), ("rl", "rl step")):
        s = {k: statistics.median(r[work] for r in v) for k, v in runs.items()}
        cells = " ".join(f"{s[setting]:10.2f}" for setting in SETTINGS)
        ratios = f"{s['pinned'] / s['native']:13.2f}x {s['pinned'] / s['mkl-avx2']:15.2f}x"
        print(f"{label:12} {cells} {ratios}")
    print(f"kernels: native {runs['native'][0]['cpu']}, pinned {runs['pinned'][0]['cpu']}")


if __name__ == "__main__":
    bench.run(main)
