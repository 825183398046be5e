"""Tests of ``fadat serve`` against its clients (issue 42): header and body timeouts, the
connection cap and the file-descriptor limit, clients that hang up, uvicorn's own answers as
JSON, the warning for a non-loopback address, SIGTERM with ``--graceful-timeout 0``, fairness
between a large and a small request, ``seed`` independent of batching, the published schema's
limits, and schemathesis fuzzing the application in-process.

The socket tests share one real server (a subprocess, ``--host 0.0.0.0``, one-second timeouts,
8 connections, 512 file descriptors) and talk raw HTTP/1.1 to it, so that what is on the wire
is what is tested."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402
from test_serve import REPO, make_models, sentences  # noqa: E402

from fadat.serve.app import Limits, create_app  # noqa: E402
from fadat.serve.batching import Batcher  # noqa: E402
from fadat.serve.engine import Engine, Result  # noqa: E402
from fadat.translation.pipeline import translate_lines  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_models(tmp_path_factory.mktemp("serve-robust-models"))


@pytest.fixture(scope="module")
def dat_engine(models: dict[str, Path]) -> Engine:
    return Engine.from_directory(models["dat"])


# ----------------------------------------------------------------------------------------------
# A real server and raw HTTP


class Server:
    """A ``fadat serve`` subprocess: its port, and its stderr lines as they come."""

    def __init__(self, model: Path, *extra: str, nofile: int | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}

        def limit_files() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fadat.cli", "serve", "--model", str(model), "--port", "0"]
            + ["--threads", "1", *extra],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=limit_files,
        )
        self.lines: list[str] = []
        first = self.proc.stderr.readline()
        self.lines.append(first)
        match = re.search(r"http://([\d.]+):(\d+)", first)
        assert match, first
        self.port = int(match.group(2))
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 120
        while b" 200 " not in ask(self.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 5)[:20]:
            assert time.monotonic() < deadline and self.proc.poll() is None, self.log
            time.sleep(0.2)

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\0" * 8)
    return sock


def read_all(sock: socket.socket, timeout: float) -> bytes:
    """What the server sends until it closes the connection (or ``timeout`` passes)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def ask(port: int, request: bytes, timeout: float = 10) -> bytes:
    """One raw request on a new connection (``connection: close`` added); the raw answer."""
    try:
        with connect(port) as sock:
            sock.sendall(request.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1))
            return read_all(sock, timeout)
    except OSError:
        return b""


def answer(raw: bytes) -> tuple[int, dict[str, str], dict]:
    """``(status, headers, JSON body)`` of a raw answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def post(path: str, body: bytes, length: int | None = None) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body) if length is None else length}\r\n\r\n"
    ).encode() + body


@pytest.fixture(scope="module")
def server(models: dict[str, Path]):
    srv = Server(
        models["dat"],
        "--host",
        "0.0.0.0",
        "--header-timeout",
        "1",
        "--body-timeout",
        "1",
        "--max-connections",
        "8",
        "--max-header-bytes",
        "2048",
        "--max-wait-ms",
        "1",
        nofile=512,
    )
    yield srv
    srv.stop()


def test_non_loopback_address_is_warned(server: Server):
    warning = [line for line in server.lines[:3] if "warning" in line]
    assert warning and "every interface" in warning[0] and "no authentication" in warning[0]


def test_header_timeout(server: Server):
    """A client that sends its request line and then a byte a second is closed after
    ``--header-timeout`` (1 s) with a 408 JSON answer; an idle one is closed silently."""
    with connect(server.port) as sock:
        start = time.monotonic()
        sock.sendall(b"POST /v1/translate HTTP/1.1\r\n")
        for byte in b"Host: x\r\n":
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.25)
        raw = read_all(sock, 5)
        elapsed = time.monotonic() - start
    status, headers, body = answer(raw)
    assert status == 408 and headers["content-type"] == "application/json"
    assert body["error"]["status"] == 408 and "1 s" in body["error"]["message"]
    assert 0.9 < elapsed < 3.0
    with connect(server.port) as sock:
        start = time.monotonic()
        assert read_all(sock, 5) == b""
        assert time.monotonic() - start < 3.0


def test_body_timeout(server: Server):
    """Headers, then 10 of 100 body bytes: 408 JSON after ``--body-timeout`` (1 s), and the
    connection is closed (a client trickling the rest cannot keep it)."""
    with connect(server.port) as sock:
        start = time.monotonic()
        sock.sendall(post("/v1/translate", b'{"text": [', length=100))
        raw = read_all(sock, 5)
        elapsed = time.monotonic() - start
    status, headers, body = answer(raw)
    assert status == 408 and headers["connection"] == "close"
    assert "did not arrive within 1 s" in body["error"]["message"]
    assert 0.9 < elapsed < 3.0


def test_client_hanging_up_mid_body_is_one_info_line(server: Server):
    before = len(server.lines)
    with connect(server.port) as sock:
        sock.sendall(post("/v1/translate", b'{"text": ["ab', length=100))
        time.sleep(0.2)
    time.sleep(0.5)
    new = "".join(server.lines[before:])
    assert "Traceback" not in new and "ERROR" not in new, new
    assert len([line for line in new.splitlines() if "hung up" in line]) == 1, new
    assert b" 200 " in ask(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")[:20]


@pytest.mark.parametrize(
    ("request_bytes", "status", "words"),
    [
        (b"GARBAGE\r\n\r\n", 400, "invalid HTTP/1.1"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Bomb: " + b"a" * 4000 + b"\r\n\r\n", 431, "2048"),
        (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % k for k in range(400)), 431, "2048"),
    ],
    ids=["garbage-request-line", "long-header", "many-headers"],
)
def test_bad_http_is_answered_json(server: Server, request_bytes: bytes, status: int, words: str):
    """A request line that is not HTTP/1.1 (h11's error): 400 JSON; headers over
    ``--max-header-bytes`` (2048), in one piece or many: 431 JSON (uvicorn alone answers
    text/plain 400, or nothing for a header block that arrives in one read)."""
    got, headers, body = answer(ask(server.port, request_bytes))
    assert got == status and headers["content-type"] == "application/json"
    assert body["error"]["status"] == status and words in body["error"]["message"]


def test_connection_cap_answers_503_json_and_health_still_answers(server: Server):
    """With 8 connections busy in requests (bodies not yet sent), a translation request is
    answered 503 JSON and ``/health`` 200; idle connections beyond the cap give way to new
    ones, the oldest first."""
    busy = [connect(server.port) for _ in range(8)]
    try:
        for sock in busy:
            sock.sendall(post("/v1/translate", b"", length=50))  # waits for its body
        time.sleep(0.2)
        status, _, body = answer(ask(server.port, post("/v1/translate", b'{"text": ["ab"]}')))
        assert status == 503 and "over 8 connections" in body["error"]["message"]
        health = ask(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer(health)[0] == 200
    finally:
        for sock in busy:
            sock.close()
    time.sleep(1.5)  # the busy ones are answered 408 and gone
    idle = [connect(server.port) for _ in range(12)]
    try:
        time.sleep(0.3)
        closed = []
        for sock in idle:
            sock.settimeout(0.05)
            try:
                closed.append(sock.recv(1) == b"")
            except TimeoutError:
                closed.append(False)
        assert closed[:4] == [True] * 4 and not any(closed[-4:]), closed
    finally:
        for sock in idle:
            sock.close()


def test_at_the_file_descriptor_limit_health_answers_without_tracebacks(server: Server):
    """The server may open 512 files: 1000 idle connections (more than its descriptors) come
    and stay; ``/health`` still answers 200 and the log has no traceback."""
    before = len(server.lines)
    flood = []
    try:
        for _ in range(1000):
            try:
                flood.append(connect(server.port))
            except OSError:
                pass
        time.sleep(0.5)
        health = ask(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer(health)[0] == 200
    finally:
        for sock in flood:
            sock.close()
    time.sleep(0.3)
    new = "".join(server.lines[before:])
    assert "Traceback" not in new and "out of system resource" not in new, new[-2000:]
    assert answer(ask(server.port, post("/v1/translate", b'{"text": ["ab"]}')))[0] == 200


def test_graceful_timeout_zero_answers_503_json(models: dict[str, Path]):
    """SIGTERM with ``--graceful-timeout 0`` while a request waits: it is answered 503 JSON
    (uvicorn alone answers text/plain 500 and logs a traceback), and the server exits 0."""
    srv = Server(models["dat"], "--graceful-timeout", "0", "--max-wait-ms", "5000")
    try:
        with connect(srv.port) as sock:
            sock.sendall(post("/v1/translate", b'{"text": ["ab cd"]}'))
            # SIGTERM once the request waits in the batcher (5 s window; it counts a request
            # when it queues it): a fixed sleep raced the request on a loaded machine
            health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            deadline = time.monotonic() + 30
            while answer(ask(srv.port, health, 5))[2]["batching"]["requests"] < 1:
                assert time.monotonic() < deadline, "the request did not reach the batcher"
                time.sleep(0.02)
            srv.proc.send_signal(signal.SIGTERM)
            raw = read_all(sock, 30)
        assert srv.proc.wait(60) == 0
    finally:
        srv.stop()
    status, headers, body = answer(raw)
    assert status == 503 and headers["content-type"] == "application/json"
    assert "stopped before the answer was ready" in body["error"]["message"]
    assert "Traceback" not in srv.log, srv.log


# ----------------------------------------------------------------------------------------------
# In-process: JSON errors, the schema, fairness, seeds


@pytest.fixture(scope="module")
def client(dat_engine: Engine):
    limits = Limits(max_sentences=8, max_chars=60)
    with TestClient(create_app(dat_engine, max_wait_ms=2, limits=limits)) as c:
        yield c


def test_405_has_allow_and_every_error_is_json(client: TestClient):
    for method, path, status, allow in [
        ("TRACE", "/v1/translate", 405, "POST"),
        ("GET", "/v1/graph", 405, "POST"),
        ("DELETE", "/health", 405, "GET"),
        ("GET", "/v2/nothing", 404, None),
        ("GET", "/static/missing.js", 404, None),
    ]:
        r = client.request(method, path)
        assert r.status_code == status, (method, path)
        assert r.headers["content-type"] == "application/json"
        assert r.json()["error"]["status"] == status
        assert r.headers.get("allow") == allow, (method, path)


def test_schema_declares_the_limits(client: TestClient, dat_engine: Engine):
    paths = client.get("/openapi.json").json()["paths"]
    body = paths["/v1/translate"]["post"]["requestBody"]["content"]["application/json"]
    variants = {v["title"]: v for v in body["schema"]["anyOf"]}
    assert set(variants) == set(dat_engine.strategies)
    text = variants["greedy"]["properties"]["text"]
    assert (text["minItems"], text["maxItems"], text["items"]["maxLength"]) == (1, 8, 60)
    assert variants["greedy"]["additionalProperties"] is False
    assert variants["greedy"]["required"] == ["text", "strategy"]
    assert variants["lookahead"]["required"] == ["text"]  # the default strategy
    assert variants["lookahead"]["properties"]["strategy"] == {"enum": ["lookahead", None]}
    sample = variants["sample"]["properties"]
    assert sample["top_p"]["exclusiveMinimum"] == 0.0 and sample["top_p"]["maximum"] == 1.0
    assert sample["seed"] == {**sample["seed"], "type": "integer", "maximum": 2**53 - 1}
    assert variants["beam"]["properties"]["beam_size"]["maximum"] == 200
    graph = paths["/v1/graph"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    props = graph["properties"]
    assert props["top_k"]["type"] == "integer" and props["text"]["maxLength"] == 60
    pattern = re.compile(props["text"]["pattern"])
    for blank in ("", "   ", "\t\x1c\x85\u3000"):
        assert not pattern.search(blank) and client.post(
            "/v1/graph", json={"text": blank}
        ).status_code in (422,)
    strategies = props["strategies"]["anyOf"][0]
    assert strategies["minItems"] == 1 and strategies["uniqueItems"] is True
    assert set(strategies["items"]["enum"]) == set(dat_engine.strategies)
    # 4.0 is an integer in JSON Schema: accepted where the schema says integer
    assert client.post("/v1/graph", json={"text": "ab", "top_k": 4.0}).status_code == 200
    r = client.post("/v1/translate", json={"text": ["ab"], "strategy": "beam", "beam_size": 3.0})
    assert r.status_code == 200


class SlowEngine:
    """An engine that takes 40 ms per sentence and echoes it; every sentence costs 100, so
    with ``model_batch_tokens = 100`` each is one piece."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def cost(self, sentence: str) -> int:
        return 100

    def translate(self, sentences, strategy, options, max_tokens=None):
        self.calls.append((strategy, list(sentences)))
        time.sleep(0.04 * len(sentences))
        return [Result(s, 0.0, 0.0, 1.0) for s in sentences]


def test_small_request_does_not_wait_behind_a_large_one():
    """A 32-sentence beam request (1.3 s of work) is running when a one-sentence greedy one
    arrives: the small one waits at most for the piece that is running (40 ms) plus its own
    batch, not for the whole request (the bound of :mod:`fadat.serve.batching`); the large
    one's answer is complete and in order."""
    engine = SlowEngine()
    batcher = Batcher(engine, max_batch_tokens=100, max_wait_ms=1, model_batch_tokens=100)
    big = [f"b{k}" for k in range(32)]

    async def main() -> tuple[list[Result], list[Result], float]:
        await batcher.start()
        try:
            large = asyncio.create_task(batcher.translate(big, "beam", {"beam_size": 200}))
            await asyncio.sleep(0.1)
            start = time.monotonic()
            small = await batcher.translate(["s"], "greedy", {})
            waited = time.monotonic() - start
            return await large, small, waited
        finally:
            await batcher.stop()

    large, small, waited = asyncio.run(main())
    assert [r.text for r in large] == big and [r.text for r in small] == ["s"]
    assert waited < 0.3, waited  # one piece (0.04 s) + the small request's own (0.04 s)
    order = [strategy for strategy, _ in engine.calls]
    assert order.index("greedy") <= 4, order


def test_seed_reproduces_sample_whatever_the_batch(dat_engine: Engine):
    """Two requests with the same seed and options share one batch; each sentence's sample is
    the one it gets alone (without the fix, a sampler's draws depend on the batch: checked)."""
    options = {"seed": 3, "temperature": 2.0, "top_p": 1.0, "top_cand_n": 5}
    first, second = sentences(3, 5, 4, 7), sentences(3, 6, 4, 7)
    alone = [dat_engine.translate([s], "sample", options)[0].text for s in first + second]
    joint = translate_lines(
        dat_engine.model, dat_engine.sp, first + second, strategy="sample", options=options
    )
    assert [h[0].text for h in joint] != alone  # the batch matters to the sampler

    batcher = Batcher(dat_engine, max_batch_tokens=100_000, max_wait_ms=500)

    async def main() -> list[list[Result]]:
        await batcher.start()
        try:
            return await asyncio.gather(
                batcher.translate(first, "sample", options),
                batcher.translate(second, "sample", options),
            )
        finally:
            await batcher.stop()

    got = asyncio.run(main())
    assert batcher.stats.batches == 1  # they did share a batch
    assert [r.text for part in got for r in part] == alone


# ----------------------------------------------------------------------------------------------
# schemathesis


def test_schemathesis(dat_engine: Engine):
    """schemathesis (every phase its engine runs: examples, coverage, fuzzing, stateful) with
    all its checks, against the application in-process, 12 examples per operation and phase,
    seed 42: no failure. The one setting changed: 413 is an expected answer to data the schema
    rejects (too many or too long sentences), besides schemathesis's default 4xx list."""
    schemathesis = pytest.importorskip("schemathesis")
    from schemathesis.config import SchemathesisConfig
    from schemathesis.engine import events, from_schema

    app = create_app(dat_engine, max_wait_ms=1, limits=Limits(max_sentences=4, max_chars=40))
    negative = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428"]
    config = SchemathesisConfig.from_dict(
        {
            "seed": 42,
            "generation": {"max-examples": 12},
            "checks": {"negative_data_rejection": {"expected-statuses": negative}},
        }
    )
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    statuses: collections.Counter[int] = collections.Counter()
    failures: list[str] = []
    checks: collections.Counter[str] = collections.Counter()
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            for interaction in event.recorder.interactions.values():
                if interaction.response is not None:
                    statuses[interaction.response.status_code] += 1
            for case_checks in event.recorder.checks.values():
                for check in case_checks:
                    checks[check.name] += 1
                    if check.status == "failure":
                        failures.append(f"{event.label} {check.name}: {check.failure_info}")
        elif isinstance(event, events.FatalError | events.NonFatalError):
            failures.append(repr(event))
    print(f"schemathesis: {sum(statuses.values())} requests, statuses {dict(statuses)}")
    print(f"schemathesis: checks run {dict(checks)}")
    assert not failures, failures[:5]
    assert statuses[200] > 30 and sum(statuses.values()) > 200
    assert not any(status >= 500 for status in statuses)
