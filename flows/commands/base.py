"""What every ``dapo`` command shares: the typer app, the console, the config options
(``-c`` presets, ``-S`` overrides, ``--params``), expected errors as one line, and how a command
reaches its flows (a Prefect server, or its stages called directly)."""

import contextlib
import functools
import gc
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from dapo_core.ablation import (
    ABLATION_LADDER,
    ALGORITHM_PRESETS,
    apply_variant,
    split_overrides,
)
from dapo_core.config import ConfigError
from dapo_core.errors import PipelineError, TrainingInterrupted
from flows.signals import exit_at_once
from tasks.signals import interrupted_status

try:  # Typer ships its own copy of click since 0.2x: its errors are that copy's, not click's
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:
    from click.exceptions import NoArgsIsHelpError, UsageError

VARIANTS_HELP = (
    f"A Table 1 variant ({', '.join(ABLATION_LADDER)}) or an algorithm "
    f"({', '.join(ALGORITHM_PRESETS)})."
)

# soft_wrap: a message is one line (the terminal wraps it), so logs and tests see it whole.
console = Console(stderr=True, soft_wrap=True)


class _UsageErrorsInOneLine(TyperGroup):
    """The root command group: a usage error anywhere below it (an unknown option or command,
    a value out of range) is one line, ``error: ... (see: dapo CMD --help)``, and exit 2, as
    every other error of this CLI, rather than Typer's box of usage, hint and message."""

    def make_context(self, *args: Any, **kwargs: Any) -> typer.Context:
        with _usage_errors_in_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: typer.Context) -> Any:
        with _usage_errors_in_one_line():
            return super().invoke(ctx)


@contextlib.contextmanager
def _usage_errors_in_one_line() -> Iterator[None]:
    try:
        yield
    except NoArgsIsHelpError:  # `dapo` alone: the help, as asked
        raise
    except UsageError as e:
        where = f" (see: {e.ctx.command_path} --help)" if e.ctx is not None else ""
        console.print(f"[bold red]error:[/] {escape(e.format_message() + where)}")
        raise typer.Exit(e.exit_code) from None


app = typer.Typer(
    cls=_UsageErrorsInOneLine,
    help="DAPO (arXiv 2503.14476) training pipeline: curate, train, evaluate, ablate.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

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
    from flows.signals import collector_for_work
    from tasks.signals import forget_interrupts, watched

    forget_interrupts()
    collector_for_work()  # off while the command imported (flows.signals.until_work_begins)
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
            console.print(f"[bold yellow]interrupted:[/] {escape(str(e))}")
            _exit_promptly()
            raise typer.Exit(interrupted_status()) from None
        except BrokenPipeError:  # the output's reader left (`| head`): click's to handle
            raise
        except (ConfigError, PipelineError, OSError) as e:  # FileNotFoundError is an OSError
            console.print(f"[bold red]error:[/] {escape(str(e))}")
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            console.print(
                "[bold yellow]interrupted:[/] stopped by a signal; run the same command to "
                "start again"
            )
            _exit_promptly()
            raise typer.Exit(interrupted_status()) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    return wrapper  # type: ignore[return-value]


def _check_eval_set(cfg, eval_set: str | None, run_name: str | None = None) -> None:
    """An eval set that is neither a known name nor a readable file of problems, or a run name
    that is not one folder, is refused before anything runs (a sweep's runs each failed on an
    empty or malformed eval file after their training)."""
    from tasks.data.eval_sets import SYNTHETIC_TEST, check_eval_set
    from tasks.rundir import check_run_name

    check_run_name(run_name)
    check_eval_set(cfg, eval_set)
    name = eval_set or cfg.eval.eval_set
    # a file, read once now for its one-line error; a named set may be prepared by the curation
    # the command runs first
    if name != SYNTHETIC_TEST and name not in cfg.data.eval_sets:
        from tasks.data.splits import eval_problems

        eval_problems(cfg, name)


def _load(
    params: Path | None,
    config: list[Path] | None,
    overrides: list[str] | None,
    variant: str | None = None,
):
    from tasks.params import load_params
    from tasks.tracking.store import refuse_unknown_store

    base, tuned = split_overrides(variant, overrides or ())
    cfg = load_params(params, config or (), base)
    cfg = apply_variant(cfg, variant, tuned) if variant else cfg
    refuse_unknown_store(cfg)
    _working()  # every command loads its config once its imports are done, before any work
    return cfg


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
    imported (seconds of every such command); otherwise it runs as a Prefect flow of
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


def _split(values: list[str] | None, option: str = "--variants") -> list[str] | None:
    """Repeatable, comma-separated options: ``--seeds 0,1 --seeds 2`` -> ["0", "1", "2"]; None
    when not given. Given but empty (``--variants ''``) is refused: it ran the full default."""
    items = [v.strip() for item in values or [] for v in item.split(",") if v.strip()]
    if values and not items:
        raise ConfigError(f"{option} is empty; name at least one, or leave the option out")
    return items or None


def _seeds(values: list[str] | None) -> list[int] | None:
    """The seeds given (None: the config's): integers >= 0, each once (a repeated seed was one
    run counted as two)."""
    items = _split(values, "--seeds")
    try:
        seeds = [int(s) for s in items] if items else None
    except ValueError:
        raise ConfigError(f"--seeds takes integers, e.g. --seeds 0,1; got {items}") from None
    if seeds and (min(seeds) < 0 or len(set(seeds)) < len(seeds)):
        raise ConfigError(f"--seeds takes distinct integers >= 0, e.g. --seeds 0,1; got {items}")
    return seeds
