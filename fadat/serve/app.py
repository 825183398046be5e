"""The ASGI application of ``fadat serve`` (FastAPI): endpoints, size limits, JSON errors.

Endpoints (schemas in the OpenAPI document at ``/openapi.json``, browsable at ``/docs``):

- ``GET /health`` — ``{"status": "ok", "model", "model_type", "strategies", …}``;
- ``POST /v1/translate`` — ``{"text": [...], "strategy": ..., <decoder options>}`` →
  ``{"translations": [{"text", "score", "log_prob", "confidence"}, ...], ...}`` in input order;
  concurrent requests are batched (:mod:`fadat.serve.batching`);
- ``POST /v1/graph`` — ``{"text": "...", "strategies": [...]}`` → the graph behind the
  translation of one sentence (:meth:`fadat.serve.engine.Engine.graph`);
- ``GET /`` — the web page (``static/``).

Bad requests get a 4xx answer ``{"error": {"status": N, "message": "..."}}`` whose message names
the problem: 400 for a body that is not UTF-8 or not JSON, 404 for an unknown path, 405 (with
``Allow``) for a method the path does not take, 408 for a body that does not arrive within
``Limits.body_timeout`` seconds, 413 for a body, sentence count or sentence length over the
limits (:class:`Limits`), 422 for wrong types, a missing or empty ``text``, an unknown strategy
or option, or a value out of range, 503 when too many sentences wait or when the server stops
(SIGTERM) before a request's answer is ready (``--graceful-timeout``). A client that hangs up
before its body has arrived is logged as one info line. The request schemas of
``/openapi.json`` declare every limit that is checked here (sentence count and length, blank
text, strategies and their options with their ranges), so that a request valid by the schema
is answered 200 (``tests/test_serve_robust.py::test_schemathesis`` fuzzes it). A model whose
outputs are NaN or infinite for a request (corrupt weights that the start-up probe of
:meth:`~fadat.serve.engine.Engine.from_directory` did not reveal) is answered 500 with a
message that says so. An unexpected error is logged with its traceback on the
server and answered 500 with a generic message (no traceback is sent). The request body is
parsed here rather than by FastAPI, so that each of these problems gets its own status and
message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict, dataclass
from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fadat.errors import InputError, NonFiniteOutputError
from fadat.options import DECODING_OPTIONS
from fadat.serve.batching import Batcher, Busy
from fadat.serve.engine import Engine, http_range

log = logging.getLogger("fadat.serve")

STATIC = files("fadat.serve") / "static"


@dataclass(frozen=True)
class Limits:
    """Request size limits (each above-limit request is answered 413).

    Attributes:
        max_sentences: sentences per ``/v1/translate`` request (default 64).
        max_chars: characters per sentence (default 1,000; longer sources would be truncated to
            the model's ``max_source_positions`` tokens anyway).
        max_body_bytes: request body size (default 1 MiB).
        body_timeout: seconds from the end of the headers until the whole body has arrived
            (default 30; later: 408). uvicorn has a keep-alive timeout and (``fadat serve``'s
            protocol, :mod:`fadat.serve.protocol`) a header timeout, but no body timeout: the
            body is read here, under this deadline.
    """

    max_sentences: int = 64
    max_chars: int = 1000
    max_body_bytes: int = 1 << 20
    body_timeout: float = 30.0


class ApiError(Exception):
    """A request problem answered with ``status`` and ``message``."""

    def __init__(self, status: int, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close  # the body was not read to its end: the connection cannot be reused


# ----------------------------------------------------------------------------------------------
# Schemas (validation of requests and the OpenAPI document)


class TranslateRequest(BaseModel):
    """Sentences to translate. Any key besides ``text`` and ``strategy`` is a decoder option of
    the strategy (``GET /health`` lists them per strategy), e.g. ``"beta": 1.0`` for lookahead,
    ``"beam_size": 5`` for beam search."""

    model_config = ConfigDict(
        strict=True,
        extra="allow",
        json_schema_extra={
            "examples": [{"text": ["In the beginning God created the heavens and the earth."]}]
        },
    )
    text: list[str] = Field(description="raw source sentences (1 to max_sentences)")
    strategy: str | None = Field(
        None, description="decoding strategy; default lookahead (DAT) or beam (AT)"
    )


class TranslationOut(BaseModel):
    text: str = Field(description="detokenised translation ('' for a blank input)")
    score: float | None = Field(description="the strategy's score in nats")
    log_prob: float | None = Field(description="log P(y|x) of the translation, nats")
    confidence: float | None = Field(
        description="exp(log P(y|x) / T): geometric mean token probability, in [0, 1]"
    )


class TranslateResponse(BaseModel):
    translations: list[TranslationOut]
    strategy: str
    options: dict[str, float | int]
    model: str


class GraphRequest(BaseModel):
    """One sentence whose translation graph to return."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "text": "In the beginning God created the heavens and the earth.",
                    "strategies": ["lookahead", "greedy", "joint-viterbi"],
                }
            ]
        },
    )
    text: str = Field(description="raw source sentence")
    strategies: list[str] | None = Field(
        None,
        description="strategies whose paths to return (default options), the first one's path "
        "highlighted; default: the model's default strategy",
    )
    top_k: int = Field(5, ge=1, le=20, description="tokens listed per vertex")

    @field_validator("top_k", mode="before")
    @classmethod
    def _integral(cls, value: Any) -> Any:
        """6.0 is an integer in JSON Schema, as in the schema we publish."""
        return int(value) if isinstance(value, float) and value.is_integer() else value

    min_passing: float = Field(
        0.05, ge=0.0, le=1.0, description="draw vertices with at least this passing probability"
    )
    min_flow: float = Field(
        0.05, ge=0.0, le=1.0, description="draw transitions used by at least this share of paths"
    )


class TokenOut(BaseModel):
    token: str
    id: int
    p: float


class VertexOut(BaseModel):
    id: int
    layer: int = Field(description="drawn transitions on the longest drawn path from vertex 0")
    passing: float = Field(description="probability that a path visits the vertex")
    tokens: list[TokenOut]


class LinkOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    from_: int = Field(alias="from")
    to: int
    flow: float = Field(description="P(pass i) * E[i, j]: probability a path uses the link")


class PathOut(BaseModel):
    strategy: str
    vertices: list[int]
    text: str
    score: float | None
    log_prob: float | None
    confidence: float | None


class GraphResponse(BaseModel):
    source: str
    graph_size: int = Field(description="L, the number of vertices")
    vertices: list[VertexOut]
    links: list[LinkOut]
    paths: list[PathOut]


class ErrorDetail(BaseModel):
    status: int
    message: str


class ErrorResponse(BaseModel):
    error: ErrorDetail


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in (
        (400, "the body is not UTF-8 or not JSON"),
        (408, "the body did not arrive within the body timeout"),
        (413, "too large: body, sentences or characters per sentence over the limits"),
        (422, "wrong types, missing or empty text, unknown strategy or option, bad value"),
        (503, "too many sentences waiting, or the server stopped before the answer was ready"),
    )
}


def _request_body(schema: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI ``requestBody`` for a handler that parses its body itself."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    }


def _not_blank_pattern() -> str:
    """A JSON-schema ``pattern`` (ECMA-262) that a string matches iff Python's ``str.strip()``
    leaves something: a character outside Python's whitespace (which is not ECMA's ``\\s``:
    it has U+001C-U+001F and U+0085, not U+FEFF). Every whitespace character is below U+3001."""
    spaces = [c for c in range(0x3001) if chr(c).isspace()]
    runs: list[list[int]] = []
    for c in spaces:
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    ranges = "".join(chr(a) if a == b else f"{chr(a)}-{chr(b)}" for a, b in runs)
    return f"[^{ranges}]"


def _option_schema(engine: Engine, strategy: str, name: str) -> dict[str, Any]:
    """The JSON schema of decoder option ``name`` of ``strategy``: its type and its
    HTTP range (:func:`fadat.serve.engine.http_range`), each end exclusive where the
    decoder rejects it (``top_p`` > 0), as :meth:`Engine.check` finds."""
    option = DECODING_OPTIONS[name]
    low, high = http_range(name)
    schema: dict[str, Any] = {"type": "integer" if option.kind is int else "number"}

    def accepted(value: float) -> bool:
        try:
            engine.check(strategy, {name: option.kind(value)})
        except InputError:
            return False
        return True

    schema["minimum" if accepted(low) else "exclusiveMinimum"] = option.kind(low)
    schema["maximum" if accepted(high) else "exclusiveMaximum"] = option.kind(high)
    if option.help:
        schema["description"] = option.help
    return schema


def translate_schema(engine: Engine, limits: Limits) -> dict[str, Any]:
    """The JSON schema of a ``/v1/translate`` body with every limit :func:`check_sentences` and
    :meth:`Engine.check` enforce: 1 to ``max_sentences`` sentences of at most ``max_chars``
    characters, and one alternative per strategy with the options it takes, in range, and no
    other key (``strategy`` may be left out, or null, for the default strategy)."""
    fields = TranslateRequest.model_fields
    text = {
        "type": "array",
        "items": {"type": "string", "maxLength": limits.max_chars},
        "minItems": 1,
        "maxItems": limits.max_sentences,
        "description": fields["text"].description,
    }
    variants = []
    for strategy, names in engine.strategies.items():
        default = strategy == engine.default_strategy
        properties: dict[str, Any] = {
            "text": text,
            "strategy": {"enum": [strategy, None] if default else [strategy]},
        }
        properties.update((name, _option_schema(engine, strategy, name)) for name in names)
        variants.append(
            {
                "title": strategy,
                "type": "object",
                "properties": properties,
                "required": ["text"] if default else ["text", "strategy"],
                "additionalProperties": False,
            }
        )
    return {
        "title": "TranslateRequest",
        "description": TranslateRequest.__doc__,
        "anyOf": variants,
        "examples": TranslateRequest.model_config["json_schema_extra"]["examples"],  # type: ignore[index]
    }


def graph_schema(engine: Engine, limits: Limits) -> dict[str, Any]:
    """The JSON schema of a ``/v1/graph`` body: :class:`GraphRequest`'s, with the limits of
    :func:`check_graph_request`: a sentence of at most ``max_chars`` characters that is not
    blank, and 1 or more distinct strategies of the model's."""
    schema = GraphRequest.model_json_schema()
    properties = schema["properties"]
    properties["text"].update(maxLength=limits.max_chars, pattern=_not_blank_pattern())
    properties["strategies"]["anyOf"][0].update(
        items={"enum": list(engine.strategies)}, minItems=1, uniqueItems=True
    )
    return schema


# ----------------------------------------------------------------------------------------------
# Parsing and checking


async def read_json(request: Request, limit: int, timeout: float = 30.0) -> Any:
    """The request body as JSON, read within ``timeout`` seconds.

    Raises:
        ClientDisconnect: the client hung up before the end of the body.
        ApiError: 408 the body took longer than ``timeout``, 413 over ``limit`` bytes, 400 not
            UTF-8 or not JSON (NaN and Infinity are not
            JSON either, nor numbers beyond the float range or integers of more than 64
            digits), an object with a key given twice, nested deeper than
            :data:`MAX_DEPTH`, or a string (key or value) holding a lone surrogate escape such
            as ``"\\ud800"``, which is no character and cannot be tokenized or answered in
            UTF-8.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the body has {declared} bytes; the limit is {limit}", close=True)
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise ApiError(413, f"the body is over the limit of {limit} bytes", close=True)
    except TimeoutError:
        raise ApiError(
            408,
            f"the body did not arrive within {timeout:g} s ({len(body)} bytes came)",
            close=True,
        ) from None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ApiError(400, f"the body is not valid UTF-8 (byte {err.start})") from err

    def reject_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    def finite_float(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise ValueError(f"the number {literal[:40]} is out of range")
        return value

    def bounded_int(literal: str) -> int:
        if len(literal.lstrip("-")) > 64:  # no option needs more; Python's limit says 4300
            raise ValueError(f"an integer of {len(literal.lstrip('-'))} digits")
        return int(literal)

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        data = dict(pairs)
        if len(data) != len(pairs):
            seen: set[str] = set()
            twice = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise ValueError(f"the key {json.dumps(twice)} appears twice in one object")
        return data

    # The character scan costs ~0.1 s per MiB in Python: only for bodies that could nest deeply.
    depth = _nesting(text) if text.count("[") + text.count("{") > MAX_DEPTH else 0
    if depth > MAX_DEPTH:
        raise ApiError(400, f"the body nests {depth} levels deep; the limit is {MAX_DEPTH}")
    try:
        data = json.loads(
            text,
            parse_constant=reject_constant,
            parse_float=finite_float,
            parse_int=bounded_int,
            object_pairs_hook=unique_keys,
        )
    except json.JSONDecodeError as err:
        raise ApiError(
            400, f"invalid JSON: {err.msg} (line {err.lineno}, column {err.colno})"
        ) from err
    except ValueError as err:  # NaN, 1e999, a huge integer, a key given twice
        raise ApiError(400, f"invalid JSON: {err}") from err
    except RecursionError as err:  # _nesting should have caught it first
        raise ApiError(400, "the body is nested too deeply") from err
    _reject_surrogates(data)
    return data


#: Deepest nesting of arrays and objects in a request body (ours need 2).
MAX_DEPTH = 32


def _nesting(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in JSON ``text``, outside strings (json.loads itself
    recurses once per level and would hit Python's recursion limit first)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _reject_surrogates(data: Any) -> None:
    """Raises ApiError 400 for a string (key or value) anywhere in ``data`` that is not valid
    Unicode text (a lone surrogate from an escape such as ``"\\udc80"``)."""
    stack = [(data, "body")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as err:
                code = ord(value[err.start])
                raise ApiError(
                    400,
                    f"{where}: the escape \\u{code:04x} is a lone surrogate, not a character",
                ) from None
        elif isinstance(value, dict):
            for key, item in value.items():
                name = json.dumps(key)[1:-1]  # ASCII: a bad key must not spoil the message
                stack.append((item, name if where == "body" else f"{where}.{name}"))
                stack.append((key, f"{where} key"))
        elif isinstance(value, list):
            stack += [(item, f"{where}[{k}]") for k, item in enumerate(value)]


def validate(model: type[BaseModel], data: Any) -> Any:
    """``model`` from parsed JSON.

    Raises:
        ApiError: 422 naming the first wrong field (``text[2]: Input should be a valid string``).
    """
    if not isinstance(data, dict):
        raise ApiError(422, f"the body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"]
        ).lstrip(".")
        more = f" (and {len(err.errors()) - 1} more problems)" if len(err.errors()) > 1 else ""
        raise ApiError(422, f"{where or 'body'}: {first['msg']}{more}") from err


def check_sentences(sentences: list[str], limits: Limits) -> None:
    """Raises ApiError 422 for no sentence, 413 for too many or too long ones."""
    if not sentences:
        raise ApiError(422, "text: the list is empty")
    if len(sentences) > limits.max_sentences:
        raise ApiError(
            413, f"text: {len(sentences)} sentences; the limit is {limits.max_sentences}"
        )
    for k, sentence in enumerate(sentences):
        if len(sentence) > limits.max_chars:
            raise ApiError(
                413,
                f"text[{k}]: {len(sentence)} characters; the limit is {limits.max_chars}",
            )


def _json_number(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else value


# ----------------------------------------------------------------------------------------------
# The application


def create_app(
    engine: Engine,
    *,
    max_batch_tokens: int = 4096,
    max_wait_ms: float = 5.0,
    model_batch_tokens: int = 512,
    threads: int = 0,
    limits: Limits | None = None,
) -> FastAPI:
    """The ASGI application serving ``engine``.

    Args:
        engine: the model.
        max_batch_tokens: dynamic batching budget in padded graph vertices (DAT) or source tokens
            (AT); 0 = no batching.
        max_wait_ms: how long a request may wait for others to share its batch.
        model_batch_tokens: padded positions per model batch (length-sorted) inside a batch.
        threads: torch intra-op threads of the model's worker thread (0 = torch's default).
        limits: request size limits (default :class:`Limits`).
    """
    limits = limits or Limits()
    batcher = Batcher(
        engine,
        max_batch_tokens=max_batch_tokens,
        max_wait_ms=max_wait_ms,
        model_batch_tokens=model_batch_tokens,
        threads=threads,
    )
    app = FastAPI(
        title="fadat",
        version=_version(),
        summary="Translation with a Directed Acyclic Transformer, and the graph behind it.",
        description=(
            f"Limits: at most {limits.max_sentences} sentences per request, "
            f"{limits.max_chars} characters per sentence, {limits.max_body_bytes} bytes per "
            f"body (413 above), the body within {limits.body_timeout:g} s of the headers (408 "
            'after). Errors: `{"error": {"status": N, "message": "..."}}`.'
        ),
        lifespan=_lifespan(batcher),
    )
    app.add_middleware(AnswerCancelled)
    app.state.engine = engine
    app.state.batcher = batcher
    app.state.limits = limits
    _add_error_handlers(app, engine)
    batching = {
        "max_batch_tokens": max_batch_tokens,
        "max_wait_ms": max_wait_ms,
        "model_batch_tokens": model_batch_tokens,
    }
    # Routes are matched in the order they are added: the page and /static last.
    _add_health(app, engine, batcher, limits, batching)
    _add_translate(app, engine, batcher, limits)
    _add_graph(app, engine, batcher, limits)
    _add_page(app)
    return app


def _lifespan(batcher: Batcher) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the batcher's worker runs while the server does."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    return lifespan


def _add_error_handlers(app: FastAPI, engine: Engine) -> None:
    """Every error as ``{"error": {"status", "message"}}``: :class:`ApiError` with its status,
    :class:`~fadat.errors.InputError` 422, :class:`~fadat.serve.batching.Busy` 503, FastAPI's
    own HTTP errors (404, 405) with theirs and their headers (``Allow``), a model with
    non-finite outputs 500 naming the problem, a client gone before the end of its body one
    info line, any other exception 500 with a generic message (the traceback is logged, not
    sent)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        return _error(err.status, err.message, {"connection": "close"} if err.close else None)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, err: ClientDisconnect) -> JSONResponse:
        # Nobody reads the answer; uvicorn drops it. Not the server's fault: no traceback.
        client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
        log.info(
            "%s hung up before the end of its body (%s %s)",
            client,
            request.method,
            request.url.path,
        )
        return _error(400, "the client hung up before the end of the body")

    @app.exception_handler(NonFiniteOutputError)
    async def broken_model(request: Request, err: NonFiniteOutputError) -> JSONResponse:
        # The model's fault, not the request's (its sentences would be fine with a sound model).
        log.error("%s (%s %s)", err, request.method, request.url.path)
        return _error(
            500,
            f"model {engine.name} produces non-finite {err.what}: its weights are probably "
            "corrupt (a problem of the server, not of the request)",
        )

    @app.exception_handler(InputError)
    async def input_error(request: Request, err: InputError) -> JSONResponse:
        return _error(422, str(err))

    @app.exception_handler(Busy)
    async def busy(request: Request, err: Busy) -> JSONResponse:
        return _error(503, f"the server is busy: {err}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        return _error(err.status_code, str(err.detail), err.headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, err: Exception) -> JSONResponse:
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=err)
        return _error(500, "internal error (logged on the server)")


def _add_health(
    app: FastAPI, engine: Engine, batcher: Batcher, limits: Limits, batching: dict[str, Any]
) -> None:
    """``GET /health``: the model, its strategies, the limits, the batching settings
    (``batching``) and the batcher's statistics at the time of the request."""

    @app.get("/health", summary="Server and model status")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": engine.name,
            "model_type": engine.model_type,
            "strategies": engine.strategies,
            "default_strategy": engine.default_strategy,
            "graph": engine.has_graph,
            "limits": asdict(limits),
            "batching": {**batching, **batcher.stats.as_dict()},
        }


def _add_translate(app: FastAPI, engine: Engine, batcher: Batcher, limits: Limits) -> None:
    """``POST /v1/translate``: the sentences translated through the batcher, in input order."""

    @app.post(
        "/v1/translate",
        summary="Translate sentences",
        response_model=TranslateResponse,
        responses=ERRORS,
        openapi_extra=_request_body(translate_schema(engine, limits)),
    )
    async def translate(request: Request) -> dict[str, Any]:
        body = await read_json(request, limits.max_body_bytes, limits.body_timeout)
        req = validate(TranslateRequest, body)
        check_sentences(req.text, limits)
        strategy, options = engine.check(req.strategy, dict(req.model_extra or {}))
        results = await batcher.translate(req.text, strategy, options)
        return {
            "translations": [
                {
                    "text": r.text,
                    "score": _json_number(r.score),
                    "log_prob": _json_number(r.log_prob),
                    "confidence": r.confidence,
                }
                for r in results
            ],
            "strategy": strategy,
            "options": options,
            "model": engine.name,
        }


def _add_graph(app: FastAPI, engine: Engine, batcher: Batcher, limits: Limits) -> None:
    """``POST /v1/graph``: the graph behind one sentence's translation
    (:meth:`fadat.serve.engine.Engine.graph`, run on the batcher's worker thread)."""

    @app.post(
        "/v1/graph",
        summary="The graph behind the translation of one sentence",
        response_model=GraphResponse,
        response_model_by_alias=True,
        responses=ERRORS,
        openapi_extra=_request_body(graph_schema(engine, limits)),
    )
    async def graph(request: Request) -> dict[str, Any]:
        body = await read_json(request, limits.max_body_bytes, limits.body_timeout)
        req = validate(GraphRequest, body)
        names = check_graph_request(req, engine, limits)
        return await batcher.call(
            engine.graph, req.text, names, req.top_k, req.min_passing, req.min_flow
        )


def check_graph_request(req: GraphRequest, engine: Engine, limits: Limits) -> list[str]:
    """The strategies whose paths ``req`` asks for (the engine's default strategy when it
    names none), after checking the request against the limits and the model.

    Raises:
        ApiError: 413 a sentence over ``limits.max_chars``; 422 a blank sentence, a model
            without a graph (AT), an empty list of strategies, a strategy named twice, or
            (from :meth:`~fadat.serve.engine.Engine.check`) an unknown one.
    """
    check_sentences([req.text], limits)
    if not req.text.strip():
        raise ApiError(422, "text: the sentence is blank")
    if not engine.has_graph:
        raise ApiError(
            422, f"this {engine.model_type.upper()} model has no graph; use /v1/translate"
        )
    names = req.strategies if req.strategies is not None else [engine.default_strategy]
    if not names:
        raise ApiError(422, "strategies: the list is empty")
    if len(set(names)) != len(names):
        raise ApiError(422, "strategies: a strategy is named twice")
    for name in names:
        engine.check(name, {})
    return names


def _add_page(app: FastAPI) -> None:
    """``GET /``: the web page; ``/static``: its scripts and styles (``static/``)."""

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(str(STATIC / "index.html"), media_type="text/html")

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"status": status, "message": message}}, status_code=status, headers=headers
    )


class AnswerCancelled:
    """ASGI middleware: a request cancelled before its answer started — uvicorn cancels the
    requests still running when ``--graceful-timeout`` is over after SIGTERM — is answered
    503 JSON (``connection: close``) instead of uvicorn's ``text/plain`` 500 and its
    traceback, and logged as one warning line."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if started or task is None:
                raise
            task.uncancel()  # answered: the cancellation has done its work
            log.warning(
                "%s %s cancelled at shutdown (--graceful-timeout): answered 503",
                scope["method"],
                scope["path"],
            )
            response = _error(
                503,
                "the server stopped before the answer was ready (shutting down); try again",
                {"connection": "close"},
            )
            await response(scope, receive, send)


def _version() -> str:
    import fadat

    return fadat.__version__
