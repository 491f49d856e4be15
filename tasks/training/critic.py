"""The critic of PPO (``algo.critic``): a value model trained beside the policy, read by ``gae``.

The model is the policy's transformer (its decoder, without the vocabulary head) with a scalar
head, ``Linear(hidden, 1)`` initialised to zero: V = 0 at the start, so ``gae`` with gamma = lam
= 1 starts from the return itself (A_t = R), and the head learns first. Its transformer is a copy
of the run's starting model, made before any update and before DeepSpeed partitions the policy
(``model: policy``), or another model directory whose tokenizer is the policy's (``model:
<path>``, e.g. a smaller model of the same family). V_t is read off the hidden state that
predicts response token t (the prompt and the response before it), the state the policy's
log-prob of token t comes from, computed by the same forward (shared prompts, kernels, autocast:
``tasks.training.forward``).

Per step (``tasks.training.trainer``): one no-grad pass over every response before the
advantages (V_old: ``gae``'s values and the value loss's clip centre), then, for each of the
step's mini-batches, after the policy's update, one update of the critic over the same
mini-batch (the responses that carry loss: overlong filtering masks the critic's tokens too),
accumulated over micro-batches under the same token budget, with the clipped value loss of
``dapo_core.algos.critic`` divided by the mini-batch's token count over all ranks (a token mean,
as verl's default ``token-mean``). Cost: one more forward per response and one more forward and
backward per update, of a second model of the policy's size (with ``model: policy``).

Its own AdamW (``lr``, ``weight_decay``, ``grad_clip``; null: the ``train.*`` values) on the
policy's warm-up schedule, its own ``OptimizerEngine``: one process (float32 master weights for
bf16 parameters, as the policy), or DeepSpeed ZeRO on several ranks, a second engine beside the
policy's with the same stage. Checkpoints hold its weights (``critic/model.safetensors``,
gathered under ZeRO-3) and each rank's optimizer state (``critic_optimizer_rank<r>.pt``), so a
resumed run continues it exactly (``tasks.training.checkpoint``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch

from dapo_core.algorithm import Chosen
from dapo_core.algos import NoParams, ValueParams, aggregate
from dapo_core.config import Config
from dapo_core.errors import PipelineError
from tasks.training.batches import Rows, Sample
from tasks.training.compiled import compile_decoder
from tasks.training.distributed import OptimizerEngine, all_reduce_sum
from tasks.training.forward import PolicyForward
from tasks.training.kernels import install_rms_norm, use_cpu_sdpa
from tasks.training.precision import adamw_optimizer

OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]


class ValueModel(torch.nn.Module):
    """A transformer (a causal LM's decoder) and a scalar head over its last hidden states."""

    def __init__(self, backbone: torch.nn.Module):
        super().__init__()
        self.backbone = backbone
        weight = next(backbone.parameters())
        self.head = torch.nn.Linear(
            backbone.config.hidden_size, 1, dtype=weight.dtype, device=weight.device
        )
        with torch.no_grad():  # V = 0 at the start; draws no random numbers
            self.head.weight.zero_()
            self.head.bias.zero_()
        self.config = backbone.config  # what PolicyForward reads (vocab_size)

    def get_decoder(self) -> torch.nn.Module:
        return self.backbone

    @property
    def is_activation_checkpointing(self) -> bool:
        return self.backbone.is_activation_checkpointing


def value_model(policy: torch.nn.Module, p: ValueParams, tokenizer, cfg: Config) -> ValueModel:
    """The critic's model, before any update: a copy of the policy's transformer (``policy``;
    made before DeepSpeed partitions the policy), or the transformer of the model at ``p.model``
    in the policy's dtype, on its device."""
    if p.model == "policy":
        return ValueModel(copy.deepcopy(policy.get_decoder()))
    from tasks.models.loading import load_policy

    weight = next(policy.parameters())
    dtype = str(weight.dtype).removeprefix("torch.")
    model, tok = load_policy(p.model, dtype, weight.device)
    if tok.get_vocab() != tokenizer.get_vocab():
        raise PipelineError(
            f"algo.critic.model {p.model}: its tokenizer is not the policy's, so it cannot read "
            "the policy's token ids; use a model of the same family, or model: policy"
        )
    if cfg.model.gradient_checkpointing:
        model.activation_checkpointing_enable()
    return ValueModel(model.get_decoder())


class ValueForward(PolicyForward):
    """``forward(batch) -> (values, mask)``, each (b, R): V_t from the state that predicts response
    token t (differentiable unless under no_grad), 0 past each response; the bool mask."""

    def __call__(self, batch: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
        states, _, mask = self.hidden_states(batch)
        values = self.model.head(states).squeeze(-1).float()  # (b, R)
        return torch.where(mask, values, torch.zeros_like(values)), mask


def _rows(rows: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Per-response rows as a (b, R) tensor shaped like ``like``, zeros past each row."""
    out = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    out = torch.nn.functional.pad(out, (0, like.shape[1] - out.shape[1]))
    return out.to(like.device, like.dtype)


class Critic:
    """The value model, its optimizer engine and its loss: ``values`` before the advantages,
    ``update`` once per mini-batch. The trainer hands it micro-batches (its shard of them, padded
    to the same count on every rank) and a dummy for the padding ones."""

    def __init__(
        self,
        model: ValueModel,
        loss: Chosen,
        cfg: Config,
        world: int,
        autocast: bool,
        pad_id: int,
        optimizer: OptimizerFactory | None = None,
    ):
        p: ValueParams = loss.params
        self.loss, self.world = loss, world
        self.lr = cfg.train.lr if p.lr is None else p.lr
        wd = cfg.train.weight_decay if p.weight_decay is None else p.weight_decay
        grad_clip = cfg.train.grad_clip if p.grad_clip is None else p.grad_clip
        params = [q for q in model.parameters() if q.requires_grad]
        device = next(model.parameters()).device
        opt = (
            optimizer(params) if optimizer else adamw_optimizer(params, self.lr, wd, device, world)
        )
        self.engine = OptimizerEngine(model, opt, grad_clip, world, cfg.train.zero_stage, autocast)
        self.model = self.engine.model
        install_rms_norm(self.model)  # the policy's drop-ins (tasks/training/kernels.py)
        use_cpu_sdpa(self.model.backbone)
        compile_decoder(self.model, cfg.model.compile, world)  # as the policy's (compiled.py)
        self.forward = ValueForward(
            self.model, pad_id, 1.0, autocast, before_forward=self.engine.before_forward
        )
        one = torch.ones(1, 1, dtype=torch.bool)
        zero = torch.zeros(1, 1)
        self.metric_names = sorted(loss(zero, zero, zero, one)[1])

    @torch.no_grad()
    def values(self, batches: list[list[Sample]], dummy: Callable[[], list[Sample]]) -> Rows:
        """The values (response_len,) of every sample in this rank's ``batches`` (an empty
        micro-batch runs a dummy: ZeRO-3 gathers at every forward)."""
        rows: Rows = {}
        for batch in batches:
            values, mask = self.forward(batch or dummy())
            for s, row, n in zip(batch, values, mask.sum(dim=1), strict=False):
                rows[s] = row[: int(n)].float()
        return rows

    def update(
        self,
        batches: list[list[Sample]],
        count: float,
        dummy: Callable[[], list[Sample]],
        lr_scale: float,
    ) -> tuple[dict[str, list[float]], bool]:
        """One gradient update over a mini-batch's micro-batches (this rank's), each micro-batch's
        clipped value loss divided by ``count``, the mini-batch's tokens over all ranks.
        Returns the metrics as ``{name: [numerator, denominator]}`` summed over micro-batches
        and ranks (``value_grad_norm`` besides the loss's), and whether the update was applied
        (not if the loss or the gradient was not finite)."""
        self.engine.set_lr(self.lr * lr_scale)
        sums = {name: [0.0, 0.0] for name in self.metric_names}
        loss_sum = 0.0
        token_mean = NoParams()
        for i, real in enumerate(batches):
            batch = real or dummy()
            values, mask = self.forward(batch)
            old = _rows([s.old_values for s in batch], values)
            returns = _rows([s.returns for s in batch], values)
            # a padding micro-batch: no token counts, so its loss and gradient are 0
            mask = mask if real else torch.zeros_like(mask)
            loss_t, metrics = self.loss(values, old, returns, mask)
            loss = aggregate("token_mean", token_mean, loss_t, mask, count)
            self.engine.backward(loss, boundary=i == len(batches) - 1)
            flat = torch.stack(
                [loss.detach().float()] + [x.float() for m in metrics.values() for x in m]
            )
            values_ = flat.tolist()
            loss_sum += values_[0]
            for j, name in enumerate(metrics):
                sums[name][0] += values_[1 + 2 * j]
                sums[name][1] += values_[2 + 2 * j]
        names = sorted(sums)
        flat = all_reduce_sum([loss_sum] + [x for k in names for x in sums[k]], self.world)
        out: dict[str, Any] = {k: [flat[1 + 2 * j], flat[2 + 2 * j]] for j, k in enumerate(names)}
        norm, applied = self.engine.step(finite=math.isfinite(flat[0]))
        out["value_grad_norm"] = [norm, 1.0] if math.isfinite(norm) else [0.0, 0.0]
        return out, applied

    # -- checkpoints ---------------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Its parameters, gathered from ZeRO-3 partitions (a collective there)."""
        return self.engine.full_state_dict()

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        params = dict(self.model.named_parameters())
        if unexpected or any(k in params for k in missing):
            raise PipelineError(
                f"the checkpoint's critic does not match the critic ({(unexpected or missing)[:3]})"
            )
