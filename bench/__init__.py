"""Benchmarks: ``python -m bench`` runs the main ones, ``python -m bench.NAME`` one of them
(docs/benchmarks.md says what each measures and what was measured)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

STOPPED = "interrupted: the benchmark stopped; run it again for the figures it did not print"


def _exit_at_once(signum: int, frame: object) -> None:
    """Ctrl-C (or SIGTERM) while a benchmark imports its libraries: nothing has started, so
    nothing needs cleaning up."""
    print(STOPPED, file=sys.stderr, flush=True)
    os._exit(128 + signum)  # the shell's status for the signal: 130 Ctrl-C, 143 SIGTERM


# Run as ``python -m bench[.NAME]``, this package is imported before the module's own imports
# (torch, transformers: seconds), and Python sets argv[0] to "-m" until the module is found.
if sys.argv[:1] == ["-m"]:
    signal.signal(signal.SIGINT, _exit_at_once)
    signal.signal(signal.SIGTERM, _exit_at_once)


def run(main: Callable[[], int | None]) -> None:
    """A benchmark's entry point: exit with what ``main`` returns, and on Ctrl-C with one line and
    status 130 rather than a traceback (the figures printed so far stand; the one being measured
    is dropped)."""
    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),  # clean-ups run
        signal.SIGTERM: signal.signal(signal.SIGTERM, signal.SIG_DFL),
    }
    try:
        code = main()
    except KeyboardInterrupt:
        print(STOPPED, file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    raise SystemExit(code or 0)
