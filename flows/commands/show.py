"""Commands that show what the project holds: the resolved config, the Table 1 variants and
algorithm presets, the metrics a run logs."""

import json
import sys
from typing import Annotated

import typer
from rich.console import Console

from dapo_core import metric_names as metric
from dapo_core.ablation import (
    ABLATION_LADDER,
    ALGORITHM_PRESETS,
)
from flows.commands.base import (
    VARIANTS_HELP,
    ConfigOpt,
    ParamsOpt,
    SetOpt,
    _load,
    app,
    console,
    user_errors,
)


@app.command("config")
@user_errors
def show_config(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    variant: Annotated[str | None, typer.Option(help=VARIANTS_HELP)] = None,
) -> None:
    """Print the resolved configuration as JSON (after presets, overrides and the variant)."""
    cfg = _load(params, config, set_, variant)
    sys.stdout.write(json.dumps(cfg.to_dict(), indent=2) + "\n")


@app.command("variants")
def variants() -> None:
    """List the Table 1 ablation ladder (each variant's switches) and the algorithm presets."""
    from rich.table import Table

    from dapo_core.ablation import ABLATION_SWITCHES, PAPER_TABLE1_AIME24

    # the switches a rung has on, by name: a column per switch cut their names at 80 columns
    table = Table(title="DAPO Table 1 ladder (cumulative: each rung adds one switch)")
    table.add_column("variant", no_wrap=True)
    table.add_column("algo switches on")
    table.add_column("paper AIME24 avg@32", justify="right")
    for name, switches in ABLATION_LADDER.items():
        on = ", ".join(s for s in ABLATION_SWITCHES if switches[s]) or "none (naive GRPO)"
        table.add_row(name, on, f"{PAPER_TABLE1_AIME24[name]:.0f}")
    Console().print(table)
    algos = Table(title="Algorithms (DAPO's full recipe with these algo entries replaced)")
    algos.add_column("variant")
    algos.add_column("algo entries")
    for name, entries in ALGORITHM_PRESETS.items():
        algos.add_row(name, json.dumps(entries) if entries else "(DAPO as configured)")
    Console().print(algos)


@app.command("metrics")
def metrics() -> None:
    """List the metrics a run logs (MLflow, metrics.jsonl) and what each measures."""
    from rich.table import Table

    table = Table(title="Metrics a run logs (val/*: the eval/* names on the validation split)")
    table.add_column("metric")
    table.add_column("what it measures")
    for name, meaning in metric.CATALOGUE.items():
        table.add_row(name, meaning)
    Console().print(table)
    console.print(
        "Besides these, each algo entry logs its own (train/<name>): `dapo variants` lists the "
        "entries, dapo_core/algos documents them."
    )
