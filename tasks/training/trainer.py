"""The DAPO training loop (DAPO Algorithm 1), with all algorithmic decisions made in ``dapo_core``.

One step:
1. build the batch with dynamic sampling (``dapo_core.sampling.fill_batch``): generate G responses
   per prompt, score them (``dapo_core.reward``), keep informative groups, carry the surplus;
2. rewards with the overlong penalty, group advantages, the overlong-filter loss mask;
3. old log-probs once, only when there are several updates per rollout (with one update the ratio
   is exactly 1 and the pass would be wasted);
4. ``prompt_batch / mini_batch`` gradient updates, each accumulated over micro-batches sized by a
   token budget, with the loss normalizer counted over the whole mini-batch (and all ranks);
5. AdamW with linear warm-up (step 1 trains at lr / warmup, never at 0; the lr is a function of the
   step, so a resumed run needs no scheduler state), gradient clipping, and
   a skip of any update whose loss or gradient is not finite.

Efficiency: groups are packed into micro-batches under a token budget, longest responses first;
in a micro-batch each distinct prompt is forwarded once and its keys and values are shared by its
samples (whole sequences under gradient checkpointing, where transformers drops the cache); only
response positions are projected onto the vocabulary, in chunks (``dapo_core.logprobs``);
samples whose loss is identically zero (advantage 0, or masked out by overlong filtering) are
counted in the normalizer but skip the forward and backward passes. The model's RMSNorm (and, on
CPU, its attention) use the faster drop-ins of ``tasks.training.kernels``.
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dapo_core.advantages import group_advantages
from dapo_core.config import Config
from dapo_core.errors import PipelineError
from dapo_core.logprobs import token_logprobs
from dapo_core.loss import policy_loss
from dapo_core.metrics import masked_mean
from dapo_core.overlong import overlong_filter_mask, shaped_rewards
from dapo_core.problem import Problem
from dapo_core.reward import score
from dapo_core.sampling import BatchStats, GroupAccumulator, fill_batch
from tasks.models.loading import chat_prompt
from tasks.rollout.generators import Generator, left_pad
from tasks.training.distributed import (
    OptimizerEngine,
    all_gather_objects,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    init_distributed,
)
from tasks.training.kernels import install_rms_norm, use_cpu_sdpa

MetricsSink = Callable[[dict[str, float], int], None]
LOGITS_BUDGET = 2**26  # logits per chunk (256 MB in fp32): ~440 rows of a 151k vocabulary


class TrainingStopped(PipelineError):
    """The run cannot go on (e.g. too many non-finite updates in a row); the message says why."""


# ---------------------------------------------------------------------------------------------
# Data order
# ---------------------------------------------------------------------------------------------


class ProblemStream:
    """Problems in a reshuffled order each epoch; its position is part of a checkpoint."""

    def __init__(self, problems: list[Problem], seed: int):
        if not problems:
            raise ValueError("the training set is empty")
        self.problems, self.seed = problems, seed
        self.epoch, self.pos = 0, 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[Problem]:
        out = []
        while len(out) < n:
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._shuffled(self.epoch)
            out.append(self.problems[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._shuffled(self.epoch)


@dataclass
class Group:
    """One prompt and its G scored responses."""

    problem_id: str
    answer: str
    prompt_ids: list[int]
    response_ids: list[list[int]]
    finished: list[bool]
    acc: list[bool]
    texts: list[str]


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def micro_batches(
    prompts: list[int], prompt_lens: list[int], response_lens: list[int], budget: int
) -> list[list[int]]:
    """Sample indices packed into micro-batches of at most ``budget`` padded tokens, counting each
    distinct prompt once (distinct prompts x longest prompt + samples x longest response), as
    ``DAPOTrainer._forward_logprobs`` runs them. ``prompts[i]`` names sample i's prompt; a group
    of samples sharing one is split only when it alone exceeds the budget. Groups go longest
    response first, so each micro-batch pads little. A single sample over budget goes alone."""
    by_prompt: dict[int, list[int]] = {}
    for i, g in enumerate(prompts):
        by_prompt.setdefault(g, []).append(i)
    groups = sorted(by_prompt.values(), key=lambda idx: -max(response_lens[i] for i in idx))

    def cost(batch: list[int]) -> int:
        n_prompts = len({prompts[i] for i in batch})
        longest_prompt = max(prompt_lens[i] for i in batch)
        return n_prompts * longest_prompt + len(batch) * max(response_lens[i] for i in batch)

    batches: list[list[int]] = [[]]
    for group in groups:
        group = sorted(group, key=lambda i: -response_lens[i])
        if batches[-1] and cost(batches[-1] + group) > budget and cost(group) <= budget:
            batches.append([])  # keep the group whole in a fresh micro-batch
        for i in group:
            if batches[-1] and cost(batches[-1] + [i]) > budget:
                batches.append([])
            batches[-1].append(i)
    return [b for b in batches if b]


def distinct_prompts(samples: list[Sample]) -> tuple[list[list[int]], list[int]]:
    """(the distinct prompts in order of first use, each sample's index into them)."""
    index: dict[tuple[int, ...], int] = {}
    owner = [index.setdefault(tuple(s.input_ids[: s.prompt_len]), len(index)) for s in samples]
    return [list(p) for p in index], owner


def new_rollout_log() -> dict[str, Any]:
    """What ``DAPOTrainer._generate_groups`` accumulates over one step's generation batches."""
    return {"gen_time": 0.0, "prompts_truncated": 0, "acc": [], "lengths": [], "finished": []}


def warmup_lambda(warmup_steps: int) -> Callable[[int], float]:
    """Linear warm-up then constant: step s (0-based) trains at lr * (s+1)/warmup, never at 0."""
    return lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps > 0 else 1.0


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------


@dataclass
class Sample:
    """One response ready for the loss: its ids, advantage and loss weight."""

    input_ids: list[int]  # prompt + response
    prompt_len: int
    advantage: float
    keep: bool  # False when overlong filtering masks it out
    old_logp: torch.Tensor | None = None  # (response_len,), when several updates per rollout


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
        run_dir: Path,
        sink: MetricsSink | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        reward_fn: Callable[[str, str], bool] | None = None,
    ):
        self.cfg, self.model, self.tokenizer, self.generator = cfg, model, tokenizer, generator
        # Correctness of a response against the answer; the rule-based reward (Eq. 7) by default.
        self.is_correct = reward_fn or (lambda response, answer: score(response, answer).acc)
        self.run_dir = Path(run_dir)
        self.stream = ProblemStream(problems, cfg.train.seed)
        self.buffer = GroupAccumulator()
        self.step = 0
        self.bad_steps = 0
        self.device = next(model.parameters()).device
        self.autocast = self.device.type == "cuda" and cfg.model.dtype in ("auto", "bfloat16")
        self.rank, self.world = init_distributed(self.device.type)
        self.sink = sink if self.rank == 0 else None  # one writer of metrics and files
        optimizer = optimizer or torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.train.lr,
            weight_decay=cfg.train.weight_decay,
        )
        self.engine = OptimizerEngine(
            model, optimizer, cfg.train.grad_clip, self.world, cfg.train.zero_stage, self.autocast
        )
        self.lr_at = warmup_lambda(cfg.train.warmup_steps)
        self.loss_cfg = cfg.algo.loss_config()
        # From the config: under ZeRO-3 a weight's shape is empty outside a gather.
        self.vocab_size = model.config.vocab_size
        install_rms_norm(model)  # same arithmetic, half the backward cost (tasks/kernels.py)
        use_cpu_sdpa(model)  # grouped-query attention without copied heads, on CPU
        # Everything alive now (libraries, the model) lives as long as the run: keep it out of
        # the cyclic garbage collector, whose full passes over it took 0.27 s (most of a step).
        gc.freeze()

    # -- rollout -----------------------------------------------------------------------------

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
        return groups, torch.tensor(accs, dtype=torch.bool)

    # -- loss inputs -------------------------------------------------------------------------

    def _samples(self, groups: list[Group]) -> tuple[list[Sample], dict[str, float]]:
        cfg, a = self.cfg, self.cfg.algo
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
        adv = group_advantages(rewards).flatten()  # (P*G,)
        keep = overlong_filter_mask(
            torch.ones(acc.numel(), 1), ~finished.flatten(), overlong_filtering=a.overlong_filtering
        )[:, 0].bool()
        samples = []
        for gi, g in enumerate(groups):
            for j, resp in enumerate(g.response_ids):
                k = gi * len(g.response_ids) + j
                samples.append(
                    Sample(g.prompt_ids + resp, len(g.prompt_ids), float(adv[k]), bool(keep[k]))
                )
        stats = {
            "train/batch_acc_mean": acc.float().mean().item(),
            "train/adv_abs_mean": adv.abs().mean().item(),
        }
        return samples, stats

    def _rollout_metrics(self, gen_log: dict[str, Any]) -> dict[str, float]:
        """What the policy did this step, over every sample generated (kept or not)."""
        a = self.cfg.algo
        acc = torch.tensor(gen_log["acc"], dtype=torch.bool)
        lengths = torch.tensor(gen_log["lengths"])
        finished = torch.tensor(gen_log["finished"], dtype=torch.bool)
        rewards = shaped_rewards(
            acc,
            lengths,
            overlong_shaping=a.overlong_shaping,
            max_len=self.cfg.rollout.max_response_len,
            cache_len=a.cache_len,
            factor=a.overlong_penalty_factor,
        )
        return {
            "train/reward_mean": rewards.mean().item(),
            "train/acc_mean": acc.float().mean().item(),
            "train/response_len_mean": lengths.float().mean().item(),
            "train/truncated_frac": (~finished).float().mean().item(),
        }

    # -- forward -----------------------------------------------------------------------------

    def _forward_logprobs(
        self, batch: list[Sample]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(b, R) response log-probs (differentiable), (b, R) entropies, (b, R) response mask."""
        pad, dev = self.tokenizer.pad_token_id, self.device
        responses = [s.input_ids[s.prompt_len :] for s in batch]
        resp_lens = torch.tensor([len(r) for r in responses], device=dev)
        R = int(resp_lens.max())
        resp_ids = torch.tensor([r + [pad] * (R - len(r)) for r in responses], device=dev)
        mask = torch.arange(R, device=dev)[None, :] < resp_lens[:, None]  # (b, R)
        self.engine.before_forward()
        with torch.autocast(dev.type, torch.bfloat16, enabled=self.autocast):
            if self.model.is_activation_checkpointing:  # transformers then drops the KV cache
                states = self._whole_sequence_states(batch, R)
            else:
                states = self._shared_prompt_states(batch, resp_ids, mask)
        rows, cols = mask.nonzero(as_tuple=True)
        logp_flat, ent_flat = token_logprobs(
            states[rows, cols],
            self.model.get_output_embeddings(),
            resp_ids[rows, cols],
            self.cfg.rollout.temperature,
            chunk=max(256, LOGITS_BUDGET // self.vocab_size),
        )
        logp = torch.zeros(len(batch), R, device=dev, dtype=logp_flat.dtype)
        logp = logp.index_put((rows, cols), logp_flat)  # differentiable scatter
        ent = torch.zeros(len(batch), R, device=dev)
        ent[rows, cols] = ent_flat
        return logp, ent, mask.float()

    def _shared_prompt_states(
        self, batch: list[Sample], resp_ids: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """(b, R, H) hidden states that predict each response token.

        Each distinct prompt runs once (left-padded); its keys and values are gathered for every
        sample that shares it and the responses (right-padded) attend to them. With G samples per
        prompt the prompt costs 1/G of a whole-sequence forward, and autograd sums its gradient
        over the G responses. Positions match an unpadded whole-sequence forward exactly.
        """
        dev, decoder = self.device, self.model.get_decoder()
        prompts, owner = distinct_prompts(batch)
        prompt_ids, prompt_attn, prompt_pos = left_pad(prompts, self.tokenizer.pad_token_id, dev)
        sel = torch.tensor(owner, device=dev)
        prefix = decoder(
            input_ids=prompt_ids,
            attention_mask=prompt_attn,
            position_ids=prompt_pos,
            use_cache=True,
        )
        # Response token j is predicted by the state before it: the prompt's last one for j = 0.
        # The last response token predicts nothing, so it is not fed in.
        states = prefix.last_hidden_state[sel, -1:]  # (b, 1, H)
        R = resp_ids.shape[1]
        if R == 1:
            return states
        cache = prefix.past_key_values
        cache.batch_select_indices(sel)  # differentiable gather: one copy per sample
        hidden = decoder(
            input_ids=resp_ids[:, :-1],
            attention_mask=torch.cat([prompt_attn[sel], mask[:, :-1].long()], dim=1),
            position_ids=prompt_attn.sum(-1)[sel, None] + torch.arange(R - 1, device=dev),
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state  # (b, R - 1, H)
        return torch.cat([states, hidden], dim=1)

    def _whole_sequence_states(self, batch: list[Sample], R: int) -> torch.Tensor:
        """(b, R, H) hidden states that predict each response token, each sample run whole
        (prompt + response, right-padded). Used under gradient checkpointing: transformers drops
        the KV cache then, and the shared-prompt forward needs it."""
        pad, dev = self.tokenizer.pad_token_id, self.device
        width = max(len(s.input_ids) for s in batch)
        ids = torch.tensor([s.input_ids + [pad] * (width - len(s.input_ids)) for s in batch])
        attn = torch.tensor(
            [[1] * len(s.input_ids) + [0] * (width - len(s.input_ids)) for s in batch]
        )
        hidden = self.model.get_decoder()(
            input_ids=ids.to(dev), attention_mask=attn.to(dev)
        ).last_hidden_state  # (b, width, H)
        # Response token j of sample i is predicted by the state at prompt_len_i - 1 + j.
        starts = torch.tensor([s.prompt_len - 1 for s in batch], device=dev)
        where = (starts[:, None] + torch.arange(R, device=dev)).clamp(max=width - 1)  # (b, R)
        return hidden.gather(1, where[..., None].expand(-1, -1, hidden.shape[-1]))

    def _my_micro_batches(self, samples: list[Sample]) -> list[list[Sample]]:
        """This rank's shard of the samples that carry loss, packed into micro-batches; padded with
        empty micro-batches to the largest count over ranks (ZeRO-3 gathers at every forward)."""
        active = [s for s in samples if s.keep and s.advantage != 0.0]
        # Shard by prompt, so that a group's shared prompt is computed on one rank.
        _, keys = distinct_prompts(active)
        mine = [i for i, k in enumerate(keys) if k % self.world == self.rank]
        idx = micro_batches(
            [keys[i] for i in mine],
            [active[i].prompt_len for i in mine],
            [len(active[i].input_ids) - active[i].prompt_len for i in mine],
            self.cfg.train.micro_batch_tokens,
        )
        batches = [[active[mine[j]] for j in b] for b in idx]
        count = all_reduce_max(len(batches), self.world)
        return batches + [[] for _ in range(count - len(batches))]

    def _dummy(self) -> list[Sample]:
        """A one-token sample with zero advantage: zero loss and gradient, same collectives."""
        pad = self.tokenizer.pad_token_id
        return [Sample([pad, pad], 1, 0.0, True)]

    @torch.no_grad()
    def _compute_old_logprobs(self, minis: list[list[Sample]]) -> None:
        """log pi_old of every response token, once, before the first update of the step."""
        for mini in minis:
            for batch in self._my_micro_batches(mini):
                logp, _, mask = self._forward_logprobs(batch or self._dummy())
                for s, lp, m in zip(batch, logp, mask, strict=False):
                    s.old_logp = lp[: int(m.sum())].float()

    # -- one update --------------------------------------------------------------------------

    def _update(self, samples: list[Sample]) -> dict[str, float]:
        """One gradient update over a mini-batch of samples (the same list on every rank)."""
        token_level = self.loss_cfg.token_level_loss
        # The normalizer counts every sample of the whole mini-batch (every rank holds all of it),
        # including the ones skipped because their loss is identically zero.
        kept = [s for s in samples if s.keep]
        count = sum(len(s.input_ids) - s.prompt_len for s in kept) if token_level else len(kept)
        normalizer = max(float(count), 1.0)
        sums = dict.fromkeys(["clip_frac_high", "clip_frac_low", "entropy", "loss", "tokens"], 0.0)
        batches = self._my_micro_batches(samples)
        for i, real in enumerate(batches):
            batch = real or self._dummy()
            logp, ent, mask = self._forward_logprobs(batch)
            if batch[0].old_logp is None:
                old = logp.detach()
            else:
                old = torch.zeros_like(logp)
                for j, s in enumerate(batch):
                    old[j, : len(s.old_logp)] = s.old_logp.to(old.dtype)
            adv = torch.tensor([s.advantage for s in batch], device=self.device)
            loss, m = policy_loss(logp, old, adv, mask, self.loss_cfg, normalizer=normalizer)
            self.engine.backward(loss, boundary=i == len(batches) - 1)
            if not real:
                continue
            t = m["num_tokens"].item()
            sums["tokens"] += t
            sums["clip_frac_high"] += m["clip_frac_high"].item() * t
            sums["clip_frac_low"] += m["clip_frac_low"].item() * t
            sums["entropy"] += masked_mean(ent, mask).item() * t
            sums["loss"] += loss.item()
        keys = list(sums)
        sums = dict(zip(keys, all_reduce_sum([sums[k] for k in keys], self.world), strict=True))
        grad_norm, applied = self.engine.step(finite=math.isfinite(sums["loss"]))
        n_tok = sums["tokens"]
        out = {
            k: sums[k] / n_tok if n_tok else 0.0
            for k in ("clip_frac_high", "clip_frac_low", "entropy")
        }
        out.update(loss=sums["loss"], grad_norm=grad_norm, finite=float(applied), tokens=n_tok)
        return out

    # -- one step ----------------------------------------------------------------------------

    def train_step(self) -> StepResult:
        cfg = self.cfg
        t0 = time.perf_counter()
        seed_everything(cfg.train.seed * 1_000_003 + self.step)
        if hasattr(self.generator, "sync_weights"):  # an inference engine with its own weights
            self.generator.sync_weights(self.model)
        gen_log = new_rollout_log()
        groups, ds = fill_batch(
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
        metrics = {**self._ds_metrics(ds), **self._rollout_metrics(gen_log)}
        lr = cfg.train.lr * self.lr_at(self.step)
        self.engine.set_lr(lr)
        updates: list[dict[str, float]] = []
        t_train = time.perf_counter()
        if groups:
            samples, batch_stats = self._samples(groups)
            metrics.update(batch_stats)
            per_update = cfg.train.mini_batch * cfg.rollout.group_size
            minis = [samples[i : i + per_update] for i in range(0, len(samples), per_update)]
            if len(minis) > 1:  # with one update the ratio is exactly 1: no extra pass
                self._compute_old_logprobs(minis)
            updates = [self._update(mini) for mini in minis]
        self.step += 1

        all_finite = all(u["finite"] for u in updates)
        self.bad_steps = 0 if all_finite else self.bad_steps + 1
        tokens = sum(u["tokens"] for u in updates)
        step_time = time.perf_counter() - t0
        mean = lambda k: float(np.mean([u[k] for u in updates])) if updates else 0.0  # noqa: E731
        metrics.update(
            {
                "train/entropy": mean("entropy"),
                "train/clip_frac_low": mean("clip_frac_low"),
                "train/clip_frac_high": mean("clip_frac_high"),
                "train/grad_norm": float(np.nanmean([u["grad_norm"] for u in updates]))
                if any(math.isfinite(u["grad_norm"]) for u in updates)
                else 0.0,
                "train/loss": mean("loss"),
                "train/lr": lr,
                "train/skipped_updates": float(sum(not u["finite"] for u in updates)),
                "train/prompts_truncated": gen_log["prompts_truncated"],
                "perf/step_time_s": step_time,
                "perf/gen_time_s": gen_log["gen_time"],
                "perf/train_time_s": time.perf_counter() - t_train,
                "perf/tokens_per_s": (sum(gen_log["lengths"]) + tokens) / step_time,
            }
        )
        if self.sink:
            self.sink(metrics, self.step)
        if self.bad_steps >= cfg.train.max_bad_steps:
            raise TrainingStopped(
                f"{self.bad_steps} steps in a row had a non-finite loss or gradient (updates "
                "skipped). Lower train.lr, check the model's dtype, or raise train.max_bad_steps."
            )
        samples_out = [
            {
                "step": self.step,
                "problem_id": g.problem_id,
                "answer": g.answer,
                "response": g.texts[0],
                "acc": g.acc[0],
            }
            for g in groups[: cfg.tracking.log_samples]
        ]
        return StepResult(metrics, samples_out)

    @staticmethod
    def _ds_metrics(ds: BatchStats) -> dict[str, float]:
        return {
            "train/kept_group_frac": ds.kept_group_frac,
            "train/num_gen_batches": float(ds.num_gen_batches),
            "train/groups_generated": float(ds.groups_generated),
            "train/groups_in_batch": float(ds.groups_in_batch),
            "train/carried_groups": float(ds.carried_over),
            "train/carried_age_mean": ds.mean_age,
            "train/samples_per_kept": ds.samples_per_kept if ds.groups_kept else 0.0,
            "train/hit_gen_cap": float(ds.hit_cap),
            "train/dropped_groups": float(ds.dropped),
        }

    # -- checkpoints -------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step_N`` atomically (tmp dir + rename) and keep the last K."""
        root = self.run_dir / "checkpoints"
        final = root / f"step_{self.step:06d}"
        tmp = root / f".tmp-step_{self.step:06d}"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        barrier(self.world)
        # Each rank's optimizer state (a ZeRO partition under DeepSpeed).
        torch.save(self.engine.state_dict(), tmp / f"optimizer_rank{self.rank}.pt")
        barrier(self.world)
        weights = self.engine.full_state_dict()  # gathered from ZeRO-3 partitions (collective)
        if self.rank != 0:
            barrier(self.world)
            return final
        self.model.save_pretrained(tmp / "model", state_dict=weights)
        self.tokenizer.save_pretrained(tmp / "model")
        state = {
            "step": self.step,
            "bad_steps": self.bad_steps,
            "world": self.world,
            "stream": self.stream.state_dict(),
            "buffer": self.buffer.state_dict(),
            "rng": {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
            },
        }
        torch.save(state, tmp / "trainer.pt")
        (tmp / "COMPLETE").write_text(json.dumps({"step": self.step}))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in list_checkpoints(self.run_dir)[: -self.cfg.train.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        barrier(self.world)
        return final

    def load_checkpoint(self, ckpt: Path) -> None:
        from safetensors.torch import load_file

        state = torch.load(ckpt / "trainer.pt", weights_only=False)
        if state["world"] != self.world:
            raise RuntimeError(
                f"{ckpt} was written by {state['world']} rank(s); resume it with as many"
            )
        # Under ZeRO-3 each rank's optimizer state holds its partition of the fp32 weights, and
        # loading it restores the (partitioned) parameters; otherwise the weights load here.
        if not self.engine.partitioned:
            weights = {}
            for f in sorted((ckpt / "model").glob("*.safetensors")):
                weights.update(load_file(f))
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
            # Tied embeddings are saved once; anything else missing means a different model.
            if unexpected or any("lm_head" not in k for k in missing):
                raise RuntimeError(f"checkpoint {ckpt} does not match the model ({missing[:3]})")
        self.step, self.bad_steps = state["step"], state["bad_steps"]
        optim = torch.load(ckpt / f"optimizer_rank{self.rank}.pt", weights_only=False)
        self.engine.load_state_dict(optim)
        self.stream.load_state_dict(state["stream"])
        self.buffer.load_state_dict(state["buffer"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (a half-written one has no COMPLETE file)."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    return sorted(p for p in root.glob("step_*") if (p / "COMPLETE").exists())
