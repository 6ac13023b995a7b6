"""Dynamic batching: one queue and one worker per model.

A request's inputs arrive as one job: a PreparedBatch (its sequences validated once, when the
request was tokenized, for one output). The worker takes a
*round* of jobs: the first one waiting, then whatever else is queued, waiting at most
max_wait for more while the round holds fewer than ROUND_BATCHES x max_batch_tokens tokens.
It waits only after a round of several jobs: a lone client has no one to wait for, and
would pay max_wait on every request.
The round's jobs of one output are joined (``PreparedBatch.concat``: no second check), their
sequences sorted by length and cut by ``runtime.batching.length_batches`` into model calls of at
most max_batch_tokens padded tokens (batch x its longest); each call is ``Runtime.run_prepared``
of its rows (``PreparedBatch.take``) on a worker thread, off the event loop. A job is answered
as soon as its last sequence is done, so the short requests of a round (run first) do not wait
for its long ones; results go back in the job's order.

No request starves: the queue is first come, first served, and only a round's own jobs are
sorted by length, so a long request behind a stream of short ones waits for the jobs queued
before it (at most max_concurrent_requests, a bounded number of rounds) and then for its own
round, never for shorts that came after it. A round ends only when it holds
ROUND_BATCHES x max_batch_tokens tokens or the queue is empty, so a job's wait in rounds
(rounds started between its queueing and its answer, its own included: ``Done.rounds``) is
at most ceil(tokens queued ahead of it / (ROUND_BATCHES x max_batch_tokens)) + 1.

A job whose client has gone (its future cancelled) is skipped, before its round and
between the calls of a round. A call that fails answers its jobs with a 424 and the worker
goes on with the next one.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..runtime.batching import PreparedBatch, length_batches
from .errors import backend, overloaded, unhealthy
from .metrics import Metrics

# a round holds up to this many model calls' worth of tokens: enough to sort a burst of
# concurrent requests by length, few enough that a request arriving after it starts waits little
ROUND_BATCHES = 4
_STOP = object()


@dataclass(eq=False)
class Job:
    batch: PreparedBatch  # one output
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)
    queued_round: int = 0  # Batcher.rounds when it was queued
    rounds: int = 0  # rounds started between its queueing and its answer
    answered_at: float = 0.0
    started_at: float | None = None
    inference_s: float = 0.0
    results: list = field(default_factory=list)
    remaining: int = 0
    tokens: int = 0

    def __post_init__(self):
        self.results = [None] * len(self.batch)
        self.remaining = len(self.results)
        self.tokens = int(self.batch.lengths.sum())


@dataclass
class Done:
    """What a job returns: one output per input, in order, and where its time went."""
    outputs: list
    queue_s: float
    inference_s: float
    rounds: int = 0  # rounds started between its queueing and its answer (its own included)
    # time.perf_counter() when it was queued, when its round started, when its last output came (tracing)
    queued_at: float = 0.0
    started_at: float = 0.0
    answered_at: float = 0.0


class Batcher:
    def __init__(self, model, metrics: Metrics, *, max_batch_tokens: int, max_wait_ms: float,
                 max_concurrent_requests: int):
        self.model = model
        self.metrics = metrics
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_ms / 1000
        self.max_concurrent_requests = max_concurrent_requests
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._pending = 0  # requests admitted and not yet answered
        self._last_round = 0  # jobs in the previous round: more than one means concurrent clients
        self._closing = False
        self.rounds = 0  # rounds started so far
        # Runtime is thread-safe; one thread per model keeps its calls from competing for the cores
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"ortformer-serve-{model.name}")

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"batcher-{self.model.name}")

    @property
    def healthy(self) -> bool:
        return self._task is not None and not self._task.done() and not self._closing

    async def stop(self) -> None:
        """Finish every job queued so far, then end the worker."""
        self._closing = True
        if self._task is not None and not self._task.done():
            self._queue.put_nowait(_STOP)
            await self._task
        self._executor.shutdown(wait=True)

    @contextlib.contextmanager
    def admit(self):
        """A request counted against max_concurrent_requests from admission (before its
        tokenization) until its answer: 429 when that many are admitted, 503 when the worker is
        down. Every caller of ``submit`` holds one."""
        if not self.healthy:
            raise unhealthy(self.model.name)
        if self._pending >= self.max_concurrent_requests:
            raise overloaded(self.model.name, self._pending, self.max_concurrent_requests)
        self._pending += 1
        try:
            yield
        finally:
            self._pending -= 1

    async def submit(self, batch: PreparedBatch) -> Done:
        """Queue a request's sequences, prepared for one output (admitted by ``admit``); that
        output of each, once every one has run. 503 when the worker is down."""
        if len(batch.outputs) != 1:
            raise ValueError(f"a queued batch computes one output, not {list(batch.outputs)}")
        if not self.healthy:
            raise unhealthy(self.model.name)
        job = Job(batch, asyncio.get_running_loop().create_future(), queued_round=self.rounds)
        try:
            self._queue.put_nowait(job)
            self.metrics.queue_size(self.model.name, self._queue.qsize())
            outputs = await job.future
            started = job.started_at or job.queued_at
            return Done(outputs, started - job.queued_at, job.inference_s, job.rounds, job.queued_at, started,
                        job.answered_at)
        finally:
            if not job.future.done():  # the caller was cancelled (its client left): drop the job
                job.future.cancel()

    async def _run(self) -> None:
        while True:
            jobs, stop = await self._next_round()
            try:
                await self._run_round(jobs)
            except Exception as exc:  # a bug here must not leave callers waiting forever
                error = backend(f"model {self.model.name!r} failed: {type(exc).__name__}: {exc}")
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(error)
            if stop:
                return

    async def _next_round(self) -> tuple[list[Job], bool]:
        """(jobs, stop): the first queued job, then more until the round is full or max_wait passes."""
        loop = asyncio.get_running_loop()
        first = await self._queue.get()
        if first is _STOP:
            return [], True
        jobs, tokens = [first], first.tokens
        deadline = loop.time() + (self.max_wait_s if self._last_round > 1 else 0.0)
        while tokens < ROUND_BATCHES * self.max_batch_tokens:
            try:
                job = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self._queue.get(), left)
                except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
                    break
            if job is _STOP:
                return jobs, True
            jobs.append(job)
            tokens += job.tokens
        self._last_round = len(jobs)
        self.rounds += 1
        self.metrics.queue_size(self.model.name, self._queue.qsize())
        return jobs, False

    async def _run_round(self, jobs: list[Job]) -> None:
        live = [job for job in jobs if not job.future.done()]  # a cancelled job's client has left
        for job in live:
            job.started_at = time.perf_counter()
        # one output per model call (concat joins parts of one output); pairs, late-interaction
        # masks and task ids travel per row, so such requests share calls with the others
        for outputs in dict.fromkeys(job.batch.outputs for job in live):
            await self._run_output([job for job in live if job.batch.outputs == outputs])

    async def _run_output(self, jobs: list[Job]) -> None:
        loop = asyncio.get_running_loop()
        owners = [(job, i) for job in jobs for i in range(len(job.results))]
        joined = PreparedBatch.concat([job.batch for job in jobs])  # rows in owners' order
        lengths = joined.lengths
        for batch in length_batches(lengths, len(owners), self.max_batch_tokens):
            batch = [int(i) for i in batch if not owners[i][0].future.done()]  # skip the clients that left
            if not batch:
                continue
            self.metrics.batch(self.model.name, len(batch), int(lengths[batch].sum()))
            start = time.perf_counter()
            try:
                out = await loop.run_in_executor(self._executor, self._call, joined.take(batch))
            except Exception as exc:  # onnxruntime's errors share no base class
                error = backend(f"model {self.model.name!r} failed: {exc}")
                for job in {owners[i][0] for i in batch}:
                    if not job.future.done():
                        job.future.set_exception(error)
                continue
            seconds = time.perf_counter() - start
            for job in {owners[i][0] for i in batch}:
                job.inference_s += seconds
            for row, i in enumerate(batch):
                job, position = owners[i]
                if job.future.done():
                    continue
                job.results[position] = out[row]
                job.remaining -= 1
                if job.remaining == 0:
                    job.rounds = self.rounds - job.queued_round
                    job.answered_at = time.perf_counter()
                    job.future.set_result(job.results)

    def _call(self, part: PreparedBatch):
        """One model call: rows of a round that length_batches cut to fit max_batch_tokens, each
        validated when its request arrived, run as cut; its one output, a row per sequence."""
        return self.model.runtime.run_prepared(part)[part.outputs[0]]
