"""Tests of fadat.models.dat: links head vs. a plain transcription of docs/reference-behaviour.md,
"Links", decoder inputs, graph sizes, masking, dropout determinism, autocast dtypes, the model
directory format."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.errors import InputError
from fadat.models.architectures import model_class
from fadat.models.config import PRESETS, ModelConfig, make_config
from fadat.models.dat import DATModel, LinksHead, transition_log_probs
from fadat.models.directory import load_pretrained, read_model_metadata, spm_model_path

V = 40


def tiny(**overrides) -> DATModel:
    torch.manual_seed(0)
    return DATModel(make_config("tiny", V, **overrides))


def reference_links(head: LinksHead, states: torch.Tensor, lengths: torch.Tensor, m: int):
    """docs/reference-behaviour.md, "Links" transcribed literally: (B, L, L, H) layout, einsum, −inf
    mask, NaN rows overwritten after the softmax, logsumexp over heads with log-gates."""
    b, size, d = states.shape
    h = head.heads
    pos = head.positions.weight[:size]  # (L, d)
    feats = torch.cat([states, pos.expand(b, size, d)], dim=-1).double()
    wq, bq = head.query_linear.weight.double(), head.query_linear.bias.double()
    wk, bk = head.key_linear.weight.double(), head.key_linear.bias.double()
    wg, bg = head.gate_linear.weight.double(), head.gate_linear.bias.double()
    q = torch.einsum("ble,de->bld", feats, wq).add(bq).view(b, size, h, d // h)
    k = torch.einsum("ble,de->bld", feats, wk).add(bk).view(b, size, h, d // h)
    log_g = torch.log_softmax(torch.einsum("ble,he->blh", feats, wg) + bg, dim=-1)  # (B, L, H)
    s = torch.einsum("bihd,bjhd->bijh", q, k) / math.sqrt(d // h)  # (B, L, L, H)
    valid = torch.zeros(b, size, size, dtype=torch.bool)
    for bb in range(b):
        for i in range(size):
            for j in range(size):
                valid[bb, i, j] = j > i and j < lengths[bb] and (m < 0 or j - i <= m)
    a = torch.log_softmax(s.masked_fill(~valid[..., None], float("-inf")), dim=2)
    no_succ = ~valid.any(dim=2)  # (B, L)
    a = a.masked_fill(no_succ[:, :, None, None], float("-inf"))
    return torch.logsumexp(a + log_g[:, :, None, :], dim=-1)  # (B, L, L)


@pytest.mark.parametrize("m", [-1, 1, 3])
@pytest.mark.parametrize("heads", [1, 4])
def test_links_head_matches_spec_transcription(m, heads):
    torch.manual_seed(1)
    config = make_config("tiny", V, link_heads=heads, max_transition_length=m)
    head = LinksHead(config)
    for p in head.parameters():  # fixed, non-trivial weights (biases too)
        torch.nn.init.normal_(p, std=0.3)
    states = torch.randn(3, 9, config.d_model)
    lengths = torch.tensor([9, 5, 2])
    got = head(states, lengths)
    want = reference_links(head, states, lengths, m)
    assert got.dtype == torch.float32
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    assert finite.any()
    torch.testing.assert_close(got[finite].double(), want[finite], rtol=1e-5, atol=1e-5)
    assert not torch.isnan(got).any()
    # every vertex with a successor has a proper distribution over its window
    row_sums = got.exp().sum(-1)  # (B, L)
    has_succ = finite.any(-1)
    torch.testing.assert_close(row_sums[has_succ], torch.ones_like(row_sums[has_succ]))
    assert (row_sums[~has_succ] == 0).all()


def test_links_gradients_are_finite():
    torch.manual_seed(2)
    q = torch.randn(2, 7, 3, 4, requires_grad=True)
    k = torch.randn(2, 7, 3, 4, requires_grad=True)
    g = torch.randn(2, 7, 3, requires_grad=True)
    links = transition_log_probs(q, k, g, torch.tensor([7, 4]), max_transition_length=2)
    # logsumexp over whole rows/graphs sends zero gradient into −inf entries, the NaN trap
    torch.logsumexp(links.flatten(1), dim=-1).sum().backward()
    for t in (q, k, g):
        assert torch.isfinite(t.grad).all()
        assert t.grad.abs().sum() > 0


def test_decoder_input_tokens_and_graph_lengths():
    model = tiny(upsample_ratio=2.5, decode_upsample_ratio=1.5, max_target_positions=20)
    src_len = torch.tensor([3, 1, 12])
    assert model.graph_lengths(src_len).tolist() == [7, 2, 20]  # int(2.5·n), min 2, clip 20
    assert model.graph_lengths(src_len, decoding=True).tolist() == [4, 2, 18]
    toks = model.decoder_input_tokens(torch.tensor([4, 2, 5]))
    want = [
        [BOS_ID, UNK_ID, UNK_ID, EOS_ID, PAD_ID],
        [BOS_ID, EOS_ID, PAD_ID, PAD_ID, PAD_ID],
        [BOS_ID, UNK_ID, UNK_ID, UNK_ID, EOS_ID],
    ]
    assert toks.tolist() == want
    with pytest.raises(ValueError):
        model.decoder_input_tokens(torch.tensor([1]))


def test_forward_shapes_masks_and_padding_invariance():
    model = tiny(max_transition_length=4).eval()
    src = torch.tensor([[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID, PAD_ID, PAD_ID]])
    lengths = model.graph_lengths(src.ne(PAD_ID).sum(1))
    lp, links = model(src, lengths)
    size = int(lengths.max())
    assert lp.shape == (2, size, V) and links.shape == (2, size, size)
    assert lp.dtype == links.dtype == torch.float32
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(2, size))
    # row 1 alone, without any padding, gives the same outputs as inside the padded batch
    lp1, links1 = model(src[1:, :3], lengths[1:])
    n = int(lengths[1])
    torch.testing.assert_close(lp1[0], lp[1, :n], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(links1[0], links[1, :n, :n], rtol=1e-5, atol=1e-5)
    assert torch.isinf(links[1, :, n:]).all() and torch.isinf(links[1, n - 1]).all()
    # window: nothing beyond 4 steps ahead
    i, j = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    assert torch.isinf(links[:, (j - i > 4) | (j <= i)]).all()


def test_decoder_self_attention_is_bidirectional():
    model = tiny().eval()
    src = torch.tensor([[5, 6, EOS_ID]])
    enc = model.encode(src)
    toks = model.decoder_input_tokens(torch.tensor([8]))
    lp_a, _ = model.decode(enc, toks)
    toks_b = toks.clone()
    toks_b[0, 6] = 17  # a glanced token late in the graph changes earlier vertices
    lp_b, _ = model.decode(enc, toks_b)
    assert not torch.allclose(lp_a[0, 1], lp_b[0, 1])


def test_dropout_masks_repeat_under_the_same_seed():
    model = tiny(dropout=0.3).train()
    src = torch.tensor([[5, 6, 7, EOS_ID], [9, EOS_ID, PAD_ID, PAD_ID]])
    enc = model.encode(src)
    toks = model.decoder_input_tokens(model.graph_lengths(torch.tensor([4, 2])))
    torch.manual_seed(123)
    a = model.decode(enc, toks)
    torch.manual_seed(123)
    b = model.decode(enc, toks)
    torch.manual_seed(124)
    c = model.decode(enc, toks)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    assert not torch.equal(a[0], c[0])  # dropout is really on


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_keeps_heads_in_fp32(dtype):
    model = tiny().train()
    src = torch.tensor([[5, 6, 7, EOS_ID]])
    lengths = model.graph_lengths(torch.tensor([4]))
    with torch.autocast("cpu", dtype=dtype):
        lp, links = model(src, lengths)
    assert lp.dtype == torch.float32 and links.dtype == torch.float32
    assert not torch.isnan(links).any()
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(lp.shape[:2]))
    torch.testing.assert_close(links.exp().sum(-1)[0, :-1], torch.ones(lp.shape[1] - 1))
    (lp[..., 5].sum() + links[torch.isfinite(links)].sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_save_load_round_trip_and_tied_output(tmp_path, pre_norm):
    model = tiny(pre_norm=pre_norm).eval()
    spm = tmp_path / "src.model"
    spm.write_bytes(b"not really a sentencepiece model")
    data = {"licence": "CC0", "attribution": "tests", "source_lang": "en", "target_lang": "es"}
    model.save_pretrained(tmp_path / "m", spm_model=spm, extra={"data": data})
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    assert meta["model_type"] == "dat" and meta["format_version"] == 1
    assert meta["data"] == data and meta["config"]["pre_norm"] is pre_norm
    assert spm_model_path(tmp_path / "m").read_bytes() == spm.read_bytes()
    # the tied weight is stored once
    stored = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert sum(t.shape == (V, model.config.d_model) for t in stored.values()) == 1
    assert set(stored) == set(model.state_dict())

    loaded = DATModel.from_pretrained(tmp_path / "m")
    assert loaded.config == model.config and loaded.metadata["data"] == data
    assert loaded.output_weight is loaded.encoder.embed_tokens.weight
    src = torch.tensor([[5, 6, 7, EOS_ID]])
    lengths = torch.tensor([9])
    for x, y in zip(model(src, lengths), loaded(src, lengths), strict=True):
        assert torch.equal(x, y)
    # the tie survives loading: a change to the embedding moves the token head
    with torch.no_grad():
        loaded.encoder.embed_tokens.weight[7] += 1.0
    assert not torch.equal(model(src, lengths)[0][..., 7], loaded(src, lengths)[0][..., 7])
    assert isinstance(load_pretrained(tmp_path / "m"), DATModel)


@pytest.mark.parametrize("weights_dtype", ["float16", "bfloat16"])
def test_half_precision_weights_load_back_into_fp32(tmp_path, weights_dtype):
    model = tiny().eval()
    model.save_pretrained(tmp_path / "m", weights_dtype=weights_dtype)
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    assert meta["weights_dtype"] == weights_dtype
    stored = load_file(str(tmp_path / "m" / "model.safetensors"))
    half = getattr(torch, weights_dtype)
    assert {t.dtype for t in stored.values() if t.is_floating_point()} == {half}
    full = (tmp_path / "f").mkdir() or tmp_path / "f"
    model.save_pretrained(full)
    size = (tmp_path / "m" / "model.safetensors").stat().st_size
    assert size < 0.6 * (full / "model.safetensors").stat().st_size
    loaded = DATModel.from_pretrained(tmp_path / "m")
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    assert loaded.output_weight is loaded.encoder.embed_tokens.weight
    for name, value in model.state_dict().items():
        expected = value.to(half).to(value.dtype) if value.is_floating_point() else value
        assert torch.equal(loaded.state_dict()[name], expected), name
    with pytest.raises(ValueError, match="weights_dtype"):
        model.save_pretrained(tmp_path / "x", weights_dtype="int8")


def test_config_validation():
    c = make_config("tiny", V)
    assert ModelConfig.from_dict(c.to_dict()) == c
    with pytest.raises(InputError, match="unknown model config keys: bogus"):
        ModelConfig.from_dict({**c.to_dict(), "bogus": 1})
    with pytest.raises(InputError, match="vocab_size"):
        ModelConfig.from_dict({k: v for k, v in c.to_dict().items() if k != "vocab_size"})
    with pytest.raises(InputError, match="divisible"):
        make_config("tiny", V, link_heads=3)
    with pytest.raises(InputError, match="wrong type"):
        make_config("tiny", V, d_model="32")
    with pytest.raises(InputError, match="unknown model preset"):
        make_config("huge", V)
    # the architecture's name is the registry's to check (fadat.models.architectures.model_class)
    bogus = make_config("tiny", V, model_type="no-such-architecture")
    with pytest.raises(InputError, match="model_type must be one of"):
        model_class(bogus.model_type)
    assert set(PRESETS) >= {"tiny", "cpu-small", "base"}
    base = make_config("base", 100)
    assert (base.encoder_layers, base.decoder_layers, base.d_model, base.ffn_dim) == (
        6,
        6,
        512,
        2048,
    )
    assert (base.attention_heads, base.link_heads, base.upsample_ratio) == (8, 8, 8.0)
    with pytest.raises(dataclasses_frozen_error()):
        c.d_model = 8  # type: ignore[misc]


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="config.json: missing"):
        load_pretrained(tmp_path / "empty")

    model = tiny()
    d = tmp_path / "m"
    model.save_pretrained(d)
    cfg = d / "config.json"
    good = json.loads(cfg.read_text())

    def rewrite(**changes):
        cfg.write_text(json.dumps({**good, **changes}))

    cfg.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_pretrained(d)
    rewrite(format_version=2)
    with pytest.raises(InputError, match="format_version"):
        load_pretrained(d)
    rewrite(model_type="no-such-architecture")
    with pytest.raises(InputError, match="unknown model_type"):
        load_pretrained(d)
    # ModelConfig leaves the name to the registry: the config's own model_type must agree
    rewrite(config={**good["config"], "model_type": "no-such-architecture"})
    with pytest.raises(InputError, match="disagrees"):
        load_pretrained(d)
    with pytest.raises(InputError, match="model_type must be one of .*'no-such-architecture'"):
        model_class("no-such-architecture")
    rewrite(config={**good["config"], "d_model": 64, "ffn_dim": 64})
    with pytest.raises(InputError, match="shape"):
        load_pretrained(d)
    rewrite(config={**good["config"], "bogus": 1})
    with pytest.raises(InputError, match="bogus"):
        load_pretrained(d)
    rewrite()
    with pytest.raises(InputError, match="expected 'at'"):
        from fadat.models.at import ATModel

        ATModel.from_pretrained(d)
    weights = d / "model.safetensors"
    weights.write_bytes(b"\x00" * 20)
    with pytest.raises(InputError, match="model.safetensors"):
        load_pretrained(d)
    weights.unlink()
    with pytest.raises(InputError, match="model.safetensors: missing"):
        load_pretrained(d)
    assert read_model_metadata(d)["model_type"] == "dat"


def test_too_long_inputs_are_rejected():
    model = tiny(max_source_positions=4, max_target_positions=8)
    with pytest.raises(InputError, match="max_source_positions"):
        model.encode(torch.full((1, 5), 5))
    enc = model.encode(torch.tensor([[5, EOS_ID]]))
    with pytest.raises(InputError, match="max_target_positions"):
        model.decode(enc, model.decoder_input_tokens(torch.tensor([9])))


def test_cpu_low_precision_attention_modes_match_fp32_model(monkeypatch):
    import fadat.models.transformer as fm

    model = tiny().eval()
    src = torch.tensor([[5, 6, 7, EOS_ID], [9, EOS_ID, PAD_ID, PAD_ID]])
    lengths = model.graph_lengths(torch.tensor([4, 2]))
    fp32 = model(src, lengths)
    for mode in ("math", "fp32", "sdpa"):
        other = DATModel(dataclasses.replace(model.config, cpu_attention=mode)).eval()
        other.load_state_dict(model.state_dict())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = other(src, lengths)
        for a, c in zip(out, fp32, strict=True):
            finite = torch.isfinite(c)
            assert torch.equal(torch.isfinite(a), finite), mode
            # within bf16 rounding of the fp32 model
            torch.testing.assert_close(a[finite], c[finite], rtol=0.05, atol=0.05)
    q = torch.zeros(1, 1, 2, 4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cpu_attention"):
        fm._attention(q, q, q, mode="nope")
    with pytest.raises(InputError, match="cpu_attention"):
        dataclasses.replace(model.config, cpu_attention="nope")


@pytest.mark.parametrize("causal", [False, True])
def test_math_attention_equals_sdpa_in_value_and_gradient(monkeypatch, causal):
    """The "math" CPU path against SDPA on the same bf16 inputs (fp32 reference math): masks,
    top-left causal alignment with more keys than queries, and the gradients of q, k, v."""
    import fadat.models.transformer as fm

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 8, generator=g).bfloat16().requires_grad_()
    k = torch.randn(2, 3, 7, 8, generator=g).bfloat16().requires_grad_()
    v = torch.randn(2, 3, 7, 8, generator=g).bfloat16().requires_grad_()
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 4:] = False
    out = fm._attention(q, k, v, attn_mask=mask, is_causal=causal)
    assert out.dtype == torch.bfloat16
    ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
    full = mask & torch.ones(5, 7, dtype=torch.bool).tril() if causal else mask
    ref = F.scaled_dot_product_attention(*ref_in, attn_mask=full)
    torch.testing.assert_close(out.double(), ref, rtol=0.03, atol=0.03)
    grad = torch.randn(out.shape, generator=g)
    out.backward(grad.bfloat16())
    ref.backward(grad.double())
    for x, r in zip((q, k, v), ref_in, strict=True):
        torch.testing.assert_close(x.grad.double(), r.grad, rtol=0.05, atol=0.05)
    # dropout on the attention weights changes the output; the same seed gives the same masks
    torch.manual_seed(1)
    dropped = fm._attention(q, k, v, attn_mask=mask, dropout_p=0.5, is_causal=causal)
    assert not torch.equal(dropped, out)
    torch.manual_seed(1)
    assert torch.equal(
        dropped, fm._attention(q, k, v, attn_mask=mask, dropout_p=0.5, is_causal=causal)
    )


def test_scale_embedding_off_feeds_unscaled_embeddings_and_round_trips(tmp_path):
    scaled, plain = tiny(dropout=0.0).eval(), tiny(dropout=0.0, scale_embedding=False).eval()
    plain.load_state_dict(scaled.state_dict())
    src = torch.tensor([[5, 6, 7, EOS_ID]])
    enc_scaled, enc_plain = scaled.encode(src), plain.encode(src)
    assert not torch.allclose(enc_scaled.states, enc_plain.states)
    # with the embedding multiplied by sqrt(d) by hand, the unscaled model equals the scaled one
    with torch.no_grad():
        plain.encoder.embed_tokens.weight.mul_(math.sqrt(plain.config.d_model))
    torch.testing.assert_close(plain.encode(src).states, enc_scaled.states)
    plain.save_pretrained(tmp_path / "m")
    assert DATModel.from_pretrained(tmp_path / "m").config.scale_embedding is False
    # config.json files written before the option existed load with the reference default
    legacy = {k: v for k, v in scaled.config.to_dict().items() if k != "scale_embedding"}
    assert ModelConfig.from_dict(legacy).scale_embedding is True


def test_copy_source_adds_uniformly_mapped_encoder_states_to_unk_vertices():
    from fadat.models.transformer import EncoderOut, uniform_copy

    d = 3
    states = torch.arange(2 * 4 * d, dtype=torch.float64).view(2, 4, d)  # (B=2, S=4, d)
    padding = torch.tensor([[False] * 4, [False, False, True, True]])  # S_b = 4, 2
    tokens = torch.tensor(
        [
            [BOS_ID, UNK_ID, UNK_ID, 9, UNK_ID, UNK_ID, EOS_ID],  # L_b = 7, one glanced token
            [BOS_ID, UNK_ID, UNK_ID, EOS_ID, PAD_ID, PAD_ID, PAD_ID],  # L_b = 4
        ]
    )
    got = uniform_copy(EncoderOut(states, padding), tokens)
    for b, (s_len, g_len) in enumerate([(4, 7), (2, 4)]):
        for j in range(7):
            if tokens[b, j] == UNK_ID:
                want = states[b, round(j * (s_len - 1) / (g_len - 1))]
            else:
                want = torch.zeros(d, dtype=torch.float64)
            assert torch.equal(got[b, j], want), (b, j)
    model = tiny(copy_source=True, dropout=0.0).eval()
    plain = tiny(dropout=0.0).eval()
    plain.load_state_dict(model.state_dict())
    src, lengths = torch.tensor([[5, 6, 7, EOS_ID]]), torch.tensor([9])
    assert not torch.allclose(model(src, lengths)[0], plain(src, lengths)[0])
    with pytest.raises(InputError, match="copy_source"):
        make_config("tiny", V, model_type="at", copy_source=True)


# ---------------------------------------------------------------------------------------------
# Cheaper dropout masks


def test_fast_dropout_rate_scale_gradient_and_seeding():
    from fadat.models.transformer import dropout

    x = torch.rand(1000, 1000, dtype=torch.float64) + 0.5  # no zeros: dropped = exactly 0
    torch.manual_seed(3)
    out = dropout(x.requires_grad_(), 0.1, True)
    kept = out != 0
    scale = 65536 / (65536 - round(0.1 * 65536))
    # drop rate: 0.100006 ± 0.0003 (std of 10⁶ Bernoulli draws); scaled survivors exactly
    assert abs((~kept).double().mean().item() - 6554 / 65536) < 0.0015
    torch.testing.assert_close(out[kept], x[kept] * scale, rtol=1e-15, atol=0)
    w = torch.randn_like(x)
    (g,) = torch.autograd.grad((out * w).sum(), x)
    torch.testing.assert_close(g, w * kept * scale, rtol=1e-15, atol=0)
    # inverted dropout is unbiased; seeding reproduces the mask; eval and p = 0 are identity
    assert abs(out.mean().item() / x.mean().item() - 1) < 0.005
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.1, True), out)
    assert dropout(x, 0.1, False) is x and dropout(x, 0.0, True) is x
    # neighbouring elements (which share one 64-bit draw) are dropped independently
    pairs = (~kept).view(-1, 4)
    both = (pairs[:, 0] & pairs[:, 1]).double().mean().item()
    assert abs(both - (6554 / 65536) ** 2) < 0.002


def test_fast_dropout_switch_falls_back_to_torch(monkeypatch):
    import fadat.models.transformer as fm

    x = torch.ones(64, 64)
    torch.manual_seed(0)
    ours = fm.dropout(x, 0.3, True, fast=False)
    torch.manual_seed(0)
    assert torch.equal(ours, torch.nn.functional.dropout(x, 0.3, True))
