"""The Transformer parts every fadat architecture shares: attention, dropout, the fairseq
Transformer layer, the encoder, the decoder stack with its input builders (:class:`Decoder`,
:func:`decoder_input`, :func:`uniform_copy`) and the initialisation. Their configuration
(:class:`~fadat.models.config.ModelConfig`, presets) is :mod:`fadat.models.config`'s.

The architecture follows the reference implementation (docs/reference-behaviour.md, "Network"):

- fairseq post-LN Transformer (``pre_norm`` is an option), gelu, learned positions, dropout 0.1,
  attention/activation dropout 0, BERT init N(0, 0.02) with zero biases and a zero padding row,
  token embeddings scaled by sqrt(d), one embedding matrix shared by the encoder, the decoder and
  the (bias-free) output projection.
- Positions are plain indices ``0..n-1`` into a table of ``max_*_positions`` rows; fairseq's
  offset of ``padding_idx + 1`` is a checkpoint-format detail that changes nothing in the maths.

Attention uses :func:`torch.nn.functional.scaled_dot_product_attention`. Dropout draws from the
global torch RNG, so two decoder passes under the same seed use identical masks (needed by
glancing). Only CPU was run; the code is device-agnostic but CUDA was not tested.
"""

from __future__ import annotations

import math
import typing
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.errors import InputError
from fadat.models.config import _ACTIVATIONS, ModelConfig

# ----------------------------------------------------------------------------------------------
# Building blocks


class EncoderOut(NamedTuple):
    """Encoder output.

    Attributes:
        states: ``(B, S, d)`` final encoder states (model dtype, or the autocast dtype).
        padding_mask: ``(B, S)`` bool, True at padding positions.
    """

    states: Tensor
    padding_mask: Tensor

    def index_select(self, index: Tensor) -> EncoderOut:
        """Rows ``index`` (``(N,)`` int64) of both tensors (beam search reordering)."""
        return EncoderOut(
            self.states.index_select(0, index), self.padding_mask.index_select(0, index)
        )


def _sdpa_attention(q, k, v, attn_mask, dropout_p, is_causal, fast_dropout) -> Tensor:
    """torch's ``scaled_dot_product_attention`` (its low-precision kernel under autocast)."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
    )


def _fp32_attention(q, k, v, attn_mask, dropout_p, is_causal, fast_dropout) -> Tensor:
    """fp32 SDPA, the result cast back to ``q``'s dtype."""
    with torch.autocast(device_type="cpu", enabled=False):
        out = F.scaled_dot_product_attention(
            q.float(),
            k.float(),
            v.float(),
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
        )
    return out.to(q.dtype)


def _math_attention(q, k, v, attn_mask, dropout_p, is_causal, fast_dropout) -> Tensor:
    """Two batched matmuls in the autocast dtype around an fp32 softmax (the scores are rounded
    to the autocast dtype before the softmax, as an eager autocast model does)."""
    with torch.autocast(device_type="cpu", enabled=False):
        scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-1, -2))  # (B, h, T, S)
        if is_causal:
            t, s = scores.shape[-2:]
            # top-left aligned, as SDPA's is_causal
            allowed = torch.ones(t, s, dtype=torch.bool, device=q.device).tril()
            attn_mask = allowed if attn_mask is None else attn_mask & allowed
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        probs = dropout(probs, dropout_p, dropout_p > 0.0, fast_dropout).to(q.dtype)
        return torch.matmul(probs, v)


#: How attention runs on CPU under bf16/fp16 autocast (``ModelConfig.cpu_attention``). torch's
#: fused low-precision SDPA kernels are slow on CPUs without AMX, and fp32 SDPA pays the casts.
#: Measured on the 2-core development machine, 2 threads, fwd+bwd of one attention at B = 32,
#: 4 heads, d_h = 64: L = 140 self-attention 40.0 ms (``"sdpa"``) / 27.7 (``"fp32"``) / 18.8
#: (``"math"``); L = 140 queries on 35 keys 42.1 / 14.3 / 5.7; L = 280 self-attention 127.7 /
#: 90.4 / 74.9. fp32 inputs and other devices always use SDPA.
CPU_ATTENTION = {"math": _math_attention, "fp32": _fp32_attention, "sdpa": _sdpa_attention}


def _attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    mode: str = "math",
    fast_dropout: bool = True,
) -> Tensor:
    """``scaled_dot_product_attention`` on ``(B, h, T, d_h)`` tensors (``attn_mask`` bool, True =
    may attend), with the CPU low-precision implementation ``mode`` of :data:`CPU_ATTENTION`;
    returns the result in ``q``'s dtype. Raises ValueError for an unknown mode."""
    if q.device.type != "cpu" or q.dtype not in (torch.bfloat16, torch.float16):
        return _sdpa_attention(q, k, v, attn_mask, dropout_p, is_causal, fast_dropout)
    if mode not in CPU_ATTENTION:
        raise ValueError(f"cpu_attention must be one of {', '.join(CPU_ATTENTION)}, not {mode!r}")
    return CPU_ATTENTION[mode](q, k, v, attn_mask, dropout_p, is_causal, fast_dropout)


def _key_mask(padding_mask: Tensor) -> Tensor:
    """``(B, S)`` True-at-pad -> ``(B, 1, 1, S)`` True-where-attended, the SDPA boolean mask."""
    return (~padding_mask)[:, None, None, :]


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection and an optional key/value cache."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        attention_dropout: float,
        mode: str = "math",
        fast_dropout: bool = True,
    ) -> None:
        super().__init__()
        self.heads = heads
        self.attention_dropout = attention_dropout
        self.mode = mode  # ModelConfig.cpu_attention
        self.fast_dropout = fast_dropout
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(
        self,
        x: Tensor,
        attn_mask: Tensor | None = None,
        causal: bool = False,
        cache: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """Attend ``x`` (``(B, T, d)``) to itself.

        Args:
            x: ``(B, T, d)``.
            attn_mask: bool, broadcastable to ``(B, heads, T, T_keys)``, True = may attend.
            causal: mask future keys (full-sequence AT decoding; ignored with a cache).
            cache: incremental decoding state; its ``"k"``/``"v"`` (``(B, heads, t, d_h)``) are
                the previous steps' keys/values and are extended in place by this step's.

        Returns:
            ``(B, T, d)``.
        """
        b, t, d = x.shape
        q, k, v = self.in_proj(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)  # (B, h, t_prev + T, d_h)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
            causal = causal and t > 1  # one new query may see every cached key
        out = _attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=self.attention_dropout if self.training else 0.0,
            is_causal=causal and attn_mask is None,
            mode=self.mode,
            fast_dropout=self.fast_dropout,
        )  # (B, h, T, d_h)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))


class CrossAttention(nn.Module):
    """Multi-head attention from decoder states to encoder states; K/V cacheable across steps."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        attention_dropout: float,
        mode: str = "math",
        fast_dropout: bool = True,
    ) -> None:
        super().__init__()
        self.heads = heads
        self.attention_dropout = attention_dropout
        self.mode = mode  # ModelConfig.cpu_attention
        self.fast_dropout = fast_dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        memory_mask: Tensor,
        cache: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """``x`` ``(B, T, d)`` attends to ``memory`` ``(B, S, d)``; ``memory_mask`` is the
        ``(B, 1, 1, S)`` True-where-attended mask. With a ``cache`` the projected memory keys and
        values are computed once (``"mk"``/``"mv"``) and reused. Returns ``(B, T, d)``."""
        b, t, d = x.shape
        dh = d // self.heads
        q = self.q_proj(x).view(b, t, self.heads, dh).transpose(1, 2)  # (B, h, T, d_h)
        if cache is not None and "mk" in cache:
            k, v = cache["mk"], cache["mv"]
        else:
            s = memory.shape[1]
            k, v = self.kv_proj(memory).view(b, s, 2, self.heads, dh).permute(2, 0, 3, 1, 4)
            if cache is not None:
                cache["mk"], cache["mv"] = k, v
        out = _attention(
            q,
            k,
            v,
            attn_mask=memory_mask,
            dropout_p=self.attention_dropout if self.training else 0.0,
            mode=self.mode,
            fast_dropout=self.fast_dropout,
        )  # (B, h, T, d_h)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))


_DROPOUT_LEVELS = 1 << 16  # resolution of the dropout probability: 16-bit random thresholds


class _FastDropout(torch.autograd.Function):
    """Inverted dropout with a mask from 16-bit random thresholds (see :func:`dropout`)."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:  # type: ignore[override]
        dropped = round(p * _DROPOUT_LEVELS)  # of the 2¹⁶ threshold levels
        n = x.numel()
        # One 64-bit draw of torch's default generator gives four int16 thresholds.
        bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device)
        bits = bits.random_(-(2**63), None).view(torch.int16)[:n].view(x.shape)
        drop = bits < dropped - _DROPOUT_LEVELS // 2  # P = dropped / 2¹⁶
        scale = _DROPOUT_LEVELS / (_DROPOUT_LEVELS - dropped)
        ctx.save_for_backward(drop)
        ctx.scale = scale
        return x.masked_fill(drop, 0.0).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (drop,) = ctx.saved_tensors
        return grad.masked_fill(drop, 0.0).mul_(ctx.scale), None


def dropout(x: Tensor, p: float, training: bool, fast: bool = True) -> Tensor:
    """Inverted dropout, as ``F.dropout(x, p, training)``, with cheaper masks on CPU.

    torch's CPU dropout draws one Bernoulli sample per element (6.8 ms for a (3840, 256) fp32
    tensor on the development machine: more than a 256×256 linear layer, 6.3 ms, and twice a
    bf16 one). Here one 64-bit draw gives the 16-bit random thresholds of four elements (2.9 ms):
    an element is dropped with probability ``round(p·2¹⁶)/2¹⁶`` (0.100006 for p = 0.1) and the
    others are scaled by the inverse of that keep rate; the mask is kept as bool for the
    backward. Same generator (torch's default) as ``F.dropout``, so seeding, ``fork_rng`` and
    the RNG states of checkpoints work alike; the masks differ from ``F.dropout``'s. Used on CPU
    when ``fast`` (``ModelConfig.fast_dropout``, default); other devices use ``F.dropout``
    (fused there).

    Args:
        x: any float tensor.
        p: drop probability in [0, 1).
        training: apply dropout only when true.
        fast: the cheaper CPU masks; False = ``F.dropout``.

    Returns:
        A tensor shaped and typed like ``x``.
    """
    if not training or p == 0.0:
        return x
    if not fast or x.device.type != "cpu" or x.numel() == 0:
        return F.dropout(x, p, training)
    return _FastDropout.apply(x, p)


class TransformerLayer(nn.Module):
    """One fairseq Transformer layer: self-attention, optional cross-attention, FFN; post-LN by
    default (``x = LN(x + dropout(sublayer(x)))``), pre-LN with ``config.pre_norm``."""

    def __init__(self, config: ModelConfig, cross_attention: bool) -> None:
        super().__init__()
        d = config.d_model
        self.pre_norm = config.pre_norm
        self.dropout = config.dropout
        self.activation_dropout = config.activation_dropout
        self.activation = _ACTIVATIONS[config.activation]
        self.fast_dropout = config.fast_dropout
        self.self_attn = SelfAttention(
            d,
            config.attention_heads,
            config.attention_dropout,
            config.cpu_attention,
            config.fast_dropout,
        )
        self.self_attn_norm = nn.LayerNorm(d)
        if cross_attention:
            self.cross_attn = CrossAttention(
                d,
                config.attention_heads,
                config.attention_dropout,
                config.cpu_attention,
                config.fast_dropout,
            )
            self.cross_attn_norm = nn.LayerNorm(d)
        else:
            self.cross_attn = None
        self.fc1 = nn.Linear(d, config.ffn_dim)
        self.fc2 = nn.Linear(config.ffn_dim, d)
        self.ffn_norm = nn.LayerNorm(d)

    def _residual(self, x: Tensor, norm: nn.LayerNorm, sublayer: typing.Callable) -> Tensor:
        if self.pre_norm:
            return x + dropout(sublayer(norm(x)), self.dropout, self.training, self.fast_dropout)
        return norm(x + dropout(sublayer(x), self.dropout, self.training, self.fast_dropout))

    def _ffn(self, x: Tensor) -> Tensor:
        h = self.activation(self.fc1(x))  # (B, T, ffn)
        return self.fc2(dropout(h, self.activation_dropout, self.training, self.fast_dropout))

    def forward(
        self,
        x: Tensor,
        self_mask: Tensor | None = None,
        causal: bool = False,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: dict[str, dict[str, Tensor]] | None = None,
    ) -> Tensor:
        """``x`` ``(B, T, d)`` -> ``(B, T, d)``. Masks are SDPA boolean masks (True = attend);
        ``cache`` holds ``"self"`` and ``"cross"`` dicts for incremental decoding."""
        self_cache = None if cache is None else cache.setdefault("self", {})
        x = self._residual(
            x, self.self_attn_norm, lambda h: self.self_attn(h, self_mask, causal, self_cache)
        )
        if self.cross_attn is not None:
            cross_cache = None if cache is None else cache.setdefault("cross", {})
            x = self._residual(
                x,
                self.cross_attn_norm,
                lambda h: self.cross_attn(h, memory, memory_mask, cross_cache),
            )
        return self._residual(x, self.ffn_norm, self._ffn)


def embedding_scale(config: ModelConfig) -> float:
    """The factor token embeddings are multiplied by: sqrt(d), or 1 with
    ``scale_embedding=False`` (docs/reference-behaviour.md, "Network")."""
    return math.sqrt(config.d_model) if config.scale_embedding else 1.0


def _init_bert(module: nn.Module, std: float) -> None:
    """BERT init (docs/reference-behaviour.md, "Network", ``--apply-bert-init``): N(0, std) weights,
    zero biases, zero padding row; LayerNorms keep (1, 0)."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()


class Encoder(nn.Module):
    """Transformer encoder; owns the token embedding shared with the decoder and output layer.

    Shared by every architecture (docs/reference-behaviour.md, "Network").
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.embed_scale = embedding_scale(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, d, padding_idx=PAD_ID)
        self.embed_positions = nn.Embedding(config.max_source_positions, d)
        self.layers = nn.ModuleList(
            TransformerLayer(config, cross_attention=False) for _ in range(config.encoder_layers)
        )
        self.final_norm = nn.LayerNorm(d) if config.pre_norm else None

    def forward(self, source: Tensor) -> EncoderOut:
        """Encode ``source``: ``(B, S)`` int64, ``x </s>`` right-padded with ``PAD_ID``.

        Returns:
            :class:`EncoderOut` with ``(B, S, d)`` states and the ``(B, S)`` padding mask.

        Raises:
            InputError: ``S`` exceeds ``max_source_positions``.
        """
        s = source.shape[1]
        if s > self.config.max_source_positions:
            raise InputError(
                f"source length {s} exceeds the model's max_source_positions "
                f"{self.config.max_source_positions}"
            )
        padding_mask = source.eq(PAD_ID)  # (B, S)
        positions = torch.arange(s, device=source.device)
        x = self.embed_scale * self.embed_tokens(source) + self.embed_positions(positions)
        x = dropout(x, self.config.dropout, self.training, self.config.fast_dropout)  # (B, S, d)
        mask = _key_mask(padding_mask)  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, self_mask=mask)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return EncoderOut(x, padding_mask)


# ----------------------------------------------------------------------------------------------
# The decoder stack and its inputs (every architecture's decoder)


def decoder_input(lengths: Tensor, ends: bool = True) -> Tensor:
    """The input ids of a non-autoregressive decoder of ``L_b`` positions per row:
    ``[<s>, <unk> × (L_b − 2), </s>, <pad> …]`` (DAT, NAT; docs/reference-behaviour.md, "Graph
    size"), or ``[<unk> × L_b, <pad> …]`` with ``ends=False`` (CTC, whose every position emits).

    Args:
        lengths: ``(B,)`` int64 ``L_b``, at least 2 (1 without ``ends``).
        ends: ``<s>`` and ``</s>`` at the first and last position.

    Returns:
        ``(B, max_b L_b)`` int64.

    Raises:
        ValueError: a length below the minimum.
    """
    shortest = 2 if ends else 1
    if lengths.numel() and int(lengths.min()) < shortest:
        raise ValueError(f"decoder lengths must be >= {shortest}")
    width = int(lengths.max()) if lengths.numel() else shortest
    idx = torch.arange(width, device=lengths.device)[None, :]  # (1, L)
    tokens = torch.where(idx < lengths[:, None], UNK_ID, PAD_ID)  # (B, L)
    if ends:
        tokens[:, 0] = BOS_ID
        tokens = torch.where(idx == lengths[:, None] - 1, EOS_ID, tokens)
    return tokens


def copy_positions(source_lengths: Tensor, decoder_lengths: Tensor, width: int) -> Tensor:
    """Uniform copy index: decoder position ``j`` of a row of ``L_b`` positions reads source
    position ``round(j·(S_b − 1)/(L_b − 1))`` (Gu et al. 2018).

    Args:
        source_lengths: ``(B,)`` int64 ``S_b``.
        decoder_lengths: ``(B,)`` int64 ``L_b``.
        width: padded decoder width.

    Returns:
        ``(B, width)`` int64 source positions in ``[0, S_b − 1]``.
    """
    j = torch.arange(width, device=source_lengths.device)  # (W,)
    ratio = (source_lengths - 1).double() / (decoder_lengths - 1).clamp(min=1).double()  # (B,)
    index = torch.round(j[None, :].double() * ratio[:, None]).long()  # (B, W)
    return torch.minimum(index, (source_lengths - 1)[:, None]).clamp(min=0)


def uniform_copy(encoder_out: EncoderOut, decoder_tokens: Tensor) -> Tensor:
    """Encoder states copied uniformly onto the ``<unk>`` positions (Gu et al. 2018; the NAT and
    CTC decoders, and the DAT's with ``ModelConfig.copy_source``).

    Position j of a row of ``L_b`` positions (the non-pad decoder tokens) takes the final
    encoder state of source position :func:`copy_positions` ``round(j·(S_b − 1)/(L_b − 1))``,
    ``S_b`` the non-pad source length; the other positions (``<s>``, ``</s>``, glanced tokens,
    padding) take zeros.

    Args:
        encoder_out: ``(B, S, d)`` states and ``(B, S)`` padding mask.
        decoder_tokens: ``(B, L)`` int64 decoder input.

    Returns:
        ``(B, L, d)`` in the states' dtype.
    """
    states = encoder_out.states  # (B, S, d)
    src_len = (~encoder_out.padding_mask).sum(dim=1)  # (B,)
    index = copy_positions(
        src_len, decoder_tokens.ne(PAD_ID).sum(dim=1), decoder_tokens.shape[1]
    )  # (B, L)
    copied = states.gather(1, index[..., None].expand(-1, -1, states.shape[-1]))  # (B, L, d)
    return copied * decoder_tokens.eq(UNK_ID)[..., None].to(copied.dtype)


class Decoder(nn.Module):
    """The Transformer decoder stack of every architecture: token embedding (the encoder's,
    passed in) scaled by :func:`embedding_scale` + learned positions (+ :func:`uniform_copy` with
    ``copy_source``), dropout, :class:`TransformerLayer` s with cross-attention, a final
    LayerNorm with ``pre_norm`` (docs/reference-behaviour.md, "Network").

    Non-autoregressive (DAT, NAT, CTC): bidirectional self-attention over the non-pad positions.
    Causal (AT): each position attends to itself and the positions before it, with an optional
    key/value cache for incremental decoding.

    Attributes:
        embed_positions: ``(max_target_positions, d)`` position table.
        layers: the ``decoder_layers`` layers.
        final_norm: the pre-LN final LayerNorm, or ``None`` (post-LN).
    """

    def __init__(self, config: ModelConfig, copy_source: bool = False) -> None:
        super().__init__()
        d = config.d_model
        self.max_positions = config.max_target_positions
        self.dropout = config.dropout
        self.fast_dropout = config.fast_dropout
        self.copy_source = copy_source
        self.embed_scale = embedding_scale(config)
        self.embed_positions = nn.Embedding(config.max_target_positions, d)
        self.layers = nn.ModuleList(
            TransformerLayer(config, cross_attention=True) for _ in range(config.decoder_layers)
        )
        self.final_norm = nn.LayerNorm(d) if config.pre_norm else None

    def forward(
        self,
        embed_tokens: nn.Embedding,
        encoder_out: EncoderOut,
        tokens: Tensor,
        *,
        causal: bool = False,
        start: int = 0,
        cache: list[dict[str, dict[str, Tensor]]] | None = None,
    ) -> Tensor:
        """Final decoder states of ``tokens`` ``(B, T)`` int64 at positions
        ``start … start + T − 1``.

        Args:
            embed_tokens: the shared token embedding.
            encoder_out: from :class:`Encoder`.
            tokens: ``(B, T)`` decoder input; non-autoregressive: ``<pad>`` a suffix of each row
                (the row's size is its non-pad count); causal: right padding is harmless.
            causal: causal self-attention (AT) instead of bidirectional over the non-pad tokens.
            start: position of the first token (incremental decoding).
            cache: with ``causal``, one dict per layer (see :meth:`TransformerLayer.forward`);
                ``tokens`` are appended after the cached prefix.

        Returns:
            ``(B, T, d)`` (model dtype, or the autocast dtype).

        Raises:
            InputError: ``start + T`` exceeds ``max_target_positions``.
        """
        end = start + tokens.shape[1]
        if end > self.max_positions:
            raise InputError(
                f"decoder length {end} exceeds the model's max_target_positions "
                f"{self.max_positions}"
            )
        positions = torch.arange(start, end, device=tokens.device)
        x = self.embed_scale * embed_tokens(tokens) + self.embed_positions(positions)
        if self.copy_source:
            x = x + uniform_copy(encoder_out, tokens)  # (B, T, d)
        x = dropout(x, self.dropout, self.training, self.fast_dropout)  # (B, T, d)
        self_mask = None if causal else _key_mask(tokens.eq(PAD_ID))  # (B, 1, 1, T)
        memory_mask = _key_mask(encoder_out.padding_mask)  # (B, 1, 1, S)
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                self_mask=self_mask,
                causal=causal,
                memory=encoder_out.states,
                memory_mask=memory_mask,
                cache=None if cache is None else cache[i],
            )
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x
