"""The DA-Transformer network: a Transformer encoder, a non-autoregressive decoder over the graph's
vertices, the token head and the links (transition) head; its configuration; and the model
directory format (``save_pretrained`` / ``from_pretrained`` / :func:`load_pretrained`).

The model returns ``(token_logprobs, links)``; objectives (``fadat.dag``) and decoders consume
them. The architecture follows the reference implementations (anchor-spec §1):

- fairseq post-LN Transformer (``pre_norm`` is an option), gelu, learned positions, dropout 0.1,
  attention/activation dropout 0, BERT init N(0, 0.02) with zero biases and a zero padding row,
  token embeddings scaled by sqrt(d), one embedding matrix shared by the encoder, the decoder and
  the (bias-free) output projection (§1.1).
- Decoder input ``[<s>, <unk> × (L−2), </s>]`` + learned positions, bidirectional self-attention,
  cross-attention; no source copy (§1.2).
- Links head exactly as ``extract_links`` (§1.3), see :func:`transition_log_probs`.

Differences from the reference, on purpose:

- Positions are plain indices ``0..n-1`` into a table of ``max_*_positions`` rows; fairseq's
  offset of ``padding_idx + 1`` is a checkpoint-format detail that changes nothing in the maths.
- No length predictor: the graph size comes from the source length (``source_old``, §1.2; the MT
  scripts use length-loss factor 0).
- ``max_transition_length`` uses the dense ``(B, L, L)`` layout with the window applied as a mask
  (the reference's compact layout exists only for its CUDA kernels).

Attention uses :func:`torch.nn.functional.scaled_dot_product_attention`. Dropout draws from the
global torch RNG with ordinary kernels, so two decoder passes under the same seed use identical
masks (needed by glancing, anchor-spec §3). Only CPU was run; the code is device-agnostic but CUDA
was not tested.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fadat import outputs
from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID, graph_size
from fadat.errors import InputError

FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
SPM_NAME = "spm.model"
MODEL_TYPES = ("dat", "at")

# ----------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Sizes and options of a DAT or AT model (anchor-spec §1.1; unknown keys are rejected).

    Attributes:
        model_type: ``"dat"`` (DA-Transformer) or ``"at"`` (autoregressive baseline).
        vocab_size: V, the sentencepiece vocabulary size (ids 0–3 are ``<s> <pad> </s> <unk>``).
        d_model: d, the model width.
        encoder_layers, decoder_layers: number of Transformer layers.
        attention_heads: heads of every attention block; must divide ``d_model``.
        ffn_dim: inner width of the feed-forward blocks.
        dropout: dropout after embeddings, attention and FFN outputs (reference 0.1).
        attention_dropout: dropout on attention weights (reference 0).
        activation_dropout: dropout after the FFN activation (reference 0).
        activation: ``"gelu"`` (reference) or ``"relu"``.
        max_source_positions: rows of the encoder's position table; longer sources are rejected.
        max_target_positions: rows of the decoder's position tables: the largest graph size L
            (DAT) or target length incl. ``<s>`` (AT).
        upsample_ratio: λ used to size the graph in training (``L = int(λ·|x </s>|)``).
        decode_upsample_ratio: λ at decoding; ``None`` means ``upsample_ratio``.
        link_heads: H, heads of the links head (DAT only); must divide ``d_model``.
        max_transition_length: largest jump ``j − i`` of a transition; −1 = unlimited (§1.3).
        pre_norm: pre-LN layers with a final LayerNorm instead of post-LN (reference: post-LN).
        init_std: standard deviation of the BERT initialisation (reference 0.02).
        scale_embedding: multiply token embeddings by sqrt(d) (reference; fairseq's
            ``--no-scale-embedding`` turns it off). Off, the N(0, init_std) learned positions
            are as large as the token embeddings from the first update instead of sqrt(d)
            times smaller, which matters for the NAT decoder whose inputs are all ``<unk>``.
        copy_source: DAT only, not in the reference (anchor-spec §1.2 says DA-T has no source
            copy; an issue-7 learning-speed option, default off): add to the input of every
            ``<unk>`` vertex j the final encoder state of source position
            ``round(j·(S_b − 1)/(L_b − 1))`` (uniform copy, Gu et al. 2018), so that each vertex
            sees source content from the first update.
    """

    model_type: str = "dat"
    vocab_size: int
    d_model: int
    encoder_layers: int
    decoder_layers: int
    attention_heads: int
    ffn_dim: int
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "gelu"
    max_source_positions: int = 256
    max_target_positions: int = 1024
    upsample_ratio: float = 4.0
    decode_upsample_ratio: float | None = None
    link_heads: int = 8
    max_transition_length: int = -1
    pre_norm: bool = False
    init_std: float = 0.02
    scale_embedding: bool = True
    copy_source: bool = False

    def __post_init__(self) -> None:
        _check_field_types(self)
        problems = []
        if self.model_type not in MODEL_TYPES:
            problems.append(f"model_type must be one of {MODEL_TYPES}, got {self.model_type!r}")
        if self.vocab_size <= UNK_ID:
            problems.append(f"vocab_size must be > {UNK_ID}, got {self.vocab_size}")
        for name in (
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "attention_heads",
            "ffn_dim",
            "link_heads",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.attention_heads >= 1 and self.d_model % self.attention_heads:
            problems.append(
                f"d_model {self.d_model} is not divisible by attention_heads {self.attention_heads}"
            )
        if self.model_type == "dat" and self.link_heads >= 1 and self.d_model % self.link_heads:
            problems.append(
                f"d_model {self.d_model} is not divisible by link_heads {self.link_heads}"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.activation not in _ACTIVATIONS:
            problems.append(f"activation must be one of {sorted(_ACTIVATIONS)}")
        if self.max_source_positions < 1:
            problems.append("max_source_positions must be >= 1")
        if self.max_target_positions < 2:
            problems.append("max_target_positions must be >= 2")
        if self.upsample_ratio <= 0:
            problems.append(f"upsample_ratio must be > 0, got {self.upsample_ratio}")
        if self.decode_upsample_ratio is not None and self.decode_upsample_ratio <= 0:
            problems.append(f"decode_upsample_ratio must be > 0, got {self.decode_upsample_ratio}")
        if self.max_transition_length == 0 or self.max_transition_length < -1:
            problems.append(
                f"max_transition_length must be -1 or >= 1, got {self.max_transition_length}"
            )
        if self.init_std <= 0:
            problems.append("init_std must be > 0")
        if self.copy_source and self.model_type != "dat":
            problems.append("copy_source applies to model_type 'dat' only")
        if problems:
            raise InputError("invalid model config: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """All fields as a JSON-serialisable dict (the ``"config"`` entry of config.json)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Build a config from a dict, e.g. read from config.json or a YAML experiment file.

        Raises:
            InputError: ``d`` is not a dict, has unknown keys, lacks a required key, or holds a
                value of the wrong type or out of range.
        """
        if not isinstance(d, dict):
            raise InputError(f"model config must be a mapping, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise InputError(f"unknown model config keys: {', '.join(unknown)}")
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = [name for name in required if name not in d]
        if missing:
            raise InputError(f"model config lacks required keys: {', '.join(missing)}")
        return cls(**d)

    @property
    def decoding_upsample_ratio(self) -> float:
        """λ used at decoding time (``decode_upsample_ratio`` or, if unset, ``upsample_ratio``)."""
        return (
            self.upsample_ratio
            if self.decode_upsample_ratio is None
            else self.decode_upsample_ratio
        )


def _check_field_types(config: ModelConfig) -> None:
    """Reject wrongly typed values (e.g. a string from a hand-edited config.json) early."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        hint = hints[f.name]
        allowed = typing.get_args(hint) or (hint,)
        ok = False
        for t in allowed:
            if t is type(None):
                ok = ok or value is None
            elif t is float:
                ok = ok or (isinstance(value, (int, float)) and not isinstance(value, bool))
            elif t is int:
                ok = ok or (isinstance(value, int) and not isinstance(value, bool))
            else:
                ok = ok or isinstance(value, t)
        if not ok:
            raise InputError(f"model config key {f.name!r} has the wrong type: {value!r}")


# Presets (kwargs without vocab_size). "cpu-small" (8.4M parameters at V = 8000): d = 256 with 3+3
# layers, 4 heads, FFN 1024, λ = 4. bench/bench_model.py measured on this 2-core CPU (B = 32,
# source ≈ 30 tokens, ≈ 1000 target tokens, 156 GFLOP per step at λ = 4): 660 target tokens/s in
# fp32 and 880 with bf16 autocast in the least disturbed step (a shared machine often halves it),
# i.e. about 2–3 M target tokens, 2–3 k steps, per hour: a few epochs of a narrow-domain corpus of
# ~30k sentence pairs, the regime where a small DAT learns something useful. A wider or deeper
# model would see the data less than once in that time. λ = 4 instead of 8 halves the graph
# (≈ half the step's FLOPs, and the O(L²) links and DP), and the paper (Fig. "effects of λ")
# shows FA-DAT loses little at λ = 4.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        attention_heads=2,
        ffn_dim=64,
        link_heads=2,
        max_source_positions=64,
        max_target_positions=256,
        upsample_ratio=4.0,
    ),
    "cpu-small": dict(
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        attention_heads=4,
        ffn_dim=1024,
        link_heads=4,
        max_source_positions=256,
        max_target_positions=1024,
        upsample_ratio=4.0,
    ),
    "base": dict(
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        attention_heads=8,
        ffn_dim=2048,
        link_heads=8,
        max_source_positions=256,
        max_target_positions=1024,
        upsample_ratio=8.0,
    ),
}


def make_config(preset: str, vocab_size: int, **overrides: Any) -> ModelConfig:
    """The config of a named preset (``tiny``, ``cpu-small``, ``base``) with overrides.

    Raises:
        InputError: unknown preset, unknown override key or invalid value.
    """
    if preset not in PRESETS:
        raise InputError(f"unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}")
    return ModelConfig.from_dict({**PRESETS[preset], "vocab_size": vocab_size, **overrides})


# ----------------------------------------------------------------------------------------------
# Building blocks

_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}


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


# How attention runs on CPU under bf16/fp16 autocast (issue 4). PyTorch's fused low-precision
# SDPA kernels are slow on CPUs without AMX, and fp32 SDPA pays the casts. Measured on the
# 2-core development machine, 2 threads, fwd+bwd of one attention at B = 32, 4 heads, d_h = 64:
# L = 140 self-attention 40.0 ms (bf16 SDPA) / 27.7 (fp32 SDPA) / 18.8 (``"math"``); L = 140
# queries on 35 keys 42.1 / 14.3 / 5.7; L = 280 self-attention 127.7 / 90.4 / 74.9.
#   "math": two batched matmuls in the autocast dtype around an fp32 softmax (the scores are
#           rounded to the autocast dtype before the softmax, as an eager autocast model does);
#   "fp32": fp32 SDPA, the result cast back;
#   "sdpa": the low-precision SDPA kernel.
# fp32 inputs and other devices always use SDPA.
CPU_LOW_PRECISION_ATTENTION = "math"


def _attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """``scaled_dot_product_attention`` on ``(B, h, T, d_h)`` tensors (``attn_mask`` bool, True =
    may attend), with the CPU low-precision path of :data:`CPU_LOW_PRECISION_ATTENTION`; returns
    the result in ``q``'s dtype. Raises ValueError for an unknown mode."""
    mode = CPU_LOW_PRECISION_ATTENTION
    if q.device.type != "cpu" or q.dtype not in (torch.bfloat16, torch.float16) or mode == "sdpa":
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
        )
    if mode == "fp32":
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
    if mode != "math":
        raise ValueError(f"CPU_LOW_PRECISION_ATTENTION must be math, fp32 or sdpa, not {mode!r}")
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
        probs = dropout(probs, dropout_p, dropout_p > 0.0).to(q.dtype)
        return torch.matmul(probs, v)


def _key_mask(padding_mask: Tensor) -> Tensor:
    """``(B, S)`` True-at-pad -> ``(B, 1, 1, S)`` True-where-attended, the SDPA boolean mask."""
    return (~padding_mask)[:, None, None, :]


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection and an optional key/value cache."""

    def __init__(self, d_model: int, heads: int, attention_dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.attention_dropout = attention_dropout
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
        )  # (B, h, T, d_h)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))


class CrossAttention(nn.Module):
    """Multi-head attention from decoder states to encoder states; K/V cacheable across steps."""

    def __init__(self, d_model: int, heads: int, attention_dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.attention_dropout = attention_dropout
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
        )  # (B, h, T, d_h)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))


# Cheaper dropout masks on CPU (issue 4): set to False for torch's own F.dropout everywhere.
FAST_DROPOUT = True
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


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout, as ``F.dropout(x, p, training)``, with cheaper masks on CPU.

    torch's CPU dropout draws one Bernoulli sample per element (6.8 ms for a (3840, 256) fp32
    tensor on the development machine: more than a 256×256 linear layer, 6.3 ms, and twice a
    bf16 one). Here one 64-bit draw gives the 16-bit random thresholds of four elements (2.9 ms):
    an element is dropped with probability ``round(p·2¹⁶)/2¹⁶`` (0.100006 for p = 0.1) and the
    others are scaled by the inverse of that keep rate; the mask is kept as bool for the
    backward. Same generator (torch's default) as ``F.dropout``, so seeding, ``fork_rng`` and
    the RNG states of checkpoints work alike; the masks differ from ``F.dropout``'s. Used on CPU
    when :data:`FAST_DROPOUT` is true (default); other devices use ``F.dropout`` (fused there).

    Args:
        x: any float tensor.
        p: drop probability in [0, 1).
        training: apply dropout only when true.

    Returns:
        A tensor shaped and typed like ``x``.
    """
    if not training or p == 0.0:
        return x
    if not FAST_DROPOUT or x.device.type != "cpu" or x.numel() == 0:
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
        self.self_attn = SelfAttention(d, config.attention_heads, config.attention_dropout)
        self.self_attn_norm = nn.LayerNorm(d)
        if cross_attention:
            self.cross_attn = CrossAttention(d, config.attention_heads, config.attention_dropout)
            self.cross_attn_norm = nn.LayerNorm(d)
        else:
            self.cross_attn = None
        self.fc1 = nn.Linear(d, config.ffn_dim)
        self.fc2 = nn.Linear(config.ffn_dim, d)
        self.ffn_norm = nn.LayerNorm(d)

    def _residual(self, x: Tensor, norm: nn.LayerNorm, sublayer: typing.Callable) -> Tensor:
        if self.pre_norm:
            return x + dropout(sublayer(norm(x)), self.dropout, self.training)
        return norm(x + dropout(sublayer(x), self.dropout, self.training))

    def _ffn(self, x: Tensor) -> Tensor:
        h = self.activation(self.fc1(x))  # (B, T, ffn)
        return self.fc2(dropout(h, self.activation_dropout, self.training))

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
    ``scale_embedding=False`` (anchor-spec §1.1)."""
    return math.sqrt(config.d_model) if config.scale_embedding else 1.0


def _init_bert(module: nn.Module, std: float) -> None:
    """BERT init (anchor-spec §1.1, ``--apply-bert-init``): N(0, std) weights, zero biases, zero
    padding row; LayerNorms keep (1, 0)."""
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

    Shared by :class:`DATModel` and :class:`fadat.baseline.ATModel` (anchor-spec §1.1).
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
        x = dropout(x, self.config.dropout, self.training)  # (B, S, d)
        mask = _key_mask(padding_mask)  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, self_mask=mask)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return EncoderOut(x, padding_mask)


# ----------------------------------------------------------------------------------------------
# Links head


def transition_mask(graph_lengths: Tensor, size: int, max_transition_length: int = -1) -> Tensor:
    """Valid transitions ``v_i -> v_j``: ``i < j < L_b`` and ``j − i ≤ m`` (anchor-spec §1.3).

    Args:
        graph_lengths: ``(B,)`` int64 graph sizes ``L_b`` (≤ ``size``).
        size: padded graph size ``L``.
        max_transition_length: m; −1 = unlimited.

    Returns:
        ``(B, L, L)`` bool.
    """
    idx = torch.arange(size, device=graph_lengths.device)
    jump = idx[None, :] - idx[:, None]  # (L, L): j - i
    valid = jump > 0
    if max_transition_length > 0:
        valid = valid & (jump <= max_transition_length)
    return valid[None] & (idx[None, None, :] < graph_lengths[:, None, None])  # (B, L, L)


def transition_log_probs(
    query: Tensor,
    key: Tensor,
    gate_logits: Tensor,
    graph_lengths: Tensor,
    max_transition_length: int = -1,
) -> Tensor:
    """The links: log transition probabilities of the DAG, a gated mixture of H heads
    (anchor-spec §1.3 ``extract_links``; paper Eq. 2 with multi-head transitions).

    ``links[b,i,j] = log Σ_h softmax_h(gate[b,i])_h · softmax_{j valid}(S[b,i,j,h])`` with
    ``S[b,i,j,h] = <Q[b,i,h], K[b,j,h]> / sqrt(d_h)``,

    computed in fp32 as ``logsumexp_h(log_softmax_j(S) + log_softmax_h(gate))``. Invalid
    transitions (``j ≤ i``, ``j ≥ L_b``, ``j − i > m``) are −inf; rows with no successor (the last
    vertex, padding rows) are all −inf. Those entries are filled *after* the softmax and the
    mixture and never enter them, so neither the values nor the gradients contain NaN.

    Args:
        query: ``(B, L, H, d_h)`` projected vertex features (any float dtype; cast to fp32).
        key: ``(B, L, H, d_h)``.
        gate_logits: ``(B, L, H)``.
        graph_lengths: ``(B,)`` int64 ``L_b``.
        max_transition_length: m; −1 = unlimited.

    Returns:
        ``(B, L, L)`` fp32 links.
    """
    b, size, heads, dh = query.shape
    q = query.float().transpose(1, 2)  # (B, H, L, d_h)
    k = key.float().transpose(1, 2)  # (B, H, L, d_h)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh)  # (B, H, L, L)
    valid = transition_mask(graph_lengths, size, max_transition_length)  # (B, L, L)
    has_successor = valid.any(dim=-1, keepdim=True)  # (B, L, 1)
    # Rows without a successor are left unmasked so their softmax stays finite (and is discarded).
    scores = scores.masked_fill((~valid & has_successor)[:, None], float("-inf"))
    head_logp = torch.log_softmax(scores, dim=-1)  # (B, H, L, L)
    log_gate = torch.log_softmax(gate_logits.float(), dim=-1).transpose(1, 2)  # (B, H, L)
    mixed = head_logp + log_gate[..., None]  # (B, H, L, L)
    # Zero the invalid entries before the logsumexp: all −inf inputs would give NaN gradients.
    mixed = torch.where(valid[:, None], mixed, mixed.new_zeros(()))
    links = torch.logsumexp(mixed, dim=1)  # (B, L, L)
    return links.masked_fill(~valid, float("-inf"))


class LinksHead(nn.Module):
    """Projects vertex features ``[h_j; P_link(j)]`` (2d) to per-head queries and keys (d) and gate
    logits (H) and returns the links (anchor-spec §1.3, ``--links-feature feature:position``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.heads = config.link_heads
        self.max_transition_length = config.max_transition_length
        self.positions = nn.Embedding(config.max_target_positions, d)
        self.query_linear = nn.Linear(2 * d, d)
        self.key_linear = nn.Linear(2 * d, d)
        self.gate_linear = nn.Linear(2 * d, config.link_heads)

    def forward(self, states: Tensor, graph_lengths: Tensor) -> Tensor:
        """``states`` ``(B, L, d)`` final decoder states, ``graph_lengths`` ``(B,)`` ->
        ``(B, L, L)`` fp32 links. Runs in fp32 with autocast disabled."""
        b, size, d = states.shape
        with torch.autocast(device_type=states.device.type, enabled=False):
            pos = self.positions(torch.arange(size, device=states.device))  # (L, d)
            feats = torch.cat([states.float(), pos.float().expand(b, size, d)], dim=-1)  # (B,L,2d)
            q = self.query_linear(feats).view(b, size, self.heads, d // self.heads)
            k = self.key_linear(feats).view(b, size, self.heads, d // self.heads)
            gate = self.gate_linear(feats)  # (B, L, H)
            return transition_log_probs(q, k, gate, graph_lengths, self.max_transition_length)


# ----------------------------------------------------------------------------------------------
# DA-Transformer


def _vertex_targets(targets: Tensor, size: int) -> Tensor:
    """``(B, T)`` target ids repeated for each of ``size`` vertices: ``(B·size, T)`` int64."""
    batch, steps = targets.shape
    return targets[:, None, :].expand(batch, size, steps).reshape(batch * size, steps)


class _TargetLogProbs(torch.autograd.Function):
    """``log_softmax(logits)`` gathered at the target ids, with a hand-written backward.

    Forward and backward run over row blocks of ``(B·L, V)`` so that no ``(B, L, V)`` fp32
    tensor exists: the log-softmax is taken in fp32 (or fp64) block by block and gathered, and
    the gradient ``scatter(g) − softmax · Σ_t g`` of each block (the softmax recomputed) is
    written straight into the logits' dtype: into a new tensor, or with ``inplace_backward``
    into the logits' own storage, block by block after that block's softmax is taken.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, logits: Tensor, targets: Tensor, block: int, inplace_backward: bool
    ) -> Tensor:
        batch, size, vocab = logits.shape
        wide = torch.float64 if logits.dtype == torch.float64 else torch.float32
        flat = logits.reshape(batch * size, vocab)
        index = _vertex_targets(targets, size)  # (B·L, T)
        steps = index.shape[1]
        # torch's fused (log_)softmax kernels with an fp32 output are ≈ 1.5x faster on CPU than
        # logsumexp (max, subtract, exp, sum, log as separate passes) on the cast block
        out = torch.empty(batch * size, steps, dtype=wide, device=logits.device)  # (B·L, T)
        for start in range(0, batch * size, block):
            stop = start + block
            logprobs = torch.log_softmax(flat[start:stop], dim=-1, dtype=wide)
            out[start:stop] = logprobs.gather(1, index[start:stop])
        ctx.save_for_backward(logits, targets)
        ctx.block, ctx.wide = block, wide
        ctx.inplace = inplace_backward and logits.is_contiguous()
        ctx.consumed = False
        return out.view(batch, size, steps).transpose(1, 2)  # (B, T, L)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        if ctx.consumed:
            raise RuntimeError(
                "target_logprobs(inplace_backward=True): the first backward overwrote the logits "
                "with their gradient; a second backward (retain_graph) cannot run"
            )
        logits, targets = ctx.saved_tensors
        batch, size, vocab = logits.shape
        steps = targets.shape[1]
        g = grad.transpose(1, 2).reshape(batch * size, steps)  # (B·L, T)
        g_total = g.sum(dim=-1)  # (B·L,)
        index = _vertex_targets(targets, size)  # (B·L, T)
        flat = logits.reshape(batch * size, vocab)
        out = flat if ctx.inplace else torch.empty_like(flat)  # (B·L, V)
        ctx.consumed = ctx.inplace
        for start in range(0, batch * size, ctx.block):
            stop = start + ctx.block
            probs = torch.softmax(flat[start:stop], dim=-1, dtype=ctx.wide)
            probs.mul_(-g_total[start:stop, None])
            probs.scatter_add_(1, index[start:stop], g[start:stop].to(ctx.wide))
            out[start:stop] = probs
        return out.view(batch, size, vocab), None, None, None


def target_logprobs(
    logits: Tensor, targets: Tensor, block: int = 256, inplace_backward: bool = False
) -> Tensor:
    """Log-probabilities of the reference tokens at every vertex, straight from the logits.

    Equals ``fadat.dag.gather_match(log_softmax(logits.float(), -1), targets)`` (the "match" of
    anchor-spec §2) without materialising the ``(B, L, V)`` fp32 log-softmax or its gradient:
    the training step's largest memory traffic on CPU.

    Args:
        logits: ``(B, L, V)`` fp32, bf16, fp16 or fp64 output-projection logits.
        targets: ``(B, T)`` int64 token ids in ``[0, V)`` (padding ids included; the DAG DP
            ignores positions past ``T_b``).
        block: rows of ``(B·L, V)`` processed at once.
        inplace_backward: the backward writes the gradient into the storage of ``logits``
            (contiguous ones; others get a new tensor) instead of a new ``(B, L, V)`` tensor,
            as fused cross-entropy kernels do: one large allocation less per training step,
            whose first touch is what costs on CPU. ``logits`` hold the gradient after the
            backward, so only a caller that owns them may set it; their version counter moves,
            so an autograd node that saved them raises if it runs later, and a second backward
            through this node raises.

    Returns:
        ``(B, T, L)`` fp32 (fp64 for fp64 logits), differentiable w.r.t. ``logits``; the
        gradient comes back in the logits' dtype.

    Raises:
        ValueError: bad shapes or a target id outside ``[0, V)``.
    """
    if logits.dim() != 3 or targets.dim() != 2 or targets.shape[0] != logits.shape[0]:
        raise ValueError(
            f"need logits (B, L, V) and targets (B, T), got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= logits.shape[-1]):
        raise ValueError(f"target ids must lie in [0, {logits.shape[-1]})")
    return _TargetLogProbs.apply(logits, targets, block, inplace_backward)


def uniform_copy(encoder_out: EncoderOut, decoder_tokens: Tensor) -> Tensor:
    """Encoder states copied uniformly onto the ``<unk>`` vertices (``ModelConfig.copy_source``).

    Vertex j of a graph of ``L_b`` vertices (the non-pad decoder tokens) takes the state of
    source position ``round(j·(S_b − 1)/(L_b − 1))``, ``S_b`` the non-pad source length; the
    other vertices (``<s>``, ``</s>``, glanced tokens, padding) take zeros.

    Args:
        encoder_out: ``(B, S, d)`` states and ``(B, S)`` padding mask.
        decoder_tokens: ``(B, L)`` int64 decoder input.

    Returns:
        ``(B, L, d)`` in the states' dtype.
    """
    states = encoder_out.states  # (B, S, d)
    src_len = (~encoder_out.padding_mask).sum(dim=1)  # (B,)
    graph_len = decoder_tokens.ne(PAD_ID).sum(dim=1)  # (B,)
    j = torch.arange(decoder_tokens.shape[1], device=decoder_tokens.device)  # (L,)
    ratio = (src_len - 1).double() / (graph_len - 1).clamp(min=1).double()  # (B,)
    index = torch.round(j[None, :].double() * ratio[:, None]).long()  # (B, L)
    index = torch.minimum(index, (src_len - 1)[:, None]).clamp(min=0)
    copied = states.gather(1, index[..., None].expand(-1, -1, states.shape[-1]))  # (B, L, d)
    return copied * decoder_tokens.eq(UNK_ID)[..., None].to(copied.dtype)


class DATModel(nn.Module):
    """DA-Transformer: encoder, non-autoregressive decoder over L graph vertices, token head and
    links head (anchor-spec §1; paper §2.2, Eq. 1–2).

    Attributes:
        config: the :class:`ModelConfig` (``model_type == "dat"``).
        encoder: the :class:`Encoder` (owns the shared embedding).
        metadata: the non-config entries of config.json after :meth:`from_pretrained`
            (e.g. ``"data"`` licence/attribution), else ``{}``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.model_type != "dat":
            raise InputError(f"DATModel needs model_type 'dat', got {config.model_type!r}")
        self.config = config
        self.metadata: dict[str, Any] = {}
        d = config.d_model
        self.encoder = Encoder(config)
        self.embed_scale = embedding_scale(config)
        self.embed_positions = nn.Embedding(config.max_target_positions, d)
        self.layers = nn.ModuleList(
            TransformerLayer(config, cross_attention=True) for _ in range(config.decoder_layers)
        )
        self.final_norm = nn.LayerNorm(d) if config.pre_norm else None
        self.links_head = LinksHead(config)
        self.apply(lambda m: _init_bert(m, config.init_std))

    @property
    def output_weight(self) -> Tensor:
        """``(V, d)`` the bias-free output projection, tied to the shared token embedding."""
        return self.encoder.embed_tokens.weight

    def encode(self, source: Tensor) -> EncoderOut:
        """Run the encoder on ``source`` ``(B, S)`` int64 (see :meth:`Encoder.forward`)."""
        return self.encoder(source)

    def graph_lengths(self, source_lengths: Tensor, decoding: bool = False) -> Tensor:
        """Graph sizes ``L_b = clip(int(λ·|x </s>|), 2, max_target_positions)`` (anchor-spec §1.2).

        Args:
            source_lengths: ``(B,)`` int64 source lengths including ``</s>``.
            decoding: use ``decode_upsample_ratio`` instead of ``upsample_ratio``.

        Returns:
            ``(B,)`` int64 on the device of ``source_lengths``.
        """
        ratio = self.config.decoding_upsample_ratio if decoding else self.config.upsample_ratio
        sizes = graph_size(source_lengths, ratio, max_positions=self.config.max_target_positions)
        return sizes.to(source_lengths.device) if isinstance(source_lengths, Tensor) else sizes

    def decoder_input_tokens(self, graph_lengths: Tensor) -> Tensor:
        """Decoder input ids ``[<s>, <unk> × (L_b − 2), </s>, <pad> …]`` (anchor-spec §1.2).

        Args:
            graph_lengths: ``(B,)`` int64, every ``L_b ≥ 2``.

        Returns:
            ``(B, max_b L_b)`` int64.

        Raises:
            ValueError: a graph length < 2.
        """
        if graph_lengths.numel() and int(graph_lengths.min()) < 2:
            raise ValueError("graph lengths must be >= 2")
        width = int(graph_lengths.max()) if graph_lengths.numel() else 2
        idx = torch.arange(width, device=graph_lengths.device)[None, :]  # (1, L)
        lengths = graph_lengths[:, None]  # (B, 1)
        tokens = torch.full(
            (graph_lengths.shape[0], width), UNK_ID, dtype=torch.int64, device=graph_lengths.device
        )
        tokens[:, 0] = BOS_ID
        tokens = torch.where(idx == lengths - 1, EOS_ID, tokens)
        return torch.where(idx >= lengths, PAD_ID, tokens)  # (B, L)

    def decoder_states(self, encoder_out: EncoderOut, decoder_tokens: Tensor) -> Tensor:
        """Final decoder states of the NAT decoder (bidirectional self-attention over the
        non-pad vertices, cross-attention to the source).

        Args:
            encoder_out: from :meth:`encode`.
            decoder_tokens: ``(B, L)`` int64 vertex inputs (see :meth:`decode`).

        Returns:
            ``(B, L, d)`` (model dtype, or the autocast dtype).

        Raises:
            InputError: ``L`` exceeds ``max_target_positions``.
        """
        size = decoder_tokens.shape[1]
        if size > self.config.max_target_positions:
            raise InputError(
                f"graph size {size} exceeds the model's max_target_positions "
                f"{self.config.max_target_positions}"
            )
        positions = torch.arange(size, device=decoder_tokens.device)
        emb = self.encoder.embed_tokens(decoder_tokens)  # (B, L, d)
        x = self.embed_scale * emb + self.embed_positions(positions)
        if self.config.copy_source:
            x = x + uniform_copy(encoder_out, decoder_tokens)  # (B, L, d)
        x = dropout(x, self.config.dropout, self.training)  # (B, L, d)
        self_mask = _key_mask(decoder_tokens.eq(PAD_ID))  # (B, 1, 1, L): bidirectional
        memory_mask = _key_mask(encoder_out.padding_mask)  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, self_mask=self_mask, memory=encoder_out.states, memory_mask=memory_mask)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x

    def token_logits(self, states: Tensor) -> Tensor:
        """``(B, L, d)`` states -> ``(B, L, V)`` logits of the tied, bias-free output projection,
        in the autocast dtype (bf16/fp16 under autocast, else fp32)."""
        return F.linear(states, self.output_weight)  # (B, L, V)

    def token_head(self, states: Tensor) -> Tensor:
        """``(B, L, d)`` states -> ``(B, L, V)`` fp32 token log-probs: the tied, bias-free output
        projection, logits cast to fp32 before the log-softmax (anchor-spec §1.4)."""
        return torch.log_softmax(self.token_logits(states).float(), dim=-1)  # (B, L, V) fp32

    def decode_logits(
        self, encoder_out: EncoderOut, decoder_tokens: Tensor
    ) -> tuple[Tensor, Tensor]:
        """:meth:`decode` without the log-softmax: ``(logits (B, L, V), links (B, L, L))``.

        The training objectives take the reference tokens' log-probabilities from the logits with
        :func:`target_logprobs`, which never builds the ``(B, L, V)`` fp32 log-softmax.
        """
        states = self.decoder_states(encoder_out, decoder_tokens)  # (B, L, d)
        lengths = decoder_tokens.ne(PAD_ID).sum(dim=1)  # (B,)
        return self.token_logits(states), self.links_head(states, lengths)

    def decode(self, encoder_out: EncoderOut, decoder_tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Run the NAT decoder and both heads.

        Args:
            encoder_out: from :meth:`encode`.
            decoder_tokens: ``(B, L)`` int64 vertex inputs (plain ``<unk>`` input or a glanced
                one); the graph size ``L_b`` is the number of non-pad tokens of row b, which
                must form a prefix of the row.

        Returns:
            ``token_logprobs`` ``(B, L, V)`` fp32 (:meth:`token_head`) and ``links``
            ``(B, L, L)`` fp32 (:class:`LinksHead`, :func:`transition_log_probs`).

        Raises:
            InputError: ``L`` exceeds ``max_target_positions``.
        """
        logits, links = self.decode_logits(encoder_out, decoder_tokens)
        return torch.log_softmax(logits.float(), dim=-1), links  # (B, L, V), (B, L, L)

    def forward(
        self, source: Tensor, graph_lengths: Tensor, decoder_tokens: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Encode ``source`` ``(B, S)`` and decode a graph of ``graph_lengths`` ``(B,)`` vertices.

        Args:
            source: ``(B, S)`` int64.
            graph_lengths: ``(B,)`` int64 (from :meth:`graph_lengths`).
            decoder_tokens: ``(B, L)`` int64 decoder input; default
                :meth:`decoder_input_tokens` of ``graph_lengths``.

        Returns:
            ``(token_logprobs (B, L, V), links (B, L, L))``, both fp32.
        """
        if decoder_tokens is None:
            decoder_tokens = self.decoder_input_tokens(graph_lengths)
        return self.decode(self.encode(source), decoder_tokens)

    def save_pretrained(
        self,
        directory: str | Path,
        *,
        spm_model: str | Path | None = None,
        extra: dict[str, Any] | None = None,
        weights_dtype: str = "float32",
    ) -> None:
        """Write a complete model directory (see :func:`save_model_directory`)."""
        save_model_directory(
            self, directory, spm_model=spm_model, extra=extra, weights_dtype=weights_dtype
        )

    @classmethod
    def from_pretrained(cls, directory: str | Path, map_location: str = "cpu") -> DATModel:
        """Load a model directory written by :meth:`save_pretrained` (see :func:`load_pretrained`).

        Raises:
            InputError: as :func:`load_pretrained`, or the directory holds an AT model.
        """
        return _load(directory, map_location, expected="dat")


# ----------------------------------------------------------------------------------------------
# Model directory: config.json + model.safetensors + spm.model


def save_model_directory(
    model: nn.Module,
    directory: str | Path,
    *,
    spm_model: str | Path | None = None,
    extra: dict[str, Any] | None = None,
    weights_dtype: str = "float32",
) -> None:
    """Write ``config.json``, ``model.safetensors`` and (optionally) ``spm.model`` to ``directory``.

    config.json is ``{"model_type", "format_version": 1, "config": {...}, "spm_model": "spm.model"
    or null, **extra}``; put the training data's licence and attribution in ``extra`` (e.g.
    ``{"data": {"licence": ..., "attribution": ..., "source_lang": ..., "target_lang": ...}}``).
    The tied output weight is the shared embedding and is stored once. Files are written to a
    temporary name and renamed, so an interrupted save leaves no truncated file.

    Args:
        model: a :class:`DATModel` or ``fadat.baseline.ATModel``.
        directory: created if missing.
        spm_model: path of the sentencepiece model to copy in; ``None`` keeps no tokenizer.
        extra: further JSON-serialisable top-level entries.
        weights_dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"``: the dtype of the stored
            floating-point weights (half the file size for the 16-bit ones, e.g. for a model
            kept in git). Loading casts them back into the model's fp32 parameters; the value
            is recorded in config.json as ``weights_dtype``.

    Raises:
        ValueError: ``extra`` uses a reserved key, or an unknown ``weights_dtype``.
        InputError: ``spm_model`` does not exist, or ``directory`` is not new, empty or a
            fadat model directory (:func:`fadat.outputs.check_output_dir`).
    """
    from safetensors.torch import save_file

    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if weights_dtype not in dtypes:
        raise ValueError(f"weights_dtype must be one of {sorted(dtypes)}, got {weights_dtype!r}")

    directory = Path(directory)
    reserved = {"model_type", "format_version", "config", "spm_model", "weights_dtype"}
    clash = reserved & set(extra or {})
    if clash:
        raise ValueError(f"extra uses reserved config.json keys: {sorted(clash)}")
    if spm_model is not None and not Path(spm_model).is_file():
        raise InputError(f"sentencepiece model {spm_model} does not exist")
    # Only a new, empty or fadat model directory is written (fadat.outputs); other files in it
    # stay.
    outputs.mark_dir(directory, "model")
    meta = {
        "model_type": model.config.model_type,
        "format_version": FORMAT_VERSION,
        "config": model.config.to_dict(),
        "spm_model": SPM_NAME if spm_model is not None else None,
        "weights_dtype": weights_dtype,
        **(extra or {}),
    }
    state = {}
    for name, value in model.state_dict().items():
        value = value.detach()
        if value.is_floating_point():
            value = value.to(dtypes[weights_dtype])
        state[name] = value.contiguous().cpu()
    tmp = directory / (WEIGHTS_NAME + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt", "model_type": model.config.model_type})
    os.replace(tmp, directory / WEIGHTS_NAME)
    if spm_model is not None and Path(spm_model).resolve() != (directory / SPM_NAME).resolve():
        tmp = directory / (SPM_NAME + ".tmp")
        shutil.copyfile(spm_model, tmp)
        os.replace(tmp, directory / SPM_NAME)
    tmp = directory / (CONFIG_NAME + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, directory / CONFIG_NAME)


def read_model_metadata(directory: str | Path) -> dict[str, Any]:
    """Read and check a model directory's config.json.

    Returns:
        The parsed config.json (``model_type``, ``format_version``, ``config``, ...).

    Raises:
        InputError: missing directory, missing/corrupt config.json, unknown ``model_type`` or
            ``format_version``, invalid ``config``.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"model directory {directory} does not exist")
    path = directory / CONFIG_NAME
    if not path.is_file():
        raise InputError(f"{path}: missing (not a fadat model directory)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(meta, dict):
        raise InputError(f"{path}: expected a JSON object")
    if meta.get("format_version") != FORMAT_VERSION:
        raise InputError(
            f"{path}: unsupported format_version {meta.get('format_version')!r} "
            f"(this fadat reads {FORMAT_VERSION})"
        )
    if meta.get("model_type") not in MODEL_TYPES:
        raise InputError(f"{path}: unknown model_type {meta.get('model_type')!r}")
    try:
        config = ModelConfig.from_dict(meta.get("config"))
    except InputError as err:
        raise InputError(f"{path}: {err}") from err
    if config.model_type != meta["model_type"]:
        raise InputError(f"{path}: model_type {meta['model_type']!r} disagrees with its config")
    return meta


def spm_model_path(directory: str | Path) -> Path | None:
    """Path of the sentencepiece model stored in a model directory, or ``None`` if it has none.

    Raises:
        InputError: as :func:`read_model_metadata`, or config.json names a missing file.
    """
    meta = read_model_metadata(directory)
    name = meta.get("spm_model")
    if name is None:
        return None
    path = Path(directory) / name
    if not path.is_file():
        raise InputError(f"{path}: sentencepiece model named in config.json is missing")
    return path


def _load(
    directory: str | Path, map_location: str | torch.device, expected: str | None
) -> nn.Module:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    meta = read_model_metadata(directory)
    if expected is not None and meta["model_type"] != expected:
        raise InputError(
            f"{Path(directory) / CONFIG_NAME}: holds a {meta['model_type']!r} model, "
            f"expected {expected!r}"
        )
    config = ModelConfig.from_dict(meta["config"])
    if config.model_type == "dat":
        model: nn.Module = DATModel(config)
    else:
        from fadat.baseline import ATModel

        model = ATModel(config)
    path = Path(directory) / WEIGHTS_NAME
    if not path.is_file():
        raise InputError(f"{path}: missing")
    try:
        state = load_file(str(path), device=str(map_location))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise InputError(f"{path}: cannot read weights ({err})") from err
    expected_state = model.state_dict()
    missing = sorted(set(expected_state) - set(state))
    unexpected = sorted(set(state) - set(expected_state))
    if missing or unexpected:
        raise InputError(
            f"{path}: weights do not match the config (missing {missing[:5]}, "
            f"unexpected {unexpected[:5]})"
        )
    for name, tensor in state.items():
        if tensor.shape != expected_state[name].shape:
            raise InputError(
                f"{path}: {name} has shape {tuple(tensor.shape)}, the config expects "
                f"{tuple(expected_state[name].shape)}"
            )
    model.to(map_location)
    # load_state_dict copies into the existing parameters, so the tie (one Parameter used by the
    # embedding and the output projection) is kept.
    model.load_state_dict(state, strict=True)
    model.metadata = {k: v for k, v in meta.items() if k != "config"}
    model.eval()
    return model


def load_pretrained(directory: str | Path, map_location: str | torch.device = "cpu") -> nn.Module:
    """Load any fadat model directory, dispatching on config.json's ``model_type``.

    Args:
        directory: written by ``save_pretrained``.
        map_location: device for the weights.

    Returns:
        A :class:`DATModel` or ``fadat.baseline.ATModel`` in eval mode; its ``metadata`` holds
        the non-config entries of config.json.

    Raises:
        InputError: missing directory; missing or corrupt config.json or model.safetensors;
            unknown ``model_type`` or ``format_version``; invalid config; weights whose names or
            shapes do not match the config. The message names the file.
    """
    return _load(directory, map_location, expected=None)
