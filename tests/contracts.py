"""Contract-faithful fakes for services that cannot run here (no Grafana server is installable).

:class:`GrafanaFake` serves :class:`sim.grafana_standin.GrafanaAnnotations` (the legacy annotations API from
Grafana's docs and ``pkg/api/annotations.go``: bearer token, typed DTO binding, epoch milliseconds, PATCH of the
given fields only) to every ``requests`` call, through ``responses``. The demo's HTTP stand-in serves the same
class, so the contract exists once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager

import responses

from sim.grafana_standin import GrafanaAnnotations


class GrafanaFake(GrafanaAnnotations):
    """The annotations of one Grafana organisation, answering ``responses`` callbacks."""

    def callback(self, request) -> tuple[int, dict[str, str], str]:
        status, body = self.handle(request.method, request.path_url, request.headers, request.body)
        return status, {"Content-Type": "application/json"}, json.dumps(body)


@contextmanager
def grafana_contract(url: str, token: str) -> Iterator[GrafanaFake]:
    """Serve the fake at ``url`` for every ``requests`` call made inside the block."""
    fake = GrafanaFake(token)
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        for method in (responses.GET, responses.POST, responses.PATCH):
            mock.add_callback(method, re.compile(rf"{re.escape(url)}/api/.*"), callback=fake.callback)
        yield fake
