"""Hypothesis strategies for hostile Alertmanager payloads, shared by the payload and engine fuzz tests."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.fakes import START
from tests.payloads import alert, xid

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
# Long strings built cheaply: a short seed repeated up to a few thousand times.
long_strings = st.builds(lambda seed, n: seed * n, st.text(min_size=1, max_size=3), st.integers(0, 3000))
label_names = st.sampled_from(["alertname", "gpu", "Hostname", "xid", "bad-name", "", "_x", "1a"])
plausible = (
    json_values
    | long_strings
    | st.sampled_from(["firing", "resolved", "4", "2026-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "0" * 16])
    | st.dictionaries(label_names, st.text(max_size=10) | json_scalars, max_size=5)
)
alerts = st.lists(
    st.dictionaries(
        st.sampled_from(
            ["status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint", "extra"]
        ),
        plausible,
    ),
    max_size=4,
)
payloads = st.fixed_dictionaries(
    {"version": st.sampled_from(["4", "3", 4]) | plausible, "alerts": alerts | plausible},
    optional={
        key: plausible
        for key in (
            "receiver",
            "status",
            "groupLabels",
            "commonLabels",
            "commonAnnotations",
            "externalURL",
            "groupKey",
            "truncatedAlerts",
        )
    },
)


# Alerts an engine test delivers: a few nodes and jobs (hostile target values among them), three Xids (a node fault,
# a job's, one no playbook acts on), three start times, and resolutions among them.
NODES = ("node1", "node2", "node3", "node 1;reboot", "../etc")
JOBS = ("1234", "77", "$(id)")


@st.composite
def alert_docs(draw: st.DrawFn) -> dict[str, Any]:
    labels = xid(
        node=draw(st.sampled_from(NODES)),
        job=draw(st.sampled_from(JOBS)),
        gpu=draw(st.sampled_from(("3", "5"))),
        code=draw(st.sampled_from(("79", "48", "13"))),
    )
    starts = START.replace(minute=draw(st.sampled_from((0, 1, 2))))
    return alert(labels, status=draw(st.sampled_from(("firing", "firing", "resolved"))), starts_at=starts)
