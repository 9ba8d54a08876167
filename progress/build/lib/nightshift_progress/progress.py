"""The training metric contract as an API: :class:`Progress` owns the metrics of one training process in a
registry of its own and serves them on ``/metrics``.

Metrics (names, types and labels are Nightshift's contract; its rules and playbooks read them):
``training_step_total``, ``training_samples_total``, ``training_loss``, ``training_checkpoint_in_progress``,
``training_eval_in_progress``, ``training_last_checkpoint_timestamp_seconds``,
``training_errors_total{error_class}`` and ``training_checkpoint_requested``, each with the labels of
:mod:`nightshift_progress.identity`, and ``training_rank_step_seconds{rank}`` (:mod:`nightshift_progress.timing`).
Every error class starts at 0, so the first error is an increase Prometheus can see. A checkpoint request from
Nightshift is answered as :mod:`nightshift_progress.checkpoint_request` says.

Serving: only the process :meth:`Identity.serves` picks opens the port (one endpoint per node by default);
the others record into their registry and serve nothing. :meth:`Progress.close` keeps serving until ``linger``
seconds have passed since the last change, so an error counted just before the process exits is scraped by
every Prometheus (an HA pair scrapes independently: ending at the first scrape would starve the other), and until
a scrape has collected after the last change (``scrape_wait`` at most): a rank that fails within seconds of its
start is otherwise gone before Prometheus has discovered it. Choose ``linger`` of at least two scrape intervals.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from nightshift_progress.checkpoint_request import CheckpointRequest, request_file_from_env, signal_from_env
from nightshift_progress.classify import ERROR_CLASSES, Classifier, packaged_classifier
from nightshift_progress.identity import LABELS, Identity, identity_from_env
from nightshift_progress.timing import RankTiming, exchange_dir

log = logging.getLogger("nightshift_progress")

DEFAULT_PORT = 9464
# Two scrapes at Prometheus's default 15 s interval.
DEFAULT_LINGER_SECONDS = 30.0
# How long a process whose last change no scrape has collected yet keeps serving at most: a rank that fails within
# seconds of its (re)start is not discovered yet (Nightshift's service discovery, refreshed every 15 s in
# docs/slurm.md, Prometheus's 5 s throttle of discovery updates, then a 15 s scrape interval: 35 s at worst).
DEFAULT_SCRAPE_WAIT_SECONDS = 60.0
# close() looks again this often whether a scrape came.
_CLOSE_POLL_SECONDS = 0.25


class _Scrapes(Collector):
    """A collector that yields nothing and notes the monotonic time of the last scrape (every scrape collects
    every collector of the registry)."""

    def __init__(self, monotonic: Callable[[], float]):
        self._monotonic = monotonic
        self.last = -math.inf

    def collect(self) -> Iterator[Metric]:
        self.last = self._monotonic()
        return iter(())

    def describe(self) -> list[Metric]:
        return []


class _WithoutCreated(Collector):
    """A registry's families without their ``*_created`` samples (when each counter was created): they add
    nothing to the contract and double the series a scrape stores."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


def served(registry: CollectorRegistry) -> CollectorRegistry:
    """What ``/metrics`` serves of ``registry``: its families, no ``*_created`` series. Only this library's
    endpoint changes; the process's other metrics keep prometheus_client's defaults."""
    view = CollectorRegistry(auto_describe=False)
    view.register(_WithoutCreated(registry))
    return view


class Progress:
    """The metrics of one training process. Build with :func:`start` (serves) or directly (``serve()`` later).

    ``registry`` defaults to a fresh one; ``classifier`` to the packaged signatures; ``error_classes`` to the
    contract's (a site may export more; each starts at 0); ``exchange`` is the node-local directory of the rank
    timing and the checkpoint request file (default: :func:`~nightshift_progress.timing.exchange_dir` from the
    environment); ``request_file`` overrides the latter; ``clock``, ``monotonic`` and ``sleep`` are for tests.
    """

    def __init__(
        self,
        identity: Identity,
        *,
        registry: CollectorRegistry | None = None,
        classifier: Classifier | None = None,
        error_classes: Sequence[str] = ERROR_CLASSES,
        exchange: Path | None = None,
        request_file: Path | None = None,
        clock: Any = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.identity = identity
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.classifier = classifier or packaged_classifier()
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._last_change = -math.inf  # monotonic() of the last change
        self._scrapes = _Scrapes(monotonic)
        self.registry.register(self._scrapes)
        self._server: Any = None
        labels = identity.labels()

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=self.registry).labels(**labels)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=self.registry).labels(**labels)

        self._steps = counter("training_step", "Optimizer steps completed (the global step).")
        self._samples = counter("training_samples", "Training samples consumed.")
        self._loss = gauge("training_loss", "Training loss of the last step.")
        self._checkpointing = gauge(
            "training_checkpoint_in_progress", "1 while a checkpoint is being written."
        )
        self._evaluating = gauge("training_eval_in_progress", "1 while an evaluation runs.")
        self._last_checkpoint = gauge(
            "training_last_checkpoint_timestamp_seconds", "Unix time of the newest checkpoint (0: none yet)."
        )
        errors = Counter(
            "training_errors",
            "Errors logged by the job, by class.",
            (*LABELS, "error_class"),
            registry=self.registry,
        )
        self._errors = {cls: errors.labels(**labels, error_class=cls) for cls in error_classes}
        self._step_total = 0  # what training_step_total says, for sync_step
        exchange = exchange if exchange is not None else exchange_dir(identity, os.environ)
        self.rank_timing = RankTiming(identity, exchange, clock=clock)
        self.registry.register(self.rank_timing)
        self.checkpoint_request = CheckpointRequest(
            request_file or request_file_from_env(os.environ, exchange), clock=clock
        )
        gauge(
            "training_checkpoint_requested",
            "1 while a checkpoint asked for by Nightshift is not yet written.",
        ).set_function(lambda: 1.0 if self.checkpoint_request.requested() else 0.0)

    # -- the contract -------------------------------------------------------------------------------------------
    def step(self, steps: int = 1, samples: int = 0) -> None:
        """``steps`` optimizer steps done (and ``samples`` consumed by them)."""
        self._steps.inc(steps)
        self._step_total += steps
        if samples:
            self._samples.inc(samples)
        self._changed()

    def sync_step(self, global_step: int, samples_per_step: int = 0) -> None:
        """Advance the step counter to a framework's ``global_step`` (a resumed run jumps to it once); an
        older value (a restarted count) changes nothing."""
        done = global_step - self._step_total
        if done > 0:
            self.step(done, done * samples_per_step)

    def step_time(self, seconds: float) -> None:
        """One step of this rank took ``seconds`` of its own work (before waiting for the other ranks)."""
        self.rank_timing.record(seconds)

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """Around the work a rank does alone in a step (for DDP: forward and loss): its duration is the step's
        :meth:`step_time`, unless it raises."""
        started = time.perf_counter()
        yield
        self.step_time(time.perf_counter() - started)

    def checkpoint_requested(self) -> bool:
        """Whether Nightshift asked for a checkpoint that has not been written yet: poll it in the training loop
        and checkpoint when true (:mod:`nightshift_progress.checkpoint_request`)."""
        return self.checkpoint_request.requested()

    def samples(self, count: int) -> None:
        """``count`` more samples consumed."""
        self._samples.inc(count)
        self._changed()

    def resumed(self, step: int, samples: int = 0, checkpoint_time: float | None = None) -> None:
        """The job resumed from a checkpoint at global ``step``: the step counter starts there. A checkpoint request
        older than ``checkpoint_time`` was answered by that checkpoint."""
        self._steps.inc(step)
        self._step_total += step
        if samples:
            self._samples.inc(samples)
        if checkpoint_time is not None:
            self.checkpoint_loaded(checkpoint_time)
        self._changed()

    def checkpoint_loaded(self, checkpoint_time: float) -> None:
        """This run loaded a checkpoint written at ``checkpoint_time``: the newest checkpoint's time, and a
        checkpoint request older than it was answered by it (the framework callbacks call this on a resume)."""
        self._last_checkpoint.set(checkpoint_time)
        self.checkpoint_request.resumed_from(checkpoint_time)
        self._changed()

    def loss(self, value: float) -> None:
        """The loss of the last step."""
        self._loss.set(value)
        self._changed()

    @contextlib.contextmanager
    def checkpointing(self) -> Iterator[None]:
        """Around writing a checkpoint: in progress meanwhile; saved (:meth:`checkpoint_saved`) if no exception."""
        self._checkpointing.set(1)
        self._changed()
        try:
            yield
        finally:
            self._checkpointing.set(0)
            self._changed()
        self.checkpoint_saved()

    def checkpoint_saved(self, timestamp: float | None = None) -> None:
        """A checkpoint was written at ``timestamp`` (default: now); it answers a pending checkpoint request."""
        saved = self._clock() if timestamp is None else timestamp
        self._last_checkpoint.set(saved)
        self.checkpoint_request.saved(saved)
        self._changed()

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """Around an evaluation (a hang detector does not count it as a stall)."""
        self.evaluation(True)
        try:
            yield
        finally:
            self.evaluation(False)

    def evaluation(self, running: bool) -> None:
        """An evaluation started (True) or ended (False), for frameworks whose hooks are not one block."""
        self._evaluating.set(1 if running else 0)
        self._changed()

    def error(self, error_class: str) -> None:
        """Count one error of ``error_class`` (one of the classes exported; ValueError otherwise)."""
        if error_class not in self._errors:
            raise ValueError(f"unknown error class {error_class!r} (one of {', '.join(self._errors)})")
        self._errors[error_class].inc()
        self._changed()

    def error_line(self, text: str) -> str | None:
        """Classify one error event (a log line, or a message with its traceback) with the diagnosis
        signatures and count it once; its error class, or None when no class applies."""
        error_class = self.classifier.classify_event(text)
        if error_class is not None:
            self.error(error_class)
        return error_class

    def log_handler(self, level: int = logging.WARNING) -> logging.Handler:
        """A :class:`logging.Handler` counting the error lines of records at ``level`` or above."""
        return ErrorLineHandler(self, level)

    # -- serving ------------------------------------------------------------------------------------------------
    def serve(self, port: int, addr: str = "0.0.0.0", per_node: bool = True) -> bool:
        """Serve ``/metrics`` on ``addr:port`` if this process serves (see :meth:`Identity.serves`); whether it
        does. Raises OSError when the port is taken."""
        if not self.identity.serves(per_node):
            return False
        self._server, _ = start_http_server(port, addr=addr, registry=served(self.registry))
        self.rank_timing.publishing = (
            False  # its own figures are exported here, its siblings' read from files
        )
        for warning in self.identity.warnings:
            log.warning("nightshift_progress: %s", warning)
        return True

    @property
    def port(self) -> int | None:
        """The port served, None when this process does not serve."""
        return self._server.server_port if self._server is not None else None

    def close(
        self, linger: float = DEFAULT_LINGER_SECONDS, scrape_wait: float = DEFAULT_SCRAPE_WAIT_SECONDS
    ) -> None:
        """Stop serving once ``linger`` seconds have passed since the last change and a scrape has collected after
        it (at once if both hold). A change no scrape has seen yet (the error of a rank that fails within seconds
        of its start, before Prometheus has discovered it) keeps it serving until the first scrape, for at most
        ``scrape_wait`` seconds after the change."""
        self.rank_timing.close()
        if self._server is None:
            return
        while (left := self.serving_left(linger, scrape_wait)) > 0:
            self._sleep(min(left, _CLOSE_POLL_SECONDS))
        self._server.shutdown()
        self._server.server_close()
        self._server = None

    def serving_left(self, linger: float, scrape_wait: float) -> float:
        """Seconds :meth:`close` still serves for, as of now (it looks again as scrapes come)."""
        seen = self._scrapes.last >= self._last_change
        end = self._last_change + (linger if seen else max(linger, scrape_wait))
        return max(0.0, end - self._monotonic())

    def _changed(self) -> None:
        self._last_change = self._monotonic()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ErrorLineHandler(logging.Handler):
    """Counts log records that name an error class (message and traceback, once per record) into a
    :class:`Progress`."""

    def __init__(self, progress: Progress, level: int = logging.WARNING):
        super().__init__(level)
        self.progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            self.progress.error_line(text)
        except Exception:  # a logging handler must never raise into the training loop
            self.handleError(record)


def start(
    job: str | None = None,
    *,
    port: int | None = None,
    addr: str | None = None,
    per_node: bool = True,
    env: Mapping[str, str] | None = None,
    hostname: str | None = None,
) -> Progress:
    """A :class:`Progress` for this process, serving when it should.

    ``port`` defaults to ``NIGHTSHIFT_PROGRESS_PORT``, else :data:`DEFAULT_PORT`; ``addr`` to
    ``NIGHTSHIFT_PROGRESS_ADDR``, else all interfaces. A checkpoint request arrives as ``SIGUSR1``
    (``NIGHTSHIFT_CHECKPOINT_SIGNAL``) or the request file (:mod:`nightshift_progress.checkpoint_request`).
    On Slurm, submit with ``--comment=nightshift.progress_port=<port>`` so Nightshift's service discovery finds the
    endpoint.
    """
    env = os.environ if env is None else env
    identity = identity_from_env(env, job, hostname)
    exchange = exchange_dir(identity, env)
    progress = Progress(identity, exchange=exchange, request_file=request_file_from_env(env, exchange))
    progress.checkpoint_request.install_signal(signal_from_env(env))
    port = port if port is not None else int(env.get("NIGHTSHIFT_PROGRESS_PORT", DEFAULT_PORT))
    progress.serve(port, addr or env.get("NIGHTSHIFT_PROGRESS_ADDR", "0.0.0.0"), per_node)
    return progress
