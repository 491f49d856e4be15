"""The rollout sampler a config asks for (``rollout.backend``, ``rollout.weights``): one place that
builds it, for training, its rollout process, evaluation and preference mining."""

from __future__ import annotations

import logging

import torch

from dapo_core.config import Config
from tasks.rollout.generators import HFGenerator
from tasks.rollout.graphs import DECODE_STEPS, DecodeOptions
from tasks.rollout.vllm_backend import VLLMGenerator
from tasks.runtime import env_world_size

log = logging.getLogger(__name__)


def make_generator(cfg: Config, model, tokenizer, model_path: str):
    if cfg.rollout.backend == "vllm":
        return VLLMGenerator(
            model_path,
            tokenizer,
            cfg.rollout.max_prompt_len,
            cfg.rollout.max_prompt_len + cfg.rollout.max_response_len,
            gpu_memory=cfg.rollout.vllm_gpu_memory,
        )
    dtype = rollout_dtype(cfg, model)
    options = compile_options(cfg)
    if dtype is None:
        return HFGenerator(model, tokenizer, cfg.rollout.max_prompt_len, **options)
    return HFGenerator.with_weights(model, tokenizer, cfg.rollout.max_prompt_len, dtype, **options)


def compile_options(cfg: Config) -> dict:
    """``model.compile: none`` keeps the sampler eager too: the CUDA decode step uncompiled and
    the exact sampler (a short evaluation then pays no compilation); otherwise the step
    ``rollout.decode_step`` names and each device's sampler (``HFGenerator``)."""
    if cfg.model.compile != "none":
        return {"decode_options": DECODE_STEPS[cfg.rollout.decode_step]}
    return {"decode_options": DecodeOptions(compiled=False), "sampler": "exact"}


def rollout_dtype(cfg: Config, model) -> torch.dtype | None:
    """The dtype of the sampler's own copy of the weights (``rollout.weights``), or None to
    sample from the policy itself: under ZeRO-3 on several ranks the policy's weights exist only
    in shards."""
    weights, current = cfg.rollout.weights, next(model.parameters()).dtype
    sharded = cfg.train.zero_stage == 3 and env_world_size() > 1
    if weights == "bfloat16" and sharded:
        log.warning("rollout.weights=bfloat16 is ignored under ZeRO-3: sampling from the policy")
    if weights == "policy" or sharded or current == torch.bfloat16:
        return None
    # auto: not under DeepSpeed either, whose bf16 mode casts the policy itself to bf16 later.
    if weights == "auto" and (
        model.device.type != "cuda" or current != torch.float32 or env_world_size() > 1
    ):
        return None
    return torch.bfloat16
