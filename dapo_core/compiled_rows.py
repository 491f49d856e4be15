"""``torch.compile`` for functions called with a varying number of rows, whose kernels must not
depend on the calls that came before.

Why: compiled with ``dynamic=None``, a function is first specialised to the row count of its
first call and recompiled with a symbolic row count at the second; torch then tries the most
recently used compilation first. So the same call can run the first, fixed-size kernels in one
process and the symbolic ones in another (a resumed run, a rollout process), and the two may
round differently: a resumed run would not reproduce the uninterrupted one. Marking the rows
symbolic from the first call gives every process the same kernels for the same call. Other
dimensions (the vocabulary a reduction runs over) stay constants the kernels are tuned for."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def compile_over_rows(fn: Callable, backend="inductor") -> Callable:
    """``fn`` compiled with the first dimension of its tensor arguments symbolic from the start
    (one row stays a special case, as torch compiles it apart whatever came before)."""
    compiled = torch.compile(fn, dynamic=None, backend=backend)

    @functools.wraps(fn)
    def call(*args):
        for a in args:
            if isinstance(a, torch.Tensor) and a.dim() > 0:
                torch._dynamo.maybe_mark_dynamic(a, 0)
        return compiled(*args)

    return call
