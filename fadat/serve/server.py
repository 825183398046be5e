"""Run the translation server (uvicorn) on a model directory: :func:`serve`, which ``fadat serve``
(:mod:`fadat.cli.serve`) runs; the application itself is :func:`fadat.serve.app.create_app`.

Binds 127.0.0.1 unless ``--host`` says otherwise; any other address gets a warning on stderr
(the server has no authentication). SIGTERM (and a first Ctrl-C) stop accepting connections,
finish the requests in flight (at most ``--graceful-timeout`` seconds; those still running then
are answered 503) and exit 0. ``--port 0`` picks a free port; the first line on stderr names the
address either way.

Connections (:mod:`fadat.serve.protocol`): request headers within ``--header-timeout`` seconds,
the body within ``--body-timeout`` seconds after them (408 JSON after either), headers of at most
``--max-header-bytes`` (431 JSON above), at most ``--max-connections`` connections (503 JSON
beyond, ``/health`` excepted), lowered to fit the process's file-descriptor limit, whose soft
value is first raised to the hard one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import math
import os
import signal
import socket
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from fadat.engine import DEFAULT_ENGINE
from fadat.errors import InputError, ThreadsAboveCoresWarning
from fadat.options import check_threads

if TYPE_CHECKING:
    from fadat.serve.app import Limits
    from fadat.serve.protocol import ConnectionLimits

#: The ``log_level`` values (uvicorn's, without ``trace``).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``.

    Raises:
        InputError: the address cannot be bound (in use, not an address of this machine).
    """
    if not 0 <= port <= 65535:
        raise InputError(f"--port must be in [0, 65535], got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as err:
        raise InputError(f"cannot listen on {host}:{port}: {err.strerror or err}") from err


#: The longest ``--max-wait-ms``: every request waits up to this long for company, so a larger
#: value (1e9 ms) would make the server look hung.
MAX_WAIT_MS = 10_000.0

#: The longest ``--header-timeout`` and ``--body-timeout`` (one hour): the point of the timeouts
#: is that no client holds a connection for ever.
MAX_TIMEOUT_S = 3600.0

#: Connections the event loop may accept in one turn before the protocol sees any of them
#: (``uvicorn.Config(backlog=...)``, which asyncio also uses as its accept batch). A connection
#: that makes another give way (:mod:`fadat.serve.protocol`) frees its descriptor two turns
#: after it was accepted, so up to three batches are open above ``--max-connections``.
ACCEPT_BATCH = 64


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bound socket's numeric address) is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def connection_cap(requested: int) -> int:
    """``--max-connections`` lowered to fit the file-descriptor limit: the soft limit is
    raised to the hard one, and the cap leaves room for the descriptors open now (the model,
    torch, logging), three accept batches (:data:`ACCEPT_BATCH`) and a margin of 16, so that
    ``accept`` does not run out of descriptors (if it does, :func:`_quiet_accept_errors` logs it as
    one line). Prints a warning when it lowers the cap.
    """
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    except (ImportError, ValueError, OSError):
        return requested
    if soft == resource.RLIM_INFINITY:
        return requested
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 64
    room = max(1, soft - in_use - 3 * ACCEPT_BATCH - 16)
    if room < requested:
        print(
            f"fadat: warning: --max-connections {requested} lowered to {room} to fit the limit "
            f"of {soft} open files (ulimit -n)",
            file=sys.stderr,
            flush=True,
        )
    return min(requested, room)


def check_options(
    *,
    port: int = 8080,
    threads: int = 0,
    force: bool = False,
    max_batch_tokens: int = 4096,
    max_wait_ms: float = 5.0,
    max_tokens: int = 512,
    graceful_timeout: float = 60.0,
    limits: Limits | None = None,
    connections: ConnectionLimits | None = None,
) -> None:
    """Every option of :func:`serve` in range, before the model is loaded (the keywords are
    :func:`serve`'s; ``None`` limits are the defaults, which are).

    Warns:
        ThreadsAboveCoresWarning: ``force`` lets more threads than cores through (``fadat``'s
            command line prints it as one ``fadat: warning: ...`` line).

    Raises:
        InputError: naming the flag (``--max-wait-ms`` for ``max_wait_ms``, ...), its value
            and the allowed range.
    """
    warning = check_threads(threads, force)  # also rejects < 0 and absurd counts
    if warning:
        warnings.warn(warning, ThreadsAboveCoresWarning, stacklevel=3)
    if max_batch_tokens < 0:
        raise InputError(f"--max-batch-tokens must be >= 0, got {max_batch_tokens}")
    counts = {"max_tokens": max_tokens}
    if limits is not None:
        counts.update(max_sentences=limits.max_sentences, max_chars=limits.max_chars)
    if connections is not None:
        counts["max_connections"] = connections.max_connections
    for name in ("max_sentences", "max_chars", "max_tokens", "max_connections"):
        if name in counts and counts[name] < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {counts[name]}")
    # NaN passes every comparison, so a range test must be written as "inside", not "outside".
    if not 0.0 <= max_wait_ms <= MAX_WAIT_MS:
        raise InputError(f"--max-wait-ms must be in [0, {MAX_WAIT_MS:g}], got {max_wait_ms}")
    if not (0.0 <= graceful_timeout and math.isfinite(graceful_timeout)):
        raise InputError(
            f"--graceful-timeout must be a finite number of seconds >= 0, got {graceful_timeout}"
        )
    if not 0 <= port <= 65535:
        raise InputError(f"--port must be in [0, 65535], got {port}")
    timeouts = {}
    if connections is not None:
        timeouts["header_timeout"] = connections.header_timeout
    if limits is not None:
        timeouts["body_timeout"] = limits.body_timeout
    for name, value in timeouts.items():
        if not 0.0 < value <= MAX_TIMEOUT_S:
            raise InputError(
                f"--{name.replace('_', '-')} must be in (0, {MAX_TIMEOUT_S:g}] seconds, got {value}"
            )
    if connections is not None and not 256 <= connections.max_header_bytes <= 1 << 20:
        raise InputError(
            f"--max-header-bytes must be in [256, 1048576], got {connections.max_header_bytes}"
        )


def _quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """``accept`` out of file descriptors is logged by asyncio with a traceback each time (it
    retries a second later); here as one warning line, at most one a second."""
    default = loop.get_exception_handler()
    last = [0.0]

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if context.get("message") != "socket.accept() out of system resource":
            if default is None:
                loop.default_exception_handler(context)
            else:
                default(loop, context)
            return
        if loop.time() - last[0] >= 1.0:
            last[0] = loop.time()
            logging.getLogger("fadat.serve").warning(
                "accept: %s; new connections wait (raise ulimit -n or lower --max-connections)",
                context.get("exception"),
            )

    loop.set_exception_handler(handler)


def _log_to_stderr(level: str) -> logging.Handler:
    """The server's own log lines (``fadat.serve``: clients that hang up, requests cancelled at
    shutdown, internal errors) on stderr at ``--log-level``, as uvicorn's (``INFO:  ...``);
    returns the handler, for :func:`serve` to remove when the server stops."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:  %(message)s"))
    logger = logging.getLogger("fadat.serve")
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return handler


def serve(
    model: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    device: str = "cpu",
    engine: str = DEFAULT_ENGINE,
    threads: int = 0,
    max_batch_tokens: int = 4096,
    max_wait_ms: float = 5.0,
    max_tokens: int = 512,
    limits: Limits | None = None,
    connections: ConnectionLimits | None = None,
    graceful_timeout: float = 60.0,
    log_level: str = "info",
    force: bool = False,
    lm: str | Path | None = None,
) -> None:
    """Serve ``model`` over HTTP until SIGTERM or Ctrl-C (``fadat serve``); blocks, as
    ``uvicorn.run`` does, and like it runs in the main thread (it installs a SIGTERM handler).
    See the module docstring for the address, the shutdown and the connection rules; the
    endpoints are :func:`fadat.serve.app.create_app`'s (an ASGI application to run otherwise).

    Args:
        model: a DAT or AT model directory, or an export of ``fadat export --format onnx``.
        host: the address to bind; any but a loopback address gets a warning on stderr (the
            server has no authentication).
        port: the port (0: any free port; the first line on stderr names it).
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        engine: ``auto`` (the directory's: ``onnxruntime`` for an export, else ``torch``),
            ``torch`` or ``onnxruntime`` (:data:`fadat.engine.ENGINES`).
        threads: torch intra-op threads (0 = torch's default); above the cores needs ``force``.
        max_batch_tokens: dynamic batching budget: sentences x largest graph size (DAT) or
            source length (AT) per batch; 0 = no batching.
        max_wait_ms: how long a request waits for others to share its batch, in ms.
        max_tokens: padded positions per model batch (a batch's sentences sorted by length).
        limits: request size limits and the body timeout (default
            :class:`fadat.serve.app.Limits`).
        connections: header timeout, connection cap and header size (default
            :class:`fadat.serve.protocol.ConnectionLimits`); the cap is lowered to fit the
            file-descriptor limit (:func:`connection_cap`).
        graceful_timeout: on SIGTERM, seconds to wait for the requests in flight.
        log_level: one of :data:`LOG_LEVELS` (uvicorn's and the server's own log on stderr).
        force: allow ``threads`` above the cores this process may use.
        lm: a KenLM language model file for the DAT beam search, opened once; beam requests
            decode with it and may set its weight ``gamma`` (:class:`fadat.serve.engine.Engine`).

    Raises:
        InputError: an option out of range (:func:`check_options`), the ``serve`` extra
            missing, a model directory that cannot be loaded, an ``lm`` that cannot be used,
            an address that cannot be bound.
    """
    check_options(
        port=port,
        threads=threads,
        force=force,
        max_batch_tokens=max_batch_tokens,
        max_wait_ms=max_wait_ms,
        max_tokens=max_tokens,
        graceful_timeout=graceful_timeout,
        limits=limits,
        connections=connections,
    )
    if log_level not in LOG_LEVELS:
        raise InputError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
    try:
        import uvicorn

        from fadat.serve.app import Limits, create_app
        from fadat.serve.protocol import ConnectionLimits, uvicorn_settings
    except ImportError as err:
        raise InputError(
            f"fadat serve needs the 'serve' extra ({err.name} is missing): "
            "pip install 'fadat[serve]'"
        ) from err
    import torch

    from fadat.serve.engine import Engine

    limits = limits or Limits()
    connections = connections or ConnectionLimits()
    if threads:
        torch.set_num_threads(threads)
    loaded = Engine.from_directory(model, device, engine, intra_threads=threads, lm=lm)
    app = create_app(
        loaded,
        max_batch_tokens=max_batch_tokens,
        max_wait_ms=max_wait_ms,
        model_batch_tokens=max_tokens,
        threads=threads,
        limits=limits,
    )
    sock = bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(f"fadat: serving {model} on http://{shown}:{bound_port}", file=sys.stderr, flush=True)
    if not is_loopback(bound_host):
        where = (
            "every interface of this machine"
            if ipaddress.ip_address(bound_host).is_unspecified
            else bound_host
        )
        print(
            f"fadat: warning: listening on {where}: the server has no authentication, anyone "
            f"who can reach port {bound_port} can use it (the default --host 127.0.0.1 serves "
            "this machine only)",
            file=sys.stderr,
            flush=True,
        )
    connections = dataclasses.replace(
        connections, max_connections=connection_cap(connections.max_connections)
    )
    config = uvicorn.Config(
        app,
        log_level=log_level,
        timeout_graceful_shutdown=graceful_timeout,
        access_log=log_level == "debug",
        backlog=ACCEPT_BATCH,
        **uvicorn_settings(connections),
    )

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            _quiet_accept_errors(asyncio.get_running_loop())
            await super().startup(sockets)

    server = Server(config)
    # uvicorn shuts down gracefully on SIGTERM and then raises the signal again for the handler
    # that was installed before it; this one ignores it, so the process exits 0.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    handler = _log_to_stderr(log_level)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        logger = logging.getLogger("fadat.serve")
        logger.removeHandler(handler)
        logger.propagate = True
