"""The ``dapo`` command line: one entry point for every flow of the pipeline.

Every command takes ``-c/--config`` overlay presets and ``-S section.key=value`` overrides on top of
params.yaml (DVC's convention), and turns expected failures (a bad config key, a missing file) into
a one-line message and a non-zero exit code instead of a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from dapo_core.config import ABLATION_LADDER, ConfigError, apply_variant
from dapo_core.errors import PipelineError

app = typer.Typer(
    help="DAPO (arXiv 2503.14476) training pipeline: curate, train, evaluate, ablate.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)

ConfigOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--config",
        "-c",
        help="Overlay preset(s) on top of params.yaml, e.g. configs/qwen2.5-7b.yaml.",
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-S", help="Override a value: -S algo.eps_high=0.3 (repeatable)."),
]
ParamsOpt = Annotated[
    Path | None,
    typer.Option("--params", help="Base params file (default: params.yaml at the repo root)."),
]

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Print expected errors as one actionable line and exit 2, rather than a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ConfigError, FileNotFoundError, FileExistsError, PipelineError) as e:
            console.print(f"[bold red]error:[/] {e}")
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def _load(
    params: Path | None,
    config: list[Path] | None,
    overrides: list[str] | None,
    variant: str | None = None,
):
    from tasks.params import load_params

    cfg = load_params(params, config or (), overrides or ())
    return apply_variant(cfg, variant) if variant else cfg


@app.command("config")
@user_errors
def show_config(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    variant: Annotated[
        str | None, typer.Option(help=f"A Table 1 variant: {', '.join(ABLATION_LADDER)}.")
    ] = None,
) -> None:
    """Print the resolved configuration as JSON (after presets, overrides and the variant)."""
    cfg = _load(params, config, set_, variant)
    sys.stdout.write(json.dumps(cfg.to_dict(), indent=2) + "\n")


@app.command("variants")
def variants() -> None:
    """List the Table 1 ablation ladder: each variant's algorithm switches."""
    from rich.table import Table

    from dapo_core.config import ABLATION_SWITCHES, PAPER_TABLE1_AIME24

    table = Table(title="DAPO Table 1 ladder (cumulative)")
    table.add_column("variant")
    for s in ABLATION_SWITCHES:
        table.add_column(s)
    table.add_column("paper AIME24 avg@32")
    for name, switches in ABLATION_LADDER.items():
        marks = ["✓" if switches[s] else "·" for s in ABLATION_SWITCHES]
        table.add_row(name, *marks, f"{PAPER_TABLE1_AIME24[name]:.0f}")
    Console().print(table)


@app.command("train")
@user_errors
def train(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    variant: Annotated[str | None, typer.Option(help="A Table 1 variant to train.")] = None,
    run_dir: Annotated[
        Path | None, typer.Option(help="Run directory (default: train.out_dir/<timestamp>).")
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Continue the run in this directory from its last checkpoint."),
    ] = None,
) -> None:
    """Train the policy with DAPO (or a Table 1 variant) on the configured data."""
    import time

    from tasks.params import repo_path
    from tasks.train import run_training

    if resume is not None:
        if not (resume / "config.json").exists():
            raise FileNotFoundError(f"{resume} is not a run directory (no config.json)")
        cfg = _load_logged(resume / "config.json")
        out = resume
    else:
        cfg = _load(params, config, set_, variant)
        out = run_dir or repo_path(cfg.train.out_dir) / time.strftime("train-%Y%m%d-%H%M%S")
    result = run_training(cfg, out, resume=resume is not None)
    last = result.history[-1] if result.history else {}
    console.print(
        f"[green]done[/]: {result.steps} steps in {result.wall_time_s:.0f}s, "
        f"last sampled accuracy {last.get('train/acc_mean', float('nan')):.3f}; "
        f"model in {result.final_model}"
    )


def _load_logged(path: Path):
    from dapo_core.config import from_dict

    return from_dict(json.loads(path.read_text()), source=str(path))


@app.command("demo")
@user_errors
def demo() -> None:
    """The embedded default end to end (what `make demo` runs)."""
    from flows.demo import run_demo

    run_demo()


if __name__ == "__main__":
    app()
