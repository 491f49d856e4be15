"""The ``dapo`` command's entry point: Ctrl-C and SIGTERM are handled before the CLI's imports,
which take seconds (``flows.signals``), and a command a warm process can run runs there, without
them (``flows.warm``)."""

from __future__ import annotations

import sys

from flows.signals import run_to_the_end, until_work_begins

until_work_begins()  # at import, which the console script does before main(): from its first ms

from flows import warm  # noqa: E402
from flows.environment import apply_defaults  # noqa: E402


def main() -> None:
    apply_defaults()
    argv = sys.argv[1:]
    code = warm.run(argv)
    if code is not None:
        sys.exit(code)
    warm.start_if_wanted(argv)  # for the next command: this one imports for itself
    from flows.cli import app  # the imports that take seconds

    run_to_the_end(app)
