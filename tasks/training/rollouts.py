"""The rollout half of a step (DAPO Algorithm 1, lines 3-8): prompts from the problem stream, G
sampled responses each, scored by the rule-based reward, kept or carried by dynamic sampling.

``RolloutCollector`` owns what the rollout side keeps across steps (the problem stream, the carried
groups) and writes it into checkpoints through the trainer's ``state_dict``. Under data
parallelism every rank takes the same prompts, generates its slice, and the groups are
all-gathered, so every rank builds the same batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from dapo_core.config import Config
from dapo_core.problem import Problem
from dapo_core.sampling import BatchStats, GroupAccumulator, fill_batch
from tasks.models.loading import chat_prompt
from tasks.rollout.generators import Generator
from tasks.training.batches import Group, ProblemStream
from tasks.training.distributed import all_gather_objects
from tasks.training.records import RolloutLog

Correct = Callable[[str, str], bool]  # (response, answer) -> whether the answer is right


def _as_tensors(logprobs: list) -> list[torch.Tensor]:
    """Per-response log-probs as float32 tensors (4 bytes a token where a Python float takes 24,
    in the carried buffer, its checkpoints and the ranks' all-gather)."""
    return [torch.as_tensor(lp, dtype=torch.float32) for lp in logprobs]


def _spread(group: Group) -> list[bool]:
    """What dynamic sampling reads of a group: its correctness (a group is kept when it holds
    both values); with a learned reward, whether each score is above the group's lowest (kept
    when the scores are not all equal: their advantages are not all 0)."""
    if group.scores is None:
        return group.acc
    low = min(group.scores)
    return [s > low for s in group.scores]


class RolloutCollector:
    def __init__(
        self,
        cfg: Config,
        tokenizer,
        generator: Generator,
        problems: list[Problem],
        is_correct: Correct,
        rank: int = 0,
        world: int = 1,
        autocast: tuple[str, bool] = ("cpu", False),
        reward_model: Callable[[str, list[str]], list[float]] | None = None,
    ):
        self.cfg, self.tokenizer, self.generator = cfg, tokenizer, generator
        self.reward_model = reward_model  # scores responses under rollout.reward=model
        self.is_correct = is_correct
        self.rank, self.world = rank, world
        self.autocast = autocast  # (device type, whether to sample under bf16 autocast)
        self.stream = ProblemStream(problems, cfg.train.seed)
        self.buffer = GroupAccumulator()
        self.version = None  # the sampling policy's version when not the step's (a rollout process)

    def sampler(self, policy) -> Generator:
        """The generator, holding the policy's current weights: an inference engine (vLLM) or a
        sampling copy (``rollout.weights``) is synced first. Rollouts and validation call it."""
        if hasattr(self.generator, "sync_weights"):
            self.generator.sync_weights(policy)
        return self.generator

    def collect(self, policy, step: int) -> tuple[list[Group], BatchStats, RolloutLog]:
        """The step's groups by dynamic sampling (surplus groups carried to the next step), its
        dynamic-sampling statistics and the log of everything generated."""
        self.sampler(policy)
        log, cfg = RolloutLog(), self.cfg
        groups, stats = fill_batch(
            lambda n: self.generate(n, log, step),
            self.buffer,
            step=step,
            prompt_batch=cfg.train.prompt_batch,
            gen_batch=cfg.train.gen_batch,
            max_gen_batches=cfg.algo.max_gen_batches,
            on_gen_cap=cfg.algo.on_gen_cap,
            dynamic_sampling=cfg.algo.dynamic_sampling,
            sized=cfg.algo.size_gen_batches,
        )
        return groups, stats, log

    def generate(self, n: int, log: RolloutLog, step: int = 0) -> tuple[list[Group], torch.Tensor]:
        """n prompts x G scored responses, each group stamped with ``step``, and their (n, G)
        correctness; every rank returns the same list."""
        problems = self.stream.take(n)  # the same prompts on every rank
        mine = problems[self.rank :: self.world]
        t0 = time.perf_counter()
        groups = self._sampled(mine, log, step) if mine else []
        log.gen_time += time.perf_counter() - t0
        if self.world > 1:  # interleave the shards back into the prompt order
            shards = all_gather_objects(groups, self.world)
            groups = [shards[i % self.world][i // self.world] for i in range(n)]
        log.add(groups)
        return groups, torch.tensor([_spread(g) for g in groups], dtype=torch.bool)

    def _sampled(self, problems: list[Problem], log: RolloutLog, step: int) -> list[Group]:
        """This rank's groups: G responses to each problem, scored."""
        r, G = self.cfg.rollout, self.cfg.rollout.group_size
        prompts = [chat_prompt(self.tokenizer, p.prompt) for p in problems]
        device, bf16 = self.autocast
        with torch.autocast(device, torch.bfloat16, enabled=bf16):
            out = self.generator.generate(prompts, G, r.temperature, r.top_p, r.max_response_len)
        log.prompts_truncated += out.prompts_truncated
        groups = []
        for i, p in enumerate(problems):
            sl = slice(i * G, (i + 1) * G)
            acc = [self.is_correct(t, p.answer) for t in out.texts[sl]]
            logprobs = _as_tensors(out.logprobs[sl]) if out.logprobs is not None else None
            scores = None
            if self.reward_model is not None:
                scores = self.reward_model(p.prompt, out.texts[sl])
            groups.append(
                Group(
                    problem_id=p.id,
                    answer=p.answer,
                    prompt_ids=out.prompt_ids[i],
                    response_ids=out.response_ids[sl],
                    finished=out.finished[sl],
                    acc=acc,
                    texts=out.texts[sl],
                    logprobs=logprobs,
                    step=step,
                    scores=scores,
                    version=step if self.version is None else self.version,
                )
            )
        return groups

    def state_dict(self) -> dict:
        return {"stream": self.stream.state_dict(), "buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["stream"])
        self.buffer.load_state_dict(state["buffer"])


def bf16_autocast(cfg: Config, device: torch.device) -> bool:
    """Training and its sampling run under bf16 autocast on CUDA unless ``model.dtype`` says
    otherwise."""
    return device.type == "cuda" and cfg.model.dtype in ("auto", "bfloat16")


def rule_correctness(response: str, answer: str) -> float:
    """The rule-based reward's verdict (Eq. 7): 1.0 when the response's answer is right."""
    from dapo_core.reward import score

    return score(response, answer).acc


def make_collector(
    cfg: Config,
    tokenizer,
    generator: Generator,
    problems: list[Problem],
    device: torch.device,
    is_correct: Correct | None = None,
    rank: int = 0,
    world: int = 1,
) -> RolloutCollector:
    """The rollout side as training builds it, in the trainer or in its rollout process:
    ``is_correct`` or the rule-based reward (Eq. 7), the reward model under
    ``rollout.reward: model`` (issue 27), bf16 autocast as the trainer's."""
    learned = None
    if cfg.rollout.reward == "model":
        from tasks.models.learned_reward import LearnedReward

        r = cfg.rollout
        learned = LearnedReward(
            r.reward_model, tokenizer, device, r.max_prompt_len + r.max_response_len
        )
    correct = is_correct or rule_correctness
    autocast = (device.type, bf16_autocast(cfg, device))
    return RolloutCollector(
        cfg, tokenizer, generator, problems, correct, rank, world, autocast, learned
    )
