"""Regional ``torch.compile`` of the policy's decoder for the training forward (``model.compile``).

Why regional: compiling the whole model recompiles whenever a micro-batch's shape changes and
takes minutes for a deep model; the decoder layers are identical, so one compiled function serves
all of them (parameters are inputs to the graph, not constants), and compile time stays that of
one layer. What it buys on a GPU is fewer kernel launches: the norms, rotary embedding, SwiGLU
and residual adds fuse into a few kernels, forward and backward (docs/benchmarks.md has the
figures).

Two modes (``auto``, the default: ``layers`` on one CUDA process, ``none`` on CPU, where
compiling costs more than it saves at the embedded model's size, and under DeepSpeed, where it
was not measured):

- ``regions``: each decoder layer's children that do not hold the attention (the MLP, the norms).
  The attention stays eager because it writes the shared prompt's keys and values into
  transformers' cache, indexed by the layer's number: compiled, it would be specialised (and
  recompiled) once per layer. The shared-prompt forward is kept.
- ``layers``: whole decoder layers, with the training forward run on whole sequences (no cache):
  each prompt is run once per sample instead of once per group, for fewer, larger kernels.

Only the training forward (``PolicyForward``, gradients on or off) runs the compiled code: the
sampler calls the same modules under CUDA graphs and keeps the eager ones.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator

import torch

MODES = ("auto", "none", "regions", "layers")
_active = False  # inside a training forward: compiled regions run


@contextlib.contextmanager
def training_forward() -> Iterator[None]:
    """Run the compiled regions inside this block (the trainer's forward passes)."""
    global _active
    before, _active = _active, True
    try:
        yield
    finally:
        _active = before


@functools.cache
def _compiled(fn: Callable) -> Callable:
    """One compiled function per forward *function*: every layer's module shares its cache.
    Every size symbolic from the first call (the weights' stay fixed): one compilation serves
    every micro-batch of a process, where a first fixed-size one would serve only the shapes of
    the first micro-batch (``dapo_core.compiled_rows`` says why that matters). Its kernels are
    still tuned to the first micro-batch's sizes (docs/determinism.md)."""
    return torch.compile(fn, dynamic=True)


def _route(module: torch.nn.Module) -> None:
    """Send ``module``'s calls inside :func:`training_forward` to the compiled forward."""
    eager = module.forward  # a bound method: the class's forward or an installed drop-in
    compiled = _compiled(eager.__func__)

    def forward(self, *args, **kwargs):
        return compiled(self, *args, **kwargs) if _active else eager(*args, **kwargs)

    module.forward = types.MethodType(forward, module)


def _holds_attention(module: torch.nn.Module) -> bool:
    return any(hasattr(m, "layer_idx") for m in module.modules())


def chosen_mode(mode: str, device: torch.device, world: int) -> str:
    """``model.compile`` with ``auto`` resolved for this device and world size."""
    if mode not in MODES:
        raise ValueError(f"model.compile must be one of {', '.join(MODES)}, not {mode!r}")
    if mode != "auto":
        return mode
    return "layers" if device.type == "cuda" and world == 1 else "none"


def compile_decoder(model: torch.nn.Module, mode: str, world: int = 1) -> str:
    """Compile ``model``'s decoder layers for the training forward; returns the mode applied.
    Call after the other drop-ins (``kernels.py``)."""
    mode = chosen_mode(mode, next(model.parameters()).device, world)
    if mode == "none":
        return mode
    layers = model.get_decoder().layers
    if mode == "layers":
        targets = list(layers)
    else:
        targets = [c for layer in layers for c in layer.children() if not _holds_attention(c)]
    for module in targets:
        _route(module)
    model.compiled_decoder = mode  # PolicyForward reads it: ``layers`` needs whole sequences
    return mode


def whole_sequences(model: torch.nn.Module) -> bool:
    """The training forward runs whole sequences: under activation checkpointing (transformers
    drops the cache) or with whole layers compiled."""
    return model.is_activation_checkpointing or getattr(model, "compiled_decoder", "") == "layers"
