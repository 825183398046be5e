"""``fadat serve``: run the translation server (uvicorn) on a model directory.

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

import argparse
import asyncio
import ipaddress
import logging
import math
import os
import signal
import socket
import sys

from fadat.engine import DEFAULT_ENGINE, ENGINES
from fadat.errors import InputError
from fadat.options import check_threads
from fadat.verbs import add_force_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fadat serve``."""
    from fadat.serve.app import Limits
    from fadat.serve.protocol import ConnectionLimits

    defaults = Limits()
    connections = ConnectionLimits()
    parser.add_argument("--model", required=True, metavar="DIR", help="DAT or AT model directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 = any free)")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)"
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        default=4096,
        metavar="T",
        help="dynamic batching budget: sentences x largest graph size (DAT) or source length "
        "(AT) per batch; 0 = no batching (default 4096)",
    )
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=5.0,
        metavar="W",
        help="how long a request waits for others to share its batch (default 5 ms)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=512,
        metavar="M",
        help="padded positions per model batch: a batch's sentences are sorted by length and "
        "cut into model batches of at most M (default 512, faster on a CPU than larger ones)",
    )
    parser.add_argument(
        "--max-sentences",
        type=int,
        default=defaults.max_sentences,
        help=f"sentences per request (default {defaults.max_sentences}; more: 413)",
    )
    parser.add_argument(
        "--max-chars",
        type=int,
        default=defaults.max_chars,
        help=f"characters per sentence (default {defaults.max_chars}; more: 413)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=connections.header_timeout,
        metavar="S",
        help="seconds for a request's line and headers to arrive (default "
        f"{connections.header_timeout:g}; later: 408 and the connection is closed)",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=defaults.body_timeout,
        metavar="S",
        help="seconds for a request's body to arrive after its headers (default "
        f"{defaults.body_timeout:g}; later: 408)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=connections.max_connections,
        metavar="N",
        help=f"open connections (default {connections.max_connections}, lowered to fit the "
        "file-descriptor limit); beyond: the oldest connection still without a request is "
        "closed, and requests get 503 (GET /health excepted)",
    )
    parser.add_argument(
        "--max-header-bytes",
        type=int,
        default=connections.max_header_bytes,
        metavar="B",
        help=f"request line and headers (default {connections.max_header_bytes}; more: 431)",
    )
    parser.add_argument(
        "--graceful-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="on SIGTERM, wait at most S seconds for requests in flight (default 60)",
    )
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps")
    parser.add_argument(
        "--engine",
        default=DEFAULT_ENGINE,
        choices=ENGINES,
        help="torch, or onnxruntime for an export of `fadat export --format onnx` (no graph "
        f"view, no confidence; docs/engine.md; default {DEFAULT_ENGINE})",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    add_force_argument(parser)


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


def check_arguments(args: argparse.Namespace) -> None:
    """Every option of ``fadat serve`` in range, before the model is loaded.

    Raises:
        InputError: naming the flag, its value and the allowed range.
    """
    warning = check_threads(args.threads, args.force)  # also rejects < 0 and absurd counts
    if warning:
        print(f"fadat: warning: {warning}", file=sys.stderr)
    if args.max_batch_tokens < 0:
        raise InputError(f"--max-batch-tokens must be >= 0, got {args.max_batch_tokens}")
    for name in ("max_sentences", "max_chars", "max_tokens", "max_connections"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    # NaN passes every comparison, so a range test must be written as "inside", not "outside".
    if not 0.0 <= args.max_wait_ms <= MAX_WAIT_MS:
        raise InputError(f"--max-wait-ms must be in [0, {MAX_WAIT_MS:g}], got {args.max_wait_ms}")
    if not (0.0 <= args.graceful_timeout and math.isfinite(args.graceful_timeout)):
        raise InputError(
            f"--graceful-timeout must be a finite number of seconds >= 0, "
            f"got {args.graceful_timeout}"
        )
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be in [0, 65535], got {args.port}")
    for name in ("header_timeout", "body_timeout"):
        value = getattr(args, name)
        if not 0.0 < value <= MAX_TIMEOUT_S:
            raise InputError(
                f"--{name.replace('_', '-')} must be in (0, {MAX_TIMEOUT_S:g}] seconds, got {value}"
            )
    if not 256 <= args.max_header_bytes <= 1 << 20:
        raise InputError(
            f"--max-header-bytes must be in [256, 1048576], got {args.max_header_bytes}"
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
    returns the handler, for :func:`run` to remove when the server stops."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:  %(message)s"))
    logger = logging.getLogger("fadat.serve")
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return handler


def run(args: argparse.Namespace) -> int:
    """``fadat serve``: load the model, bind, serve until SIGTERM/Ctrl-C; returns 0."""
    check_arguments(args)
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

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine.from_directory(args.model, args.device, args.engine, intra_threads=args.threads)
    limits = Limits(
        max_sentences=args.max_sentences, max_chars=args.max_chars, body_timeout=args.body_timeout
    )
    app = create_app(
        engine,
        max_batch_tokens=args.max_batch_tokens,
        max_wait_ms=args.max_wait_ms,
        model_batch_tokens=args.max_tokens,
        threads=args.threads,
        limits=limits,
    )
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"fadat: serving {args.model} on http://{shown}:{port}", file=sys.stderr, flush=True)
    if not is_loopback(host):
        where = (
            "every interface of this machine" if ipaddress.ip_address(host).is_unspecified else host
        )
        print(
            f"fadat: warning: listening on {where}: the server has no authentication, anyone "
            f"who can reach port {port} can use it (the default --host 127.0.0.1 serves this "
            "machine only)",
            file=sys.stderr,
            flush=True,
        )
    connections = ConnectionLimits(
        header_timeout=args.header_timeout,
        max_connections=connection_cap(args.max_connections),
        max_header_bytes=args.max_header_bytes,
    )
    config = uvicorn.Config(
        app,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.graceful_timeout,
        access_log=args.log_level == "debug",
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
    handler = _log_to_stderr(args.log_level)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        logger = logging.getLogger("fadat.serve")
        logger.removeHandler(handler)
        logger.propagate = True
    return 0
