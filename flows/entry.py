"""The ``dapo`` command's entry point: Ctrl-C and SIGTERM are handled before the CLI's imports,
which take seconds (``flows.signals``), and a command a warm process can run runs there, without
them (``flows.warm``)."""

from __future__ import annotations

import sys

from flows import warm
from flows.environment import apply_defaults
from flows.signals import until_work_begins


def main() -> None:
    until_work_begins()
    apply_defaults()
    argv = sys.argv[1:]
    code = warm.run(argv)
    if code is not None:
        sys.exit(code)
    warm.start_if_wanted(argv)  # for the next command: this one imports for itself
    from flows.cli import app  # the imports that take seconds

    app()
