"""Hand-written fakes at our own seams (clock, actions, Prometheus) for unit tests of the engine."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from app.actions.base import Action, ActionContext, Plan
from app.errors import Unavailable
from app.outcome import Ok, Outcome
from app.params import NODE_NAME, SAFE_TEXT, SLURM_JOB_ID, Param

START = datetime(2026, 12, 2, 3, 0, 0, tzinfo=UTC)


class FakeClock:
    """A clock that moves only when told to; ``sleep`` advances it."""

    def __init__(self, start: datetime = START):
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float = 0, **delta: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds, **delta)

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)


@dataclass
class Script:
    """What a fake action returns, call by call (the last one repeats)."""

    outcomes: list[Outcome] = field(default_factory=lambda: [Ok(output="done")])
    calls: list[dict[str, Any]] = field(default_factory=list)

    def next(self, params: Mapping[str, Any]) -> Outcome:
        self.calls.append(dict(params))
        return self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]


class FakeAction(Action):
    """A configurable action whose runs are recorded in ``script.calls``."""

    def __init__(
        self,
        name: str,
        *,
        read_only: bool = False,
        return_to_service: bool = False,
        params: Mapping[str, Param] | None = None,
        script: Script | None = None,
    ):
        self.name = name  # type: ignore[misc]
        self.read_only = read_only  # type: ignore[misc]
        self.return_to_service = return_to_service  # type: ignore[misc]
        self.params = params or {"node": Param(pattern=NODE_NAME, required=False)}  # type: ignore[misc]
        self.script = script or Script()

    def plan(self, params: Mapping[str, Any]) -> Plan:
        return Plan(
            summary=f"{self.name} {dict(params)}",
            command=f"{self.name} " + " ".join(f"{k}={v}" for k, v in sorted(params.items())),
        )

    def run(self, params: Mapping[str, Any], ctx: ActionContext) -> Outcome:
        return self.script.next(params)


def fake_actions() -> dict[str, FakeAction]:
    """The actions the engine tests' playbooks use, with Slurm-like parameter schemas."""
    node = Param(pattern=NODE_NAME)
    return {
        "fake.drain": FakeAction(
            "fake.drain", params={"node": node, "reason": Param(pattern=SAFE_TEXT, required=False)}
        ),
        "fake.requeue": FakeAction("fake.requeue", params={"job": Param(pattern=SLURM_JOB_ID)}),
        "fake.resume": FakeAction("fake.resume", return_to_service=True, params={"node": node}),
        "fake.logs": FakeAction(
            "fake.logs",
            read_only=True,
            params={"job": Param(pattern=SLURM_JOB_ID)},
            script=Script(
                [
                    Ok(
                        output="log",
                        data={"log": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."},
                    )
                ]
            ),
        ),
        "fake.notice": FakeAction("fake.notice", read_only=True, params={"text": Param(max_length=4000)}),
    }


@dataclass
class FakeSample:
    labels: dict[str, str]
    value: float
    timestamp: float = 0.0


class FakePrometheus:
    """Answers queries from a dict expr → list of samples; records every query; can be made unreachable."""

    name: ClassVar[str] = "prometheus"

    def __init__(self) -> None:
        self.answers: dict[str, list[FakeSample]] = {}
        self.default: list[FakeSample] = []
        self.down = False
        self.queries: list[str] = []

    def query(self, expr: str, at: datetime | None = None) -> list[FakeSample]:
        self.queries.append(expr)
        if self.down:
            raise Unavailable("prometheus: connection refused")
        return list(self.answers.get(expr, self.default))

    def ready(self) -> bool:
        return not self.down
