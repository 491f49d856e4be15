"""bf16 parameters trained through float32 master weights (mixed-precision training).

Why: bf16 keeps 8 bits of mantissa, so an update smaller than ~1/256 of a weight rounds away.
DAPO's learning rate is 1e-6: an AdamW step moves each weight by about lr, far below the spacing
of bf16 numbers near a typical weight (~1e-4 at 0.02), and a model whose parameters are bf16
would barely change. Keeping the parameters in float32 and computing under autocast is correct
but re-casts every weight at every use; ``bench.mfu --weights float32`` measures what that costs.

So the model keeps bf16 parameters (its forward and backward run in bf16 at full speed) and this
wrapper keeps a float32 copy of each. A step copies the bf16 gradients onto the float32 copies,
lets the inner optimizer (AdamW) update those, and writes them back, rounded, into the bf16
parameters in place (so a sampler's CUDA graphs, which read the parameters' memory, stay valid).
Gradients are clipped on the float32 copies. Its state (the inner optimizer's and the float32
weights) is checkpointed, so a resumed run continues from the unrounded weights.
DeepSpeed's bf16 mode does the same under ZeRO; this is the one-process path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class MasterWeights:
    """The optimizer interface the trainer uses (``param_groups``, ``step``, ``zero_grad``,
    ``state_dict``, ``load_state_dict``) over float32 copies of low-precision parameters."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
    ):
        self.params = list(params)
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.optimizer = make_optimizer(self.master)
        self._grads_moved = False  # master_grads() ran since the last step

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @torch.no_grad()
    def master_grads(self) -> list[torch.Tensor]:
        """Move the parameters' gradients onto the float32 copies (the bf16 ones are freed);
        returns those copies, the tensors to clip before :meth:`step`.

        The float32 gradients are views of one buffer filled by one multi-tensor copy: a cast
        per parameter is ~300 allocations and launches at the end of every update, during
        which the GPU would wait for the host."""
        pairs = [
            (p, m) for p, m in zip(self.params, self.master, strict=True) if p.grad is not None
        ]
        for m in self.master:
            m.grad = None
        if pairs:
            grads = [p.grad for p, _ in pairs]
            flat = torch.empty(
                sum(g.numel() for g in grads), dtype=torch.float32, device=grads[0].device
            )
            views = [
                v.view_as(g)
                for v, g in zip(flat.split([g.numel() for g in grads]), grads, strict=True)
            ]
            torch._foreach_copy_(views, grads)
            for (p, m), v in zip(pairs, views, strict=True):
                m.grad, p.grad = v, None
        self._grads_moved = True
        return self.master

    @torch.no_grad()
    def step(self) -> None:
        if not self._grads_moved:  # called as a plain optimizer: no clipping in between
            self.master_grads()
        self.optimizer.step()
        torch._foreach_copy_(self.params, self.master)  # rounded to bf16, in place
        self._grads_moved = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self._grads_moved = False

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "master": [m.detach() for m in self.master],
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore; a plain optimizer state (a checkpoint written without master weights) takes
        its float32 copies from the parameters as loaded (the checkpoint's weights)."""
        if "master" not in state:
            self.optimizer.load_state_dict(state)
            torch._foreach_copy_(self.master, self.params)
            return
        self.optimizer.load_state_dict(state["optimizer"])
        for m, saved in zip(self.master, state["master"], strict=True):
            m.copy_(saved)
        torch._foreach_copy_(self.params, self.master)


def needs_master_weights(params: list[torch.nn.Parameter]) -> bool:
    """Parameters stored in a 16-bit float type: updates of ~1e-6 would round away."""
    return any(p.dtype in (torch.bfloat16, torch.float16) for p in params)


def adamw_optimizer(
    params: list[torch.nn.Parameter],
    lr: float,
    weight_decay: float,
    device: torch.device,
    world: int,
):
    """AdamW over ``params``; through float32 master weights when they are bf16 on one process
    (DeepSpeed's bf16 mode does that itself on several). The policy's and the critic's."""

    def adamw(tensors):
        return torch.optim.AdamW(
            tensors,
            lr=lr,
            weight_decay=weight_decay,
            # One fused kernel over all parameters instead of a loop of elementwise ops (2.5x
            # faster on CPU for the embedded model's shapes); torch has it for CPU and CUDA.
            fused=device.type in ("cpu", "cuda"),
        )

    if world == 1 and needs_master_weights(params):
        return MasterWeights(params, adamw)
    return adamw(params)
