"""The decode step's attention by FlexAttention (``DecodeOptions(attention="flex")``).

Why: torch's flex-decoding kernel (Inductor's template, compiled with a fixed batch) is built for
one query position: it splits the key/value positions among thread blocks (flash-decoding) where
the batch would leave the GPU's processors idle, handles a kv head's group of query heads in one
block, and visits only the blocks of keys that its block mask lists. The step attends over its
whole key/value buffer with a block count it sets on the device each step (the blocks up to the
newest token's), so one graph serves a whole rollout and at most ``FLEX_BLOCK - 1`` masked
positions are read past the newest token. Unfused (eager, as on CPU) the maths is the same but
every block is visited: the additive mask alone keeps unwritten positions out.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

FLEX_BLOCK = 64  # key/value positions per block of the block mask: the kernel's tile on CUDA


def attend(q, keys, values, bias, scale: float, block_mask):
    """``decode.attend``'s result by FlexAttention: the group's query heads are its query rows (the
    decoding kernel packs them into one block), the additive mask a score modification, and
    ``block_mask`` says how many blocks of keys hold written positions (the rest are skipped;
    the mask covers the written block's tail)."""
    mask = bias.view(bias.shape[0], bias.shape[-1])  # (B, T)

    def masked(score, b, h, q_idx, kv_idx):
        return score + mask[b, kv_idx]

    return flex_attention(q, keys, values, score_mod=masked, block_mask=block_mask, scale=scale)


def block_mask(queries: int, capacity: int, device):
    """A block mask over ``capacity`` key positions for ``queries`` query rows whose count of
    blocks to visit (``kv_num_blocks``) the step sets in place."""
    count = torch.ones(1, 1, 1, dtype=torch.int32, device=device)
    order = torch.arange(capacity // FLEX_BLOCK, dtype=torch.int32, device=device)
    return BlockMask.from_kv_blocks(
        count, order.view(1, 1, 1, -1), BLOCK_SIZE=FLEX_BLOCK, seq_lengths=(queries, capacity)
    )


def blocks_to_visit(cur: torch.Tensor) -> torch.Tensor:
    """(1,) position of the newest token -> (1, 1, 1) the blocks holding positions 0 to it."""
    return (cur // FLEX_BLOCK + 1).view(1, 1, 1)
