"""Rollout backends: prompts -> G sampled completions each (DAPO section 4.1).

One interface, two backends:

- ``HFGenerator``: the project's own sampler on a transformers model (the portable default; CPU
  and GPU): each prompt prefilled once and its cache shared by its G samples, then a decode loop,
  batched, with left padding (``bench.generation`` times it against transformers ``generate``);
- ``VLLMGenerator`` (``tasks.rollout.vllm_backend``): vLLM (optional extra ``gpu``, imported
  lazily), weights synced from the trainer before each rollout.

Both return a :class:`Rollouts`: per sample the prompt and response token ids, whether the response
ended with EOS (else it was truncated at max length), the decoded text, and the sampler's log-prob
of each response token (the train/rollout mismatch of ``dapo_core.mismatch`` compares them with
the trainer's).
"""

from __future__ import annotations

import copy as copy_module
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from dapo_core.problem import Problem
from tasks.models.loading import chat_prompt
from tasks.rollout.decode import LeanDecoder
from tasks.rollout.graphs import DecodeOptions, Draw, StaticDecoder
from tasks.rollout.sampling import sampler_for


@dataclass
class Rollouts:
    """P prompts x G samples, flattened prompt-major (sample i belongs to prompt i // G)."""

    group_size: int
    prompt_ids: list[list[int]]  # (P,) token ids of each prompt, after truncation
    response_ids: list[list[int]]  # (P*G,) response ids, EOS included when finished
    finished: list[bool]  # (P*G,) True when the response ended with EOS within max length
    texts: list[str]  # (P*G,) decoded responses without special tokens
    prompts_truncated: int  # prompts cut to max_prompt_len
    # (P*G,) per response token, log pi_rollout under the temperature-scaled, unrestricted
    # distribution (what the trainer computes); None when the backend does not give them.
    logprobs: list[list[float]] | None = None

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


def left_pad(
    seqs: list[list[int]], pad: int, device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token lists -> (ids, attention mask, position ids), each (n, longest), padded on the left
    so every sequence ends at the last column; positions count real tokens from 0."""
    width = max(len(x) for x in seqs)
    ids = torch.tensor([[pad] * (width - len(x)) + list(x) for x in seqs], device=device)
    attn = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in seqs], device=device)
    return ids, attn, (attn.cumsum(-1) - 1).clamp(min=0)


def split_response(tokens: list[int], eos_ids: set[int], pad_id: int) -> tuple[list[int], bool]:
    """Generated ids -> (response up to and including the first EOS, finished?)."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: i + 1], True
    # No EOS: trailing pads can only be padding after another sequence finished; keep real tokens.
    while tokens and tokens[-1] == pad_id and pad_id not in eos_ids:
        tokens = tokens[:-1]
    return tokens, False


class _GrowingLayer(DynamicLayer):
    """A KV-cache layer preallocated to its final length: each decode step writes its keys and
    values in place and attention sees a view of the filled part. ``DynamicLayer`` concatenates
    instead, copying the whole cache every step (a third of CPU decode time at 64 tokens)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
        super().__init__()
        self.lazy_initialization(keys, values)
        shape = (*keys.shape[:2], capacity, keys.shape[-1])
        self._k, self._v = keys.new_empty(shape), values.new_empty(shape)
        self.length = 0
        self.update(keys, values)

    def update(self, key_states, value_states, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        self._k[..., self.length : end, :] = key_states
        self._v[..., self.length : end, :] = value_states
        self.length = end
        self.keys, self.values = self._k[..., :end, :], self._v[..., :end, :]
        return self.keys, self.values


class HFGenerator:
    """Sampling with a transformers causal LM: each prompt is prefilled once and its KV cache
    repeated for the G samples (``generate(num_return_sequences=G)`` would run the prompt G times),
    then a plain decode loop with temperature / top-p sampling and left padding.

    ``min_new_tokens`` suppresses EOS before that many tokens (benchmarks use it to fix lengths).
    Decode steps use ``tasks.rollout.decode.LeanDecoder`` where the architecture allows
    (``lean=False`` forces the generic transformers forward). There, once half of the sequences
    still decoded have finished (``COMPACT_AT``), they are dropped from the batch and its
    key/value buffers (``compact``), so the tail of long responses does not pay for the finished
    short ones. Each step draws one uniform per sequence of the whole batch, finished or not, so
    compaction changes no sample: the same seed gives the same rollouts with or without it.
    """

    # Share of the decoded batch that must have finished before it is compacted: each compaction
    # copies the key/value buffers once, so halving the batch at most log2(B) times bounds the cost.
    COMPACT_AT = 0.5
    # Tokens between checks of "all finished?" (a host synchronisation) per device type: on a GPU
    # each check stalls the launch queue; decoding up to 7 tokens of pads past the end costs less.
    CHECK_EVERY = {"cuda": 8}
    # The CUDA-graph decoder's buffers are kept between calls (with its graphs) while they hold at
    # most this share of the GPU's memory.
    KEEP_FRACTION = 0.125

    def __init__(
        self,
        model,
        tokenizer,
        max_prompt_len: int,
        batch_size: int = 256,
        min_new_tokens: int = 0,
        lean: bool = True,
        compact: bool = True,
        graphs: bool | None = None,
        decode_options: DecodeOptions | None = None,
        sampler: str = "auto",
        draw_in_graphs: bool | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.max_prompt_len = max_prompt_len
        self.batch_size = batch_size  # sequences per decode batch (P_chunk * n)
        self.min_new_tokens = min_new_tokens
        self.lean = lean  # tasks.rollout.decode.LeanDecoder where the architecture allows
        self.compact = compact  # drop finished sequences from the lean decoder's batch
        # CUDA-graph decode (tasks.rollout.graphs); None: on CUDA, where the lean step applies.
        self.graphs = graphs
        self.decode_options = decode_options  # how the CUDA-graph step computes (graphs.py)
        self.sampler = sampler  # tasks.rollout.sampling.SAMPLERS, or auto (by device)
        # Sampling recorded in the CUDA graphs with the step (StaticDecoder.begin); None: where
        # graphs are captured.
        self.draw_in_graphs = draw_in_graphs
        self._static: StaticDecoder | None = None  # kept across calls with its graphs
        eos = model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {e for e in eos + [tokenizer.eos_token_id] if e is not None}

    @classmethod
    def with_weights(cls, model, tokenizer, max_prompt_len: int, dtype: torch.dtype, **kwargs):
        """A generator that samples from a copy of ``model`` in ``dtype``, refreshed in place by
        :meth:`sync_weights` (the trainer calls it before each rollout)."""
        return cls(rollout_copy(model, dtype), tokenizer, max_prompt_len, **kwargs)

    @torch.no_grad()
    def sync_weights(self, model) -> None:
        """Copy ``model``'s current parameters into the sampling copy, cast, in place (the copy's
        storage never moves); nothing to do when the generator samples from ``model`` itself."""
        if self.model is model:
            return
        source = dict(model.named_parameters())
        for name, param in self.model.named_parameters():
            param.copy_(source[name])

    def _decoder(self, keys, values, prompt_attn, max_new_tokens):
        """An object whose ``step(tokens (B,), positions (B, 1))`` gives the (B, V) next-token
        logits, one call per token; the lean decoders also have ``keep(rows)``."""
        B = len(prompt_attn)
        lean = self.lean and LeanDecoder.supports(self.model)
        cuda = self.model.device.type == "cuda"
        if lean and (cuda if self.graphs is None else self.graphs):
            decoder = self._static_decoder(B, self.max_prompt_len + max_new_tokens, cuda)
            decoder.load(keys, values, prompt_attn)
            return decoder
        # Generated positions are all attended to: a finished sample's later tokens are pads that
        # nothing reads.
        attn = torch.cat([prompt_attn, prompt_attn.new_ones(B, max_new_tokens)], dim=1)
        if lean:
            return LeanDecoder(self.model, keys, values, attn, max_new_tokens)
        cache = DynamicCache()  # the generic forward, with keys and values written in place
        cache.layers = [
            _GrowingLayer(k, v, k.shape[-2] + max_new_tokens)
            for k, v in zip(keys, values, strict=True)
        ]

        def step(tokens, positions):
            length = cache.get_seq_length() + 1
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=attn[:, :length],
                position_ids=positions,
                cache=cache,
                use_cache=True,
            )
            return out.logits[:, -1]

        return types.SimpleNamespace(step=step)  # no keep(): the batch stays whole

    def _static_decoder(self, rows: int, capacity: int, capture: bool) -> StaticDecoder:
        """The kept fixed-shape decoder if it serves this call, else a new one large enough for
        this call and the last (so alternating rollouts and validations do not rebuild it)."""
        old = self._static
        if old is not None and old.fits(self.model, rows, capacity):
            return old
        if old is not None and old.model is self.model:
            rows, capacity = max(rows, old.rows), max(capacity, old.capacity)
        self._static = None  # free the old buffers and graphs first
        self._static = StaticDecoder(self.model, rows, capacity, capture, self.decode_options)
        return self._static

    def _release_if_large(self) -> None:
        """Drop the kept decoder when its buffers hold over ``KEEP_FRACTION`` of the GPU: the
        update that follows a rollout needs the memory more than the next rollout needs the
        graphs (they are captured again)."""
        decoder = self._static
        if decoder is None or self.model.device.type != "cuda":
            return
        total = torch.cuda.get_device_properties(self.model.device).total_memory
        if decoder.nbytes > self.KEEP_FRACTION * total:
            self._static = None

    @torch.no_grad()
    def generate(
        self, prompts: list[str], n: int, temperature: float, top_p: float, max_new_tokens: int
    ) -> Rollouts:
        prompt_ids, n_trunc = encode_prompts(self.tokenizer, prompts, self.max_prompt_len)
        was_training = self.model.training
        self.model.eval()
        responses: list[list[int]] = []
        finished: list[bool] = []
        logprobs: list[list[float]] = []
        per_call = max(1, self.batch_size // n)
        for start in range(0, len(prompt_ids), per_call):
            chunk = prompt_ids[start : start + per_call]
            r, f, lp = self._sample(chunk, n, temperature, top_p, max_new_tokens)
            responses += r
            finished += f
            logprobs += lp
        self.model.train(was_training)
        self._release_if_large()
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        return Rollouts(n, prompt_ids, responses, finished, texts, n_trunc, logprobs)

    def _sample(self, prompt_ids, n, temperature, top_p, max_new_tokens):
        device = self.model.device
        pad = self.tokenizer.pad_token_id
        ids, attn, pos = left_pad(prompt_ids, pad, device)
        out = self.model(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1
        )
        # The G samples share the prompt's keys and values, copied once into buffers that hold
        # the whole rollout.
        keys = [layer.keys.repeat_interleave(n, dim=0) for layer in out.cache.layers]
        values = [layer.values.repeat_interleave(n, dim=0) for layer in out.cache.layers]
        logits = out.logits[:, -1].repeat_interleave(n, dim=0)  # (P*n, V)
        decoder = self._decoder(keys, values, attn.repeat_interleave(n, dim=0), max_new_tokens)
        next_pos = pos[:, -1:].repeat_interleave(n, dim=0) + 1  # (P*n, 1)
        in_graphs = isinstance(decoder, StaticDecoder) and (
            decoder.pool is not None if self.draw_in_graphs is None else self.draw_in_graphs
        )
        if in_graphs:
            tokens, logps = self._draw_in_graphs(
                decoder, logits, next_pos, temperature, top_p, max_new_tokens
            )
        else:
            tokens, logps = self._draw_step_by_step(
                decoder, logits, next_pos, temperature, top_p, max_new_tokens
            )
        pairs = [split_response(g, self.eos_ids, pad) for g in tokens.tolist()]
        step_logps = logps.tolist()
        logprobs = [lp[: len(r)] for (r, _), lp in zip(pairs, step_logps, strict=True)]
        return [p[0] for p in pairs], [p[1] for p in pairs], logprobs

    def _draw_step_by_step(self, decoder, logits, next_pos, temperature, top_p, max_new_tokens):
        """(tokens, log-probs) (N, steps) drawn one step at a time from ``decoder``'s logits."""
        device, pad = logits.device, self.tokenizer.pad_token_id
        can_compact = self.compact and hasattr(decoder, "keep")
        check_every = self.CHECK_EVERY.get(device.type, 1)
        eos = torch.tensor(sorted(self.eos_ids), device=device)
        sample = sampler_for(self.sampler, device)
        N = len(logits)
        tokens = torch.full((N, max_new_tokens), pad, dtype=torch.long, device=device)
        logps = torch.zeros(N, max_new_tokens, device=device)
        live = torch.arange(N, device=device)  # row of each sequence still decoded
        done = torch.zeros(N, dtype=torch.bool, device=device)  # over the live rows
        for t in range(max_new_tokens):
            if t < self.min_new_tokens:
                logits[:, eos] = float("-inf")
            uniforms = torch.rand(N, 1, device=device)[live]  # the whole batch's draw, always
            nxt, lp = sample(logits, temperature, top_p, uniforms)
            nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
            tokens[live, t] = nxt
            logps[live, t] = lp.float()
            done |= torch.isin(nxt, eos)
            if t == max_new_tokens - 1:
                break
            if (t + 1) % check_every == 0:  # a check step: the one host synchronisation
                finished = int(done.sum())
                if finished == len(done):
                    break
                if can_compact and finished >= self.COMPACT_AT * len(done):
                    keep = (~done).nonzero().squeeze(1)
                    decoder.keep(keep)
                    live, nxt, next_pos, done = live[keep], nxt[keep], next_pos[keep], done[keep]
            logits = decoder.step(nxt, next_pos)
            next_pos = next_pos + 1
        return tokens[:, : t + 1], logps[:, : t + 1]

    def _draw_in_graphs(self, decoder, logits, next_pos, temperature, top_p, max_new_tokens):
        """``_draw_step_by_step``'s tokens from the same uniforms, each step one replay of a graph
        that decodes and draws; the host only checks every ``CHECK_EVERY`` tokens whether all
        sequences finished, and compacts at the same points."""
        N, device = len(logits), logits.device
        eos = tuple(sorted(self.eos_ids))
        draw = Draw(self.sampler, temperature, top_p, eos, self.tokenizer.pad_token_id,
                    self.min_new_tokens)  # fmt: skip
        check_every = self.CHECK_EVERY.get(device.type, 1)

        def uniforms(start: int) -> torch.Tensor:
            # The draws of the steps up to the next check, made at once: as many numbers as the
            # step-by-step loop draws however the rollout ends, and the same ones (CPU).
            return torch.rand(min(check_every, max_new_tokens - start), N, device=device)

        decoder.begin(logits, next_pos, uniforms(0), draw, max_new_tokens)
        live, drawn = N, 1  # rows still decoded, tokens drawn
        while drawn < max_new_tokens:
            if drawn % check_every == 0:  # a check step: the one host synchronisation
                finished = int(decoder.done[:live].sum())
                if finished == live:
                    break
                if self.compact and finished >= self.COMPACT_AT * live:
                    keep = (~decoder.done[:live]).nonzero().squeeze(1)
                    decoder.keep(keep)
                    live = len(keep)
                decoder.add_uniforms(drawn, uniforms(drawn))
            decoder.advance(live)
            drawn += 1
        return decoder.results(N, drawn)


def rollout_copy(model, dtype: torch.dtype):
    """An inference copy of ``model`` in ``dtype`` on its device: built empty (no fp32 copy on the
    way), its weights cast from the model's, its buffers (the rotary table) copied as they are."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # its own config: from_config would share (and change) the model's
        copy = AutoModelForCausalLM.from_config(copy_module.deepcopy(model.config), dtype=dtype)
    copy = copy.to_empty(device=model.device)
    copy.tie_weights()
    copy.load_state_dict(model.state_dict())
    buffers = dict(model.named_buffers())
    for name, buf in copy.named_buffers():
        buf.data = buffers[name].detach().clone()
    copy.generation_config = model.generation_config
    return copy.eval().requires_grad_(False)


def sample_problems(
    generator: Generator,
    tokenizer,
    problems: list[Problem],
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int,
    batch_prompts: int = 16,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[list[str], list[int], list[bool]]:
    """(texts, lengths, finished) of ``n`` responses per problem, in problem order, seeded with
    ``seed`` and without shifting the caller's RNG stream (a training run's, say).
    ``on_batch(done)`` is called after each batch of prompts (progress bars)."""
    texts: list[str] = []
    lengths: list[int] = []
    finished: list[bool] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(problems), batch_prompts):
            chunk = problems[start : start + batch_prompts]
            prompts = [chat_prompt(tokenizer, p.prompt) for p in chunk]
            out = generator.generate(prompts, n, temperature, top_p, max_new_tokens)
            texts += out.texts
            lengths += out.lengths
            finished += out.finished
            if on_batch:
                on_batch(start + len(chunk))
    return texts, lengths, finished
