"""What the commands print when a flow is done: one summary line for a pipeline, the ablation
table for a sweep. Shared by the CLI and the demo."""

from __future__ import annotations

import math
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

# soft_wrap: a message is one line (the terminal wraps it), so logs and tests see it whole.
console = Console(stderr=True, soft_wrap=True)


def report_pipeline(out: dict[str, Any]) -> None:
    """The pipeline's outcome: steps, the eval set's avg@k with its CI, and where to look."""
    t, e = out["train"], out["evaluate"]
    m = e.metrics
    console.print(
        f"[green]done[/]: {trained(t.steps, t.resumed_from, t.wall_time_s)}; {e.eval_set} "
        f"avg@{int(m['eval/n_samples'])} {m['eval/avg_at_k']:.4f} "
        f"(95% CI {m['eval/avg_at_k_ci_low']:.4f}-{m['eval/avg_at_k_ci_high']:.4f}); "
        f"run {t.run_dir}; {mlflow_link(t.mlflow_run_id, t.mlflow_url)}"
    )


def trained(steps: int, resumed_from: int, wall_s: float) -> str:
    """What this attempt trained: "40 steps in 52s", "steps 31-40 in 13s" when it continued a
    run (the steps before were an earlier attempt's), or that the run was complete already."""
    if resumed_from >= steps:
        return f"the run was complete already ({steps} steps)"
    what = f"steps {resumed_from + 1}-{steps}" if resumed_from else f"{steps} steps"
    return f"{what} in {wall_s:.0f}s"


def mlflow_link(run_id: str | None, url: str | None) -> str:
    """Where a finished run is in the MLflow UI: its page in the training view."""
    from tasks.tracking.store import UI_DEFAULT

    if not run_id:
        return "not tracked in MLflow"
    if not url:
        return f"MLflow run {run_id} (browse with `dapo ui`)"
    served = " (served by `dapo ui`)" if url.startswith(UI_DEFAULT) else ""
    return f"MLflow run {run_id}: {url}{served}"


def report_ablation(table: Any, out: Console | None = None) -> None:
    """The ablation table (Table 1 order, each rung against the one before; or each variant
    against a baseline) and each switch's own signal, in 80 columns: numbers to the precision
    their CI supports, no column a reader can do without; the full tables are in the sweep's
    directory and MLflow (``table.attrs``: ``mechanisms``, ``baseline``, ``dir``)."""
    out = out or Console()
    baseline = table.attrs.get("baseline")
    rows = table.to_dict("records")
    no_ci = [_missing(r["delta_ci_low"]) for r in rows if not _missing(r["delta"])]
    view = Table(
        title="Ablation (DAPO Table 1 order)" if baseline is None else "Ablation",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        caption=_caption(no_ci, "differences"),
    )
    for col in (
        "variant",
        "avg@k",
        "95% CI",
        "vs before" if baseline is None else f"vs {baseline}",
    ):
        view.add_column(col, no_wrap=True)
    view.add_column("min", justify="right", no_wrap=True)
    paper = any(not _missing(r["paper_aime24"]) for r in rows)  # Table 1's rungs only
    if paper:
        view.add_column("paper", justify="right", no_wrap=True)
    for r in rows:
        n = _decimals(r["ci_high"] - r["ci_low"])
        cells = [
            r["variant"],
            f"{r['avg_at_k']:.{n}f}",
            f"{r['ci_low']:.{n}f}-{r['ci_high']:.{n}f}",
            _change(r["delta"], r["delta_ci_low"], r["delta_ci_high"], r["distinguishable"]),
            f"{r['train_wall_s'] / 60:.1f}",
        ]
        view.add_row(
            *cells,
            *(
                [f"{r['paper_aime24']:.0f}"]
                if not _missing(r["paper_aime24"])
                else [""]
                if paper
                else []
            ),
        )
    out.print(view)
    mechanisms = table.attrs.get("mechanisms")
    if mechanisms is not None and len(mechanisms):
        out.print(_mechanism_view(mechanisms))
    if table.attrs.get("dir"):
        out.print(
            f"full tables: {table.attrs['dir']} (ablation.md, mechanisms.md, .csv)",
            highlight=False,
            soft_wrap=True,
        )


def _mechanism_view(mechanisms: Any) -> Table:
    rows = mechanisms.to_dict("records")
    no_ci = [_missing(r["ci_low"]) for r in rows if r["as_paper"] != "not probed"]
    view = Table(
        title="Each switch's own signal, against the rung before",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        caption=_caption(no_ci, "changes") + "\npaper: the way it says; yes/no: ours went so",
    )
    for col in ("rung", "signal", "change [95% CI]", "paper"):
        view.add_column(col, no_wrap=True)
    for r in rows:
        verdict = r["as_paper"] if r["as_paper"] in ("yes", "no") else ""
        direction = {"none claimed": "-"}.get(r["paper_direction"], r["paper_direction"])
        view.add_row(
            r["variant"],
            r["signal"],
            "not probed"
            if r["as_paper"] == "not probed"
            else _change(r["delta"], r["ci_low"], r["ci_high"], r["distinguishable"]),
            f"{direction}: {verdict}" if verdict else direction,
        )
    return view


def _caption(no_ci: list[bool], what: str) -> str:
    """The one line that replaces a column of rows saying nothing (one seed: no CI)."""
    if no_ci and all(no_ci):
        return f"one seed: the {what} have no CI; --seeds 0,1,2,... gives them"
    said = "~0: the 95% CI includes 0"
    return said + (f"; {what} without a CI need 2+ seeds" if any(no_ci) else "")


def _missing(value: Any) -> bool:
    """A table cell with no number: None, or NaN (pandas' missing float)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _decimals(width: float) -> int:
    """Decimals a value deserves: down to the first significant digit of its CI's width, and
    at least two (a CI 0.1 wide still reads +0.02 [-0.03, +0.07], not +0.0 [-0.0, +0.1])."""
    if not width or _missing(width) or width <= 0:
        return 3
    return int(min(4, max(2, -math.floor(math.log10(width)))))


def _change(delta: float, low: float, high: float, distinguishable: bool) -> str:
    """``+0.02 [-0.01, +0.05] ~0``: a paired difference to its CI's precision."""
    if _missing(delta):
        return ""
    if _missing(low):
        return f"{delta:+.3g}"
    if delta == low == high == 0:  # the same runs as the row compared with (the demo's rungs
        return "0 (the same runs)"  # whose switch cannot act in 20 steps)
    if max(abs(low), abs(high)) < 1e-3:  # the entropy probe's scale: one significant digit
        return f"{delta:+.0e} [{low:+.0e}, {high:+.0e}]" + ("" if distinguishable else " ~0")
    n = _decimals(high - low)
    return f"{delta:+.{n}f} [{low:+.{n}f}, {high:+.{n}f}]" + ("" if distinguishable else " ~0")


def report_comparison(table: Any, out: Console | None = None) -> None:
    """The method comparison in 80 columns (``table.attrs['terminal']``), what its columns mean,
    and where the full table, the curves and the MLflow runs are."""
    out = out or Console()
    warm = table.attrs["warm"]
    out.print(table.attrs["terminal"], highlight=False, soft_wrap=True)
    out.print(
        f"warm start avg@k {warm['avg_at_k']:.3f}; 95% CI over seeds; sd: seed standard "
        "deviation; coll: runs below half the warm start; gnCV: gradient-norm sd/mean over "
        "steps; advVar: advantage variance per step; resp: responses generated; min: wall time",
        highlight=False,
        soft_wrap=True,  # a terminal wraps it; a pipe or a log keeps the lines whole
    )
    out.print(
        f"table, curves (sample_efficiency.png) and records in {table.attrs['dir']}; "
        f"{mlflow_link(table.attrs.get('run_id'), None)}",
        highlight=False,
        soft_wrap=True,  # a URL cut at 80 columns cannot be copied
    )
    if table.attrs.get("mlflow_view"):
        out.print(
            f"every run side by side in MLflow: {table.attrs['mlflow_view']}",
            highlight=False,
            soft_wrap=True,
        )
