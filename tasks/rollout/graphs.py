"""The lean decode step with every shape fixed, captured once as a CUDA graph and replayed.

Why: on a GPU a decode step of a small model is launch-bound. The lean step (``decode.py``)
issues ~25 kernels per layer, each a few microseconds of GPU work behind a longer stretch of
Python and dispatch, so the GPU idles while the host queues kernels. A CUDA graph records the
step's kernels once; a replay launches all of them in one call.

A graph replays fixed kernels on fixed memory, so everything a step touches stays in place:
- key/value buffers sized for the longest rollout (``capacity`` positions, ``rows`` sequences)
  live as long as the decoder, and so do the token, position and logits buffers;
- the write position ``cur`` is a device tensor that the step advances itself;
- attention reads a window of the buffers that grows in steps of ``WINDOW`` positions (more for
  rollouts so long that there would be over ``MAX_WINDOWS`` steps), with positions not yet
  written masked out, so one graph serves a whole step of the window (FlexAttention: one
  window, the whole buffer, below);
- the batch is padded up to a power of two: compaction (``keep``) halves it, and the smaller
  batch gets its own graphs (the padding rows compute finite garbage that nobody reads).

Graphs are keyed by (batch rows, window) and captured on first use: that step runs eagerly on a
side stream (its real work, and the warm-up capture needs), then is recorded. They stay valid as
long as the weights keep their storage: the bf16 rollout copy is refreshed in place, and the
optimizer updates the policy in place; the generator rebuilds the decoder when a weight moved.
The buffers are kept between rollouts with the graphs, so the update runs beside them. They are
sized for ``max_prompt_len + max_new_tokens`` positions and a power-of-two batch (more than the
lean decoder's per-rollout buffers), so the generator frees them after a rollout when they hold
over ``HFGenerator.KEEP_FRACTION`` of the GPU, and captures the graphs again at the next.

The step itself (``DecodeOptions``; ``python -m bench.decode`` measures each against the others):
- ``fuse``: q/k/v and gate/up as one matrix product each, from weight copies refreshed in place at
  each rollout (so captured graphs see them); three fewer products per layer;
- ``attention="sdpa"``: the new token's attention as one fused kernel
  (``F.scaled_dot_product_attention``: scale, mask, softmax and both products), where ``"matmul"``
  launches six; the group's query heads are its query rows, so no key/value head is repeated;
- ``attention="flex"``: FlexAttention's decoding kernel (``flex.py``, compiled for each batch
  size) over one window, the whole buffer, whose blocks not yet written it skips, so one graph
  serves a batch size's whole rollout;
- ``compiled``: the layer's work before and after attention as two ``torch.compile``d functions
  (``regions.py``) shared by every layer (weights are their inputs): the norm, residual add,
  rotary and SwiGLU pointwise work fuse into a few kernels around the matrix products. Keys and
  values are written and attended to outside them, so the compiled code never mutates the
  buffers.

Sampling can be recorded too (``begin``/``advance``, what ``HFGenerator`` does on CUDA): each
replay then decodes the tokens drawn last, draws the next from uniforms drawn for the whole rollout
beforehand, and writes them and their log-probs into output buffers, with no host work between
steps but the replay (the Python around an eager sampler and the rollout's bookkeeping left the
GPU idle between steps). Graphs are then keyed by the ``Draw`` as well. Without CUDA (or
``graphs=False``) the same fixed-shape step runs eagerly: that is how the CPU tests hold it to
``LeanDecoder``, and the recorded sampling to the step-by-step loop.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from tasks.rollout import flex, regions
from tasks.rollout.decode import LeanDecoder, attend
from tasks.rollout.sampling import sampler_for

ATTENTION = ("sdpa", "matmul", "flex")


@dataclass(frozen=True)
class DecodeOptions:
    """How the fixed-shape step computes (module docstring); ``compiled`` None: where graphs are
    captured (CUDA), as compiling costs more than it saves on CPU."""

    attention: str = "sdpa"
    fuse: bool = True
    compiled: bool | None = None
    # Compiled with symbolic sizes: one compilation serves every batch size. Static sizes give
    # Inductor fixed strides: a step a tenth faster (docs/benchmarks.md), at one compilation per
    # power-of-two batch a rollout passes through. (FlexAttention is compiled with static sizes
    # whatever this says: its decoding kernel needs a fixed batch.)
    dynamic: bool = True
    # Compiled with Inductor's max-autotune (``regions.compiled``): each matrix product's
    # kernel, and FlexAttention's block sizes and key/value splits, chosen by timing at their
    # sizes. Longer compilations, one per batch size.
    autotune: bool = False

    def __post_init__(self):
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, not {self.attention!r}")


@dataclass(frozen=True)
class Draw:
    """How ``StaticDecoder.advance`` draws tokens: part of each graph's key, as a graph replays
    the sampler it recorded."""

    sampler: str  # tasks.rollout.sampling.SAMPLERS (or auto)
    temperature: float
    top_p: float
    eos: tuple[int, ...]
    pad: int
    min_new_tokens: int = 0  # EOS is never drawn before this many tokens (benchmarks)


# The lean step of PR 11 (before fused kernels): the baseline that bench.decode measures against.
LEAN_OPTIONS = DecodeOptions(attention="matmul", fuse=False, compiled=False)
# The steps a config can choose (``rollout.decode_step``): fixed sizes compile once per batch size.
DECODE_STEPS = {
    "default": DecodeOptions(),
    "static-shapes": DecodeOptions(dynamic=False),
    "flex": DecodeOptions(attention="flex"),
    "flex-static": DecodeOptions(attention="flex", dynamic=False),
    "flex-static-autotune": DecodeOptions(attention="flex", dynamic=False, autotune=True),
}


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class StaticDecoder(LeanDecoder):
    """Decodes up to ``rows`` sequences of up to ``capacity`` positions (prompt included)."""

    WINDOW = 128  # positions by which attention's window grows: one graph per window and batch
    # Draws whose graphs are kept (training's and validation's sampling settings alternate).
    KEEP_DRAWS = 2
    MAX_WINDOWS = 32  # bounds the graphs per batch size (capture time) for very long rollouts

    def __init__(
        self, model, rows: int, capacity: int, capture: bool, options: DecodeOptions | None = None
    ):
        """Buffers for ``rows`` sequences of ``capacity`` positions; ``capture``: record CUDA
        graphs (else every step runs eagerly, as on CPU)."""
        options = options or DecodeOptions()
        if options.attention == "flex":  # one window: the kernel skips the blocks not written
            self.window = capacity = _round_up(capacity, flex.FLEX_BLOCK)
        else:
            self.window = _round_up(-(-capacity // self.MAX_WINDOWS), self.WINDOW)
            capacity = _round_up(capacity, self.window)
        self.options = options
        self.compiled = capture if options.compiled is None else options.compiled
        self._bind(model, capacity)
        self.rows, self.capacity = _pow2_at_least(rows), capacity
        weight = self.decoder.embed_tokens.weight
        dev = weight.device
        self._choose_attention(dev)
        # Each layer's keys and values in one buffer, (rows, kv heads, 2, positions, d): a step
        # writes its token's pair with one kernel. Zeros, not empty: padding rows must compute
        # finite values.
        shape = (self.rows, self.n_kv, 2, capacity, self.head_dim)
        self.kv_buf = [
            torch.zeros(shape, dtype=weight.dtype, device=dev) for _ in self.decoder.layers
        ]
        # The additive attention mask; SDPA takes it in the queries' dtype (0 and -inf are exact).
        mask_dtype = weight.dtype if options.attention == "sdpa" else torch.float32
        self.bias = torch.zeros(self.rows, capacity, dtype=mask_dtype, device=dev)
        self.tok = torch.zeros(self.rows, dtype=torch.long, device=dev)
        self.pos = torch.zeros(self.rows, 1, dtype=torch.long, device=dev)
        self.cur = torch.zeros(1, dtype=torch.long, device=dev)  # the position written next
        vocab = self.model.get_output_embeddings().weight.shape[0]
        self.logits = torch.zeros(self.rows, vocab, dtype=weight.dtype, device=dev)
        # Keyed by (batch rows, window, Draw or None for the step alone).
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.draw: Draw | None = None
        self._eos: dict[Draw, torch.Tensor] = {}  # each draw's EOS ids, alive as long as its graphs
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.weights = self._weight_pointers(model)
        self.length = 0
        self._shape = (self.rows, self.window)  # (batch rows, attention window) of a step

    def _choose_attention(self, device) -> None:
        """``_attend``, the attention ``options`` ask for; FlexAttention's with its block mask."""
        self.block_mask = None
        if self.options.attention != "flex":
            self._attend = functools.partial(attend, how=self.options.attention)
            return
        self.block_mask = flex.block_mask(self.n_heads // self.n_kv, self.capacity, device)
        # Compiled with static sizes: FlexAttention's decoding kernel needs a fixed batch.
        autotune = self.options.autotune  # its blocks and key/value splits chosen by timing
        fn = regions.compiled(flex.attend, False, autotune) if self.compiled else flex.attend
        self._attend = functools.partial(fn, block_mask=self.block_mask)

    def _fuse(self) -> None:
        """The fused q/k/v and gate/up weights (``options.fuse``), copied in place into buffers
        made once, so graphs captured over them read each rollout's weights."""
        self.fused = self.options.fuse
        if not self.fused:
            return
        layers = self.decoder.layers
        fresh_qkv = [self._fuse_qkv(layer.self_attn) for layer in layers]
        fresh_gate_up = [
            torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]) for layer in layers
        ]
        if not hasattr(self, "qkv"):
            self.qkv, self.gate_up = fresh_qkv, [w.detach() for w in fresh_gate_up]
            return
        for (w, b), (fw, fb) in zip(self.qkv, fresh_qkv, strict=True):
            w.copy_(fw)
            if b is not None:
                b.copy_(fb)
        for w, fw in zip(self.gate_up, fresh_gate_up, strict=True):
            w.copy_(fw)

    @property
    def nbytes(self) -> int:
        """Memory held by the key/value buffers, the fused weight copies and the sampler's
        buffers."""
        held = list(self.kv_buf)
        if hasattr(self, "drawn"):  # the recorded sampler's outputs and uniforms
            held += [self.drawn, self.drawn_logp, self.uniforms]
        if self.fused:
            held += [w for pair in self.qkv for w in pair if w is not None] + self.gate_up
        return sum(b.numel() * b.element_size() for b in held)

    @staticmethod
    def _weight_pointers(model) -> tuple[int, ...]:
        return tuple(p.data_ptr() for p in model.parameters())

    def fits(self, model, rows: int, capacity: int) -> bool:
        """Whether this decoder (its buffers and graphs) can serve that batch for ``model``."""
        return (
            model is self.model
            and rows <= self.rows
            and capacity <= self.capacity
            and self._weight_pointers(model) == self.weights
        )

    def load(self, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor):
        """Start a rollout from the prefilled prompt cache: ``keys[l]``, ``values[l]``
        (B, kv heads, W, d) and the prompt's attention mask (B, W), 0 at left padding."""
        B, W = mask.shape
        for buf, k, v in zip(self.kv_buf, keys, values, strict=True):
            buf[:B, :, 0, :W] = k
            buf[:B, :, 1, :W] = v
        self.bias[:B] = float("-inf")  # unwritten positions; each step unmasks its own
        self.bias[:B, :W].masked_fill_(mask.bool(), 0.0)
        self.cur.fill_(W)
        self.length = W
        self._fuse()  # the fused copies would otherwise hold the last rollout's weights

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only these rows (sequences still decoding), moved to the front of the buffers."""
        n, end = len(rows), self.length  # positions past ``length`` hold nothing yet
        for buf in self.kv_buf:
            buf[:n, :, :, :end] = buf[rows, :, :, :end]
        self.bias[:n] = self.bias[rows]
        if self.draw is not None:  # the recorded sampler's per-row state moves with them
            for buf in (self.tok, self.pos, self.live, self.done):
                buf[:n] = buf[rows]
            self.live[n:] = self.rows
            self.done[n:] = True

    def _kv_window(self, i: int, k: torch.Tensor, v: torch.Tensor):
        """The lean step's way in (``LeanDecoder._attention``): key and value apart."""
        return self._store(i, torch.stack((k, v), dim=2))

    def _store(self, i: int, kv: torch.Tensor):
        """Write the new token's key and value, (B, kv, 2, 1, d), of layer i at ``cur``; return
        the keys and values attention reads (B, kv, window, d) and the mask over them."""
        rows, window = self._shape
        buf = self.kv_buf[i][:rows]
        buf.index_copy_(3, self.cur, kv)
        bias = self.bias[:rows, None, None, :window]
        return buf[:, :, 0, :window], buf[:, :, 1, :window], bias

    def _decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if not self.fused:  # the lean step, as LEAN_OPTIONS asks
            return self.logits[: len(tokens)].copy_(super()._decode(tokens, positions))
        d = self.decoder
        before, after = regions.attention_inputs, regions.after_attention
        if self.compiled:
            dynamic, autotune = self.options.dynamic, self.options.autotune
            before = regions.compiled(regions.attention_inputs, dynamic, autotune)
            after = regions.compiled(regions.after_attention, dynamic, autotune)
        x = d.embed_tokens(tokens[:, None])  # (B, 1, H)
        cos = self.cos[0, positions][:, :, None]  # (B, 1, 1, d): broadcast over heads
        sin = self.sin_signed[0, positions][:, :, None]
        for i, layer in enumerate(d.layers):
            attn, norm1 = layer.self_attn, layer.input_layernorm
            norm2 = layer.post_attention_layernorm
            q, kv = before(
                x, norm1.weight, norm1.variance_epsilon, *self.qkv[i], cos, sin, self.n_kv,
                self.head_dim,
            )  # fmt: skip
            keys, values, bias = self._store(i, kv)
            out = self._attend(q, keys, values, bias, attn.scaling)
            x = after(
                x, out, attn.o_proj.weight, attn.o_proj.bias, norm2.weight,
                norm2.variance_epsilon, self.gate_up[i], layer.mlp.down_proj.weight,
            )  # fmt: skip
        return self._head(self._norm(d.norm, x)[:, -1])

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        """(B, H) -> the (B, V) logits, written by the output layer's product straight into the
        logits buffer (at B = 512 a copy would move another 311 MB a step)."""
        head, out = self.model.get_output_embeddings(), self.logits[: h.shape[0]]
        if head.bias is not None:
            return out.copy_(head(h))
        return torch.mm(h, head.weight.t(), out=out)

    def _run(self) -> None:
        """One decode step at ``self._shape``: tokens and positions in, logits out, ``cur``
        advanced. Only buffers, so it can be recorded as a graph."""
        rows = self._shape[0]
        self.bias[:rows].index_fill_(1, self.cur, 0.0)  # the new token attends to itself
        if self.block_mask is not None:
            self.block_mask.kv_num_blocks.copy_(flex.blocks_to_visit(self.cur))
        self._decode(self.tok[:rows], self.pos[:rows])  # into self.logits
        self.cur += 1

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        n = len(tokens)
        self.tok[:n].copy_(tokens)
        self.pos[:n].copy_(positions)
        self._replay(n, None, self._run)
        return self.logits[:n]

    def begin(
        self,
        logits: torch.Tensor,
        positions: torch.Tensor,
        uniforms: torch.Tensor,
        draw: Draw,
        steps: int,
    ) -> None:
        """Sample inside the graphs from here on (after ``load``), for up to ``steps`` tokens: the
        first token of N sequences is drawn from the prefill's ``logits`` (N, V) now, each
        ``advance`` decodes and draws the next; ``positions`` (N, 1) are the next tokens'
        positions, ``uniforms`` (k, N) the draws of the first k steps (``add_uniforms`` gives the
        next; those of dropped rows go unused, so compaction changes nothing)."""
        N = uniforms.shape[1]
        if not hasattr(self, "drawn"):  # made once: graphs hold their addresses
            R, dev = self.rows, self.tok.device
            # Row R takes what the padding rows of a power-of-two batch draw.
            self.drawn = torch.zeros(R + 1, self.capacity, dtype=torch.long, device=dev)
            self.drawn_logp = torch.zeros(R + 1, self.capacity, device=dev)
            self.uniforms = torch.zeros(self.capacity, R + 1, device=dev)
            self.eos_bias = torch.zeros(self.capacity, device=dev)  # -inf before min_new_tokens
            self.live = torch.zeros(R, dtype=torch.long, device=dev)  # output row of each row
            self.done = torch.zeros(R, dtype=torch.bool, device=dev)
            self.t = torch.zeros(1, dtype=torch.long, device=dev)  # the token drawn next
        if draw not in self._eos:
            if len(self._eos) >= self.KEEP_DRAWS:  # the oldest draw's graphs go
                old = next(iter(self._eos))
                self.graphs = {k: g for k, g in self.graphs.items() if k[2] != old}
                del self._eos[old]
            self._eos[draw] = torch.tensor(draw.eos, device=self.tok.device)
        self._eos[draw] = self._eos.pop(draw)  # the most recent last
        self.draw, self.sample = draw, sampler_for(draw.sampler, self.tok.device)
        self.drawn[:N, :steps] = draw.pad
        self.drawn_logp[:N, :steps] = 0.0
        self.add_uniforms(0, uniforms)
        self.eos_bias.zero_()
        self.eos_bias[: draw.min_new_tokens] = float("-inf")
        self.live.fill_(self.rows)
        self.live[:N] = torch.arange(N, device=self.live.device)
        self.done.fill_(True)
        self.done[:N] = False
        self.t.zero_()
        self.pos.zero_()  # padding rows' positions advance too: from 0 they stay in the table
        self.pos[:N] = positions
        self.logits[:N] = logits
        self._draw(N)

    def add_uniforms(self, start: int, uniforms: torch.Tensor) -> None:
        """The draws (k, N) of steps ``start`` to ``start + k - 1``."""
        self.uniforms[start : start + len(uniforms), : uniforms.shape[1]] = uniforms

    def advance(self, n: int) -> None:
        """Decode the tokens drawn last in the first ``n`` rows and draw the next ones."""
        self._replay(n, self.draw, self._run_and_draw)

    def results(self, n: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The drawn tokens (pad after a sequence's EOS) and their log-probs, (n, steps) each."""
        return self.drawn[:n, :steps], self.drawn_logp[:n, :steps]

    def _draw(self, rows: int) -> None:
        """Draw the next token of the first ``rows`` rows from ``logits``: the sampler with the
        step's uniforms, pad where a sequence has finished, written to the outputs. Only
        buffers, so it can be recorded."""
        draw, eos, t = self.draw, self._eos[self.draw], self.t
        logits, live, done = self.logits[:rows], self.live[:rows], self.done[:rows]
        if draw.min_new_tokens:
            logits[:, eos] += self.eos_bias.index_select(0, t)
        u = self.uniforms.index_select(0, t)[0, live][:, None]
        nxt, logp = self.sample(logits, draw.temperature, draw.top_p, u)
        nxt = torch.where(done, draw.pad, nxt)
        at = (live, t.expand(rows))
        self.drawn.index_put_(at, nxt)
        self.drawn_logp.index_put_(at, logp.float())
        done |= (nxt[:, None] == eos).any(dim=-1)
        self.tok[:rows] = nxt
        self.t += 1

    def _run_and_draw(self) -> None:
        rows = self._shape[0]
        self._run()
        self.pos[:rows] += 1
        self._draw(rows)

    def _replay(self, n: int, draw: Draw | None, fn) -> None:
        """One step over the first ``n`` rows: ``fn`` recorded at this step's shape, replayed
        (recorded first if new; run eagerly without CUDA)."""
        rows = min(self.rows, _pow2_at_least(n))
        shape = (rows, min(self.capacity, _round_up(self.length + 1, self.window)))
        graph = self.graphs.get((*shape, draw))
        if graph is not None:
            graph.replay()
        else:
            self._shape = shape
            self._run_eagerly(fn)  # this step's work, and the warm-up before a capture
            if self.pool is not None:
                self.graphs[(*shape, draw)] = self._capture(fn)
        self.length += 1

    def _run_eagerly(self, fn) -> None:
        if self.pool is None:
            fn()
            return
        # Before a capture, on a side stream as torch asks: lazy initialisations (cuBLAS
        # workspaces) happen outside the graph.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)

    def _capture(self, fn) -> torch.cuda.CUDAGraph:
        """Record ``fn`` at the current shape (recording runs nothing)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            fn()
        return graph
