"""Rollout backends: prompts -> G sampled completions each (DAPO section 4.1).

One interface, two backends:

- ``HFGenerator``: transformers ``generate`` (the portable default; CPU and GPU), batched, with KV
  cache and left padding;
- ``VLLMGenerator``: vLLM (optional extra ``gpu``, imported lazily), weights synced from the trainer
  before each rollout.

Both return a :class:`Rollouts`: per sample the prompt and response token ids, whether the response
ended with EOS (else it was truncated at max length), and the decoded text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Rollouts:
    """P prompts x G samples, flattened prompt-major (sample i belongs to prompt i // G)."""

    group_size: int
    prompt_ids: list[list[int]]  # (P,) token ids of each prompt, after truncation
    response_ids: list[list[int]]  # (P*G,) response ids, EOS included when finished
    finished: list[bool]  # (P*G,) True when the response ended with EOS within max length
    texts: list[str]  # (P*G,) decoded responses without special tokens
    prompts_truncated: int  # prompts cut to max_prompt_len

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self.response_ids]


class Generator(Protocol):
    def generate(
        self, prompts: list[str], n: int, temperature: float, top_p: float, max_new_tokens: int
    ) -> Rollouts: ...


def encode_prompts(
    tokenizer, prompts: list[str], max_prompt_len: int
) -> tuple[list[list[int]], int]:
    """Token ids of chat-formatted prompts; over-long ones keep their last ``max_prompt_len`` tokens
    (the question and the generation prompt sit at the end) and are counted."""
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    truncated = sum(len(x) > max_prompt_len for x in ids)
    return [x[-max_prompt_len:] for x in ids], truncated


def split_response(tokens: list[int], eos_ids: set[int], pad_id: int) -> tuple[list[int], bool]:
    """Generated ids -> (response up to and including the first EOS, finished?)."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: i + 1], True
    # No EOS: trailing pads can only be padding after another sequence finished; keep real tokens.
    while tokens and tokens[-1] == pad_id and pad_id not in eos_ids:
        tokens = tokens[:-1]
    return tokens, False


class HFGenerator:
    """Sampling with transformers ``generate``: left padding, KV cache, n samples per prompt."""

    def __init__(self, model, tokenizer, max_prompt_len: int, batch_size: int = 256):
        self.model = model
        self.tokenizer = tokenizer
        self.max_prompt_len = max_prompt_len
        self.batch_size = batch_size  # sequences per generate call (P_chunk * n)
        eos = model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {e for e in eos + [tokenizer.eos_token_id] if e is not None}

    @torch.no_grad()
    def generate(
        self, prompts: list[str], n: int, temperature: float, top_p: float, max_new_tokens: int
    ) -> Rollouts:
        prompt_ids, n_trunc = encode_prompts(self.tokenizer, prompts, self.max_prompt_len)
        was_training = self.model.training
        self.model.eval()
        responses: list[list[int]] = []
        finished: list[bool] = []
        per_call = max(1, self.batch_size // n)
        for start in range(0, len(prompt_ids), per_call):
            chunk = prompt_ids[start : start + per_call]
            r, f = self._generate_chunk(chunk, n, temperature, top_p, max_new_tokens)
            responses += r
            finished += f
        self.model.train(was_training)
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        return Rollouts(n, prompt_ids, responses, finished, texts, n_trunc)

    def _generate_chunk(self, prompt_ids, n, temperature, top_p, max_new_tokens):
        device = self.model.device
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompt_ids)
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids], device=device)
        attention = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=device
        )
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=0,  # the paper samples from the full (nucleus) distribution
            max_new_tokens=max_new_tokens,
            num_return_sequences=n,
            pad_token_id=pad,
            eos_token_id=sorted(self.eos_ids),
        )
        generated = out[:, width:].tolist()
        pairs = [split_response(g, self.eos_ids, pad) for g in generated]
        return [p[0] for p in pairs], [p[1] for p in pairs]


class VLLMGenerator:
    """vLLM sampling (GPU, optional extra ``gpu``); the trainer's weights are loaded before each
    rollout so samples come from the current policy."""

    def __init__(self, model_path: str, tokenizer, max_prompt_len: int, max_model_len: int):
        try:
            from vllm import LLM
        except ImportError:
            raise RuntimeError(
                "rollout.backend=vllm needs vLLM: pip install -e '.[gpu]' on a CUDA machine, "
                "or use rollout.backend=hf"
            ) from None
        self.llm = LLM(model=model_path, max_model_len=max_model_len, enable_prefix_caching=True)
        self.tokenizer = tokenizer
        self.max_prompt_len = max_prompt_len

    def sync_weights(self, model) -> None:
        """Load the trainer's current parameters into the vLLM engine."""
        worker_model = (
            self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model  # vLLM V0
            if hasattr(self.llm.llm_engine, "model_executor")
            else None
        )
        if worker_model is not None:
            worker_model.load_weights(model.state_dict().items())
        else:  # vLLM V1: collective RPC into the workers
            state = {k: v.detach() for k, v in model.state_dict().items()}
            self.llm.collective_rpc(
                lambda self_: self_.model_runner.model.load_weights(state.items())
            )

    def generate(
        self, prompts: list[str], n: int, temperature: float, top_p: float, max_new_tokens: int
    ) -> Rollouts:
        from vllm import SamplingParams

        prompt_ids, n_trunc = encode_prompts(self.tokenizer, prompts, self.max_prompt_len)
        params = SamplingParams(
            n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens
        )
        outs = self.llm.generate(
            [{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False
        )
        responses, finished, texts = [], [], []
        for out in outs:
            for c in out.outputs:
                responses.append(list(c.token_ids))
                finished.append(c.finish_reason == "stop")
                texts.append(c.text)
        return Rollouts(n, prompt_ids, responses, finished, texts, n_trunc)
