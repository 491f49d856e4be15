"""``torch.compile`` for functions called with a varying number of rows, whose kernels must not
depend on the calls that came before.

Why: compiled with ``dynamic=None``, a function is first specialised to the row count of its
first call and recompiled with a symbolic row count at the second; torch then tries the most
recently used compilation first. So the same call could run the first, fixed-size kernels in
one process and the symbolic ones in another (a resumed run, a rollout process), which may round
differently: a resumed run would not reproduce the uninterrupted one. Marking the rows symbolic
from the first call leaves one compilation for every row count above one.

A symbolic compilation is still tuned to a size: Inductor picks its reduction splits and block
sizes from each symbolic size's hint, by default the first call's value. Each function here gets
a fixed hint instead (``hint_override``, where torch has it), so two processes compile the same
kernels whatever their first calls. Other dimensions (the vocabulary a reduction runs over) stay
constants the kernels are tuned for."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def mark_rows(t: torch.Tensor, hint: int) -> None:
    """Make ``t``'s first dimension symbolic with the size hint ``hint``. One row stays fixed:
    torch compiles it apart whatever the hint, the same in every process."""
    if t.dim() == 0 or t.shape[0] < 2:
        return
    try:
        torch._dynamo.mark_dynamic(t, 0, hint_override=hint)
    except TypeError:  # a torch without hint overrides: symbolic, hinted by the first call
        torch._dynamo.maybe_mark_dynamic(t, 0)


def compile_over_rows(fn: Callable, rows_hint: int, backend="inductor") -> Callable:
    """``fn`` compiled with the first dimension of its tensor arguments symbolic from the start
    and tuned for ``rows_hint`` rows. Every positional tensor argument's first dimension must be
    the row count; keyword arguments pass through unmarked."""
    compiled = torch.compile(fn, dynamic=None, backend=backend)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        for a in args:
            if isinstance(a, torch.Tensor):
                mark_rows(a, rows_hint)
        return compiled(*args, **kwargs)

    return call
