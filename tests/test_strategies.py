"""The strategy records (fadat.decoding.strategies): every model offers the registry's records for
its decoder kind, the records' defaults and ranges are the decoders' own, the command line and the
server read them, and a request a model cannot honour (a strategy it does not offer, a decoding λ
it would ignore) is refused once, at the boundary, with a DecodingOptionError."""

from __future__ import annotations

import argparse
import inspect

import pytest
import torch
from test_decoding import random_graph
from test_translate import _assert_one_error_line, run_cli

import fadat.decoding
from fadat.cli import build_parser
from fadat.decoding import decode
from fadat.decoding.strategies import (
    AUTOREGRESSIVE,
    DECODER_KINDS,
    GRAPH,
    REGISTRY,
    StrategyError,
    offered,
    strategy_names,
)
from fadat.errors import DecodingOptionError, InputError
from fadat.models.architectures import ARCHITECTURES, model_class
from fadat.models.config import make_config
from fadat.models.directory import load_model
from fadat.translation.pipeline import check_strategy, check_upsample_ratio, translate_lines
from fadat.translation.translator import Translator


def tiny(model_type: str, vocab: int = 16):
    torch.manual_seed(0)
    return model_class(model_type)(make_config("tiny", vocab, model_type=model_type)).eval()


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_every_models_strategies_are_the_registrys_records(model_type):
    model = tiny(model_type)
    got = model.offered_strategies()
    want = [s for s in REGISTRY.values() if s.needs == model.decoder_kind]
    assert list(got.values()) == want and all(got[s.name] is s for s in want)
    assert model.strategies() == {s.name: s.option_names for s in want}
    assert model.default_strategy in got and model.validation_strategy in got
    # the capabilities the callers branch on agree with the decoder kind
    assert model.has_graph == (model.decoder_kind == GRAPH)
    assert model.autoregressive == (model.decoder_kind == AUTOREGRESSIVE)


def test_every_record_is_offered_by_some_model_and_names_are_unique_per_kind():
    kinds = {model_class(t).decoder_kind for t in ARCHITECTURES}
    assert kinds == set(DECODER_KINDS)
    for kind in DECODER_KINDS:
        names = [s.name for s in REGISTRY.values() if s.needs == kind]
        assert len(names) == len(set(names)) == len(offered(kind))
    assert fadat.decoding.STRATEGIES == {n: s.fn for n, s in offered(GRAPH).items()}
    with pytest.raises(ValueError, match="decoder kind"):
        offered("tree")


def _signature_defaults(fn, skip: int) -> dict:
    params = list(inspect.signature(fn).parameters.values())[skip:]
    return {p.name: p.default for p in params}


def test_records_hold_the_decoders_own_options_and_defaults():
    for record in offered(GRAPH).values():
        assert record.defaults == _signature_defaults(record.fn, 3), record.name  # after the graph
    at = tiny("at")
    for record in at.offered_strategies().values():
        method = getattr(at, record.method)
        assert _signature_defaults(method, 1) == record.defaults, record.name  # after source


def _outside(option):
    """A value just outside an option's range and one on its closed bound (or None)."""
    step = 1 if option.type is int else 1e-6
    if option.low is not None:
        bad = option.low if option.low_open else option.low - step
        edge = None if option.low_open else option.low
        return bad, edge
    return option.high + step, option.high


def test_record_ranges_are_the_decoders_ranges():
    """For each bounded option of a DAG strategy: a value just outside the range is refused by
    the record *and* by the decoder itself; a value on a closed bound passes both."""
    tlp, ln, lens = random_graph(2, 6, 5, seed=1)
    checked = 0
    for record in offered(GRAPH).values():
        for option in record.options:
            if option.low is None and option.high is None:
                continue
            bad, edge = _outside(option)
            extra = {"no_repeated_ngram": 2} if record.name == "lookahead" else {}  # candidates
            extra.pop(option.name, None)
            with pytest.raises(StrategyError, match=option.name):
                record.check_request({**extra, option.name: bad})
            with pytest.raises(ValueError):
                decode(tlp, ln, lens, record.name, **extra, **{option.name: bad})
            if edge is not None:
                record.check_request({**extra, option.name: edge})
                decode(tlp, ln, lens, record.name, **extra, **{option.name: edge})
            checked += 1
    assert checked >= 12


def test_validation_tries_no_decode(models, monkeypatch):
    """The one check reads the record: no trial decode on a dummy graph."""
    model, _ = load_model(models["dat"])

    def no_decode(*args, **kwargs):
        raise AssertionError("a decode was tried")

    monkeypatch.setattr(fadat.decoding, "decode", no_decode)
    check_strategy(model, "sample", {"top_p": 0.5, "temperature": 2.0}, nbest=3)
    with pytest.raises(DecodingOptionError, match=r"top_p must be in \(0, 1\], got 2"):
        check_strategy(model, "sample", {"top_p": 2.0})
    with pytest.raises(DecodingOptionError, match="temperature:? must be > 0"):
        check_strategy(model, "sample", {"temperature": 0.0})
    with pytest.raises(DecodingOptionError, match="nbest 2.*one hypothesis.*'sample'"):
        check_strategy(model, "lookahead", {}, nbest=2)


def test_cli_strategy_choices_and_help_come_from_the_registry():
    def verb_parser(verb: str) -> argparse.ArgumentParser:
        actions = build_parser(verb)._actions
        verbs = next(a for a in actions if isinstance(a, argparse._SubParsersAction))
        return verbs.choices[verb]

    translate = verb_parser("translate")
    action = next(a for a in translate._actions if a.dest == "strategy")
    assert tuple(action.choices) == strategy_names()
    assert set(action.choices) == {s.name for s in REGISTRY.values()}
    for model_type in ARCHITECTURES:
        cls = model_class(model_type)
        names = [
            f"{n} (default)" if n == cls.default_strategy else n for n in offered(cls.decoder_kind)
        ]
        assert model_type.upper() in action.help and ", ".join(names) in action.help
    assert "NAT, CTC: argmax (default)" in action.help  # the hand-written help had lost it
    evaluate = verb_parser("evaluate")
    help_text = next(a for a in evaluate._actions if a.dest == "strategies").help
    assert "DAT: greedy, lookahead, viterbi, joint-viterbi, sample, beam; NAT, CTC: argmax" in (
        help_text
    )
    assert "; AT:" not in help_text


def test_unknown_cli_strategy_exits_2(models, capsys, monkeypatch):
    code, _, err = run_cli(
        ["translate", "--model", str(models["dat"]), "--strategy", "nope"],
        capsys,
        monkeypatch,
        b"ab\n",
    )
    _assert_one_error_line(code, err, "'nope'", "lookahead", "argmax")


@pytest.mark.parametrize(
    ("model_type", "strategy", "allowed"),
    [
        ("at", "lookahead", "greedy, beam"),
        ("nat", "beam", "argmax"),
        ("ctc", "sample", "argmax"),
        ("dat", "argmax", "greedy, lookahead, viterbi, joint-viterbi, sample, beam"),
    ],
)
def test_a_strategy_not_offered_is_refused_naming_the_offered_ones(model_type, strategy, allowed):
    model = tiny(model_type)
    with pytest.raises(DecodingOptionError) as caught:
        check_strategy(model, strategy, {})
    message = str(caught.value)
    assert f"{strategy!r} is not available for {model_type.upper()} models" in message
    assert message.endswith(f"choose one of {allowed}")
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, InputError)
    with pytest.raises(ValueError, match="not available"):  # the model's own check, the same
        model.check_options(strategy, {})


def test_lambda_is_refused_where_the_model_would_ignore_it(models, capsys, monkeypatch):
    for model_type in ("at", "nat"):
        model = tiny(model_type)
        assert not model.upsampled
        with pytest.raises(ValueError, match=f"this {model_type.upper()} model does not use"):
            check_upsample_ratio(2.0, model)
        check_upsample_ratio(None, model)
    for model_type in ("dat", "ctc"):
        assert tiny(model_type).upsampled
        check_upsample_ratio(2.0, tiny(model_type))
    at, sp = load_model(models["at"])
    with pytest.raises(DecodingOptionError, match="upsample_ratio"):
        translate_lines(at, sp, ["ab"], upsample_ratio=3.0)
    with pytest.raises(DecodingOptionError, match="upsample_ratio"):
        Translator.from_pretrained(models["at"], upsample_ratio=3.0)
    nat = tiny("nat", at.config.vocab_size)
    with pytest.raises(DecodingOptionError, match="NAT"):
        Translator(nat, sp, upsample_ratio=3.0)
    code, _, err = run_cli(
        ["translate", "--model", str(models["at"]), "--upsample-ratio", "3"],
        capsys,
        monkeypatch,
        b"ab\n",
    )
    _assert_one_error_line(code, err, "upsample", "AT")
    code, out, _ = run_cli(  # a DAT takes it
        ["translate", "--model", str(models["dat"]), "--upsample-ratio", "3"],
        capsys,
        monkeypatch,
        b"ab\n",
    )
    assert code == 0 and out.count("\n") == 1


def test_server_rejects_an_unknown_strategy_naming_the_allowed_ones(models):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from fadat.serve.app import create_app
    from fadat.serve.engine import Engine

    engine = Engine.from_directory(models["dat"])
    with TestClient(create_app(engine, max_wait_ms=2)) as client:
        health = client.get("/health").json()
        assert list(health["strategies"]) == list(offered(GRAPH))
        r = client.post("/v1/translate", json={"text": ["ab"], "strategy": "argmax"})
        assert r.status_code == 422
        detail = r.text
        assert "argmax" in detail
        for name in offered(GRAPH):
            assert name in detail
