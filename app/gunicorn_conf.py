"""Gunicorn settings and hooks, shared by ``nightshift serve`` and
``gunicorn -c python:app.gunicorn_conf 'app:create_app()'``.

- ``worker_class``: :class:`app.serving.BufferingWorker`, gthread that reads each request in full before a thread
  serves it, so slow clients cannot hold the threads the webhook needs.

- ``post_worker_init`` starts the in-process worker thread (when ``embedded_worker`` is on) in every gunicorn worker:
  claims in the store keep them from stepping on each other.
- ``child_exit`` tells prometheus_client's multiprocess mode that a worker's files are dead.
"""

from __future__ import annotations

from typing import Any

worker_class = "app.serving.BufferingWorker"
logger_class = "app.logging_setup.GunicornLogger"  # gunicorn's own logs follow log_format


def post_worker_init(worker: Any) -> None:
    from app.logging_setup import configure_logging
    from app.worker import start_worker_thread

    services = worker.wsgi.extensions["nightshift"]
    # Under `gunicorn -c` nothing else configures this process's logging (`nightshift serve` already did).
    configure_logging(services.settings.log_format, services.settings.log_level)
    worker.log.setup(worker.cfg)
    if services.settings.embedded_worker:
        worker.nightshift_worker = start_worker_thread(services.engine, services.settings.worker.poll_seconds)


def worker_exit(server: Any, worker: Any) -> None:
    started = getattr(worker, "nightshift_worker", None)
    if started:
        thread, stop = started
        stop.set()
        worker.wsgi.extensions["nightshift"].engine.wakeup.set()  # cut its idle wait short
        thread.join(timeout=30)


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
