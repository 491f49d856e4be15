"""The training forward pass: log-probabilities and entropies of response tokens under the policy.

In a micro-batch each distinct prompt is forwarded once and its keys and values are shared by the
samples that continue it (whole sequences under gradient checkpointing, where transformers drops
the cache); only response positions are projected onto the vocabulary, in chunks
(``dapo_core.logprobs``), so the (tokens x vocabulary) logits never exist in full.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from dapo_core.logprobs import linear_logprobs, token_logprobs
from tasks.rollout.generators import left_pad
from tasks.training.batches import Sample, distinct_prompts
from tasks.training.compiled import training_forward, whole_sequences

LOGITS_BUDGET = 2**26  # logits per chunk (256 MB in fp32): ~440 rows of a 151k vocabulary
# The fused head keeps no float32 copy of a chunk: 512 MB of bf16 logits, ~1,770 rows of 151k.
FUSED_LOGITS_BUDGET = 2**28
FUSED_HEAD = True  # on CUDA, a plain linear head runs fused (bench.mfu --head switches it)
# The fused head keeps a micro-batch's logits for backward (instead of recomputing them) when
# they take at most this share of the GPU memory not in use: one matrix product less per chunk,
# the logits' memory more (rows x V x 2 bytes in bf16: 8.5 GB for 28k rows of a 151k vocabulary).
KEEP_LOGITS_SHARE = 0.25


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``; to CUDA through pinned memory without blocking: a plain copy
    from pageable memory waits for every kernel queued before it, and the host would stop
    queueing the micro-batch's work."""
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _padded_ids(rows: list[list[int]], pad: int) -> torch.Tensor:
    """(b, max length) token ids, right-padded: each row through numpy, then one padding op.
    ``torch.tensor`` of a list converts element by element, several times slower: milliseconds
    per micro-batch, during which the GPU waits for the update's first kernel."""
    tensors = [torch.from_numpy(np.array(r, dtype=np.int64)) for r in rows]
    return torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True, padding_value=pad)


# Response columns a micro-batch is given at least. The shared-prompt forward runs the decoder
# twice (prompts, then responses) when R > 1 and once when R = 1; under ZeRO-3 every decoder call
# gathers parameters collectively, so a rank whose micro-batch holds only one-token responses (or
# the one-token padding sample, ``PolicyUpdater.dummy``) would fall out of step with a rank whose
# responses are longer and abort the run. A masked second column keeps every micro-batch on the
# two-pass path; its state is computed and never read.
MIN_RESPONSE_COLUMNS = 2


def _response_mask(batch: list[Sample]) -> torch.Tensor:
    """(b, R) bool on the host: True at each sample's response positions; R is the longest
    response, at least ``MIN_RESPONSE_COLUMNS``."""
    lens = torch.tensor([s.response_len for s in batch])
    width = max(int(lens.max()), MIN_RESPONSE_COLUMNS)
    return torch.arange(width)[None, :] < lens[:, None]


class PolicyForward:
    """``forward(batch) -> (logp, entropy, mask)``, each (b, R), for a list of samples."""

    def __init__(
        self,
        model: torch.nn.Module,
        pad_id: int,
        temperature: float,
        autocast: bool,
        before_forward: Callable[[], None] = lambda: None,
    ):
        self.model, self.pad_id, self.temperature = model, pad_id, temperature
        self.autocast, self.before_forward = autocast, before_forward
        self.device = next(model.parameters()).device
        # From the config: under ZeRO-3 a weight's shape is empty outside a gather.
        self.vocab_size = model.config.vocab_size
        self.logits_kept = False  # the last fused head with gradients kept its logits (bench.mfu)

    def __call__(self, batch: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(b, R) response log-probs (differentiable), (b, R) entropies, (b, R) response mask."""
        dev = self.device
        states, resp_ids, mask = self.hidden_states(batch)
        R = resp_ids.shape[1]
        rows, cols = (to_device(i, dev) for i in _response_mask(batch).nonzero(as_tuple=True))
        head, hidden, targets = (
            self.model.get_output_embeddings(),
            states[rows, cols],
            resp_ids[rows, cols],
        )
        if self._fusable(head):
            chunk = max(256, FUSED_LOGITS_BUDGET // self.vocab_size)
            keep = self._room_for_logits(
                len(targets), 2 if self.autocast else head.weight.element_size()
            )
            if torch.is_grad_enabled():
                self.logits_kept = keep
            logp_flat, ent_flat = linear_logprobs(
                hidden, head.weight, targets, self.temperature, chunk, keep_logits=keep
            )
        else:
            chunk = max(256, LOGITS_BUDGET // self.vocab_size)
            logp_flat, ent_flat = token_logprobs(hidden, head, targets, self.temperature, chunk)
        logp = torch.zeros(len(batch), R, device=dev, dtype=logp_flat.dtype)
        logp = logp.index_put((rows, cols), logp_flat)  # differentiable scatter
        ent = torch.zeros(len(batch), R, device=dev)
        ent[rows, cols] = ent_flat
        return logp, ent, mask.float()

    def _room_for_logits(self, rows: int, itemsize: int) -> bool:
        """Whether ``rows`` x V logits fit in ``KEEP_LOGITS_SHARE`` of the GPU memory free now
        (the driver's free memory plus what torch's allocator holds unused). The choice moves
        speed and memory only: kept logits are bit for bit the ones backward would recompute."""
        if not torch.is_grad_enabled() or self.device.type != "cuda":
            return False
        free, _ = torch.cuda.mem_get_info(self.device)
        unused = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return rows * self.vocab_size * itemsize <= KEEP_LOGITS_SHARE * (free + unused)

    def _fusable(self, head: torch.nn.Module) -> bool:
        """On CUDA, a bias-free linear head whose weight is whole (not a ZeRO-3 partition, which
        only a module call gathers) runs fused (``dapo_core.logprobs.linear_logprobs``: fewer,
        larger kernels and no recomputed log-softmax). CPU keeps the chunked module call."""
        w = getattr(head, "weight", None)
        plain = isinstance(head, torch.nn.Linear) and head.bias is None
        return FUSED_HEAD and self.device.type == "cuda" and plain and not hasattr(w, "ds_id")

    def hidden_states(self, batch: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(b, R, H) the hidden states that predict each response token (the state of the
        prompt and the response before it: what a critic's head reads too), (b, R) the
        response ids, (b, R) the bool response mask."""
        pad, dev = self.pad_id, self.device
        mask = to_device(_response_mask(batch), dev)  # (b, R)
        resp_ids = _padded_ids([s.input_ids[s.prompt_len :] for s in batch], pad)
        resp_ids = torch.nn.functional.pad(
            resp_ids, (0, mask.shape[1] - resp_ids.shape[1]), value=pad
        )
        resp_ids = to_device(resp_ids, dev)
        R = resp_ids.shape[1]
        self.before_forward()
        with torch.autocast(dev.type, torch.bfloat16, enabled=self.autocast), training_forward():
            if whole_sequences(self.model):  # no KV cache: checkpointing or compiled layers
                states = self._whole_sequence_states(batch, R)
            else:
                states = self._shared_prompt_states(batch, resp_ids, mask)
        return states, resp_ids, mask

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
        prompt_ids, prompt_attn, prompt_pos = left_pad(prompts, self.pad_id, dev)
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
        R = resp_ids.shape[1]  # at least 2 (MIN_RESPONSE_COLUMNS): the same two passes always
        cache = prefix.cache
        cache.batch_select_indices(sel)  # differentiable gather: one copy per sample
        hidden = decoder(
            input_ids=resp_ids[:, :-1],
            attention_mask=torch.cat([prompt_attn[sel], mask[:, :-1].long()], dim=1),
            position_ids=prompt_attn.sum(-1)[sel, None] + torch.arange(R - 1, device=dev),
            cache=cache,
            use_cache=True,
        ).last_hidden_state  # (b, R - 1, H)
        return torch.cat([states, hidden], dim=1)

    def _whole_sequence_states(self, batch: list[Sample], R: int) -> torch.Tensor:
        """(b, R, H) hidden states that predict each response token, each sample run whole
        (prompt + response, right-padded). Used under gradient checkpointing: transformers drops
        the KV cache then, and the shared-prompt forward needs it."""
        pad, dev = self.pad_id, self.device
        ids = _padded_ids([s.input_ids for s in batch], pad)
        width = ids.shape[1]
        lens = torch.tensor([len(s.input_ids) for s in batch])
        attn = (torch.arange(width)[None, :] < lens[:, None]).long()
        hidden = self.model.get_decoder()(
            input_ids=to_device(ids, dev), attention_mask=to_device(attn, dev), use_cache=False
        ).last_hidden_state  # (b, width, H); no cache: nothing reads it (and it costs copies)
        # Response token j of sample i is predicted by the state at prompt_len_i - 1 + j.
        starts = to_device(torch.tensor([s.prompt_len - 1 for s in batch]), dev)
        where = (starts[:, None] + torch.arange(R, device=dev)).clamp(max=width - 1)  # (b, R)
        return hidden.gather(1, where[..., None].expand(-1, -1, hidden.shape[-1]))
