"""The ``dapo`` command's entry point: Ctrl-C and SIGTERM are handled before the CLI's imports,
which take seconds (``flows.signals``)."""

from __future__ import annotations

from flows.signals import until_work_begins


def main() -> None:
    until_work_begins()
    from flows.cli import app  # the imports that take seconds

    app()
