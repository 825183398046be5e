"""The model configuration of every fadat architecture: :class:`ModelConfig` (a frozen
dataclass, checked when built, saved as ``config.json`` in a model directory) and the named
presets (:data:`PRESETS`, :func:`make_config`). The layers that read it are
:mod:`fadat.models.transformer`'s.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F

from fadat.data.contract import UNK_ID
from fadat.errors import InputError

#: The activations a config may name, and their functions (the layers of
#: :mod:`fadat.models.transformer` look them up here, so the check and the layers cannot disagree).
_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}

#: The largest value of each size of a :class:`ModelConfig`. A config.json is read before any
#: layer is built, and a damaged or hand-edited one (``d_model`` 1e9, 100000 layers) would
#: otherwise allocate until memory runs out, or build modules for minutes, before failing with
#: a traceback. Each bound is far above any model that can be trained today:
MAX_SIZES: dict[str, int] = {
    # 64x the largest sentencepiece vocabularies in use (256k pieces).
    "vocab_size": 2**24,
    # 3.5x the widest published Transformers (d = 18432); one d x d matrix is then 16 GiB.
    "d_model": 2**16,
    "ffn_dim": 2**18,
    # The deepest published Transformer (DeepNet) has 1000 layers.
    "encoder_layers": 1024,
    "decoder_layers": 1024,
    # A DAT's links for one sentence of L = 65536 vertices are an (L, L) float32 matrix of
    # 16 GiB; the AT's and the encoder's attention grow the same way.
    "max_source_positions": 2**16,
    "max_target_positions": 2**16,
}

#: The most parameters a config may describe (:func:`minimum_parameters`): 2**34 = 17.2 G
#: parameters are 64 GiB of float32 weights, and training them needs 4x that with AdamW's
#: gradients and two moments: more than the memory of the largest single GPU (141 GB) or of
#: most CPU machines.
MAX_PARAMETERS = 2**34


def minimum_parameters(config: ModelConfig) -> int:
    """A lower bound of the parameter count of a model of any architecture with ``config``:
    the token embedding (V·d), the two position tables ((S + T)·d) and, per layer, the
    attention projections (4·d²) and the feed-forward block (2·d·ffn). Biases, norms, the
    decoder's cross-attention and the architectures' heads come on top.

    Python integers: no overflow whatever the sizes.
    """
    d = config.d_model
    embeddings = d * (config.vocab_size + config.max_source_positions + config.max_target_positions)
    layers = (config.encoder_layers + config.decoder_layers) * (4 * d * d + 2 * d * config.ffn_dim)
    return embeddings + layers


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Sizes and options of a DAT or AT model (docs/reference-behaviour.md, "Network"; unknown keys
    are rejected).

    Attributes:
        model_type: the architecture, a key of :data:`fadat.models.architectures.ARCHITECTURES`.
            Checked where a name comes in (the training config, a model directory's
            config.json, :func:`fadat.models.architectures.model_class`), not here: the registry's
            interface names this class, so this module does not import the registry.
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
        upsample_ratio: λ used to size the graph in training (``L = int(λ·|x </s>|)``); with
            ``upsample_ratio_range``, the λ of the validation loss and (unless
            ``decode_upsample_ratio`` is set) of decoding.
        upsample_ratio_range: DAT only; ``(a, b)``: each training sentence's λ is drawn
            uniformly from ``[a, b]`` at every update instead of being ``upsample_ratio``
            (DA-Transformer v2's ``--upsample-scale a~b``;
            :func:`fadat.data.contract.drawn_graph_size`, which also raises a drawn graph to
            the target length). ``None`` (default): a fixed λ. Not written to config.json when
            ``None``, so that fixed-λ model directories are as before.
        decode_upsample_ratio: λ at decoding; ``None`` means ``upsample_ratio``.
        link_heads: H, heads of the links head (DAT only); must divide ``d_model``.
        max_transition_length: largest jump ``j − i`` of a transition; −1 = unlimited (§1.3).
        pre_norm: pre-LN layers with a final LayerNorm instead of post-LN (reference: post-LN).
        init_std: standard deviation of the BERT initialisation (reference 0.02).
        scale_embedding: multiply token embeddings by sqrt(d) (reference; fairseq's
            ``--no-scale-embedding`` turns it off). Off, the N(0, init_std) learned positions
            are as large as the token embeddings from the first update instead of sqrt(d)
            times smaller, which matters for the NAT decoder whose inputs are all ``<unk>``.
        copy_source: DAT only, not in the reference (whose decoder input has no source copy;
            a learning-speed option, default off): add to the input of every ``<unk>`` vertex j
            the final encoder state of source position ``round(j·(S_b − 1)/(L_b − 1))``
            (uniform copy, Gu et al. 2018), so that each vertex sees source content from the
            first update.
        cpu_attention: how attention runs on CPU under bf16/fp16 autocast (:data:`CPU_ATTENTION`):
            ``"math"`` (default, fastest measured here), ``"fp32"`` or ``"sdpa"``; no effect in
            fp32 or on other devices.
        fast_dropout: dropout masks from 16-bit random thresholds on CPU (:func:`dropout`);
            False = ``F.dropout``. Changes the masks, not the expected result.
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
    upsample_ratio_range: tuple[float, float] | None = None
    decode_upsample_ratio: float | None = None
    link_heads: int = 8
    max_transition_length: int = -1
    pre_norm: bool = False
    init_std: float = 0.02
    scale_embedding: bool = True
    copy_source: bool = False
    cpu_attention: str = "math"
    fast_dropout: bool = True

    def __post_init__(self) -> None:
        r = self.upsample_ratio_range
        if isinstance(r, (list, tuple)) and all(_is_number(v) for v in r):  # JSON/YAML lists
            object.__setattr__(self, "upsample_ratio_range", tuple(float(v) for v in r))
        _check_field_types(self)
        problems = []
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
        for name, most in MAX_SIZES.items():
            if getattr(self, name) > most:
                problems.append(
                    f"{name} must be <= {most} (larger than any CPU or GPU could hold), got "
                    f"{getattr(self, name)}"
                )
        if not problems and minimum_parameters(self) > MAX_PARAMETERS:
            problems.append(
                f"the sizes describe at least {minimum_parameters(self):.3g} parameters, more "
                f"than the {MAX_PARAMETERS:.3g} (64 GiB of float32 weights) that fadat loads"
            )
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
        if self.upsample_ratio_range is not None:
            low, high = self.upsample_ratio_range
            if not 0 < low <= high:
                problems.append(
                    f"upsample_ratio_range must be two numbers 0 < a <= b, got "
                    f"{list(self.upsample_ratio_range)}"
                )
            if self.model_type != "dat":
                problems.append("upsample_ratio_range applies to model_type 'dat' only")
        if self.decode_upsample_ratio is not None and self.decode_upsample_ratio <= 0:
            problems.append(f"decode_upsample_ratio must be > 0, got {self.decode_upsample_ratio}")
        if self.max_transition_length == 0 or self.max_transition_length < -1:
            problems.append(
                f"max_transition_length must be -1 or >= 1, got {self.max_transition_length}"
            )
        if self.init_std <= 0:
            problems.append("init_std must be > 0")
        if self.cpu_attention not in ("math", "fp32", "sdpa"):
            problems.append(f"cpu_attention must be math, fp32 or sdpa, got {self.cpu_attention!r}")
        if self.copy_source and self.model_type != "dat":
            problems.append("copy_source applies to model_type 'dat' only")
        if problems:
            raise InputError("invalid model config: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """All fields as a JSON-serialisable dict (the ``"config"`` entry of config.json), but
        ``upsample_ratio_range`` only when set (a list): a fixed-λ model's config.json stays
        what earlier versions wrote and read."""
        d = dataclasses.asdict(self)
        if self.upsample_ratio_range is None:
            del d["upsample_ratio_range"]
        else:
            d["upsample_ratio_range"] = list(self.upsample_ratio_range)
        return d

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
            if typing.get_origin(t) is tuple:  # a fixed-length tuple of numbers
                ok = ok or (
                    isinstance(value, tuple)
                    and len(value) == len(typing.get_args(t))
                    and all(_is_number(v) for v in value)
                )
            elif t is type(None):
                ok = ok or value is None
            elif t is float:
                ok = ok or _is_number(value)
            elif t is int:
                ok = ok or (isinstance(value, int) and not isinstance(value, bool))
            else:
                ok = ok or isinstance(value, t)
        if not ok:
            raise InputError(f"model config key {f.name!r} has the wrong type: {value!r}")
        numbers = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
            # NaN passes every range check below (NaN <= 0 is False) and empties every output.
            raise InputError(f"model config key {f.name!r} must be a finite number, got {value}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
    # Deep-encoder / shallow-decoder DATs at about cpu-small's parameter count (issue 44; Kasai et
    # al., ICLR 2021, "Deep encoder, shallow decoder"): every decoder layer runs over the λ·|x|
    # vertices, an encoder layer over |x| tokens, so a decoder layer costs about λ times an
    # encoder layer (more, with its cross-attention). Parameters of the DAT (tests/test_depths.py
    # counts them) at the released model's V = 4000 / at V = 8000: cpu-small (3+3) 7,408,132 /
    # 8,432,132; cpu-small-4x2 7,144,452 (−3.6 %) / 8,168,452 (−3.1 %); cpu-small-5x1 7,274,756
    # (−1.8 %) / 8,298,756 (−1.6 %). 5+1 at FFN 1024 would be −7.1 % / −6.3 %, so cpu-small-5x1
    # has FFN 1152 in both stacks.
    "cpu-small-4x2": dict(
        d_model=256,
        encoder_layers=4,
        decoder_layers=2,
        attention_heads=4,
        ffn_dim=1024,
        link_heads=4,
        max_source_positions=256,
        max_target_positions=1024,
        upsample_ratio=4.0,
    ),
    "cpu-small-5x1": dict(
        d_model=256,
        encoder_layers=5,
        decoder_layers=1,
        attention_heads=4,
        ffn_dim=1152,
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
    """The config of a named preset (a key of :data:`PRESETS`: ``tiny``, ``cpu-small``,
    ``cpu-small-4x2``, ``cpu-small-5x1``, ``base``) with overrides.

    Raises:
        InputError: unknown preset, unknown override key or invalid value.
    """
    if preset not in PRESETS:
        raise InputError(f"unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}")
    return ModelConfig.from_dict({**PRESETS[preset], "vocab_size": vocab_size, **overrides})
