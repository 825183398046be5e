"""The HTTP/1.1 connections of ``fadat serve``: uvicorn's h11 protocol, with what uvicorn lacks.

uvicorn gives a keep-alive timeout (``timeout_keep_alive``: an idle connection after a response)
and h11 a header size limit (``h11_max_incomplete_event_size``); both are used as they are.
:func:`protocol_class` adds, in a subclass of uvicorn's ``H11Protocol`` given to
``uvicorn.Config(http=...)``:

- **a header timeout**: a connection whose request line and headers are not complete
  ``header_timeout`` seconds after it opened (or after its previous answer) is closed, with a
  408 JSON answer if some bytes of the request came; uvicorn would wait forever for a client
  that sends one byte a second. The body has its own deadline, in the application
  (:attr:`fadat.serve.app.Limits.body_timeout`), as uvicorn has no body timeout;
- **a cap on open connections**, which is uvicorn's ``limit_concurrency`` with JSON answers:
  when a connection opens beyond ``max_connections``, the oldest connection still waiting for
  its request headers is closed (408 if it had sent part of them: a slow client gives way to a
  new one, so that idle or trickling clients cannot hold every file descriptor); a request that
  arrives while more than ``max_connections`` connections are open or requests are running is
  answered 503 JSON, except ``GET /health``, which always gets through. The cap is kept below
  the process's file-descriptor limit (``fadat serve`` lowers it), so ``accept`` never fails;
- **a header size limit**: a request line and headers over ``max_header_bytes`` are answered
  431 JSON and the connection closed (h11's ``max_incomplete_event_size``, set to the same
  value, only bounds headers that arrive in pieces);
- **JSON for uvicorn's own answers**: its 400 for a request line or headers that are not HTTP/1.1
  (h11's ``RemoteProtocolError``) and its 503 (``limit_concurrency``) are ``text/plain``; here
  they are ``{"error": {"status", "message"}}`` like the application's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("fadat.serve")

_END_OF_HEADERS = re.compile(rb"\r?\n\r?\n")


@dataclass(frozen=True)
class ConnectionLimits:
    """Limits on the server's connections.

    Attributes:
        header_timeout: seconds for a request line and its headers to arrive (default 10).
        max_connections: open connections (default 1000; see the module docstring).
        max_header_bytes: size of a request line plus headers (default 16 KiB, h11's own
            default; more: 431).
        keep_alive: seconds an idle connection stays open after an answer (uvicorn's
            ``timeout_keep_alive``, default 5).
    """

    header_timeout: float = 10.0
    max_connections: int = 1000
    max_header_bytes: int = 16 * 1024
    keep_alive: float = 5.0


def json_answer(status: int, reason: str, message: str) -> bytes:
    """A complete HTTP/1.1 answer with a JSON error body that closes the connection, for the
    moments when h11 has no request to answer (a request line that never completed)."""
    body = json.dumps({"error": {"status": status, "message": message}}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout, a connection cap and JSON answers (see
    the module docstring). Made for one server by :func:`protocol_class`, which sets
    :attr:`limits` and a fresh :attr:`waiting`."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    #: This server's connections that wait for request headers, oldest first (a dict as an
    #: ordered set).
    waiting: ClassVar[dict[GuardedH11Protocol, None]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # checked by _guard, which answers JSON
        self.app = self._guard(self.app)
        self._header_timer: asyncio.TimerHandle | None = None
        self._head = b""  # what came of the request whose headers are waited for

    # -- the header timeout ----------------------------------------------------------------------

    def _await_headers(self) -> None:
        self._stop_waiting()
        self.waiting[self] = None
        self._header_timer = self.loop.call_later(self.limits.header_timeout, self._too_slow)

    def _stop_waiting(self) -> None:
        self._head = b""
        self.waiting.pop(self, None)
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self, reason: str = "header timeout") -> None:
        """Close a connection whose headers did not come: 408 if part of a request came."""
        if self._head:
            message = (
                "the request line and headers did not arrive within "
                f"{self.limits.header_timeout:g} s"
            )
            self._refuse(408, "Request Timeout", message, reason)
        else:
            self._stop_waiting()
            self.transport.close()

    def _refuse(self, status: int, reason: str, message: str, why: str) -> None:
        """Answer ``status`` JSON to a request whose headers are incomplete, and close."""
        self._stop_waiting()
        if self.transport.is_closing():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.info("%s: %s, answered %d and closed", client, why, status)
        self.transport.write(json_answer(status, reason, message))
        self.transport.close()

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections and self.waiting:
            # The oldest connection still without a request gives way (it is idle or slow).
            next(iter(self.waiting))._too_slow("connection cap reached")
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is not None:
            # h11's max_incomplete_event_size only bounds headers that arrive in pieces; a
            # header block that comes in one read is parsed whatever its size.
            self._head += data
            end = _END_OF_HEADERS.search(self._head)
            size = end.end() if end else len(self._head)
            limit = self.limits.max_header_bytes
            if size > limit:
                message = f"the request line and headers are over {limit} bytes"
                self._refuse(431, "Request Header Fields Too Large", message, "headers too large")
                return
        super().data_received(data)
        if self._header_timer is not None and self.conn.their_state is not h11.IDLE:
            self._stop_waiting()  # the headers are in (or the request was refused)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._await_headers()  # the next request on this connection

    # -- uvicorn's own answers, as JSON ----------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        self._stop_waiting()
        body = json.dumps(
            {
                "error": {
                    "status": 400,
                    "message": "invalid HTTP/1.1 request: a malformed request line or header",
                }
            }
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def _guard(self, app: Any) -> Any:
        """``app`` behind the connection cap: a request is answered 503 JSON while more than
        ``max_connections`` connections are open or requests running (uvicorn's
        ``limit_concurrency`` rule), except ``GET /health``."""
        limit = self.limits.max_connections

        async def guarded(scope: dict, receive: Any, send: Any) -> None:
            over = len(self.connections) > limit or len(self.tasks) > limit
            if over and not (scope["method"] in ("GET", "HEAD") and scope["path"] == "/health"):
                log.warning("over %d connections: answered 503", limit)
                body = json.dumps(
                    {
                        "error": {
                            "status": 503,
                            "message": f"the server is busy: over {limit} connections; "
                            "try again shortly",
                        }
                    }
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 503,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
            await app(scope, receive, send)

        return guarded


def protocol_class(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` class for one server, for ``uvicorn.Config(http=...)``."""
    return type("FadatH11Protocol", (GuardedH11Protocol,), {"limits": limits, "waiting": {}})


def uvicorn_settings(limits: ConnectionLimits) -> dict[str, Any]:
    """The keywords of ``uvicorn.Config`` that carry ``limits``: the protocol, h11's header
    size limit (``h11_max_incomplete_event_size``) and the keep-alive timeout."""
    return {
        "http": protocol_class(limits),
        "h11_max_incomplete_event_size": limits.max_header_bytes,
        "timeout_keep_alive": limits.keep_alive,
    }
