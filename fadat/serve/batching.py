"""Dynamic batching: concurrent translation requests decoded as one batch, answered separately.

A request becomes a :class:`Job` (its sentences, checked strategy and options, and the batch
cost of each sentence, :meth:`fadat.serve.engine.Engine.cost`). The job is cut into
:class:`Piece` s of at most ``model_batch_tokens`` padded positions each (one model batch:
:func:`fadat.translation.pipeline.make_batches`, sentences sorted by cost, a single sentence
over the budget alone), and only its first piece waits in line; when a piece has run, the
job's next piece goes to the back of the line, behind every request that arrived meanwhile.

One asyncio task (:meth:`Batcher.run`) takes the piece at the front of the line and adds later
pieces with the same strategy and options while

- the batch's padded cost ``sentences × largest cost`` stays within ``max_batch_tokens`` (graph
  vertices for a DAT, source tokens for an AT: the model's ``batch_cost``), and
- at most ``max_wait_ms`` have passed since the oldest job arrived;

then one :meth:`~fadat.serve.engine.Engine.translate` call runs the batch and each job gets
its own slice of the results. Inside that call the translation core sorts the batch's sentences
by length and cuts them into model batches of at most ``model_batch_tokens`` padded positions
(:func:`fadat.translation.pipeline.make_batches`): on a CPU, one model batch of thousands of graph
vertices is slower than the same sentences one by one (the ``(B, L, V)`` token log-probabilities
leave the caches), while length-sorted model batches of ≈ 512 vertices are faster
(docs/results/journal.md, "fadat serve"). Pieces with other options wait for a later batch, in
line order. ``max_batch_tokens = 0`` turns batching off: every piece runs alone.

**Fairness bound.** A request that arrives while others are being translated waits for at most
the batch that is running (its pieces: ≤ ``max_batch_tokens`` padded positions, or one piece
when a piece is larger) plus one piece of each request ahead of it in line, plus its own
``max_wait_ms``. A maximum-size request (64 sentences of 1,000 characters, beam 200) thus
delays a one-sentence request by one of its model batches (one sentence, for sentences longer
than ``model_batch_tokens`` / 1 positions), not by the whole request, which used to be 23 s;
``tests/test_serve_robust.py::test_small_request_does_not_wait_behind_a_large_one`` checks it.

All model work — batches and the graph requests of :meth:`Batcher.call` — runs on one worker
thread, one piece at a time: torch's own intra-op threads (``--threads``) use the cores, and two
pieces of work in parallel would only compete for them.

If a batch of several pieces fails, each of its pieces is run again alone, so one request that
trips an error cannot fail the others with it; the failing request's other pieces are dropped.
A request whose future is already done (failed, or cancelled at shutdown) is not run further.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from fadat.serve.engine import Engine, Result

log = logging.getLogger("fadat.serve")


class Busy(Exception):
    """More sentences are waiting than the server accepts (``max_pending``)."""


@dataclass
class Job:
    """One translation request waiting for its batches.

    Attributes:
        sentences: raw source text.
        strategy, options: checked by :meth:`fadat.serve.engine.Engine.check`.
        costs: batch cost of each sentence.
        future: receives the list of :class:`~fadat.serve.engine.Result`.
        arrival: ``time.monotonic()`` when the job was queued.
        results: per sentence, its result once its piece has run.
        pieces: the rows (indices into ``sentences``) of the pieces not yet in line.
    """

    sentences: list[str]
    strategy: str
    options: dict[str, Any]
    costs: list[int]
    future: asyncio.Future
    arrival: float = field(default_factory=time.monotonic)
    results: list[Result | None] = field(default_factory=list)
    pieces: collections.deque[list[int]] = field(default_factory=collections.deque)

    @property
    def key(self) -> tuple:
        """Jobs with equal keys can share a batch."""
        return (self.strategy, tuple(sorted(self.options.items())))


@dataclass
class Piece:
    """Some sentences of a :class:`Job` (``rows``: indices into ``job.sentences``), at most one
    model batch, that run together in one batch."""

    job: Job
    rows: list[int]

    @property
    def sentences(self) -> list[str]:
        return [self.job.sentences[i] for i in self.rows]

    @property
    def width(self) -> int:
        """The largest batch cost of the piece's sentences."""
        return max((self.job.costs[i] for i in self.rows), default=0)


@dataclass
class Statistics:
    """Counters shown by ``GET /health``."""

    requests: int = 0
    sentences: int = 0
    batches: int = 0
    largest_batch: int = 0
    failed_batches: int = 0

    def as_dict(self) -> dict[str, float]:
        mean = self.sentences / self.batches if self.batches else 0.0
        return {
            "requests": self.requests,
            "sentences": self.sentences,
            "batches": self.batches,
            "mean_batch_sentences": round(mean, 3),
            "largest_batch_sentences": self.largest_batch,
            "failed_batches": self.failed_batches,
        }


class Batcher:
    """Collects translation jobs into batches and runs all model work on one worker thread.

    Args:
        engine: the model.
        max_batch_tokens: padded-cost budget of a batch (see the module docstring); 0 = no
            batching.
        max_wait_ms: how long the oldest job of a batch may wait for others (milliseconds).
        model_batch_tokens: padded positions per model batch inside a batch (see above).
        threads: torch intra-op threads of the worker thread (0 = torch's default).
        max_pending: sentences that may wait at once; :meth:`translate` raises :class:`Busy`
            beyond it.
    """

    def __init__(
        self,
        engine: Engine,
        max_batch_tokens: int = 4096,
        max_wait_ms: float = 5.0,
        model_batch_tokens: int = 512,
        threads: int = 0,
        max_pending: int = 4096,
    ) -> None:
        if max_batch_tokens < 0 or max_wait_ms < 0 or model_batch_tokens < 1:
            raise ValueError(
                "max_batch_tokens and max_wait_ms must be >= 0, model_batch_tokens >= 1"
            )
        self.engine = engine
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait_ms / 1000.0
        self.model_batch_tokens = model_batch_tokens
        self.max_pending = max_pending
        self.stats = Statistics()
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._queue: asyncio.Queue[Job | None] | None = None
        self._line: collections.deque[Piece] = collections.deque()
        self._task: asyncio.Task | None = None
        self._pending = 0

    # -- life cycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the worker thread and the batching task (inside the running event loop)."""
        threads = self._threads

        def init() -> None:
            if threads > 0:
                torch.set_num_threads(threads)

        self._executor = ThreadPoolExecutor(1, thread_name_prefix="fadat-model", initializer=init)
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self.run())

    async def stop(self) -> None:
        """Finish every queued job, then stop the task and the worker thread."""
        if self._task is None:
            return
        assert self._queue is not None and self._executor is not None
        await self._queue.put(None)
        await self._task
        self._executor.shutdown(wait=True)
        self._task = None

    # -- submitting work -------------------------------------------------------------------------

    async def translate(
        self, sentences: Sequence[str], strategy: str, options: dict[str, Any]
    ) -> list[Result]:
        """Translate checked sentences in a dynamic batch; results in input order.

        Raises:
            Busy: more than ``max_pending`` sentences would be waiting.
            RuntimeError: the batcher is not running.
        """
        if self._queue is None or self._task is None:
            raise RuntimeError("the batcher is not running")
        if self._pending + len(sentences) > self.max_pending:
            raise Busy(f"{self._pending} sentences are waiting; try again shortly")
        loop = asyncio.get_running_loop()
        job = Job(
            sentences=list(sentences),
            strategy=strategy,
            options=dict(options),
            costs=[self.engine.cost(s) for s in sentences],
            future=loop.create_future(),
        )
        self._pending += len(job.sentences)
        self.stats.requests += 1
        await self._queue.put(job)
        try:
            return await job.future
        finally:
            self._pending -= len(job.sentences)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the model's worker thread (between batches)."""
        if self._executor is None:
            raise RuntimeError("the batcher is not running")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- the batching loop -----------------------------------------------------------------------

    def _fits(self, batch: list[Piece], piece: Piece) -> bool:
        sentences = sum(len(p.rows) for p in batch) + len(piece.rows)
        width = max(p.width for p in [*batch, piece])
        return sentences * width <= self.max_batch_tokens

    def _admit(self, job: Job) -> Piece:
        """Cut a new job into pieces (:func:`~fadat.translation.pipeline.make_batches`); returns
        its first piece, the others stay in ``job.pieces``."""
        from fadat.translation.pipeline import make_batches

        job.results = [None] * len(job.sentences)
        # Each piece in input order (make_batches sorts by cost), as a batch keeps it.
        pieces = make_batches(job.costs, self.model_batch_tokens)
        job.pieces = collections.deque(sorted(rows) for rows in pieces)
        return Piece(job, job.pieces.popleft())

    def _drain(self, stopping: bool) -> bool:
        """Move every job already queued into the line (no waiting); returns whether stop was
        asked."""
        assert self._queue is not None
        while not self._queue.empty():
            job = self._queue.get_nowait()
            if job is None:
                stopping = True
            else:
                self._line.append(self._admit(job))
        return stopping

    async def _next_job(self, timeout: float | None) -> Job | None:
        """The next job from the queue (``None`` = stop); raises TimeoutError after ``timeout``."""
        assert self._queue is not None
        if timeout is None:
            return await self._queue.get()
        if timeout <= 0:
            return self._queue.get_nowait()  # raises asyncio.QueueEmpty
        return await asyncio.wait_for(self._queue.get(), timeout)

    async def run(self) -> None:
        """Form and run batches until :meth:`stop`; then finish what is queued."""
        stopping = False
        while True:
            stopping = self._drain(stopping)
            if not self._line:
                if stopping:
                    return
                job = await self._next_job(None)
                if job is None:
                    stopping = True
                else:
                    self._line.append(self._admit(job))
                continue
            first = self._line.popleft()
            if first.job.future.done():  # failed, or its request was cancelled
                continue
            batch = [first]
            if self.max_batch_tokens > 0:
                stopping = await self._collect(batch, stopping)
            follow = await self._run_batch(batch)
            # Requests that arrived while the batch ran go before the next pieces of its jobs.
            stopping = self._drain(stopping)
            self._line.extend(follow)

    async def _collect(self, batch: list[Piece], stopping: bool) -> bool:
        """Add compatible pieces to ``batch`` (from the line first, then the queue, until the
        oldest job's wait is over or the budget is full); returns whether stop was asked."""
        first = batch[0]
        later: collections.deque[Piece] = collections.deque()
        while self._line:
            piece = self._line.popleft()
            if piece.job.key == first.job.key and self._fits(batch, piece):
                batch.append(piece)
            else:
                later.append(piece)
        self._line = later
        deadline = first.job.arrival + self.max_wait
        while not stopping:
            try:
                job = await self._next_job(deadline - time.monotonic())
            except (asyncio.TimeoutError, asyncio.QueueEmpty):
                break
            if job is None:
                stopping = True
                break
            piece = self._admit(job)
            if job.key == first.job.key and self._fits(batch, piece):
                batch.append(piece)
                continue
            self._line.append(piece)
            if job.key == first.job.key:  # the budget is full
                break
        return stopping

    async def _run_batch(self, batch: list[Piece]) -> list[Piece]:
        """Run one batch and deliver its results; returns the next piece of each of its jobs
        that has more."""
        batch = [p for p in batch if not p.job.future.done()]
        if not batch:
            return []
        sentences = [s for piece in batch for s in piece.sentences]
        first = batch[0].job
        try:
            results = await self.call(
                self.engine.translate,
                sentences,
                first.strategy,
                first.options,
                self.model_batch_tokens,
            )
        except Exception as err:  # noqa: BLE001 - delivered to the waiting requests
            self.stats.failed_batches += 1
            if len(batch) > 1:
                return [p for piece in batch for p in await self._run_batch([piece])]
            log.exception("a translation batch failed")
            first.pieces.clear()
            if not first.future.done():
                first.future.set_exception(err)
            return []
        self.stats.batches += 1
        self.stats.sentences += len(sentences)
        self.stats.largest_batch = max(self.stats.largest_batch, len(sentences))
        start = 0
        follow = []
        for piece in batch:
            job = piece.job
            for row, result in zip(
                piece.rows, results[start : start + len(piece.rows)], strict=True
            ):
                job.results[row] = result
            start += len(piece.rows)
            if job.pieces:
                follow.append(Piece(job, job.pieces.popleft()))
            elif not job.future.done():  # the client may have gone
                job.future.set_result(list(job.results))
        return follow
