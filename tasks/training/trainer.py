"""The DAPO training loop (DAPO Algorithm 1), with all algorithmic decisions made in ``dapo_core``.

One step:
1. build the batch with dynamic sampling (``dapo_core.sampling.fill_batch``): generate G responses
   per prompt, score them (``dapo_core.reward``), keep informative groups, carry the surplus;
2. rewards with the overlong penalty, per-token advantages from the ``algo.advantage`` entry, the
   overlong-filter loss mask;
3. old log-probs once, only when there are several updates per rollout (with one update the ratio
   is exactly 1 and the pass would be wasted);
4. ``prompt_batch / mini_batch`` gradient updates, each accumulated over micro-batches sized by a
   token budget; each micro-batch calls the ``algo`` entries (``dapo_core.algorithm``: rollout
   correction -> policy loss -> aggregation) and divides by the aggregation's count over the
   whole mini-batch (and all ranks), known before any backward; the entries' metrics are summed
   as (numerator, denominator) over micro-batches and ranks and logged as ``train/<name>``;
   with a KL term (``algo.kl``) the frozen reference's log-probs come from one no-grad pass per
   step (``tasks.training.reference``), for the loss or, before the advantages, the reward;
   with a critic (``algo.critic``, PPO) its values come from one no-grad pass per step before
   the advantages (``gae`` reads them), and after each policy update the critic makes its own
   over the same mini-batch (``tasks.training.critic``);
5. AdamW with linear warm-up (step 1 trains at lr / warmup, never at 0; the lr is a function of the
   step, so a resumed run needs no scheduler state), gradient clipping, and
   a skip of any update whose loss or gradient is not finite.

Efficiency: groups are packed into micro-batches under a token budget, longest responses first;
in a micro-batch each distinct prompt is forwarded once and its keys and values are shared by its
samples (whole sequences under gradient checkpointing, where transformers drops the cache); only
response positions are projected onto the vocabulary, in chunks (``dapo_core.logprobs``);
samples whose loss is identically zero (advantage 0, or masked out by overlong filtering) are
counted in the normalizer but skip the forward and backward passes (``tasks.training.forward``).
The model's RMSNorm (and, on CPU, its attention) use the faster drop-ins of
``tasks.training.kernels``. Checkpoints are ``tasks.training.checkpoint``'s job: the trainer only
hands over its loop state (``state_dict``).
"""

from __future__ import annotations

import gc
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dapo_core.algorithm import (
    Algorithm,
    algorithm,
    estimate,
    global_count,
    response_mask,
    response_weights,
    reward_kl,
    token_losses,
)
from dapo_core.algos import Metrics, TokenBatch, aggregate, explained_variance, reduce_metrics
from dapo_core.config import AlgoConfig, Config
from dapo_core.errors import TrainingStopped
from dapo_core.loss import long_weight_share
from dapo_core.metrics import masked_mean
from dapo_core.mismatch import mismatch_sums
from dapo_core.overlong import overlong_filter_mask, shaped_rewards
from dapo_core.problem import Problem
from dapo_core.reward import extract_answer, score
from dapo_core.sampling import BatchStats, GroupAccumulator, fill_batch
from tasks.models.loading import chat_prompt
from tasks.rollout.generators import Generator
from tasks.training import probe
from tasks.training.batches import (
    Group,
    ProblemStream,
    Sample,
    distinct_prompts,
    pack_samples,
    sample_padding_fraction,
)
from tasks.training.critic import Critic, OptimizerFactory, value_model
from tasks.training.distributed import (
    OptimizerEngine,
    all_gather_objects,
    all_reduce_max,
    init_distributed,
)
from tasks.training.forward import PolicyForward
from tasks.training.kernels import install_rms_norm, use_cpu_sdpa
from tasks.training.precision import adamw_optimizer
from tasks.training.reference import ReferencePolicy, frozen_copy
from tasks.training.step_metrics import (
    StallWatch,
    UpdateSums,
    dynamic_sampling_metrics,
    rollout_metrics,
    update_metrics,
)

MetricsSink = Callable[[dict[str, float], int], None]


def _as_tensors(logprobs: list) -> list[torch.Tensor]:
    """Per-response log-probs as float32 tensors (4 bytes a token where a Python float takes 24,
    in the carried buffer, its checkpoints and the ranks' all-gather)."""
    return [torch.as_tensor(lp, dtype=torch.float32) for lp in logprobs]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def warmup_lambda(warmup_steps: int) -> Callable[[int], float]:
    """Linear warm-up then constant: step s (0-based) trains at lr * (s+1)/warmup, never at 0."""
    return lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def response_advantage(adv: torch.Tensor) -> float:
    """A response's advantage: the mean of its tokens' (exactly A_i for sequence-level
    estimators: a float64 sum of equal float32 values divided by their number)."""
    return float(adv.double().mean().float()) if adv.numel() else 0.0


def new_rollout_log() -> dict[str, Any]:
    """What ``DAPOTrainer._generate_groups`` accumulates over one step's generation batches."""
    return {
        "gen_time": 0.0,
        "prompts_truncated": 0,
        "acc": [],
        "lengths": [],
        "finished": [],
        "parsed": [],
    }


@dataclass
class StepResult:
    metrics: dict[str, float]
    samples: list[dict[str, Any]] = field(default_factory=list)


class DAPOTrainer:
    def __init__(
        self,
        cfg: Config,
        model,
        tokenizer,
        generator: Generator,
        problems: list[Problem],
        sink: MetricsSink | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        reward_fn: Callable[[str, str], bool] | None = None,
        critic_optimizer: OptimizerFactory | None = None,
    ):
        self.cfg, self.model, self.tokenizer, self.generator = cfg, model, tokenizer, generator
        # Correctness of a response against the answer; the rule-based reward (Eq. 7) by default.
        self.is_correct = reward_fn or (lambda response, answer: score(response, answer).acc)
        self.stream = ProblemStream(problems, cfg.train.seed)
        self.buffer = GroupAccumulator()
        self.step = 0
        self.bad_steps = 0
        self.stall = StallWatch(cfg.train.max_stalled_steps, cfg.rollout.group_size)
        self.device = next(model.parameters()).device
        self.autocast = self.device.type == "cuda" and cfg.model.dtype in ("auto", "bfloat16")
        self.rank, self.world = init_distributed(self.device.type)
        self.sink = sink if self.rank == 0 else None  # one writer of metrics and files
        self.algorithm = algorithm(cfg.algo)  # the entries every update calls
        self.metric_names = self.algorithm.metric_names()
        # pi_ref: copied now, from the run's starting model, before DeepSpeed partitions it
        ref = frozen_copy(model) if self.algorithm.needs_reference else None
        # the critic's transformer likewise, from the starting model (``tasks.training.critic``)
        alg = self.algorithm
        critic = value_model(model, alg.critic.params, tokenizer, cfg) if alg.critic else None
        optimizer = optimizer or self._adamw(model, cfg)
        self.engine = OptimizerEngine(
            model, optimizer, cfg.train.grad_clip, self.world, cfg.train.zero_stage, self.autocast
        )
        self.forward = PolicyForward(
            model,
            tokenizer.pad_token_id,
            cfg.rollout.temperature,
            self.autocast,
            before_forward=self.engine.before_forward,
        )
        self.reference = ReferencePolicy(ref, self.engine.model, self.forward) if ref else None
        self.critic = None
        if critic is not None:
            pad, opt = tokenizer.pad_token_id, critic_optimizer
            self.critic = Critic(critic, alg.critic, cfg, self.world, self.autocast, pad, opt)
            self.metric_names = sorted({*self.metric_names, "value_grad_norm"})
        self.lr_at = warmup_lambda(cfg.train.warmup_steps)
        self.probed_switch = cfg.tracking.switch_probe  # the switch a probe flips, or None
        probe.check_world(self.probed_switch, self.world)
        install_rms_norm(
            model
        )  # same arithmetic, half the backward cost (tasks/training/kernels.py)
        use_cpu_sdpa(model)  # grouped-query attention without copied heads, on CPU
        # Everything alive now (libraries, the model) lives as long as the run: keep it out of
        # the cyclic garbage collector, whose full passes over it cost most of a tiny step.
        gc.freeze()

    def _adamw(self, model, cfg: Config):
        """AdamW over the trainable parameters; through float32 master weights when they are
        bf16 on one process (``tasks.training.precision``; DeepSpeed's bf16 mode does that
        itself)."""
        params = [p for p in model.parameters() if p.requires_grad]
        return adamw_optimizer(
            params, cfg.train.lr, cfg.train.weight_decay, self.device, self.world
        )

    # -- one step: rollout -> loss inputs -> updates -> metrics ---------------------------------

    def train_step(self) -> StepResult:
        cfg = self.cfg
        t0 = time.perf_counter()
        seed_everything(cfg.train.seed * 1_000_003 + self.step)
        gen_log = new_rollout_log()
        groups, ds = self._rollout(gen_log)
        metrics = {**dynamic_sampling_metrics(ds), **rollout_metrics(gen_log, cfg)}
        lr = cfg.train.lr * self.lr_at(self.step)
        self.engine.set_lr(lr)
        t_train = time.perf_counter()
        updates: list[dict[str, float]] = []
        if groups:
            samples, batch_stats = self._samples(groups)
            metrics.update(batch_stats)
            if self.probed_switch:  # the update, and beside it the same with a switch flipped
                updates, readings = self._probed_updates(groups, samples)
                metrics.update(readings)
            else:
                updates = self._updates(samples)
            if self.critic:
                self._critic_updates(samples, updates)
        self.step += 1
        self.bad_steps = 0 if all(u["finite"] for u in updates) else self.bad_steps + 1
        metrics.update(update_metrics(updates, lr, self.metric_names))
        step_time = time.perf_counter() - t0
        tokens = sum(gen_log["lengths"]) + sum(u["tokens"] for u in updates)
        metrics.update(
            {
                "train/prompts_truncated": gen_log["prompts_truncated"],
                "perf/step_time_s": step_time,
                "perf/gen_time_s": gen_log["gen_time"],
                "perf/train_time_s": time.perf_counter() - t_train,
                "perf/tokens_per_s": tokens / step_time,
            }
        )
        if self.sink:
            self.sink(metrics, self.step)
        if self.bad_steps >= cfg.train.max_bad_steps:
            raise TrainingStopped(
                f"{self.bad_steps} steps in a row had a non-finite loss or gradient (updates "
                "skipped). Lower train.lr, check the model's dtype, or raise train.max_bad_steps."
            )
        self.stall.observe(gen_log, self.step)
        return StepResult(metrics, self._sample_rows(groups))

    def _rollout(self, gen_log: dict[str, Any]) -> tuple[list[Group], BatchStats]:
        """The step's groups by dynamic sampling (surplus groups carried to the next step)."""
        self.sampler()
        cfg = self.cfg
        return fill_batch(
            lambda n: self._generate_groups(n, gen_log),
            self.buffer,
            step=self.step,
            prompt_batch=cfg.train.prompt_batch,
            gen_batch=cfg.train.gen_batch,
            max_gen_batches=cfg.algo.max_gen_batches,
            on_gen_cap=cfg.algo.on_gen_cap,
            dynamic_sampling=cfg.algo.dynamic_sampling,
            sized=cfg.algo.size_gen_batches,
        )

    def _updates(self, samples: list[Sample], alg: Algorithm | None = None) -> list[dict[str, Any]]:
        """``prompt_batch / mini_batch`` gradient updates over the step's samples (with the run's
        algorithm unless ``alg`` says otherwise: a switch probe's flipped update)."""
        minis = self._minis(samples)
        if len(minis) > 1:  # with one update the ratio is exactly 1: no extra pass
            self._compute_old_logprobs(minis)
        if (alg or self.algorithm).kl_in_loss:
            self._compute_ref_logprobs(minis)
        return [self._update(mini, alg) for mini in minis]

    def _minis(self, samples: list[Sample]) -> list[list[Sample]]:
        """The step's samples in mini-batches of ``train.mini_batch`` groups, one per update."""
        per_update = self.cfg.train.mini_batch * self.cfg.rollout.group_size
        return [samples[i : i + per_update] for i in range(0, len(samples), per_update)]

    def _critic_updates(self, samples: list[Sample], updates: list[dict[str, Any]]) -> None:
        """The critic's update after each of the policy's, over the same mini-batch; its metrics
        join that update's entries (``train/value_*``), and an update whose critic step was
        skipped (a non-finite loss or gradient) counts as skipped."""
        for mini, update in zip(self._minis(samples), updates, strict=True):
            entries, applied = self._critic_update(mini)
            update["entries"] = {**update.get("entries", {}), **entries}
            update["finite"] = float(bool(update["finite"]) and applied)

    def _critic_update(self, samples: list[Sample]) -> tuple[dict[str, list[float]], bool]:
        """One update of the critic over a mini-batch (the same list on every rank): every
        response that carries loss (overlong-filtered ones do not), whatever its advantage,
        each micro-batch divided by the mini-batch's token count."""
        count = float(max(sum(s.response_len for s in samples if s.keep), 1))
        batches = self._my_micro_batches(samples, lambda s: s.keep)
        return self.critic.update(batches, count, self._dummy, self.lr_at(self.step))

    def _probed_updates(
        self, groups: list[Group], samples: list[Sample]
    ) -> tuple[list[dict[str, float]], dict[str, float]]:
        """The step's updates, and the ``probe/*`` metrics of the same updates made with the
        switch ``tracking.switch_probe`` flipped, from the same weights, optimizer state and
        groups, then undone (``tasks.training.probe``)."""
        algo = probe.flipped(self.cfg.algo, self.probed_switch)

        def entropy() -> float:
            return probe.mean_entropy(self.forward, samples, self.cfg.train.micro_batch_tokens)

        t0 = time.perf_counter()
        before, saved = entropy(), probe.snapshot(self.engine)
        # The flipped update draws no random numbers today; forking keeps it so if one ever does.
        with torch.random.fork_rng(devices=probe.cuda_devices(self.device)):
            self._updates(self._samples(groups, algo)[0], algorithm(algo))
            after_flipped = entropy()
        probe.restore(self.engine, saved)
        t_real = time.perf_counter()
        updates = self._updates(samples)
        real = time.perf_counter() - t_real
        on = bool(getattr(self.cfg.algo, self.probed_switch))
        readings = probe.probe_metrics(on, before, entropy(), after_flipped)
        # What the probe added to the step's time (perf/train_time_s includes it)
        readings["perf/probe_time_s"] = time.perf_counter() - t0 - real
        return updates, readings

    # -- rollout -------------------------------------------------------------------------------

    def sampler(self) -> Generator:
        """The generator, holding the policy's current weights: an inference engine (vLLM) or a
        sampling copy (``rollout.weights``) is synced first. Rollouts and validation call it."""
        if hasattr(self.generator, "sync_weights"):
            self.generator.sync_weights(self.model)
        return self.generator

    def _generate_groups(self, n: int, gen_log: dict[str, Any]) -> tuple[list[Group], torch.Tensor]:
        """n prompts x G scored responses; under data parallelism each rank generates its slice
        and the groups are all-gathered, so every rank returns the same list."""
        cfg = self.cfg
        G = cfg.rollout.group_size
        problems = self.stream.take(n)  # the same prompts on every rank
        mine = problems[self.rank :: self.world]
        t0 = time.perf_counter()
        groups: list[Group] = []
        if mine:
            prompts = [chat_prompt(self.tokenizer, p.prompt) for p in mine]
            with torch.autocast(self.device.type, torch.bfloat16, enabled=self.autocast):
                out = self.generator.generate(
                    prompts,
                    G,
                    cfg.rollout.temperature,
                    cfg.rollout.top_p,
                    cfg.rollout.max_response_len,
                )
            gen_log["prompts_truncated"] += out.prompts_truncated
            for i, p in enumerate(mine):
                sl = slice(i * G, (i + 1) * G)
                acc = [self.is_correct(t, p.answer) for t in out.texts[sl]]
                groups.append(
                    Group(
                        p.id,
                        p.answer,
                        out.prompt_ids[i],
                        out.response_ids[sl],
                        out.finished[sl],
                        acc,
                        out.texts[sl],
                        _as_tensors(out.logprobs[sl]) if out.logprobs is not None else None,
                        self.step,
                    )
                )
        gen_log["gen_time"] += time.perf_counter() - t0
        if self.world > 1:  # interleave the shards back into the prompt order
            shards = all_gather_objects(groups, self.world)
            groups = [shards[i % self.world][i // self.world] for i in range(n)]
        accs = [g.acc for g in groups]
        gen_log["acc"] += [a for row in accs for a in row]
        gen_log["lengths"] += [len(r) for g in groups for r in g.response_ids]
        gen_log["finished"] += [f for g in groups for f in g.finished]
        gen_log["parsed"] += [extract_answer(t) is not None for g in groups for t in g.texts]
        return groups, torch.tensor(accs, dtype=torch.bool)

    # -- loss inputs ---------------------------------------------------------------------------

    def _samples(
        self, groups: list[Group], algo: AlgoConfig | None = None
    ) -> tuple[list[Sample], dict[str, float]]:
        """The groups' responses with their advantages and loss mask, under the run's switches
        unless ``algo`` says otherwise (a switch probe's flipped update)."""
        cfg, a = self.cfg, algo or self.cfg.algo
        acc = torch.tensor([g.acc for g in groups], dtype=torch.bool)  # (P, G)
        lengths = torch.tensor([[len(r) for r in g.response_ids] for g in groups])  # (P, G)
        finished = torch.tensor([g.finished for g in groups])  # (P, G)
        rewards = shaped_rewards(
            acc.flatten(),
            lengths.flatten(),
            overlong_shaping=a.overlong_shaping,
            max_len=cfg.rollout.max_response_len,
            cache_len=a.cache_len,
            factor=a.overlong_penalty_factor,
        ).view_as(acc)
        alg = algorithm(a) if algo else self.algorithm
        kl_rewards, kl_metrics = (
            self._reward_kl(groups, lengths, alg) if alg.kl_in_reward else (None, {})
        )
        values = self._critic_values(groups, lengths) if self.critic else None
        adv, adv_metrics = estimate(alg.advantage, rewards, lengths, kl_rewards, values)
        adv_t = adv.advantages
        keep = overlong_filter_mask(
            torch.ones(acc.numel(), 1), ~finished.flatten(), overlong_filtering=a.overlong_filtering
        )[:, 0].bool()
        samples = []
        for gi, g in enumerate(groups):
            rollout_logps = self._rollout_logps(g, alg)
            for j, resp in enumerate(g.response_ids):
                k = gi * len(g.response_ids) + j
                adv_k = adv_t[k, : len(resp)]
                samples.append(
                    Sample(
                        g.prompt_ids + resp,
                        len(g.prompt_ids),
                        response_advantage(adv_k),
                        bool(keep[k]),
                        rollout_logp=rollout_logps[j] if rollout_logps else None,
                        fresh=getattr(g, "step", None) == self.step,
                        token_advantages=adv_k,
                        kl=alg.kl_in_loss,
                        old_values=None if values is None else values[k, : len(resp)],
                        returns=None if values is None else adv.returns[k, : len(resp)],
                    )
                )
        carrying = [len(s.input_ids) - s.prompt_len for s in samples if s.carries_loss]
        weights = response_weights(alg.aggregation, carrying)
        value_metrics = {}
        if values is not None:  # over the tokens the critic learns from (kept responses)
            learnt = response_mask(lengths.flatten()) & keep[:, None]
            value_metrics = explained_variance(values, adv.returns, learnt)
        metrics = reduce_metrics([adv_metrics, kl_metrics, value_metrics])
        stats = {f"train/{k}": float(v) for k, v in metrics.items()}
        stats |= {
            "train/batch_acc_mean": acc.float().mean().item(),
            # per response (its token mean), as before per-token advantages
            "train/adv_abs_mean": torch.tensor([abs(s.advantage) for s in samples]).mean().item(),
            "train/long_weight_share": long_weight_share(carrying, weights=weights),
        }
        return samples, stats

    def _rollout_logps(self, group: Group, alg: Algorithm) -> list[torch.Tensor] | None:
        """The sampler's log-probs of each response, as ``_generate_groups`` stored them (None
        when the backend gives none, or for a group carried in a checkpoint written before they
        were kept)."""
        logprobs = getattr(group, "logprobs", None)
        if logprobs is None:
            if alg.corrects:
                raise TrainingStopped(
                    "algo.correction needs the sampler's log-probs: this rollout backend gave "
                    "none (vLLM gives them at rollout.temperature=1.0 and top_p=1.0), or a group "
                    "carried in a checkpoint from an older version lacks them. Set "
                    "algo.correction.name=none"
                )
            return None
        return logprobs

    # -- forward -------------------------------------------------------------------------------

    def _forward_logprobs(self, batch: list[Sample]):
        return self.forward(batch)

    def _my_micro_batches(
        self, samples: list[Sample], select: Callable[[Sample], bool] | None = None
    ) -> list[list[Sample]]:
        """This rank's shard of the samples that carry loss (or that ``select`` picks), packed
        into micro-batches; padded with empty micro-batches to the largest count over ranks
        (ZeRO-3 gathers at every forward)."""
        active = [s for s in samples if (select(s) if select else s.carries_loss)]
        # Shard by prompt, so that a group's shared prompt is computed on one rank.
        _, keys = distinct_prompts(active)
        mine = [s for s, k in zip(active, keys, strict=True) if k % self.world == self.rank]
        batches = pack_samples(mine, self.cfg.train.micro_batch_tokens)
        count = all_reduce_max(len(batches), self.world)
        return batches + [[] for _ in range(count - len(batches))]

    def _dummy(self) -> list[Sample]:
        """A one-token sample with zero advantage: zero loss and gradient, same collectives."""
        pad = self.tokenizer.pad_token_id
        zero = torch.zeros(1)
        rows = dict(rollout_logp=zero, ref_logp=zero, old_values=zero, returns=zero)
        return [Sample([pad, pad], 1, 0.0, True, **rows)]

    @torch.no_grad()
    def _compute_old_logprobs(self, minis: list[list[Sample]]) -> None:
        """log pi_old of every response token, once, before the first update of the step."""
        for mini in minis:
            for batch in self._my_micro_batches(mini):
                logp, _, mask = self._forward_logprobs(batch or self._dummy())
                for s, lp, m in zip(batch, logp, mask, strict=False):
                    s.old_logp = lp[: int(m.sum())].float()

    def _compute_ref_logprobs(self, minis: list[list[Sample]]) -> None:
        """log pi_ref of every response token this rank will update on, once per step (pi_ref
        never changes: one pass serves every update). A plain module, not under DeepSpeed: an
        empty micro-batch needs no forward to keep ranks in step."""
        for mini in minis:
            for batch in self._my_micro_batches(mini):
                if batch:
                    logp, mask = self.reference(batch)
                    for s, lp, m in zip(batch, logp, mask, strict=True):
                        s.ref_logp = lp[: int(m.sum())].float()

    def _reward_kl(
        self, groups: list[Group], lengths: torch.Tensor, alg: Algorithm
    ) -> tuple[torch.Tensor, Metrics]:
        """(P*G, T) per-token rewards -beta * kl of every response (the KL term in the reward),
        from its log-probs under the policy that sampled it (this step's, before any update)
        and under pi_ref: each rank forwards its shard, and the rows are all-gathered so that
        every rank computes the same advantages."""
        samples = self._every_response(groups, kl=True)
        self._compute_old_logprobs([samples])
        self._compute_ref_logprobs([samples])
        mine = {
            k: (s.old_logp, s.ref_logp) for k, s in enumerate(samples) if s.ref_logp is not None
        }
        rows = {k: v for part in all_gather_objects(mine, self.world) for k, v in part.items()}
        like = torch.zeros(len(samples), int(lengths.max()))
        old, ref = (self._stack([rows[k][i] for k in range(len(samples))], like) for i in (0, 1))
        return reward_kl(alg.kl, old, ref, lengths)

    @staticmethod
    def _every_response(groups: list[Group], kl: bool = False) -> list[Sample]:
        """Every response of the groups as a sample (row p * G + g: response g of group p)."""
        return [
            Sample(g.prompt_ids + r, len(g.prompt_ids), 0.0, True, kl=kl)
            for g in groups
            for r in g.response_ids
        ]

    def _critic_values(self, groups: list[Group], lengths: torch.Tensor) -> torch.Tensor:
        """(P*G, T) the critic's value of every response token, before any update of the step
        (``gae``'s V and the value loss's V_old): each rank forwards its shard, and the rows
        are all-gathered so that every rank computes the same advantages."""
        samples = self._every_response(groups)
        self.critic.values(self._my_micro_batches(samples, lambda s: True), self._dummy)
        mine = {k: s.old_values for k, s in enumerate(samples) if s.old_values is not None}
        rows = {k: v for part in all_gather_objects(mine, self.world) for k, v in part.items()}
        like = torch.zeros(len(samples), int(lengths.max()))
        return self._stack([rows[k] for k in range(len(samples))], like)

    # -- one update ----------------------------------------------------------------------------

    def _update(self, samples: list[Sample], alg: Algorithm | None = None) -> dict[str, Any]:
        """One gradient update over a mini-batch of samples (the same list on every rank):
        correction -> policy loss -> aggregation, each micro-batch divided by the global count."""
        alg = alg or self.algorithm
        # The count spans every sample of the whole mini-batch (every rank holds all of it),
        # including the ones skipped because their loss is identically zero.
        count = global_count(alg.aggregation, [s.response_len for s in samples if s.keep])
        sums = UpdateSums()
        batches = self._my_micro_batches(samples)
        for i, real in enumerate(batches):
            batch = real or self._dummy()
            logp, ent, mask = self._forward_logprobs(batch)
            old = self._padded(batch, "old_logp", logp)
            rollout = self._padded(batch, "rollout_logp", logp)
            tokens = TokenBatch(
                logp,
                logp.detach() if old is None else old,
                self._stack([s.advantages() for s in batch], logp),
                # a padding micro-batch: no token counts, so its loss and gradient are 0
                mask if real else torch.zeros_like(mask),
                rollout_logp=rollout,
                ref_logp=self._padded(batch, "ref_logp", logp),
            )
            loss_t, keep, m = token_losses(alg, tokens)
            entry = alg.aggregation
            loss = aggregate(entry.entry, entry.params, loss_t, keep, count)
            stats = {"tokens": mask.sum(), "entropy": masked_mean(ent, mask), "loss": loss}
            if rollout is not None:  # the sampler's arithmetic: groups sampled this step only
                fresh = torch.tensor([float(s.fresh) for s in batch], device=self.device)
                gap = mismatch_sums(tokens.old_logp, rollout, mask * fresh[:, None])
                stats |= {f"mismatch_{k}": v for k, v in gap.items()}
            self.engine.backward(loss, boundary=i == len(batches) - 1)
            sums.add_micro(stats, m, real=bool(real))
        sums.all_reduce(self.world)
        grad_norm, applied = self.engine.step(finite=math.isfinite(sums.sums["loss"]))
        out = sums.result()
        out.update(grad_norm=grad_norm, finite=float(applied))
        out["padding_frac"] = sample_padding_fraction([b for b in batches if b])  # this rank's
        return out

    @staticmethod
    def _stack(rows: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """Per-response rows as a (b, R) tensor shaped like ``like``, zeros past each row."""
        out = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
        out = torch.nn.functional.pad(out, (0, like.shape[1] - out.shape[1]))
        return out.to(like.device, like.dtype)

    @staticmethod
    def _padded(batch: list[Sample], field: str, like: torch.Tensor) -> torch.Tensor | None:
        """The samples' per-token ``field`` (old_logp or rollout_logp) as a (b, R) tensor shaped
        like ``like``, zeros past each response; None unless every sample has it."""
        rows = [getattr(s, field) for s in batch]
        if any(r is None for r in rows):
            return None
        # One padding op on the rows' device and one copy to ``like``'s, not a copy per row.
        return DAPOTrainer._stack(rows, like)

    # -- metrics and state ---------------------------------------------------------------------

    def _sample_rows(self, groups: list[Group]) -> list[dict[str, Any]]:
        """The first response of the first ``tracking.log_samples`` groups, for the run's table."""
        return [
            {
                "step": self.step,
                "problem_id": g.problem_id,
                "answer": g.answer,
                "response": g.texts[0],
                "acc": g.acc[0],
            }
            for g in groups[: self.cfg.tracking.log_samples]
        ]

    def state_dict(self) -> dict[str, Any]:
        """The loop state a checkpoint needs besides weights and optimizer (exact resume)."""
        return {
            "step": self.step,
            "bad_steps": self.bad_steps,
            "stalled_steps": self.stall.count,
            "world": self.world,
            "stream": self.stream.state_dict(),
            "buffer": self.buffer.state_dict(),
            "rng": {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.bad_steps = state["step"], state["bad_steps"]
        self.stall.count = state.get("stalled_steps", 0)  # absent in older checkpoints
        self.stream.load_state_dict(state["stream"])
        self.buffer.load_state_dict(state["buffer"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
