"""Dynamic batching: concurrent translation requests decoded as one batch, answered separately.

A request becomes a :class:`Job` (its sentences, checked strategy and options, and the batch
cost of each sentence, :meth:`fadat.serve.engine.Engine.cost`). One asyncio task
(:meth:`Batcher.run`) takes the oldest waiting job and adds later jobs with the same strategy and
options while

- the batch's padded cost ``sentences × largest cost`` stays within ``max_batch_tokens`` (graph
  vertices for a DAT, source tokens for an AT: the model's ``batch_cost``), and
- at most ``max_wait_ms`` have passed since the oldest job arrived;

then one :meth:`~fadat.serve.engine.Engine.translate` call runs the batch and each job gets
its own slice of the results. Inside that call the translation core sorts the batch's sentences
by length and cuts them into model batches of at most ``model_batch_tokens`` padded positions
(:func:`fadat.translation.pipeline.make_batches`): on a CPU, one model batch of thousands of graph
vertices is slower than the same sentences one by one (the ``(B, L, V)`` token log-probabilities
leave the caches), while length-sorted model batches of ≈ 512 vertices are faster
(docs/results/journal.md, "fadat serve"). Jobs with other options
wait for a later batch, in arrival order. ``max_batch_tokens = 0`` turns batching off: every job
runs alone, as it arrives.

All model work — batches and the graph requests of :meth:`Batcher.call` — runs on one worker
thread, one piece at a time: torch's own intra-op threads (``--threads``) use the cores, and two
pieces of work in parallel would only compete for them.

If a batch of several jobs fails, each of its jobs is run again alone, so one job that trips an
error cannot fail the others with it.
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
    """One translation request waiting for its batch.

    Attributes:
        sentences: raw source text.
        strategy, options: checked by :meth:`fadat.serve.engine.Engine.check`.
        costs: batch cost of each sentence.
        future: receives the list of :class:`~fadat.serve.engine.Result`.
        arrival: ``time.monotonic()`` when the job was queued.
    """

    sentences: list[str]
    strategy: str
    options: dict[str, Any]
    costs: list[int]
    future: asyncio.Future
    arrival: float = field(default_factory=time.monotonic)

    @property
    def key(self) -> tuple:
        """Jobs with equal keys can share a batch."""
        return (self.strategy, tuple(sorted(self.options.items())))


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
        self._deferred: collections.deque[Job] = collections.deque()
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

    def _fits(self, batch: list[Job], job: Job) -> bool:
        sentences = sum(len(j.sentences) for j in batch) + len(job.sentences)
        width = max(max(j.costs, default=0) for j in [*batch, job])
        return sentences * width <= self.max_batch_tokens

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
            if self._deferred:
                first = self._deferred.popleft()
            elif stopping:
                return
            else:
                first = await self._next_job(None)
                if first is None:
                    stopping = True
                    continue
            batch = [first]
            if self.max_batch_tokens > 0:
                stopping = await self._collect(batch, stopping)
            await self._run_batch(batch)

    async def _collect(self, batch: list[Job], stopping: bool) -> bool:
        """Add compatible jobs to ``batch`` (deferred ones first, then the queue, until the
        oldest job's wait is over or the budget is full); returns whether stop was asked."""
        first = batch[0]
        later: collections.deque[Job] = collections.deque()
        while self._deferred:
            job = self._deferred.popleft()
            if job.key == first.key and self._fits(batch, job):
                batch.append(job)
            else:
                later.append(job)
        self._deferred = later
        deadline = first.arrival + self.max_wait
        while not stopping:
            try:
                job = await self._next_job(deadline - time.monotonic())
            except (asyncio.TimeoutError, asyncio.QueueEmpty):
                break
            if job is None:
                stopping = True
                break
            if job.key == first.key and self._fits(batch, job):
                batch.append(job)
                continue
            self._deferred.append(job)
            if job.key == first.key:  # the budget is full
                break
        return stopping

    async def _run_batch(self, batch: list[Job]) -> None:
        sentences = [s for job in batch for s in job.sentences]
        first = batch[0]
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
                for job in batch:
                    await self._run_batch([job])
                return
            log.exception("a translation batch failed")
            if not first.future.done():
                first.future.set_exception(err)
            return
        self.stats.batches += 1
        self.stats.sentences += len(sentences)
        self.stats.largest_batch = max(self.stats.largest_batch, len(sentences))
        start = 0
        for job in batch:
            part = results[start : start + len(job.sentences)]
            start += len(job.sentences)
            if not job.future.done():  # the client may have gone
                job.future.set_result(part)
