"""PNG plots of a run and of the ablation table, rendered with matplotlib's Agg backend.

DVC's HTML plots need a CDN (blank offline), so the pipeline renders its own:
the training curves DAPO's section 3 discusses (reward/accuracy, entropy, response length, clip
fractions), the evaluation curve (in-training validation and the final evaluation, with the 95% CI)
and the Table 1 bar chart (ours beside the paper's). Figures are built without pyplot (no global
state, safe in Prefect's worker threads); the caller saves or logs them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

from dapo_core import metric_names as metric

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402 - after the backend is chosen
from matplotlib.ticker import MaxNLocator  # noqa: E402

Rows = Sequence[Mapping[str, Any]]


def _series(rows: Rows, key: str) -> tuple[list[int], list[float]]:
    pts = [(int(r["step"]), float(r[key])) for r in rows if key in r and r[key] is not None]
    return [s for s, _ in pts], [v for _, v in pts]


def _line_figure(title: str, rows: Rows, keys: Sequence[tuple[str, str]], ylabel: str) -> Figure:
    fig = Figure(figsize=(6, 3.6), dpi=100)
    ax = fig.add_subplot()
    for key, label in keys:
        x, y = _series(rows, key)
        if x:
            ax.plot(x, y, marker="." if len(x) < 30 else None, label=label)
    ax.set_title(title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def training_figures(history: Rows) -> dict[str, Figure]:
    """``{file name: figure}`` from per-step rows (``{"step": s, "train/...": v, ...}``)."""
    return {
        "reward_accuracy.png": _line_figure(
            "Reward and sampled accuracy",
            history,
            [
                (metric.REWARD_MEAN, "reward (shaped)"),
                (metric.ACC_MEAN, "accuracy (all samples)"),
                (metric.BATCH_ACC_MEAN, "accuracy (training batch)"),
            ],
            "value",
        ),
        "entropy.png": _line_figure(
            "Policy entropy (valid tokens)", history, [(metric.ENTROPY, "entropy")], "nats"
        ),
        "response_length.png": _line_figure(
            "Response length",
            history,
            [(metric.RESPONSE_LEN_MEAN, "mean length")],
            "tokens",
        ),
        "clip_fractions.png": _line_figure(
            "Clipped token fractions (Eq. 10)",
            history,
            [(metric.CLIP_FRAC_HIGH, "clip_frac_high"), (metric.CLIP_FRAC_LOW, "clip_frac_low")],
            "share of valid tokens",
        ),
    }


def eval_curve(
    validation: Rows,
    final: Mapping[str, Any] | None = None,
    start: Mapping[str, Any] | None = None,
    prefix: str = "val/",
) -> Figure:
    """avg@k over training steps with its 95% CI; ``final`` and ``start`` (rows with ``step`` and
    ``eval/`` metrics) are the evaluation after training and the same one before it, each drawn
    as its own point (on the eval set, where the curve is on the validation split)."""
    fig = Figure(figsize=(6, 3.6), dpi=100)
    ax = fig.add_subplot()
    x, y = _series(validation, f"{prefix}avg_at_k")
    if x:
        _, lo = _series(validation, f"{prefix}avg_at_k_ci_low")
        _, hi = _series(validation, f"{prefix}avg_at_k_ci_high")
        ax.plot(x, y, marker="o", label="validation avg@k")
        if len(lo) == len(x) and len(hi) == len(x):
            ax.fill_between(x, lo, hi, alpha=0.2, label="95% CI")
    for row, marker, label in ((start, "D", "before training"), (final, "s", "final evaluation")):
        if row and metric.AVG_AT_K in row:
            v = float(row[metric.AVG_AT_K])
            err = [
                [v - float(row.get(metric.AVG_AT_K_CI_LOW, v))],
                [float(row.get(metric.AVG_AT_K_CI_HIGH, v)) - v],
            ]
            step = int(row.get("step", 0))
            ax.errorbar([step], [v], yerr=err, fmt=marker, color="C3", capsize=4, label=label)
    ax.set_title("Evaluation accuracy (avg@k)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("avg@k")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def ablation_chart(table: Any, mechanisms: Any = None, paper_scale: float = 100.0) -> Figure:
    """The ladder in labelled panels: ours (avg@k per variant with its 95% CI), the paper's
    (AIME 2024 avg@32 of Qwen2.5-32B, Table 1: a different task and model, so the two share the
    variant order but not an axis), and, given ``mechanisms`` (``mechanism_table``), each rung's
    own signal against the rung before: the change in percent of the previous rung's value, with
    its 95% CI, so that signals in different units share one axis."""
    panels = 3 if mechanisms is not None and len(mechanisms) else 2
    fig = Figure(figsize=(6 * panels, 4.5), dpi=100)
    ours_ax, paper_ax, *rest = fig.subplots(
        1, panels, gridspec_kw={"width_ratios": [1, 1, 1.5][:panels]}
    )
    xs = list(range(len(table)))
    ours = [float(v) * 100 for v in table["avg_at_k"]]
    lo = [max(0.0, o - float(v) * 100) for o, v in zip(ours, table["ci_low"], strict=True)]
    hi = [max(0.0, float(v) * 100 - o) for o, v in zip(ours, table["ci_high"], strict=True)]
    # points, not bars: the axis is zoomed to the scores, and a bar from a cut axis misleads
    ours_ax.errorbar(xs, ours, yerr=[lo, hi], fmt="o", capsize=3, color="tab:blue")
    ours_ax.set_title("this sweep: avg@k on its eval set (95% CI)", fontsize=9)
    paper = [float(v) / paper_scale * 100 for v in table["paper_aime24"]]
    paper_ax.bar(xs, paper, 0.6, color="tab:gray")
    paper_ax.set_ylim(0, 100)
    paper_ax.set_title("paper: AIME 2024 avg@32, Qwen2.5-32B (Table 1)", fontsize=9)
    for ax in (ours_ax, paper_ax):
        ax.set_xticks(xs, list(table["variant"]), rotation=25, ha="right", fontsize=8)
        ax.set_ylabel("accuracy (%)")
        ax.grid(axis="y", alpha=0.3)
    if rest:
        _mechanism_panel(rest[0], mechanisms)
    fig.suptitle("DAPO Table 1 ladder (cumulative: each rung adds one component)")
    fig.tight_layout()
    return fig


def _mechanism_panel(ax: Any, mechanisms: Any) -> None:
    rows = mechanisms.to_dict("records")
    ys = list(range(len(rows)))[::-1]
    for y, r in zip(ys, rows, strict=True):
        base = abs(r["previous"]) or 1.0
        d, low, high = (100 * r[k] / base for k in ("delta", "ci_low", "ci_high"))
        color = "tab:green" if r["as_paper"] == "yes" else "tab:gray"
        xerr = None if math.isnan(low) else [[d - low], [high - d]]  # one seed: no interval
        ax.errorbar(d, y, xerr=xerr, fmt="o", color=color, capsize=3)
    ax.axvline(0, color="black", lw=0.8)
    # Linear within +-10%, logarithmic beyond: a signal that moves 4% stays visible beside one
    # that triples.
    ax.set_xscale("symlog", linthresh=10)
    ax.set_yticks(ys, [f"{r['variant']}: {r['signal']} ({r['paper_direction']})" for r in rows])
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("change vs the rung before, % of its value (95% CI; log beyond +-10%)")
    ax.set_title(
        "each switch's own signal\n(green: as the paper says, beyond its CI; grey: not shown, "
        "as with one seed)",
        fontsize=9,
    )
    ax.grid(axis="x", alpha=0.3)


def save_figures(figures: Mapping[str, Figure], out_dir: Path) -> list[Path]:
    """Write each figure as PNG into ``out_dir``; returns the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures.items():
        path = out_dir / name
        fig.savefig(path, format="png")
        paths.append(path)
    return paths
