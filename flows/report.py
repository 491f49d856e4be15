"""What the commands print when a flow is done: one summary line for a pipeline, the ablation
table for a sweep. Shared by the CLI and the demo."""

from __future__ import annotations

from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

# soft_wrap: a message is one line (the terminal wraps it), so logs and tests see it whole.
console = Console(stderr=True, soft_wrap=True)


def report_pipeline(out: dict[str, Any]) -> None:
    """The pipeline's outcome: steps, the eval set's avg@k with its CI, and where to look."""
    t, e = out["train"], out["evaluate"]
    m = e.metrics
    console.print(
        f"[green]done[/]: {t.steps} steps in {t.wall_time_s:.0f}s; {e.eval_set} "
        f"avg@{int(m['eval/n_samples'])} {m['eval/avg_at_k']:.4f} "
        f"(95% CI {m['eval/avg_at_k_ci_low']:.4f}-{m['eval/avg_at_k_ci_high']:.4f}); "
        f"run {t.run_dir}; MLflow run {t.mlflow_run_id} (browse with `dapo ui`)"
    )


def report_ablation(table: Any) -> None:
    """The ablation table in Table 1 order (each rung against the one before, ours beside the
    paper's AIME 2024 numbers), then each switch's own signal (``table.attrs["mechanisms"]``)."""
    baseline = table.attrs.get("baseline")
    against = "vs rung before" if baseline is None else f"vs {baseline}"
    view = Table(title="Ablation (DAPO Table 1 order)" if baseline is None else "Ablation")
    for col in ("variant", "avg@k", "95% CI", f"{against} [95% CI]", "train s", "paper"):
        view.add_column(col)
    for r in table.to_dict("records"):
        delta = (
            ""
            if pd.isna(r["delta"])
            else _paired(r["delta"], r["delta_ci_low"], r["delta_ci_high"], r["distinguishable"])
        )
        view.add_row(
            r["variant"],
            f"{r['avg_at_k']:.4f}",
            f"{r['ci_low']:.4f}-{r['ci_high']:.4f}",
            delta,
            f"{r['train_wall_s']:.0f}",
            "" if pd.isna(r["paper_aime24"]) else f"{r['paper_aime24']:.0f}",
        )
    console = Console()
    console.print(view)
    mechanisms = table.attrs.get("mechanisms")
    if mechanisms is None or not len(mechanisms):
        return
    view = Table(
        title="Each switch's own signal, against the rung before (paired over seeds; a probe's "
        "within each step of the rung's runs)"
    )
    for col in ("rung", "signal", "paper says", "before", "after", "change [95% CI]", "as paper"):
        view.add_column(col)
    for r in mechanisms.to_dict("records"):
        view.add_row(
            r["variant"],
            r["signal"],
            r["paper_direction"],
            f"{r['previous']:.4g}",
            f"{r['value']:.4g}",
            _paired(r["delta"], r["ci_low"], r["ci_high"], r["distinguishable"]),
            r["as_paper"],
        )
    console.print(view)


def _paired(delta: float, low: float, high: float, distinguishable: bool) -> str:
    if pd.isna(delta):
        return "not measured"
    if pd.isna(low):
        return f"{delta:+.3g} (one seed: no CI)"
    mark = "" if distinguishable else " ~0"
    return f"{delta:+.3g} [{low:+.3g}, {high:+.3g}]{mark}"
