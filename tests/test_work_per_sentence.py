"""bench/work_per_sentence.py: the multiply-adds counted on fadat's real forward code equal
closed forms written from the architecture (tiny DAT and AT, every part), scale with λ as the
architecture says, the AT's beam costs the beam width times greedy's steps after the first, a
shallower decoder does less decoder work, and the command line's table and JSON come from the
counts."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fadat.models.at import ATModel
from fadat.models.config import make_config
from fadat.models.dat import DATModel

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "work_per_sentence.py"
SPM = ROOT / "models" / "bible-en-es-fadat-cpu-small" / "spm.model"
SRC = ROOT / "tests" / "data" / "bible-en-es-test-50.en"
REF = ROOT / "tests" / "data" / "bible-en-es-test-50.es"

D, F, HEADS, LINK_HEADS, V = 32, 64, 4, 2, 40


def load_script():
    spec = importlib.util.spec_from_file_location("work_per_sentence", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["work_per_sentence"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def wps():
    return load_script()


def tiny(model_type: str, encoder_layers: int, decoder_layers: int):
    config = make_config(
        "tiny",
        V,
        model_type=model_type,
        d_model=D,
        ffn_dim=F,
        attention_heads=HEADS,
        link_heads=LINK_HEADS,
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        copy_source=model_type == "dat",
    )
    return (DATModel if model_type == "dat" else ATModel)(config).eval()


# ---- closed forms, from the architecture (fadat.models.transformer, fadat.models.dat)


def encoder_macs(layers: int, s: int) -> int:
    """Per layer: Q/K/V/O projections 4·S·d², scores and weighted sum 2·S²·d, FFN 2·S·d·f."""
    return layers * (4 * s * D * D + 2 * s * s * D + 2 * s * D * F)


def dat_macs(encoder_layers: int, decoder_layers: int, s: int, size: int) -> dict[str, int]:
    """The DAT at graph size L: decoder layers over L (self-attention over L, cross-attention:
    Q/O over L, K/V over S, scores and sum L·S), links head (Q and K of [h; pos] (2d → d), gate
    (2d → H), scores L·L·d), token head L·d·V."""
    n = decoder_layers
    return {
        "graph_size": size,
        "encoder": encoder_macs(encoder_layers, s),
        "decoder_self_attention": n * (4 * size * D * D + 2 * size * size * D),
        "decoder_cross_attention": n * (2 * size * D * D + 2 * s * D * D + 2 * size * s * D),
        "decoder_ffn": n * 2 * size * D * F,
        "links_head": 2 * size * 2 * D * D + size * 2 * D * LINK_HEADS + size * size * D,
        "token_head": size * D * V,
    }


def at_step_macs(decoder_layers: int, s: int, t: int, rows: int) -> dict[str, int]:
    """Step t (0-based) on ``rows`` rows with a cache: self-attention Q/K/V/O 4·d² and t + 1 keys;
    cross-attention Q/O 2·d² and S keys, its K/V (2·S·d²) at step 0 only; FFN; d·V output."""
    n = decoder_layers
    return {
        "decoder_self_attention": n * rows * (4 * D * D + 2 * (t + 1) * D),
        "decoder_cross_attention": n * rows * (2 * D * D + 2 * s * D)
        + (n * rows * 2 * s * D * D if t == 0 else 0),
        "decoder_ffn": n * rows * 2 * D * F,
        "output_projection": rows * D * V,
    }


@pytest.mark.parametrize(("encoder_layers", "decoder_layers"), [(2, 2), (3, 1)])
@pytest.mark.parametrize(("s", "lam", "size"), [(5, 2.0, 10), (9, 4.0, 36), (7, 2.5, 17)])
def test_dat_counts_equal_the_closed_form(wps, encoder_layers, decoder_layers, s, lam, size):
    model = tiny("dat", encoder_layers, decoder_layers)
    assert wps.dat_work(model, s, lam) == dat_macs(encoder_layers, decoder_layers, s, size)


@pytest.mark.parametrize("beam", [1, 3])
def test_at_counts_equal_the_closed_form(wps, beam):
    """Every step on CTranslate2's schedule: step 0 on one row, then ``beam`` rows."""
    model = tiny("at", 2, 2)
    s, steps = 6, 5
    encoder, per_step = wps.at_work(model, s, steps, beam)
    assert encoder == encoder_macs(2, s)
    expected = [at_step_macs(2, s, t, 1 if t == 0 else beam) for t in range(steps)]
    assert per_step == expected


def test_at_sentences_composed_from_steps_equal_whole_closed_form(wps):
    """The composition (steps at the shortest length, step 1 per length) gives every sentence's
    closed-form total, and its check counts some sentences whole."""
    model = tiny("at", 1, 2)
    pairs = [(4, 3), (9, 2), (6, 7), (4, 3), (12, 1)]
    work, checked = wps.at_sentence_work(model, pairs, beam=4, verify=3)
    assert len(checked) == 3
    for s, t in set(pairs):
        steps = [at_step_macs(2, s, i, 1 if i == 0 else 4) for i in range(t)]
        expected = {"encoder": encoder_macs(1, s)}
        for key in steps[0]:
            expected[key] = sum(step[key] for step in steps)
        assert work[s, t] == expected, (s, t)


def test_at_sentence_check_catches_a_wrong_composition(wps, monkeypatch):
    """Steps whose work is not a step term plus a length term make the check fail."""

    def fake(model, s, steps, beam):
        return 0, [{k: s * t for k in wps.AT_DETAIL[1:]} for t in range(steps)]

    monkeypatch.setattr(wps, "at_work", fake)
    with pytest.raises(AssertionError, match="counted whole"):
        wps.at_sentence_work(None, [(3, 4), (5, 6)], beam=1, verify=2)


def test_work_scales_with_lambda_as_the_architecture_says(wps):
    """At one source length and L = 2S, 3S, 4S: the encoder does not change; the token head is
    L·d·V; the decoder's and the links head's second differences are those of their L² terms
    (self-attention scores 2·L²·d per layer, link scores L²·d); the token head has none."""
    layers, s = 2, 8
    model = tiny("dat", 1, layers)
    work = [wps.dat_work(model, s, lam) for lam in (2.0, 3.0, 4.0)]
    sizes = [w["graph_size"] for w in work]
    assert sizes == [2 * s, 3 * s, 4 * s]
    assert len({w["encoder"] for w in work}) == 1
    assert [w["token_head"] for w in work] == [size * D * V for size in sizes]

    def second_difference(key):
        values = [sum(w[k] for k in w if k.startswith(key)) for w in work]
        return values[2] - 2 * values[1] + values[0]

    assert second_difference("decoder") == 2 * (layers * 2 * D) * s * s
    assert second_difference("links_head") == 2 * D * s * s
    assert second_difference("token_head") == 0


def test_beam_is_beam_width_times_greedys_steps_after_the_first(wps):
    model = tiny("at", 2, 2)
    s, steps = 7, 6
    enc_g, greedy = wps.at_work(model, s, steps, 1)
    enc_b, beam = wps.at_work(model, s, steps, 5)
    assert enc_g == enc_b
    assert beam[0] == greedy[0]  # one row, the cross-attention's K/V projected once
    for t in range(1, steps):
        assert beam[t] == {k: 5 * v for k, v in greedy[t].items()}
    total_g = sum(sum(step.values()) for step in greedy)
    total_b = sum(sum(step.values()) for step in beam)
    assert total_b - total_g == 4 * sum(sum(step.values()) for step in greedy[1:])


def test_shallower_decoder_does_less_decoder_work(wps):
    """At one width and λ, 5+1 does a third of 3+3's decoder work and less in all; the sweep's
    presets (cpu-small-5x1 has a wider FFN) too."""

    def decoder(work):
        return sum(v for k, v in work.items() if k.startswith("decoder_"))

    def total(work):
        return sum(v for k, v in work.items() if k != "graph_size")

    deep, shallow = tiny("dat", 3, 3), tiny("dat", 5, 1)
    a, b = wps.dat_work(deep, 10, 4.0), wps.dat_work(shallow, 10, 4.0)
    assert 3 * decoder(b) == decoder(a)
    assert total(b) < total(a)
    base = DATModel(make_config("cpu-small", 4000, copy_source=True)).eval()
    five = DATModel(make_config("cpu-small-5x1", 4000, copy_source=True)).eval()
    a, b = wps.dat_work(base, 30, 4.0), wps.dat_work(five, 30, 4.0)
    assert decoder(b) < decoder(a) / 2
    assert total(b) < total(a)


def test_dag_decoder_ops_by_hand(wps):
    # L = 4: K = 2; lookahead 4²; joint-Viterbi block k=2: 2², ends k=1, 2: 3 + 2
    assert wps.dag_decoder_ops(4) == {"lookahead": 16, "joint_viterbi": 4 + 3 + 2}
    assert wps.dag_decoder_ops(2) == {"lookahead": 4, "joint_viterbi": 0}


def test_command_line_table_and_json_come_from_the_counts(wps, tmp_path, capsys):
    """Configs and a model directory, three sentences: every row's numbers are the summaries of
    per-sentence totals recomputed here from the JSON's per-length counts; a design with the
    released model's network (the λ range) refers to its counts."""
    from fadat.data.spm import encode_source, load_sentencepiece

    out = tmp_path / "work.json"
    argv = [
        "--src",
        str(SRC),
        "--ref",
        str(REF),
        "--test-sentences",
        "3",
        "--dat",
        f"tiny={ROOT / 'configs' / 'dat-tiny-nll.yaml'}",
        "--dat",
        f"released={ROOT / 'models' / 'bible-en-es-fadat-cpu-small'}",
        "--dat",
        f"same={ROOT / 'configs' / 'dat-cpu-small-range-nll.yaml'}",  # released's network
        "--vocab",
        "4000",
        "--spm",
        str(SPM),
        "--at",
        str(ROOT / "configs" / "synth-at.yaml"),
        "--at-vocab",
        "4000",
        "--at-spm",
        str(SPM),
        "--ratios",
        "2",
        "4",
        "--beam",
        "3",
        "--verify",
        "1",
        "--json",
        str(out),
    ]
    report = wps.main(argv)
    table = capsys.readouterr().out
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert [r["system"] for r in report["rows"]] == [
        "AT greedy",
        "AT beam3",
        "tiny",
        "tiny",
        "released",
        "released",
        "same",
        "same",
    ]
    assert report["counts"]["dat"]["same"] == {"same_counts_as": "released"}
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(report["rows"])  # the header, then one per row
    sp = load_sentencepiece(SPM)
    sources = SRC.read_text().splitlines()[:3]
    refs = REF.read_text().splitlines()[:3]
    lengths = [len(encode_source(sp, x)) for x in sources]
    steps = [len(sp.encode(y)) + 1 for y in refs]

    def records(columns, *keys):
        """Columns -> {(key values): total MACs}."""
        parts = [k for k in columns if k in wps.AT_DETAIL or k in wps.DAT_DETAIL]
        return {
            tuple(columns[k][i] for k in keys): sum(columns[k][i] for k in parts)
            for i in range(len(columns[keys[0]]))
        }

    def at_totals(label):
        total = records(report["counts"]["at"][label], "source_length", "steps")
        return np.array([total[s, t] for s, t in zip(lengths, steps, strict=True)])

    greedy, beam = at_totals("greedy"), at_totals("beam3")
    assert report["rows"][1]["total"]["mean"] == pytest.approx(beam.mean())
    for row in report["rows"][2:]:
        design = report["counts"]["dat"][row["system"]]
        design = report["counts"]["dat"][design.get("same_counts_as", row["system"])]
        columns = design[f"{row['lambda']:g}"]
        total = records(columns, "source_length")
        totals = np.array([total[(s,)] for s in lengths])
        assert row["total"]["median"] == pytest.approx(np.median(totals))
        assert row["total"]["p90"] == pytest.approx(np.percentile(totals, 90))
        ratio = row["ratios"]["beam3"]
        assert ratio["median_of_ratios"] == pytest.approx(np.median(totals / beam))
        assert ratio["ratio_of_means"] == pytest.approx(totals.mean() / beam.mean())
        assert row["ratios"]["greedy"]["ratio_of_means"] == pytest.approx(
            totals.mean() / greedy.mean()
        )
        assert sum(row["share"].values()) == pytest.approx(1.0)
    # the two designs at λ = 4 differ (3+3 at d = 256 against the tiny preset)
    assert report["rows"][5]["total"]["mean"] > 10 * report["rows"][3]["total"]["mean"]
