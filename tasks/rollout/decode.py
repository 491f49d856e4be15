"""A lean one-token decode step for Llama-family causal LMs (Qwen2, Llama), used by the HF sampler.

Why: on a small model the generic transformers forward spends more time in bookkeeping and
operator dispatch than in arithmetic. Each call rebuilds the attention mask and the rotary table,
goes through the cache object and the output wrappers, and copies the key/value heads for
grouped-query attention (``python -m bench.generation`` measures the difference).

It does the same arithmetic as the model's forward, with the model's own weights and modules:
- the rotary table is computed once per rollout by the model's rotary module;
- the norms are ``F.rms_norm``, one operator instead of six;
- keys and values are written in place into buffers that hold the whole rollout;
- attention for the one query position is computed per key/value head, without repeated heads;
- on CPU, q/k/v and gate/up are fused into one matrix product each, because there every operator
  call has a fixed cost, whatever its size. The weights are concatenated once per rollout, so
  they are never stale. On GPU the copies would cost memory (~3/4 of the weights) for little gain.

A test holds its sampling log-probs to the trainer's forward. ``LeanDecoder.supports(model)``
says when it applies: unknown architectures, sliding-window attention, length-dependent rotary
scaling, and parameters partitioned by DeepSpeed ZeRO-3 use the generic forward instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
STATIC_ROPE_TYPES = ("default", "linear", "llama3")  # frequencies independent of sequence length


def _rope_type(cfg) -> str:
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return params.get("rope_type", params.get("type", "default"))


def split_rotated(qkv: torch.Tensor, cos, sin):
    """(B, kv heads, g + 2, d) per kv head its g queries, key and value -> queries (B, kv, g, d),
    key and value (B, kv, 1, d), with rotary applied to the queries and the key at once."""
    d, group = qkv.shape[-1], qkv.shape[2] - 2
    qk = qkv[:, :, : group + 1]
    qk = qk * cos + qk.roll(d // 2, dims=-1) * sin
    return qk[:, :, :group], qk[:, :, group:], qkv[:, :, group + 1 :]


def attend(q, keys, values, bias, scale: float, how: str = "matmul"):
    """Attention of g query rows per kv head (B, kv, g, d) over (B, kv, T, d) keys and values,
    with an additive mask (B, 1, 1, T) or None. ``matmul``: scores, mask, softmax in float32 and
    the values' product as separate kernels; ``sdpa``: one fused kernel (the mask then in the
    queries' dtype)."""
    if how == "sdpa":
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=scale)
    scores = q @ keys.transpose(-1, -2) * scale  # (B, kv, g, T)
    if bias is not None:
        scores = scores + bias
    return scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype) @ values


class LeanDecoder:
    """Decodes one token per sequence against key/value buffers that hold the whole rollout.

    ``keys[l]`` and ``values[l]`` (B, kv_heads, prompt_len, head_dim) are the prefilled prompt
    cache of layer l; ``attention_mask`` (B, prompt_len + max_new_tokens) is 1 where a position may
    be attended to (0 at left padding).
    """

    FUSED_DEVICES = ("cpu",)  # where q/k/v and gate/up run as one matrix product each

    def __init__(
        self,
        model,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        attention_mask: torch.Tensor,
        max_new_tokens: int,
    ):
        self.length = keys[0].shape[-2]
        self._bind(model, self.length + max_new_tokens)
        shape = (*keys[0].shape[:2], self.length + max_new_tokens, self.head_dim)
        self.k_buf = [k.new_empty(shape) for k in keys]
        self.v_buf = [v.new_empty(shape) for v in values]
        for kb, vb, k, v in zip(self.k_buf, self.v_buf, keys, values, strict=True):
            kb[:, :, : self.length] = k
            vb[:, :, : self.length] = v
        # Additive mask, broadcast over (kv head, query head in the group); none without padding.
        self.mask_bias = None
        if not bool(attention_mask.all()):
            bias = torch.zeros_like(attention_mask, dtype=torch.float32)
            self.mask_bias = bias.masked_fill(attention_mask == 0, float("-inf"))[:, None, None]

    def _bind(self, model, capacity: int) -> None:
        """The model's shapes, its rotary table for ``capacity`` positions, the fused weights."""
        self.model, self.decoder = model, model.get_decoder()
        cfg = model.config
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        probe = self.decoder.embed_tokens.weight[:1, None]  # dtype and device of the states
        positions = torch.arange(capacity, device=probe.device)[None]
        self.cos, sin = self.decoder.rotary_emb(probe, positions)  # (1, capacity, d)
        # rotate_half(x) * sin == roll(x, d/2) * [-sin_1, sin_2]: one roll instead of three ops.
        half = self.head_dim // 2
        self.sin_signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        self.fused = probe.device.type in self.FUSED_DEVICES
        self._fuse()

    def _fuse(self) -> None:
        """Concatenate q/k/v and gate/up weights (fused devices only): copies, so they are made
        again whenever the weights may have changed."""
        if self.fused:
            self.qkv = [self._fuse_qkv(layer.self_attn) for layer in self.decoder.layers]
            self.gate_up = [
                torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]).detach()
                for layer in self.decoder.layers
            ]

    def _per_kv_head(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dim: int):
        """Features along ``dim`` (0 or -1) of q (heads x d), k and v (kv heads x d) regrouped per
        kv head: its g query heads, its key, its value; one view then gives (kv, g + 2, d)."""
        parts = [x.unflatten(dim, (self.n_kv, -1)) for x in (q, k, v)]
        inner = dim + 1 if dim >= 0 else dim
        return torch.cat(parts, dim=inner).flatten(inner - 1, inner)

    def _fuse_qkv(self, attn) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight = self._per_kv_head(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, 0)
        if attn.q_proj.bias is None:
            return weight.detach(), None
        bias = self._per_kv_head(attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias, 0)
        return weight.detach(), bias.detach()

    @staticmethod
    def supports(model) -> bool:
        cfg = model.config
        if cfg.model_type not in SUPPORTED_MODEL_TYPES or getattr(cfg, "hidden_act", "") != "silu":
            return False
        if _rope_type(cfg) not in STATIC_ROPE_TYPES:
            return False
        layers = model.get_decoder().layers
        if any(getattr(layer.self_attn, "sliding_window", None) for layer in layers):
            return False
        for layer in layers:  # fusing needs q/k/v all with or all without bias; same for MLP
            a, mlp = layer.self_attn, layer.mlp
            if len({a.q_proj.bias is None, a.k_proj.bias is None, a.v_proj.bias is None}) > 1:
                return False
            if mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:
                return False
        # ZeRO-3 partitions weights; only module calls gather them.
        return all(p.numel() > 0 and not hasattr(p, "ds_id") for p in model.parameters())

    @staticmethod
    def _norm(module, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, x.shape[-1:], module.weight, module.variance_epsilon)

    def _qkv(self, i: int, layer, h: torch.Tensor) -> torch.Tensor:
        """(B, 1, H) -> (B, kv heads, g + 2, d): per kv head its g queries, its key, its value."""
        B = h.shape[0]
        if self.fused:
            return F.linear(h, *self.qkv[i]).view(B, self.n_kv, -1, self.head_dim)
        a = layer.self_attn
        return self._per_kv_head(a.q_proj(h), a.k_proj(h), a.v_proj(h), -1).view(
            B, self.n_kv, -1, self.head_dim
        )

    def _mlp(self, i: int, layer, h: torch.Tensor) -> torch.Tensor:
        if not self.fused:
            return layer.mlp(h)
        gate, up = F.linear(h, self.gate_up[i]).chunk(2, dim=-1)
        return layer.mlp.down_proj(F.silu(gate) * up)

    def _attention(self, i: int, layer, h: torch.Tensor, cos, sin) -> torch.Tensor:
        """(B, 1, H) normed hidden -> (B, 1, H) attention output of layer i for the new token."""
        attn, B = layer.self_attn, h.shape[0]
        q, k, v = split_rotated(self._qkv(i, layer, h), cos, sin)
        keys, values, bias = self._kv_window(i, k, v)
        out = attend(q, keys, values, bias, attn.scaling)  # (B, kv, g, d)
        return attn.o_proj(out.reshape(B, 1, self.n_heads * self.head_dim))

    def _kv_window(self, i: int, k: torch.Tensor, v: torch.Tensor):
        """Store the new token's key and value (B, kv, 1, d) of layer i; return the keys and
        values attention reads (B, kv, T, d) and the additive mask over them (or None)."""
        T = self.length + 1
        self.k_buf[i][:, :, self.length : T] = k
        self.v_buf[i][:, :, self.length : T] = v
        bias = None if self.mask_bias is None else self.mask_bias[..., :T]
        return self.k_buf[i][:, :, :T], self.v_buf[i][:, :, :T], bias

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (sequences still decoding): later steps take their tokens
        alone and cost what a batch of ``len(rows)`` costs."""
        self.k_buf = [k[rows] for k in self.k_buf]
        self.v_buf = [v[rows] for v in self.v_buf]
        if self.mask_bias is not None:
            self.mask_bias = self.mask_bias[rows]

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(B,) next tokens at (B, 1) positions -> (B, V) logits for the token after them."""
        logits = self._decode(tokens, positions)
        self.length += 1
        return logits

    def _decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        d = self.decoder
        x = d.embed_tokens(tokens[:, None])  # (B, 1, H)
        cos = self.cos[0, positions][:, :, None]  # (B, 1, 1, d): broadcast over heads
        sin = self.sin_signed[0, positions][:, :, None]
        for i, layer in enumerate(d.layers):
            x = x + self._attention(i, layer, self._norm(layer.input_layernorm, x), cos, sin)
            x = x + self._mlp(i, layer, self._norm(layer.post_attention_layernorm, x))
        return self.model.get_output_embeddings()(self._norm(d.norm, x))[:, -1]
