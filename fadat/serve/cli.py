"""``fadat serve``: run the translation server (uvicorn) on a model directory.

Binds 127.0.0.1 unless ``--host`` says otherwise. SIGTERM (and a first Ctrl-C) stop accepting
connections, finish the requests in flight (at most ``--graceful-timeout`` seconds) and exit 0.
``--port 0`` picks a free port; the first line on stderr names the address either way.
"""

from __future__ import annotations

import argparse
import math
import signal
import socket
import sys

from fadat.engine import DEFAULT_ENGINE, ENGINES
from fadat.errors import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fadat serve``."""
    from fadat.serve.app import Limits

    defaults = Limits()
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


def check_arguments(args: argparse.Namespace) -> None:
    """Every option of ``fadat serve`` in range, before the model is loaded.

    Raises:
        InputError: naming the flag, its value and the allowed range.
    """
    for name in ("threads", "max_batch_tokens"):
        if getattr(args, name) < 0:
            raise InputError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    for name in ("max_sentences", "max_chars", "max_tokens"):
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


def run(args: argparse.Namespace) -> int:
    """``fadat serve``: load the model, bind, serve until SIGTERM/Ctrl-C; returns 0."""
    check_arguments(args)
    try:
        import uvicorn

        from fadat.serve.app import Limits, create_app
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
    limits = Limits(max_sentences=args.max_sentences, max_chars=args.max_chars)
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
    config = uvicorn.Config(
        app,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.graceful_timeout,
        access_log=args.log_level == "debug",
    )
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM and then raises the signal again for the handler
    # that was installed before it; this one ignores it, so the process exits 0.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    return 0
