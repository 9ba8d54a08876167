"""Contract-faithful fakes for services that cannot run here (no Grafana server is installable).

:class:`GrafanaFake` reproduces the legacy annotations API from Grafana's docs and ``pkg/api/annotations.go``:
bearer service-account token (else 401), a JSON body bound to a typed DTO (a type mismatch is 400 "bad request
data"), ``time``/``timeEnd`` as integer epoch **milliseconds** (values below 10**12 are refused as the classic
seconds-for-milliseconds mistake), non-empty ``text``, tags a list of strings,
200 ``{"message": "Annotation added", "id": N}``; PATCH updates only the fields it is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import responses

# PostAnnotationsCmd / PatchAnnotationsCmd (pkg/api/dtos/annotations.go): field → accepted JSON types.
POST_FIELDS: dict[str, tuple[type, ...]] = {
    "dashboardId": (int,),
    "dashboardUID": (str,),
    "panelId": (int,),
    "time": (int,),
    "timeEnd": (int,),
    "text": (str,),
    "tags": (list,),
    "data": (dict,),
}
PATCH_FIELDS = {key: POST_FIELDS[key] for key in ("time", "timeEnd", "text", "tags", "data")}


class GrafanaFake:
    """The annotations endpoints of one Grafana organisation, with stored annotations to assert on."""

    def __init__(self, token: str):
        self.token = token
        self.annotations: dict[int, dict[str, Any]] = {}
        self.bodies: list[dict[str, Any]] = []

    @staticmethod
    def _reply(status: int, body: dict[str, Any]) -> tuple[int, dict[str, str], str]:
        return status, {"Content-Type": "application/json"}, json.dumps(body)

    def _bind(self, request, fields: dict[str, tuple[type, ...]]) -> dict[str, Any] | tuple:
        """Authenticate and decode the body like Grafana's ``web.Bind``; a tuple is the error reply."""
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._reply(401, {"message": "Unauthorized"})
        if not request.headers.get("Content-Type", "").startswith("application/json"):
            return self._reply(400, {"message": "bad request data"})
        try:
            body = json.loads(request.body)
        except (TypeError, ValueError):
            return self._reply(400, {"message": "bad request data"})
        if not isinstance(body, dict):
            return self._reply(400, {"message": "bad request data"})
        for key, value in body.items():
            types = fields.get(key)
            if types is None:
                continue  # encoding/json ignores unknown fields
            if isinstance(value, bool) or not isinstance(value, types):
                return self._reply(400, {"message": "bad request data", "field": key})
        if not all(isinstance(tag, str) for tag in body.get("tags") or []):
            return self._reply(400, {"message": "bad request data", "field": "tags"})
        for key in ("time", "timeEnd"):
            if body.get(key) and body[key] < 10**12:
                return self._reply(400, {"message": f"{key} {body[key]} is in seconds, not milliseconds"})
        self.bodies.append(body)
        return body

    def post(self, request):
        body = self._bind(request, POST_FIELDS)
        if isinstance(body, tuple):
            return body
        if not body.get("text"):
            return self._reply(400, {"message": "Failed to save annotation"})
        start, end = body.get("time", 0), body.get("timeEnd", 0)
        if not start and not end:
            return self._reply(400, {"message": "Failed to save annotation"})  # ErrTimerangeMissing
        start, end = start or end, end or start  # validateTimeRange
        annotation_id = len(self.annotations) + 1
        self.annotations[annotation_id] = {
            "time": min(start, end),
            "timeEnd": max(start, end),
            "text": body["text"],
            "tags": list(body.get("tags") or []),
            "dashboardUID": body.get("dashboardUID", ""),
        }
        return self._reply(200, {"message": "Annotation added", "id": annotation_id})

    def patch(self, request):
        body = self._bind(request, PATCH_FIELDS)
        if isinstance(body, tuple):
            return body
        annotation_id = int(request.path_url.rsplit("/", 1)[1])
        stored = self.annotations.get(annotation_id)
        if stored is None:
            return self._reply(404, {"message": "Annotation not found"})
        if body.get("tags") is not None:
            stored["tags"] = body["tags"]
        if body.get("text"):
            stored["text"] = body["text"]
        for key in ("time", "timeEnd"):
            if body.get(key, 0) > 0:
                stored[key] = body[key]
        return self._reply(200, {"message": "Annotation patched"})

    def health(self, request):
        return self._reply(200, {"commit": "8d3e4f1", "database": "ok", "version": "11.3.0"})


@contextmanager
def grafana_contract(url: str, token: str) -> Iterator[GrafanaFake]:
    """Serve the fake at ``url`` for every ``requests`` call made inside the block."""
    fake = GrafanaFake(token)
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add_callback(responses.POST, f"{url}/api/annotations", callback=fake.post)
        mock.add_callback(
            responses.PATCH, re.compile(rf"{re.escape(url)}/api/annotations/\d+"), callback=fake.patch
        )
        mock.add_callback(responses.GET, f"{url}/api/health", callback=fake.health)
        yield fake
