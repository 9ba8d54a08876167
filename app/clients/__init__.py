"""Thin wrappers that own third-party libraries (requests, paramiko, kubernetes, smtplib).

They always pass timeouts and translate library errors into :mod:`app.domain.errors` once; nothing above this package
sees a third-party exception type. :class:`Clients` builds each wrapper lazily from settings; tests inject their own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.config import Settings

log = logging.getLogger(__name__)


class Clients:
    """Lazily built backend clients, shared by the actions of one app. Pass instances to override (tests)."""

    def __init__(self, settings: Settings, **overrides: Any):
        self._settings = settings
        self._instances: dict[str, Any] = dict(overrides)
        self._lock = threading.Lock()

    def _get(self, name: str, build: Callable[[Settings], Any]) -> Any:
        with self._lock:
            if name not in self._instances:
                self._instances[name] = build(self._settings)
            return self._instances[name]

    @property
    def prometheus(self) -> Any:
        from app.clients.prometheus import PrometheusClient

        return self._get("prometheus", PrometheusClient.from_settings)

    @property
    def grafana(self) -> Any:
        from app.clients.grafana import GrafanaClient

        return self._get("grafana", GrafanaClient.from_settings)

    @property
    def http(self) -> Any:
        from app.clients.http import HttpPoster

        return self._get("http", HttpPoster.from_settings)

    @property
    def pagerduty(self) -> Any:
        from app.clients.pagerduty import PagerDutyClient

        return self._get("pagerduty", PagerDutyClient.from_settings)

    @property
    def mail(self) -> Any:
        from app.clients.mail import Mailer

        return self._get("mail", Mailer.from_settings)

    @property
    def kube(self) -> Any:
        from app.clients.kube import KubeClient

        return self._get("kube", KubeClient.from_settings)

    @property
    def slurm(self) -> Any:
        from app.clients.slurm import SlurmClient

        return self._get("slurm", SlurmClient.from_settings)

    def node_runner(self, node: str) -> Any:
        """Commands on ``node`` itself over SSH (a repair's validation), one runner per node."""
        from app.clients.ssh import SshRunner

        return self._get(f"node:{node}", lambda settings: SshRunner.from_settings(settings, node))

    def warm_up(self) -> None:
        """Open the SSH connection to the Slurm host now, when one is configured, so that the first incident
        does not pay the handshake (a quarter of a second on loopback, more across a network). A failure is
        logged; the first command meets it again and reports it where it matters."""
        from app.domain.errors import BackendError, ConfigError

        if not self._settings.slurm.host:
            return
        try:
            self.slurm.runner.connect()
        except (BackendError, ConfigError) as exc:
            log.warning("slurm: could not open the SSH connection ahead of time: %s", exc)

    def close(self) -> None:
        """Release connections (SSH sessions, HTTP pools)."""
        with self._lock:
            for instance in self._instances.values():
                close = getattr(instance, "close", None)
                if callable(close):
                    close()
            self._instances.clear()
