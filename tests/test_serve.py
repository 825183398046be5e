"""Tests of fadat serve: every endpoint against the translation core on the same tiny models,
every bad request (4xx JSON naming the problem, the server still up), a 500 without a
traceback, dynamic batching (results equal to one-by-one translation, batches within the
budget, a failing job does not fail its batch-mates), SIGTERM finishing requests in flight,
the confidence formula, and Spearman's rho against the textbook formula."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from fadat.data.spm import train_sentencepiece  # noqa: E402
from fadat.decoding import decode  # noqa: E402
from fadat.evaluation.analysis import model_outputs  # noqa: E402
from fadat.evaluation.show_graph import graph_view  # noqa: E402
from fadat.models.at import ATModel  # noqa: E402
from fadat.models.config import make_config  # noqa: E402
from fadat.models.dat import DATModel  # noqa: E402
from fadat.models.directory import load_pretrained  # noqa: E402
from fadat.serve.app import Limits, create_app  # noqa: E402
from fadat.serve.batching import Batcher  # noqa: E402
from fadat.serve.engine import Engine, confidence  # noqa: E402
from fadat.serve.quality import average_ranks, spearman  # noqa: E402
from fadat.translation.pipeline import score_pairs, translate_lines  # noqa: E402

WORDS = "ab cd ef gh ij kl mn op qr st uv wx".split()
REPO = Path(__file__).resolve().parents[1]


def sentences(n: int, seed: int, low: int = 1, high: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) for _ in range(n)]


def make_models(root: Path) -> dict[str, Path]:
    """Randomly initialised tiny DAT and AT model directories sharing a word-level tokenizer
    (``init_std = 0.5``: peaked distributions, so padding in a batch cannot flip a decision)."""
    root.mkdir(parents=True, exist_ok=True)
    train_sentencepiece(sentences(200, 0), root / "spm", vocab_size=16, model_type="word")
    torch.manual_seed(0)
    dat = DATModel(make_config("tiny", 16, max_source_positions=12, init_std=0.5, dropout=0.0))
    dat.save_pretrained(root / "dat", spm_model=root / "spm.model")
    at = ATModel(
        make_config("tiny", 16, model_type="at", max_source_positions=12, init_std=0.5, dropout=0.0)
    )
    at.save_pretrained(root / "at", spm_model=root / "spm.model")
    return {"dat": root / "dat", "at": root / "at"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_models(tmp_path_factory.mktemp("serve-models"))


@pytest.fixture(scope="module")
def dat_engine(models: dict[str, Path]) -> Engine:
    return Engine.from_directory(models["dat"])


@pytest.fixture(scope="module")
def at_engine(models: dict[str, Path]) -> Engine:
    return Engine.from_directory(models["at"])


@pytest.fixture(scope="module")
def client(dat_engine: Engine):
    limits = Limits(max_sentences=8, max_chars=60, max_body_bytes=4000)
    with TestClient(create_app(dat_engine, max_wait_ms=2, limits=limits)) as c:
        yield c


def expected(engine: Engine, lines: list[str], strategy: str, **options) -> list[dict]:
    """The translation core's answer for ``lines``, with the confidence formula applied."""
    hyps = [
        h[0]
        for h in translate_lines(engine.model, engine.sp, lines, strategy=strategy, options=options)
    ]
    rows = [i for i, line in enumerate(lines) if line.strip()]
    pairs = score_pairs(
        engine.model, engine.sp, [lines[i] for i in rows], [hyps[i].text for i in rows]
    )
    out = [{"text": "", "score": None, "log_prob": None, "confidence": None} for _ in lines]
    for i, pair in zip(rows, pairs, strict=True):
        out[i] = {
            "text": hyps[i].text,
            "score": hyps[i].score,
            "log_prob": pair.log_prob,
            "confidence": math.exp(pair.log_prob / pair.tokens),
        }
    return out


def assert_translations(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g["text"] == w["text"]
        for key in ("score", "log_prob", "confidence"):
            if w[key] is None:
                assert g[key] is None
            else:
                assert g[key] == pytest.approx(w[key], rel=1e-4, abs=1e-6)


# ----------------------------------------------------------------------------------------------
# Endpoints


def test_health(client: TestClient, dat_engine: Engine):
    r = client.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["model_type"] == "dat" and body["graph"] is True
    assert body["default_strategy"] == "lookahead"
    assert set(body["strategies"]) == {
        "greedy",
        "lookahead",
        "viterbi",
        "joint-viterbi",
        "sample",
        "beam",
    }
    assert "beta" in body["strategies"]["lookahead"] and body["strategies"]["greedy"] == []
    assert "lm" not in body["strategies"]["beam"]  # not a number: not settable over HTTP
    assert body["limits"] == {
        "max_sentences": 8,
        "max_chars": 60,
        "max_body_bytes": 4000,
        "body_timeout": 30.0,
    }


@pytest.mark.parametrize("strategy", ["greedy", "lookahead", "joint-viterbi", "beam"])
def test_translate_dat_matches_core(client: TestClient, dat_engine: Engine, strategy: str):
    lines = [*sentences(5, 1), "   ", *sentences(2, 2)]
    r = client.post("/v1/translate", json={"text": lines, "strategy": strategy})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["strategy"] == strategy and body["model"] == "dat"
    assert_translations(body["translations"], expected(dat_engine, lines, strategy))


def test_translate_options_and_default(client: TestClient, dat_engine: Engine):
    lines = sentences(4, 3)
    r = client.post("/v1/translate", json={"text": lines, "beta": 0.5, "top_cand_n": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["strategy"] == "lookahead" and body["options"] == {"beta": 0.5, "top_cand_n": 3}
    want = expected(dat_engine, lines, "lookahead", beta=0.5, top_cand_n=3)
    assert_translations(body["translations"], want)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_translate_at_model(at_engine: Engine, strategy: str):
    lines = sentences(5, 4)
    with TestClient(create_app(at_engine, max_wait_ms=2)) as c:
        health = c.get("/health").json()
        assert health["model_type"] == "at" and health["graph"] is False
        assert set(health["strategies"]) == {"greedy", "beam"}
        r = c.post("/v1/translate", json={"text": lines, "strategy": strategy})
        assert r.status_code == 200, r.text
        assert_translations(r.json()["translations"], expected(at_engine, lines, strategy))
        r = c.post("/v1/graph", json={"text": lines[0]})
        assert r.status_code == 422 and "no graph" in r.json()["error"]["message"]


def test_graph_matches_decoders(client: TestClient, dat_engine: Engine):
    sentence = "ab cd ef gh ij"
    names = ["lookahead", "greedy", "joint-viterbi"]
    r = client.post(
        "/v1/graph", json={"text": sentence, "strategies": names, "top_k": 3, "min_flow": 0.1}
    )
    assert r.status_code == 200, r.text
    g = r.json()
    ((_, tlp, links, lengths),) = model_outputs(dat_engine.model, dat_engine.sp, [sentence])
    size = int(lengths[0])
    assert g["graph_size"] == size and g["source"] == sentence
    hyps = [decode(tlp, links, lengths, s)[0] for s in names]
    assert [p["strategy"] for p in g["paths"]] == names
    for path, hyp in zip(g["paths"], hyps, strict=True):
        assert path["vertices"] == hyp.path
        assert path["score"] == pytest.approx(hyp.score, rel=1e-4)
        (pair,) = score_pairs(dat_engine.model, dat_engine.sp, [sentence], [path["text"]])
        assert path["log_prob"] == pytest.approx(pair.log_prob, rel=1e-5)
        assert path["confidence"] == pytest.approx(math.exp(pair.log_prob / pair.tokens), rel=1e-4)
    view = graph_view(
        tlp[0, :size],
        links[0, :size, :size],
        hyps[0].path,
        top_k=3,
        min_flow=0.1,
        other_paths=[h.path for h in hyps[1:]],
    )
    assert [v["id"] for v in g["vertices"]] == view.vertices
    assert [v["passing"] for v in g["vertices"]] == pytest.approx(view.passing)
    assert [(e["from"], e["to"]) for e in g["links"]] == [(i, j) for i, j, _ in view.edges]
    for v, tops in zip(g["vertices"], view.top_tokens, strict=True):
        assert [t["id"] for t in v["tokens"]] == [t for t, _ in tops]
        assert [t["token"] for t in v["tokens"]] == [dat_engine.sp.id_to_piece(t) for t, _ in tops]
    drawn = {(e["from"], e["to"]) for e in g["links"]}
    for p in g["paths"]:  # every strategy's path is drawn
        assert set(pairwise(p["vertices"])) <= drawn
    # layer = longest drawn path from vertex 0
    layer = {v["id"]: v["layer"] for v in g["vertices"]}
    assert layer[0] == 0
    for v in g["vertices"]:
        incoming = [layer[i] for i, j in drawn if j == v["id"]]
        assert v["layer"] == (max(incoming) + 1 if incoming else 0)


class _Passes:
    """Counts the model's forward passes: calls of its encoder (every architecture's translate
    and score run it once per batch)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.count = 0
        self.model = model

    def __enter__(self) -> _Passes:
        self.handle = self.model.encoder.register_forward_hook(self._seen)
        return self

    def _seen(self, *_: object) -> None:
        self.count += 1

    def __exit__(self, *_: object) -> None:
        self.handle.remove()


@pytest.mark.parametrize("kind", ["dat", "at"])
def test_serve_answers_from_one_forward_pass(request: pytest.FixtureRequest, kind: str):
    """Translation and confidence of a request come from one pass of the model (issue 33): a
    request of a few sentences (one batch) runs the encoder once, for every strategy; the graph
    of one sentence too. Scoring the output in a second pass would count 2."""
    engine = request.getfixturevalue(f"{kind}_engine")
    lines = [*sentences(5, 7), "  "]
    with TestClient(create_app(engine, max_wait_ms=2)) as c:
        for strategy in engine.strategies:
            with _Passes(engine.model) as passes:
                r = c.post("/v1/translate", json={"text": lines, "strategy": strategy})
            assert r.status_code == 200, r.text
            assert passes.count == 1, strategy
            assert all(t["confidence"] is not None for t in r.json()["translations"][:5])
            with _Passes(engine.model) as passes:
                engine.translate(lines, strategy, {}, max_tokens=None)
            assert passes.count == 1, strategy
        if engine.has_graph:
            with _Passes(engine.model) as passes:
                r = c.post(
                    "/v1/graph", json={"text": lines[0], "strategies": ["lookahead", "beam"]}
                )
            assert r.status_code == 200, r.text
            assert passes.count == 1


def test_outputs_the_pass_cannot_score_are_scored_alone(
    dat_engine: Engine, monkeypatch: pytest.MonkeyPatch
):
    """A model that gives no ``log P(y|x)`` for some outputs (a NAT that dropped a ``<pad>``)
    has those sentences, and only those, scored by :func:`score_pairs`; the answers are the
    two-pass ones."""
    model = dat_engine.model
    real = type(model).translate_batch

    def without_some(self, source, *args, **kwargs):  # every other sentence unscored
        hyps = real(self, source, *args, **kwargs)
        return [[h._replace(log_prob=None) if b % 2 else h for h in s] for b, s in enumerate(hyps)]

    monkeypatch.setattr(type(model), "translate_batch", without_some)
    lines = sentences(6, 9)
    with _Passes(model) as passes:
        got = dat_engine.translate(lines, "lookahead", {}, max_tokens=None)
    assert passes.count == 2  # the translation, then one batch of the unscored sentences
    want = expected(dat_engine, lines, "lookahead")
    assert_translations([vars(r) for r in got], want)


RELEASED = REPO / "models" / "bible-en-es-fadat-cpu-small"


@pytest.mark.skipif(not (RELEASED / "config.json").exists(), reason="no released model")
def test_one_pass_confidence_equals_the_two_pass_one_on_the_released_model():
    """On real sentencepiece text: the served log P(y|x) and confidence equal the two-pass
    values (the detokenised output re-encoded and scored, as before issue 33) to 1e-5 wherever
    sentencepiece re-encodes the text to the decoded tokens; where it does not (1 of these 8
    sentences with the released model, 2 with the one before it: a word decoded as pieces that
    sentencepiece segments differently) the one-pass value is that of the decoded tokens."""
    from fadat.data.spm import encode_target

    engine = Engine.from_directory(RELEASED)
    torch.set_num_threads(1)
    lines = (REPO / "tests" / "data" / "bible-en-es-test-50.en").read_text().splitlines()[:8]
    got = engine.translate(lines, "lookahead", {})
    hyps = [h[0] for h in translate_lines(engine.model, engine.sp, lines, strategy="lookahead")]
    pairs = score_pairs(engine.model, engine.sp, lines, [h.text for h in hyps])
    same = 0
    for g, h, pair in zip(got, hyps, pairs, strict=True):
        assert g.text == h.text and g.score == pytest.approx(h.score, rel=1e-5)
        if list(encode_target(engine.sp, h.text))[1:-1] == h.tokens:
            assert g.log_prob == pytest.approx(pair.log_prob, rel=1e-5)
            assert g.confidence == pytest.approx(math.exp(pair.log_prob / pair.tokens), rel=1e-5)
            same += 1
        else:
            assert g.log_prob > pair.log_prob  # the model's own segmentation is the likelier
    assert same == 7  # both branches are exercised


def test_page_static_and_openapi(client: TestClient):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<script src="/static/app.js">' in r.text
    for name in ("app.js", "style.css"):
        assert client.get(f"/static/{name}").status_code == 200
    # Offline: no asset from another host (links to documentation are not assets).
    for path in (REPO / "fadat" / "serve" / "static").iterdir():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), path
        assert "@import" not in text and "url(http" not in text, path
    schema = client.get("/openapi.json").json()
    assert {"/health", "/v1/translate", "/v1/graph"} <= set(schema["paths"])
    body = schema["paths"]["/v1/translate"]["post"]["requestBody"]["content"]["application/json"]
    assert all("text" in variant["properties"] for variant in body["schema"]["anyOf"])
    assert "413" in schema["paths"]["/v1/translate"]["post"]["responses"]
    graph = schema["paths"]["/v1/graph"]["post"]
    assert (
        "strategies" in graph["requestBody"]["content"]["application/json"]["schema"]["properties"]
    )


# ----------------------------------------------------------------------------------------------
# Bad requests

BAD_TRANSLATE = [
    # (raw body, status, words the message must contain)
    (b'{"text": ["ab"', 400, ["invalid JSON"]),
    (b"", 400, ["invalid JSON"]),
    (b'{"text": ["ab \xff cd"]}', 400, ["UTF-8"]),
    (b'{"text": ["ab"], "beta": NaN}', 400, ["NaN"]),
    (b'["ab"]', 422, ["JSON object"]),
    (b'{"strategy": "greedy"}', 422, ["text", "required"]),
    (b'{"text": "ab cd"}', 422, ["text", "list"]),
    (b'{"text": ["ab", 3]}', 422, ["text[1]", "string"]),
    (b'{"text": []}', 422, ["text", "empty"]),
    (b'{"text": ["ab"], "strategy": 3}', 422, ["strategy"]),
    (b'{"text": ["ab"], "strategy": "fastest"}', 422, ["unknown strategy", "fastest"]),
    (b'{"text": ["ab"], "bogus": 1}', 422, ["unknown option", "bogus"]),
    (b'{"text": ["ab"], "strategy": "greedy", "beta": 1}', 422, ["greedy", "beta"]),
    (b'{"text": ["ab"], "beta": "1"}', 422, ["beta", "number"]),
    (b'{"text": ["ab"], "top_cand_n": 2.5}', 422, ["top_cand_n", "integer"]),
    (b'{"text": ["ab"], "top_cand_n": true}', 422, ["top_cand_n", "integer"]),
    (b'{"text": ["ab"], "top_p": 2}', 422, ["top_p", "[0, 1]"]),
    (b'{"text": ["ab"], "strategy": "beam", "beam_size": 100000}', 422, ["beam_size"]),
    (b'{"text": ["ab"], "strategy": "beam", "lm": "/etc/passwd"}', 422, ["lm"]),
    (json.dumps({"text": ["ab"] * 9}).encode(), 413, ["9 sentences", "limit is 8"]),
    (json.dumps({"text": ["ab", "cd " * 21]}).encode(), 413, ["text[1]", "63 characters"]),
    (json.dumps({"text": ["ab"], "pad": "x" * 5000}).encode(), 413, ["4000"]),
    # Content a client can send that once got a 500.
    (b'{"text": ' + b"[" * 1500 + b"]" * 1500 + b"}", 400, ["1501 levels", "limit is 32"]),
    (b"[" * 200_000, 413, ["limit"]),
    (b'{"text": ["\\ud800"]}', 400, ["text[0]", "\\ud800", "lone surrogate"]),
    (b'{"text": ["ab\\udc80cd", "ef"]}', 400, ["text[0]", "lone surrogate"]),
    (b'{"text": ["ab"], "strategy": "\\udfff"}', 400, ["strategy", "lone surrogate"]),
    (b'{"\\ud800": 1, "text": ["ab"]}', 400, ["body key", "lone surrogate"]),
    (b'{"text": ["ab"], "x": {"y": ["\\ud800"]}}', 400, ["x.y[0]", "lone surrogate"]),
    (b'{"text": ["ab"], "beta": 1e999}', 400, ["1e999", "out of range"]),
    (b'{"text": ["ab"], "beam_size": ' + b"9" * 3000 + b"}", 400, ["3000 digits"]),
    (b'{"text": ["ab"], "text": ["cd"]}', 400, ['"text" appears twice']),
    (b'\xef\xbb\xbf{"text": ["ab"]}', 400, ["invalid JSON"]),
    (b'{"text": ["ab"]} {"text": ["cd"]}', 400, ["Extra data"]),
    (b"null", 422, ["JSON object", "NoneType"]),
    (b'{"text": [["ab"]]}', 422, ["text[0]", "string"]),
    (b'{"text": ["ab"], "strategy": "sample", "seed": 18446744073709551616}', 422, ["seed"]),
    (b'{"text": ["ab"], "strategy": "sample", "temperature": 1e-300}', 422, ["temperature"]),
]


@pytest.mark.parametrize(("body", "status", "words"), BAD_TRANSLATE)
def test_bad_translate_requests(client: TestClient, body: bytes, status: int, words: list[str]):
    r = client.post("/v1/translate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["status"] == status
    for word in words:
        assert word in error["message"], error["message"]
    assert "Traceback" not in r.text
    assert client.get("/health").status_code == 200  # still serving


BAD_GRAPH = [
    (b'{"text": ["ab"]}', 422, ["text", "string"]),
    (b'{"text": "ab", "extra": 1}', 422, ["extra"]),
    (b'{"text": "ab", "top_k": 0}', 422, ["top_k"]),
    (b'{"text": "ab", "min_flow": 1.5}', 422, ["min_flow"]),
    (b'{"text": "   "}', 422, ["blank"]),
    (b'{"text": "ab", "strategies": []}', 422, ["strategies", "empty"]),
    (b'{"text": "ab", "strategies": ["greedy", "greedy"]}', 422, ["twice"]),
    (b'{"text": "ab", "strategies": ["magic"]}', 422, ["unknown strategy"]),
    (json.dumps({"text": "ab " * 30}).encode(), 413, ["90 characters"]),
    (b"{", 400, ["invalid JSON"]),
    (b'{"text": "\\ud800"}', 400, ["text", "lone surrogate"]),
    (b'{"text": "ab", "strategies": ["\\ud800"]}', 400, ["strategies[0]", "lone surrogate"]),
    (b'{"text": "ab", "top_k": ' + b"[" * 1000 + b"]" * 1000 + b"}", 400, ["levels deep"]),
    (b'{"text": "ab", "top_k": 1, "top_k": 2}', 400, ["appears twice"]),
]


@pytest.mark.parametrize(("body", "status", "words"), BAD_GRAPH)
def test_bad_graph_requests(client: TestClient, body: bytes, status: int, words: list[str]):
    r = client.post("/v1/graph", content=body)
    assert r.status_code == status, r.text
    for word in words:
        assert word in r.json()["error"]["message"]


def test_unknown_route_and_method_are_json(client: TestClient):
    r = client.get("/v2/nothing")
    assert r.status_code == 404 and r.json()["error"]["status"] == 404
    r = client.get("/v1/translate")
    assert r.status_code == 405 and r.json()["error"]["status"] == 405


def test_internal_error_hides_traceback(dat_engine: Engine, monkeypatch: pytest.MonkeyPatch):
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("secret internal detail")

    with TestClient(create_app(dat_engine), raise_server_exceptions=False) as c:
        monkeypatch.setattr(dat_engine, "translate", broken)
        r = c.post("/v1/translate", json={"text": ["ab cd"]})
        assert r.status_code == 500 and calls
        assert r.json() == {
            "error": {"status": 500, "message": "internal error (logged on the server)"}
        }
        assert "secret" not in r.text and "Traceback" not in r.text
        monkeypatch.undo()
        r = c.post("/v1/translate", json={"text": ["ab cd"]})  # the batcher survived
        assert r.status_code == 200


def _scale_weights(model: torch.nn.Module, scale: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)


def test_model_with_extreme_weights_is_refused_at_start(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """Finite weights × 1e30 load, but the start-up probe's outputs are NaN: exit 2, no server."""
    from fadat import cli
    from fadat.errors import NonFiniteOutputError

    for arch, what in (("dat", "link scores"), ("at", "token log-probabilities")):
        model = load_pretrained(models[arch])
        _scale_weights(model, 1e30)
        broken = tmp_path / arch
        model.save_pretrained(broken, spm_model=models[arch] / "spm.model")
        with pytest.raises(NonFiniteOutputError, match=f"^model {broken} produces non-finite "):
            Engine.from_directory(broken)
        assert cli.main(["serve", "--model", str(broken), "--port", "0"]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"fadat: error: model {broken} produces non-finite {what}: its weights are probably "
            "corrupt\n"
        )


def test_weights_broken_after_start_answer_500_naming_the_problem(models: dict[str, Path]):
    engine = Engine.from_directory(models["dat"])
    with TestClient(create_app(engine, max_wait_ms=2), raise_server_exceptions=False) as c:
        assert c.post("/v1/translate", json={"text": ["ab cd"]}).status_code == 200
        _scale_weights(engine.model, 1e30)
        message = (
            "model dat produces non-finite link scores: its weights are probably corrupt (a "
            "problem of the server, not of the request)"
        )
        for route, body in (("/v1/translate", {"text": ["ab cd", "ef"]}), ("/v1/graph", {})):
            r = c.post(route, json={"text": "ab cd", **body})
            assert r.status_code == 500 and "Traceback" not in r.text
            assert r.json() == {"error": {"status": 500, "message": message}}
        assert c.get("/health").status_code == 200  # the server itself still answers


def test_too_many_waiting_sentences_is_503(dat_engine: Engine):
    app = create_app(dat_engine)
    with TestClient(app) as c:
        app.state.batcher.max_pending = 2
        r = c.post("/v1/translate", json={"text": ["ab", "cd", "ef"]})
        assert r.status_code == 503 and "busy" in r.json()["error"]["message"]
        assert c.post("/v1/translate", json={"text": ["ab", "cd"]}).status_code == 200


# ----------------------------------------------------------------------------------------------
# Dynamic batching


class Recorder:
    """Wraps Engine.translate to record each batch (and to fail on a marker sentence)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.batches: list[list[str]] = []

    def translate(self, sentences, strategy, options, max_tokens=None):
        self.batches.append(list(sentences))
        if any("BOOM" in s for s in sentences):
            raise RuntimeError("marker sentence")
        return self.engine.translate(sentences, strategy, options, max_tokens)

    def cost(self, sentence):
        return self.engine.cost(sentence)


def run_jobs(batcher: Batcher, jobs: list[tuple[list[str], str, dict]]) -> list:
    async def main():
        await batcher.start()
        try:
            return await asyncio.gather(
                *(batcher.translate(*job) for job in jobs), return_exceptions=True
            )
        finally:
            await batcher.stop()

    return asyncio.run(main())


def test_batching_joins_requests_and_splits_answers(dat_engine: Engine):
    jobs = [(sentences(k + 1, 10 + k), "lookahead", {}) for k in range(6)]
    recorder = Recorder(dat_engine)
    batcher = Batcher(recorder, max_batch_tokens=100_000, max_wait_ms=500)
    results = run_jobs(batcher, jobs)
    assert len(recorder.batches) == 1 and batcher.stats.batches == 1
    for (lines, strategy, _), got in zip(jobs, results, strict=True):
        want = expected(dat_engine, lines, strategy)
        assert_translations([r.__dict__ for r in got], want)


def test_batching_respects_budget_and_options(dat_engine: Engine):
    lines = sentences(12, 20)
    costs = {s: dat_engine.cost(s) for s in lines}
    budget = 3 * max(costs.values())
    jobs = [([s], "lookahead", {}) for s in lines] + [([lines[0]], "greedy", {})]
    recorder = Recorder(dat_engine)
    results = run_jobs(Batcher(recorder, max_batch_tokens=budget, max_wait_ms=300), jobs)
    assert len(recorder.batches) >= 5  # ≥ 4 lookahead batches of ≤ 3 sentences + greedy
    for batch in recorder.batches:
        assert len(batch) * max(costs[s] for s in batch) <= budget
    assert sorted(s for b in recorder.batches for s in b) == sorted([*lines, lines[0]])
    assert results[-1][0].text == expected(dat_engine, [lines[0]], "greedy")[0]["text"]


def test_no_batching_runs_each_job_alone(dat_engine: Engine):
    jobs = [(sentences(2, 30 + k), "lookahead", {}) for k in range(4)]
    recorder = Recorder(dat_engine)
    run_jobs(Batcher(recorder, max_batch_tokens=0, max_wait_ms=500), jobs)
    assert sorted(map(tuple, recorder.batches)) == sorted(tuple(j[0]) for j in jobs)


def test_failing_job_does_not_fail_its_batch(dat_engine: Engine):
    jobs = [(["ab cd"], "lookahead", {}), (["ef BOOM"], "lookahead", {}), (["gh"], "lookahead", {})]
    recorder = Recorder(dat_engine)
    batcher = Batcher(recorder, max_batch_tokens=100_000, max_wait_ms=500)
    results = run_jobs(batcher, jobs)
    assert isinstance(results[1], RuntimeError)
    assert results[0][0].text == expected(dat_engine, ["ab cd"], "lookahead")[0]["text"]
    assert results[2][0].text == expected(dat_engine, ["gh"], "lookahead")[0]["text"]
    assert len(recorder.batches[0]) == 3 and batcher.stats.failed_batches == 2


# ----------------------------------------------------------------------------------------------
# The real server: SIGTERM, bad command lines


def start_server(model: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fadat.cli",
            "serve",
            "--model",
            str(model),
            "--port",
            "0",
            "--threads",
            "1",
            *extra,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    line = proc.stderr.readline()
    match = re.search(r"http://[\d.]+:\d+", line)
    assert match, line
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
    return proc, match.group(0)


def wait_healthy(url: str, seconds: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not come up"
        time.sleep(0.1)


def test_sigterm_finishes_requests_in_flight(models: dict[str, Path]):
    import httpx

    proc, url = start_server(models["dat"], "--max-wait-ms", "3000")
    try:
        wait_healthy(url)
        answers: list = [None] * 4

        def ask(k: int) -> None:
            answers[k] = httpx.post(
                url + "/v1/translate", json={"text": sentences(2, 40 + k)}, timeout=60
            )

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        # SIGTERM once the batcher holds all four (it counts a request when it queues it; they
        # wait out the 3 s window): a fixed sleep raced the requests on a loaded machine
        deadline = time.monotonic() + 30
        while httpx.get(url + "/health", timeout=5).json()["batching"]["requests"] < 4:
            assert time.monotonic() < deadline, "the four requests did not reach the batcher"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert proc.wait(60) == 0
        for answer in answers:
            assert answer is not None and answer.status_code == 200
            assert len(answer.json()["translations"]) == 2
    finally:
        if proc.poll() is None:
            proc.kill()


def test_cli_bad_input(models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    import socket

    from fadat import cli

    def serve(*args: str) -> tuple[int, str]:
        code = cli.main(["serve", *args])
        return code, capsys.readouterr().err

    code, err = serve("--model", str(tmp_path / "missing"))
    assert code == 2 and err.startswith("fadat: error:") and "Traceback" not in err
    code, err = serve("--model", str(models["dat"]), "--max-batch-tokens", "-1")
    assert code == 2 and "--max-batch-tokens" in err
    for flag, value, words in [
        ("--max-wait-ms", "nan", ["--max-wait-ms must be in [0, 10000]", "nan"]),
        ("--max-wait-ms", "1e9", ["--max-wait-ms", "1000000000"]),
        ("--max-wait-ms", "-1", ["--max-wait-ms"]),
        ("--graceful-timeout", "-5", ["--graceful-timeout", ">= 0", "-5"]),
        ("--graceful-timeout", "inf", ["--graceful-timeout", "finite"]),
        ("--graceful-timeout", "nan", ["--graceful-timeout", "nan"]),
        ("--threads", "-2", ["--threads must be in [0, "]),
        ("--threads", "99999999999", ["--threads must be in [0, "]),
        ("--threads", "1000", ["--threads 1000 is more than the", "--force"]),
        ("--max-chars", "0", ["--max-chars must be >= 1"]),
        ("--port", "70000", ["--port must be in [0, 65535]"]),
        ("--port", "http", ["--port", "'http'"]),
    ]:
        code, err = serve("--model", str(models["dat"]), flag, value)
        assert code == 2 and len(err.splitlines()) == 1, err
        assert err.startswith("fadat: error:") and all(w in err for w in words), err
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        code, err = serve("--model", str(models["dat"]), "--port", str(port))
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err


# ----------------------------------------------------------------------------------------------
# Confidence and Spearman's rho


def test_confidence_formula():
    assert confidence(0.0, 3) == 1.0
    assert confidence(-6.0, 3) == pytest.approx(math.exp(-2.0))
    assert confidence(float("-inf"), 4) == 0.0
    assert confidence(float("nan"), 4) is None


def test_spearman_against_textbook_formula():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(3, 30))
        a = rng.integers(0, 6, n).astype(float)  # many ties
        b = a + rng.normal(0, 2, n)
        # Ranks by brute force: 1 + (number smaller) + (number equal − 1) / 2.
        ranks = [
            [1 + sum(y < x for y in v) + (sum(y == x for y in v) - 1) / 2 for x in v]
            for v in (a, b)
        ]
        assert average_ranks(a).tolist() == ranks[0]
        want = np.corrcoef(ranks[0], ranks[1])[0, 1]
        assert spearman(a, b) == pytest.approx(want, abs=1e-12)
    b = rng.normal(size=10)
    assert spearman(b, b * 3 + 1) == pytest.approx(1.0)
    assert spearman(b, -b) == pytest.approx(-1.0)
    # no ties: 1 - 6 Σd² / (n(n²-1))
    x, y = [1, 2, 3, 4, 5], [2, 1, 4, 3, 5]
    assert spearman(x, y) == pytest.approx(1 - 6 * 4 / (5 * 24))
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError):
        spearman([1, 2], [1, 2, 3])


# ----------------------------------------------------------------------------------------------
# The page in a real browser


def find_browser() -> tuple[str, str]:
    """``(chromium binary, chromedriver)`` or a skip naming what is missing."""
    import shutil

    pytest.importorskip("selenium", reason="selenium is not installed (pip install -e .[dev])")
    browser = next(
        (
            shutil.which(n)
            for n in ("chromium", "chromium-browser", "google-chrome")
            if shutil.which(n)
        ),
        None,
    )
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip(
            "no Chromium/chromedriver on this machine (Debian: apt-get install chromium "
            "chromium-driver; scripts/setup.sh installs them where it can)"
        )
    return browser, driver


def test_page_in_chromium(models: dict[str, Path]):
    """Headless Chromium loads the page from a running server, translates a sentence, and the
    SVG holds the graph's vertices and the chosen path; hovering shows a vertex's top tokens;
    clicking another translation highlights its path.

    ``FADAT_SERVE_MODEL=DIR`` runs it on another model directory, ``FADAT_SERVE_SCREENSHOT=FILE``
    saves a screenshot (the README's picture: ``docs/serve-page.png``)."""
    import httpx
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser, chromedriver = find_browser()
    model = Path(os.environ.get("FADAT_SERVE_MODEL") or models["dat"])
    sentence = os.environ.get("FADAT_SERVE_SENTENCE", "ab cd ef gh ij kl")
    proc, url = start_server(model)
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = None
    try:
        wait_healthy(url)
        driver = webdriver.Chrome(service=Service(chromedriver), options=options)
        driver.get(url + "/")
        wait = WebDriverWait(driver, 60)
        wait.until(lambda d: d.execute_script("return document.body.dataset.ready") == "true")
        box = driver.find_element(By.ID, "source")
        box.clear()
        box.send_keys(sentence)
        driver.find_element(By.ID, "translate").click()
        wait.until(lambda d: d.execute_script("return document.body.dataset.state") == "done")

        names = ["lookahead", "greedy", "joint-viterbi"]
        want = httpx.post(url + "/v1/graph", json={"text": sentence, "strategies": names}).json()
        paths = {p["strategy"]: p for p in want["paths"]}

        def drawn(selector: str, attribute: str) -> list[int]:
            return [
                int(e.get_attribute(attribute))
                for e in driver.find_elements(By.CSS_SELECTOR, selector)
            ]

        assert sorted(drawn("#graph g.vertex", "data-vertex")) == [
            v["id"] for v in want["vertices"]
        ]
        assert len(drawn("#graph path.link", "data-from")) == len(want["links"])
        assert (
            sorted(drawn("#graph g.vertex.on-path", "data-vertex"))
            == paths["lookahead"]["vertices"]
        )
        chosen = list(
            zip(
                drawn("#graph path.link.on-path", "data-from"),
                drawn("#graph path.link.on-path", "data-to"),
                strict=True,
            )
        )
        assert sorted(chosen) == list(pairwise(paths["lookahead"]["vertices"]))
        cards = driver.find_elements(By.CSS_SELECTOR, "#results .card")
        assert [c.get_attribute("data-strategy") for c in cards] == [
            "greedy",
            "lookahead",
            "joint-viterbi",
        ]
        for card in cards:
            text = card.find_element(By.CSS_SELECTOR, ".text").text
            assert text == (paths[card.get_attribute("data-strategy")]["text"] or "(empty)")

        # Hover a vertex of the path: the tooltip lists its top tokens.
        vertex = want["vertices"][1]
        element = driver.find_element(
            By.CSS_SELECTOR, f'#graph g.vertex[data-vertex="{vertex["id"]}"]'
        )
        ActionChains(driver).move_to_element(element).perform()
        tooltip = driver.find_element(By.ID, "tooltip")
        wait.until(lambda d: tooltip.is_displayed())
        assert f"vertex {vertex['id']}" in tooltip.text
        assert vertex["tokens"][0]["token"].replace("\u2581", "_") in tooltip.text

        if os.environ.get("FADAT_SERVE_SCREENSHOT"):
            driver.save_screenshot(os.environ["FADAT_SERVE_SCREENSHOT"])

        # Clicking the greedy translation highlights greedy's path.
        cards[0].click()
        wait.until(
            lambda d: d.find_element(By.ID, "graph").get_attribute("data-strategy") == "greedy"
        )
        assert (
            sorted(drawn("#graph g.vertex.on-path", "data-vertex")) == paths["greedy"]["vertices"]
        )
    finally:
        if driver is not None:
            driver.quit()
        proc.terminate()
        assert proc.wait(60) == 0
