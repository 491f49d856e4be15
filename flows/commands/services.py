"""Long-lived helpers a user starts: a Prefect server for the project, and the warm process."""

import os
from pathlib import Path
from typing import Annotated

import typer

from dapo_core.errors import PipelineError
from flows.commands.base import _orchestration_env, _working, app, console, user_errors

server_app = typer.Typer(
    help="A long-lived Prefect server for this project: later commands use it (no server to "
    "start each time) and its UI shows every run."
)
app.add_typer(server_app, name="server")


@server_app.command("start")
@user_errors
def server_start(
    port: Annotated[int, typer.Option(help="Port of its API and UI.", min=1, max=65535)] = 4200,
) -> None:
    """Start the server in the background (or find it running) and print its UI's address."""
    _orchestration_env()
    from flows.server import start_server

    _working()
    url, started = start_server(Path(os.environ["PREFECT_HOME"]), port)
    said = "started" if started else "already running"
    if not started and f":{port}/" not in url:  # the running one stays where it is
        said += f" (not on port {port}: `dapo server stop` first to move it)"
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

    _working()  # Ctrl-C raises from here, so that a process started for nothing is ended
    started, found = warm.start_ready()
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
        if one["running"]:
            said = f"stops once the {one['running']} command(s) it runs end; it takes no new one"
        else:
            said = "stopped"
        console.print(f"warm process (pid {one['pid']}) {said}", highlight=False)


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
