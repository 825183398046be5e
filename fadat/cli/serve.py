"""``fadat serve``: its flags, mapped onto :func:`fadat.serve.server.serve`."""

from __future__ import annotations

import argparse

from fadat.cli.common import add_force_argument
from fadat.engine import DEFAULT_ENGINE, ENGINES
from fadat.serve.server import LOG_LEVELS, serve


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
        help="auto (default): onnxruntime for an export of `fadat export --format onnx`, torch "
        "for a model directory; torch; or onnxruntime (no graph view, no confidence; "
        "docs/engine.md)",
    )
    parser.add_argument(
        "--lm",
        default=None,
        metavar="FILE",
        help="KenLM n-gram language model (ARPA or build_binary file) over the model's "
        "sentencepiece pieces, loaded once: requests with strategy beam (DAT) decode with it "
        "and may set its weight gamma (default 0.1); without it they cannot set gamma",
    )
    parser.add_argument("--log-level", default="info", choices=list(LOG_LEVELS))
    add_force_argument(parser)


def run(args: argparse.Namespace) -> int:
    """``fadat serve``: :func:`fadat.serve.server.serve` until SIGTERM/Ctrl-C; returns 0."""
    from fadat.serve.app import Limits
    from fadat.serve.protocol import ConnectionLimits

    serve(
        args.model,
        host=args.host,
        port=args.port,
        device=args.device,
        engine=args.engine,
        threads=args.threads,
        max_batch_tokens=args.max_batch_tokens,
        max_wait_ms=args.max_wait_ms,
        max_tokens=args.max_tokens,
        limits=Limits(
            max_sentences=args.max_sentences,
            max_chars=args.max_chars,
            body_timeout=args.body_timeout,
        ),
        connections=ConnectionLimits(
            header_timeout=args.header_timeout,
            max_connections=args.max_connections,
            max_header_bytes=args.max_header_bytes,
        ),
        graceful_timeout=args.graceful_timeout,
        log_level=args.log_level,
        force=args.force,
        lm=args.lm,
    )
    return 0
