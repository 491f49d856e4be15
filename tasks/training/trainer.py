"""The DAPO training loop (DAPO Algorithm 1), with all algorithmic decisions made in ``dapo_core``.

One step:
1. build the batch with dynamic sampling (``tasks.training.rollouts``): generate G responses
   per prompt, score them (``dapo_core.reward``), keep informative groups, carry the surplus;
2. rewards with the overlong penalty, per-token advantages from the ``algo.advantage`` entry, the
   overlong-filter loss mask, in one pure function (``dapo_core.algorithm.loss_inputs``);
3. old log-probs once, only when there are several updates per rollout (with one update the ratio
   is exactly 1 and the pass would be wasted);
4. ``prompt_batch / mini_batch`` gradient updates (``tasks.training.updater``: the ``algo``
   entries on every micro-batch, divided by the aggregation's global count; the no-grad passes
   for pi_old, pi_ref and the critic's values; the critic's own update after each);
5. AdamW with linear warm-up (step 1 trains at lr / warmup, never at 0; the lr is a function of the
   step, so a resumed run needs no scheduler state), gradient clipping, and
   a skip of any update whose loss or gradient is not finite.

Efficiency: groups are packed into micro-batches under a token budget, the cheaper of two
packings (``batches.micro_batches``: by group, or by length);
in a micro-batch each distinct prompt is forwarded once and its keys and values are shared by its
samples (whole sequences under gradient checkpointing, where transformers drops the cache); only
response positions are projected onto the vocabulary, in chunks (``dapo_core.logprobs``);
samples whose loss is identically zero (advantage 0, or masked out by overlong filtering) are
counted in the normalizer but skip the forward and backward passes (``tasks.training.forward``).
The model's RMSNorm (and, on CPU, its attention) use the faster drop-ins of
``tasks.training.kernels``. Checkpoints are ``tasks.training.checkpoint``'s job: the trainer only
hands over its loop state (``state_dict``). A switch probe (``tracking.switch_probe``) wraps the
step's ``learn`` (``tasks.training.probe``).
"""

from __future__ import annotations

import dataclasses
import gc
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dapo_core import metric_names as metric
from dapo_core.algorithm import (
    algorithm,
    long_weight_share,
    loss_inputs,
    response_mask,
    response_weights,
)
from dapo_core.algos import explained_variance, reduce_metrics
from dapo_core.config import AlgoConfig, Config
from dapo_core.errors import PipelineError, TrainingStopped
from dapo_core.problem import Problem
from tasks.rollout.generators import Generator
from tasks.runtime import seed_everything
from tasks.training import probe
from tasks.training.async_rollouts import AsyncRollouts
from tasks.training.batches import Group, Sample
from tasks.training.compiled import compile_decoder
from tasks.training.critic import Critic, OptimizerFactory, value_model
from tasks.training.distributed import OptimizerEngine, init_distributed, sampling_ranks
from tasks.training.forward import PolicyForward
from tasks.training.kernels import install_rms_norm, use_cpu_sdpa
from tasks.training.precision import adamw_optimizer
from tasks.training.records import RolloutLog, UpdateResult
from tasks.training.reference import ReferencePolicy, frozen_copy
from tasks.training.rollout_process import RolloutSpec
from tasks.training.rollouts import bf16_autocast, make_collector
from tasks.training.step_metrics import (
    StallWatch,
    dynamic_sampling_metrics,
    rollout_metrics,
    update_metrics,
)
from tasks.training.updater import PolicyUpdater

MetricsSink = Callable[[dict[str, float], int], None]
Learned = tuple[list[Sample], dict[str, float], list[UpdateResult]]


def warmup_lambda(warmup_steps: int) -> Callable[[int], float]:
    """Linear warm-up then constant: step s (0-based) trains at lr * (s+1)/warmup, never at 0."""
    return lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def response_advantage(adv: torch.Tensor) -> float:
    """A response's advantage: the mean of its tokens' (exactly A_i for sequence-level
    estimators: a float64 sum of equal float32 values divided by their number)."""
    return float(adv.double().mean().float()) if adv.numel() else 0.0


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
        rollout_spec: RolloutSpec | None = None,
    ):
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer
        self.step = 0
        self.bad_steps = 0
        self.stall = StallWatch(cfg.train.max_stalled_steps, cfg.rollout.group_size)
        self.device = next(model.parameters()).device
        self.autocast = bf16_autocast(cfg, self.device)
        sampling = sampling_ranks(cfg.train.rollout_ranks)  # under a launcher: not training
        self.rank, self.world = init_distributed(self.device.type, sampling)
        self.sink = sink if self.rank == 0 else None  # one writer of metrics and files
        # Correctness of a response against the answer: ``reward_fn``, else the rule (Eq. 7).
        self.rollouts = make_collector(
            cfg, tokenizer, generator, problems, self.device, reward_fn, self.rank, self.world
        )
        # train.rollout_ranks: a rollout process samples the next batches (async_rollouts.py)
        if rollout_spec is not None and reward_fn is not None:  # the rollout process scores
            rollout_spec = dataclasses.replace(rollout_spec, is_correct=reward_fn)
        self.async_rollouts = self._async_rollouts(rollout_spec)
        self.algorithm = alg = algorithm(cfg.algo)  # the entries every update calls
        self.metric_names = alg.metric_names()
        # pi_ref: copied now, from the run's starting model, before DeepSpeed partitions it
        ref = frozen_copy(model) if alg.needs_reference else None
        # the critic's transformer likewise, from the starting model (``tasks.training.critic``)
        critic = value_model(model, alg.critic.params, tokenizer, cfg) if alg.critic else None
        optimizer = optimizer or self._adamw(model, cfg)
        self.engine = OptimizerEngine(
            model, optimizer, cfg.train.grad_clip, self.world, cfg.train.zero_stage, self.autocast
        )
        pad = tokenizer.pad_token_id
        forward = PolicyForward(
            model, pad, cfg.rollout.temperature, self.autocast, self.engine.before_forward
        )
        self.reference = ReferencePolicy(ref, self.engine.model, forward) if ref else None
        self.critic = None
        if critic is not None:
            opt = critic_optimizer
            self.critic = Critic(critic, alg.critic, cfg, self.world, self.autocast, pad, opt)
            self.metric_names = sorted({*self.metric_names, "value_grad_norm"})
        per_update = cfg.train.mini_batch * cfg.rollout.group_size
        self.updater = PolicyUpdater(
            self.engine,
            forward,
            alg,
            pad,
            cfg.train.micro_batch_tokens,
            per_update,
            self.rank,
            self.world,
            self.reference,
            self.critic,
        )
        self.lr_at = warmup_lambda(cfg.train.warmup_steps)
        self.learn = self._learn  # groups -> samples, their statistics, the updates
        if switch := cfg.tracking.switch_probe:  # the update, and beside it one with it flipped
            probe.check_world(switch, self.world)
            tokens = cfg.train.micro_batch_tokens
            self.learn = probe.SwitchProbe(
                self.loss_samples, self.updater, cfg.algo, switch, tokens
            )
        install_rms_norm(model)  # same arithmetic, half the backward cost (kernels.py)
        use_cpu_sdpa(model)  # grouped-query attention without copied heads, on CPU
        for m in (model, self.reference and self.reference.model):  # both, or KL(pi, pi) != 0
            if m is not None:
                compile_decoder(
                    m, cfg.model.compile, self.world
                )  # regional torch.compile (compiled.py)
        # Everything alive now (libraries, the model) lives as long as the run: keep it out of
        # the cyclic garbage collector, whose full passes over it cost most of a tiny step.
        gc.freeze()

    def _async_rollouts(self, spec: RolloutSpec | None) -> AsyncRollouts | None:
        """The rollout side of ``train.rollout_ranks``: a process of its own, or under a
        launcher the world's last ranks."""
        if not self.cfg.train.rollout_ranks:
            return None
        if spec is None:
            raise PipelineError(
                "train.rollout_ranks=1 needs the policy's path for its rollout process: train "
                "through run_training (dapo train), or set train.rollout_ranks=0"
            )
        return AsyncRollouts(spec, self.rollouts.state_dict())

    def close(self) -> None:
        """Stop the rollout process, if any (every exit of a run calls it)."""
        if self.async_rollouts:
            self.async_rollouts.close()

    def _adamw(self, model, cfg: Config):
        """AdamW over the trainable parameters; through float32 master weights when they are
        bf16 on one process (``tasks.training.precision``; DeepSpeed's bf16 mode does that
        itself)."""
        params = [p for p in model.parameters() if p.requires_grad]
        return adamw_optimizer(
            params, cfg.train.lr, cfg.train.weight_decay, self.device, self.world
        )

    def sampler(self) -> Generator:
        """The generator, holding the policy's current weights (validation samples from it)."""
        return self.rollouts.sampler(self.model)

    # -- one step: rollout -> loss inputs -> updates -> metrics ---------------------------------

    def train_step(self) -> StepResult:
        cfg = self.cfg
        t0 = time.perf_counter()
        seed_everything(cfg.train.seed * 1_000_003 + self.step)
        groups, ds, log, overlap = self._collect()
        metrics = {**dynamic_sampling_metrics(ds), **rollout_metrics(log, cfg), **overlap}
        lr = cfg.train.lr * self.lr_at(self.step)
        self.engine.set_lr(lr)
        t_train = time.perf_counter()
        updates: list[UpdateResult] = []
        if groups:
            samples, stats, updates = self.learn(groups)
            metrics.update(stats)
            if self.critic:
                updates = self.updater.critic_updates(samples, updates, self.lr_at(self.step))
        self.step += 1
        if self.async_rollouts:  # the weights after this step, for the batch s steps ahead
            self.async_rollouts.publish(self.model, self.step)
        self.bad_steps = 0 if all(u.applied for u in updates) else self.bad_steps + 1
        metrics.update(update_metrics(updates, lr, self.metric_names))
        metrics.update(self._perf(log, updates, t0, t_train))
        if self.sink:
            self.sink(metrics, self.step)
        if self.bad_steps >= cfg.train.max_bad_steps:
            raise TrainingStopped(
                f"{self.bad_steps} steps in a row had a non-finite loss or gradient (updates "
                "skipped). Lower train.lr, check the model's dtype, or raise train.max_bad_steps."
            )
        self.stall.observe(log, self.step)
        return StepResult(metrics, self._sample_rows(groups))

    def _collect(self) -> tuple[list[Group], Any, RolloutLog, dict[str, float]]:
        """The step's groups, dynamic-sampling statistics and rollout log: sampled now, or by
        the rollout process (then with how stale they are and how long the trainer waited)."""
        if not self.async_rollouts:
            return (*self.rollouts.collect(self.model, self.step), {})
        batch, waited = self.async_rollouts.collect(self.model, self.step)
        # over the groups trained on (carried ones can be older); with none, the batch's own
        stale = [self.step - g.version for g in batch.groups if g.version is not None]
        stale = stale or [self.step - batch.version]
        overlap = {
            metric.ROLLOUT_WAIT: waited,
            metric.STALENESS_MEAN: sum(stale) / len(stale),
            metric.STALENESS_MAX: float(max(stale)),
        }
        return batch.groups, batch.stats, batch.log, overlap

    @staticmethod
    def _perf(
        log: RolloutLog, updates: list[UpdateResult], t0: float, t_train: float
    ) -> dict[str, float]:
        step_time = time.perf_counter() - t0
        tokens = sum(log.lengths) + sum(u.tokens for u in updates)
        return {
            metric.STEP_TIME: step_time,
            metric.GEN_TIME: log.gen_time,
            metric.TRAIN_TIME: time.perf_counter() - t_train,
            metric.TOKENS_PER_S: tokens / step_time,
        }

    def _learn(self, groups: list[Group]) -> Learned:
        """The step's samples with their loss inputs, their statistics, and the updates."""
        samples, stats = self.loss_samples(groups)
        return samples, stats, self.updater.updates(samples)

    # -- loss inputs ---------------------------------------------------------------------------

    def loss_samples(
        self, groups: list[Group], algo: AlgoConfig | None = None
    ) -> tuple[list[Sample], dict[str, float]]:
        """The groups' responses with their advantages and loss mask, under the run's switches
        unless ``algo`` says otherwise (a switch probe's flipped update)."""
        a = algo or self.cfg.algo
        acc = torch.tensor([g.acc for g in groups], dtype=torch.bool)  # (P, G)
        lengths = torch.tensor([[len(r) for r in g.response_ids] for g in groups])  # (P, G)
        finished = torch.tensor([g.finished for g in groups])  # (P, G)
        alg = algorithm(a) if algo else self.algorithm
        up = self.updater
        kl_rewards, kl_metrics = (
            up.reward_kl(groups, lengths, alg) if alg.kl_in_reward else (None, {})
        )
        values = up.critic_values(groups, lengths) if self.critic else None
        max_len = self.cfg.rollout.max_response_len
        learned = torch.tensor([g.scores for g in groups]) if groups and groups[0].scores else None
        inputs = loss_inputs(
            alg, a, max_len, acc, lengths, finished, kl_rewards, values, learned=learned
        )
        samples = []
        for gi, g in enumerate(groups):
            rollout_logps = self._rollout_logps(g, alg.corrects)
            for j, resp in enumerate(g.response_ids):
                k = gi * len(g.response_ids) + j
                adv_k = inputs.advantages[k, : len(resp)]
                samples.append(
                    Sample(
                        g.prompt_ids + resp,
                        len(g.prompt_ids),
                        response_advantage(adv_k),
                        bool(inputs.keep[k]),
                        rollout_logp=rollout_logps[j] if rollout_logps else None,
                        fresh=getattr(g, "step", None) == self.step,
                        token_advantages=adv_k,
                        kl=alg.kl_in_loss,
                        old_values=None if values is None else values[k, : len(resp)],
                        returns=None if values is None else inputs.returns[k, : len(resp)],
                    )
                )
        carrying = [len(s.input_ids) - s.prompt_len for s in samples if s.carries_loss]
        weights = response_weights(alg.aggregation, carrying)
        value_metrics = {}
        if values is not None:  # over the tokens the critic learns from (kept responses)
            learnt = response_mask(lengths.flatten()) & inputs.keep[:, None]
            value_metrics = explained_variance(values, inputs.returns, learnt)
        metrics = reduce_metrics([inputs.metrics, kl_metrics, value_metrics])
        stats = {f"train/{k}": float(v) for k, v in metrics.items()}
        per_response = torch.tensor([s.advantage for s in samples])
        stats |= {
            metric.BATCH_ACC_MEAN: acc.float().mean().item(),
            # per response (its token mean), as before per-token advantages
            metric.ADV_ABS_MEAN: per_response.abs().mean().item(),
            metric.ADV_VAR: per_response.var().item() if len(samples) > 1 else 0.0,
            metric.TOKENS_TRAINED: float(sum(carrying)),
            metric.LONG_WEIGHT_SHARE: long_weight_share(carrying, weights=weights),
        }
        return samples, stats

    @staticmethod
    def _rollout_logps(group: Group, needed: bool) -> list[torch.Tensor] | None:
        """The sampler's log-probs of each response, as the rollout stored them (None when the
        backend gives none, or for a group carried in a checkpoint written before they were
        kept); ``needed``: the correction reads them."""
        logprobs = getattr(group, "logprobs", None)
        if logprobs is None and needed:
            raise TrainingStopped(
                "algo.correction needs the sampler's log-probs: this rollout backend gave "
                "none (vLLM gives them at rollout.temperature=1.0 and top_p=1.0), or a group "
                "carried in a checkpoint from an older version lacks them. Set "
                "algo.correction.name=none"
            )
        return logprobs

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
            # the problem stream and the carried groups (and the batches in flight)
            **(self.async_rollouts or self.rollouts).state_dict(),
            "rng": {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.bad_steps = state["step"], state["bad_steps"]
        self.stall.count = state.get("stalled_steps", 0)  # absent in older checkpoints
        (self.async_rollouts or self.rollouts).load_state_dict(state)
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
