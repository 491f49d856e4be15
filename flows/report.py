"""What the commands print when a flow is done: one summary line for a pipeline, the ablation
table for a sweep. Shared by the CLI and the demo."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

console = Console(stderr=True)


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
    """The ablation table in Table 1 order, ours beside the paper's AIME 2024 numbers."""
    view = Table(title="Ablation (DAPO Table 1 order)")
    for col in ("variant", "avg@k", "95% CI", "steps", "train s", "paper AIME24"):
        view.add_column(col)
    for r in table.itertuples(index=False):
        view.add_row(
            r.variant,
            f"{r.avg_at_k:.4f}",
            f"{r.ci_low:.4f}-{r.ci_high:.4f}",
            str(r.steps),
            f"{r.train_wall_s:.0f}",
            f"{r.paper_aime24:.0f}",
        )
    Console().print(view)
