"""The interrupt path's handlers (``tasks.signals``): a signal held until a write is over, one
ignored while a stop cleans up, and the handlers put back afterwards."""

import signal

from tasks.signals import deferred_signals, held_signals


def _recording(calls: list[int]):
    def handler(signum, frame):
        calls.append(signum)

    return handler


def test_held_signals_delivers_the_first_after_the_body_and_a_second_at_once():
    calls: list[int] = []
    before = signal.signal(signal.SIGINT, _recording(calls))
    try:
        with held_signals():
            signal.raise_signal(signal.SIGINT)
            assert calls == []  # held: the write is not cut
            signal.raise_signal(signal.SIGINT)
            assert calls == [signal.SIGINT]  # sent again: meant now
        assert calls == [signal.SIGINT, signal.SIGINT]  # the held one, after the body
        handler = signal.getsignal(signal.SIGINT)
        assert handler is not None and handler.__name__ == "handler"  # put back
    finally:
        signal.signal(signal.SIGINT, before)


def test_deferred_signals_ignores_an_interrupt_and_puts_the_handler_back():
    calls: list[int] = []
    before = signal.signal(signal.SIGTERM, _recording(calls))
    try:
        with deferred_signals():
            signal.raise_signal(signal.SIGTERM)
        assert calls == []
        signal.raise_signal(signal.SIGTERM)
        assert calls == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)
