"""The update half of a step: the passes over the step's samples and the gradient updates.

Each update (``update``) runs the ``algo`` entries on every micro-batch (``dapo_core.algorithm``:
rollout correction -> policy loss -> aggregation) and divides by the aggregation's count over
the whole mini-batch and all ranks, known before any backward (Eq. 12's global normaliser); the
entries' metrics are summed as (numerator, denominator) over micro-batches and ranks
(``step_metrics.UpdateSums``). The no-grad passes around it: log pi_old once per step when
there are several updates (with one the ratio is exactly 1), log pi_ref for a KL term
(``tasks.training.reference``), the critic's values for ``gae``; with a critic, its own update
follows each of the policy's over the same mini-batch (``tasks.training.critic``).

Samples whose loss is identically zero are counted in the normaliser but skip the forward and
backward; each rank forwards its shard of the prompts, padded with empty micro-batches to the
largest count over ranks (ZeRO-3 gathers at every forward).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch

from dapo_core.algorithm import Algorithm, global_count, reward_kl, token_losses
from dapo_core.algos import Metrics, TokenBatch, aggregate
from dapo_core.metrics import masked_mean
from dapo_core.mismatch import mismatch_sums
from tasks.training.batches import Group, Rows, Sample, distinct_prompts, pack_samples
from tasks.training.batches import sample_padding_fraction as padding_fraction
from tasks.training.critic import Critic
from tasks.training.distributed import OptimizerEngine, all_gather_objects, all_reduce_max
from tasks.training.forward import PolicyForward, to_device
from tasks.training.records import UpdateResult
from tasks.training.reference import ReferencePolicy
from tasks.training.step_metrics import UpdateSums


class PolicyUpdater:
    def __init__(
        self,
        engine: OptimizerEngine,
        forward: PolicyForward,
        algorithm: Algorithm,
        pad_id: int,
        micro_batch_tokens: int,
        per_update: int,
        rank: int = 0,
        world: int = 1,
        reference: ReferencePolicy | None = None,
        critic: Critic | None = None,
    ):
        self.engine, self.forward, self.algorithm = engine, forward, algorithm
        self.pad_id, self.micro_batch_tokens = pad_id, micro_batch_tokens
        self.per_update = per_update  # samples per update: train.mini_batch groups of G
        self.rank, self.world = rank, world
        self.reference, self.critic = reference, critic

    # -- the step's updates --------------------------------------------------------------------

    def updates(self, samples: list[Sample], alg: Algorithm | None = None) -> list[UpdateResult]:
        """``prompt_batch / mini_batch`` gradient updates over the step's samples (with the run's
        algorithm unless ``alg`` says otherwise: a switch probe's flipped update)."""
        alg = alg or self.algorithm
        minis = self.minis(samples)
        # with one update the ratio is exactly 1: no extra pass
        old = self.old_logprobs(minis) if len(minis) > 1 else None
        ref = self.ref_logprobs(minis) if alg.kl_in_loss else None
        return [self.update(mini, alg, old, ref) for mini in minis]

    def minis(self, samples: list[Sample]) -> list[list[Sample]]:
        """The step's samples in mini-batches of ``train.mini_batch`` groups, one per update."""
        n = self.per_update
        return [samples[i : i + n] for i in range(0, len(samples), n)]

    def critic_updates(
        self, samples: list[Sample], updates: list[UpdateResult], lr_scale: float
    ) -> list[UpdateResult]:
        """The critic's update after each of the policy's, over the same mini-batch: the
        policy's updates with the critic's metrics among their entries (``train/value_*``), an
        update whose critic step was skipped (a non-finite loss or gradient) counted as skipped."""
        out = []
        for mini, update in zip(self.minis(samples), updates, strict=True):
            entries, applied = self.critic_update(mini, lr_scale)
            both = {**update.entries, **entries}
            out.append(replace(update, entries=both, applied=update.applied and applied))
        return out

    def critic_update(
        self, samples: list[Sample], lr_scale: float = 1.0
    ) -> tuple[dict[str, list[float]], bool]:
        """One update of the critic over a mini-batch (the same list on every rank): every
        response that carries loss (overlong-filtered ones do not), whatever its advantage,
        each micro-batch divided by the mini-batch's token count."""
        count = float(max(sum(s.response_len for s in samples if s.keep), 1))
        batches = self.micro_batches(samples, lambda s: s.keep)
        return self.critic.update(batches, count, self.dummy, lr_scale)

    def update(
        self,
        samples: list[Sample],
        alg: Algorithm | None = None,
        old: Rows | None = None,
        ref: Rows | None = None,
    ) -> UpdateResult:
        """One gradient update over a mini-batch of samples (the same list on every rank):
        correction -> policy loss -> aggregation, each micro-batch divided by the global count.
        ``old``: log pi_old of each sample (None: this update's own policy, a ratio of 1);
        ``ref``: log pi_ref (a KL term in the loss)."""
        alg = alg or self.algorithm
        # The count spans every sample of the whole mini-batch (every rank holds all of it),
        # including the ones skipped because their loss is identically zero.
        count = global_count(alg.aggregation, [s.response_len for s in samples if s.keep])
        sums = UpdateSums()
        batches = self.micro_batches(samples)
        for i, real in enumerate(batches):
            batch = real or self.dummy()
            logp, ent, mask = self.forward(batch)
            old_t = padded([old.get(s) for s in batch] if old else [None], logp)
            rollout = padded([s.rollout_logp for s in batch], logp)
            if real:
                ref_t = padded([ref.get(s) for s in batch] if ref else [None], logp)
            else:  # a padding micro-batch: no token counts, so its loss and gradient are 0
                mask, ref_t = torch.zeros_like(mask), torch.zeros_like(logp)
            tokens = TokenBatch(
                logp,
                logp.detach() if old_t is None else old_t,
                stacked([s.advantages() for s in batch], logp),
                mask,
                rollout_logp=rollout,
                ref_logp=ref_t,
            )
            loss_t, keep, m = token_losses(alg, tokens)
            entry = alg.aggregation
            loss = aggregate(entry.entry, entry.params, loss_t, keep, count)
            stats = {"tokens": mask.sum(), "entropy": masked_mean(ent, mask), "loss": loss}
            if rollout is not None:  # the sampler's arithmetic: groups sampled this step only
                fresh = to_device(torch.tensor([float(s.fresh) for s in batch]), logp.device)
                gap = mismatch_sums(tokens.old_logp, rollout, mask * fresh[:, None])
                stats |= {f"mismatch_{k}": v for k, v in gap.items()}
            self.engine.backward(loss, boundary=i == len(batches) - 1)
            sums.add_micro(stats, m, real=bool(real))
        sums.all_reduce(self.world)
        grad_norm, applied = self.engine.step(finite=math.isfinite(sums.sums["loss"]))
        padding = padding_fraction([b for b in batches if b])  # this rank's
        return sums.result(grad_norm, applied, padding)

    # -- micro-batches -------------------------------------------------------------------------

    def micro_batches(
        self, samples: list[Sample], select: Callable[[Sample], bool] | None = None
    ) -> list[list[Sample]]:
        """This rank's shard of the samples that carry loss (or that ``select`` picks), packed
        into micro-batches; padded with empty micro-batches to the largest count over ranks
        (ZeRO-3 gathers at every forward)."""
        active = [s for s in samples if (select(s) if select else s.carries_loss)]
        # Shard by prompt, so that a group's shared prompt is computed on one rank.
        _, keys = distinct_prompts(active)
        mine = [s for s, k in zip(active, keys, strict=True) if k % self.world == self.rank]
        batches = pack_samples(mine, self.micro_batch_tokens)
        count = all_reduce_max(len(batches), self.world)
        return batches + [[] for _ in range(count - len(batches))]

    def dummy(self) -> list[Sample]:
        """A one-token sample with zero advantage: zero loss and gradient, same collectives."""
        pad, zero = self.pad_id, torch.zeros(1)
        rows = dict(rollout_logp=zero, old_values=zero, returns=zero)
        return [Sample([pad, pad], 1, 0.0, True, **rows)]

    # -- no-grad passes ------------------------------------------------------------------------

    @torch.no_grad()
    def old_logprobs(self, minis: list[list[Sample]]) -> Rows:
        """log pi_old of every response token this rank will update on, once, before the first
        update of the step."""
        rows: Rows = {}
        for mini in minis:
            for batch in self.micro_batches(mini):
                logp, _, mask = self.forward(batch or self.dummy())
                for s, lp, m in zip(batch, logp, mask, strict=False):
                    rows[s] = lp[: int(m.sum())].float()
        return rows

    def ref_logprobs(self, minis: list[list[Sample]]) -> Rows:
        """log pi_ref of every response token this rank will update on, once per step (pi_ref
        never changes: one pass serves every update). A plain module, not under DeepSpeed: an
        empty micro-batch needs no forward to keep ranks in step."""
        rows: Rows = {}
        for mini in minis:
            for batch in self.micro_batches(mini):
                if batch:
                    logp, mask = self.reference(batch)
                    for s, lp, m in zip(batch, logp, mask, strict=True):
                        rows[s] = lp[: int(m.sum())].float()
        return rows

    def reward_kl(
        self, groups: list[Group], lengths: torch.Tensor, alg: Algorithm
    ) -> tuple[torch.Tensor, Metrics]:
        """(P*G, T) per-token rewards -beta * kl of every response (the KL term in the reward),
        from its log-probs under the policy that sampled it (this step's, before any update)
        and under pi_ref: each rank forwards its shard, and the rows are all-gathered so that
        every rank computes the same advantages."""
        samples = every_response(groups, kl=True)
        old, ref = self.old_logprobs([samples]), self.ref_logprobs([samples])
        mine = {k: (old[s], ref[s]) for k, s in enumerate(samples) if s in ref}
        rows = self._gathered(mine)
        like = torch.zeros(len(samples), int(lengths.max()))
        old, ref = (stacked([rows[k][i] for k in range(len(samples))], like) for i in (0, 1))
        return reward_kl(alg.kl, old, ref, lengths)

    def critic_values(self, groups: list[Group], lengths: torch.Tensor) -> torch.Tensor:
        """(P*G, T) the critic's value of every response token, before any update of the step
        (``gae``'s V and the value loss's V_old): each rank forwards its shard, and the rows
        are all-gathered so that every rank computes the same advantages."""
        samples = every_response(groups)
        values = self.critic.values(self.micro_batches(samples, lambda s: True), self.dummy)
        mine = {k: values[s] for k, s in enumerate(samples) if s in values}
        rows = self._gathered(mine)
        like = torch.zeros(len(samples), int(lengths.max()))
        return stacked([rows[k] for k in range(len(samples))], like)

    def _gathered(self, mine: dict) -> dict:
        """Every rank's rows, by response index."""
        return {k: v for part in all_gather_objects(mine, self.world) for k, v in part.items()}


def every_response(groups: list[Group], kl: bool = False) -> list[Sample]:
    """Every response of the groups as a sample (row p * G + g: response g of group p)."""
    return [
        Sample(g.prompt_ids + r, len(g.prompt_ids), 0.0, True, kl=kl)
        for g in groups
        for r in g.response_ids
    ]


def stacked(rows: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Per-response rows as a (b, R) tensor shaped like ``like``, zeros past each row."""
    out = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    out = torch.nn.functional.pad(out, (0, like.shape[1] - out.shape[1]))
    return to_device(out, like.device).to(like.dtype)


def padded(rows: list[torch.Tensor | None], like: torch.Tensor) -> torch.Tensor | None:
    """Per-token rows of a micro-batch's samples (log pi_old, the sampler's log-probs, log
    pi_ref) as a (b, R) tensor shaped like ``like``, zeros past each response; None unless every
    sample has one."""
    if any(r is None for r in rows):
        return None
    # One padding op on the rows' device and one copy to ``like``'s, not a copy per row.
    return stacked(rows, like)
