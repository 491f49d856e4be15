"""The demo that `make demo` runs: the embedded default end to end.

It builds the tiny model (tokenizer, random init, supervised warm start) if needed, trains it with
DAPO on the synthetic task, evaluates the warm-started and the trained policy on the held-out split,
and prints where everything landed.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from tasks.evaluate import evaluate_model
from tasks.models import resolve_model_path
from tasks.params import load_params, repo_path
from tasks.train import run_training


def run_demo() -> None:
    console = Console()
    cfg = load_params()
    console.rule("DAPO on the embedded default: tiny Qwen2, synthetic arithmetic, 2 CPU cores")
    t0 = time.perf_counter()
    warm = resolve_model_path(cfg)
    run_dir = repo_path(cfg.train.out_dir) / time.strftime("demo-%Y%m%d-%H%M%S")
    result = run_training(cfg, run_dir)
    _, before = evaluate_model(cfg, warm)
    _, after = evaluate_model(cfg, str(result.final_model))

    table = Table(title=f"held-out {cfg.eval.eval_set}, {cfg.eval.n_samples} samples per problem")
    table.add_column("policy")
    for col in ("avg@k", "95% CI", "pass@1", "maj@k"):
        table.add_column(col, justify="right")
    for name, r in (("warm start", before), (f"after {result.steps} DAPO steps", after)):
        m = r.metrics
        table.add_row(
            name,
            f"{m['eval/avg_at_k']:.3f}",
            f"{m['eval/avg_at_k_ci_low']:.3f}-{m['eval/avg_at_k_ci_high']:.3f}",
            f"{m['eval/pass_at_1']:.3f}",
            f"{m['eval/maj_at_k']:.3f}",
        )
    console.print(table)
    console.print(f"run directory: {run_dir} (metrics.jsonl, checkpoints/, final/)")
    console.print(f"total {time.perf_counter() - t0:.0f}s")
