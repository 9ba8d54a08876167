"""The engine's side of fleet incidents (app/fleet.py decides): hold a job's recovery while a shared cause lasts.

Called by the lifecycle before a job incident plans its recovery. The shared cause is one record (a control row
``fleet:<key>``: its incidents, when it opened, whether it cleared), told once (one notice, asking a person). Each
held incident is looked at again every ``fleet.recheck_seconds``: once its own alerts have all resolved the cause
is marked cleared, and every held job goes on to its recovery after its jitter (:func:`app.fleet.release_delay`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import Connection

from app import fleet
from app.engine import transitions
from app.engine.deps import EngineDeps
from app.errors import ConfigError
from app.paging import Notice
from app.states import IncidentKind, IncidentOutcome, LedgerKind, NoticeKind
from app.store import records
from app.topology import EMPTY, Topology, TopologyError, loggers, parse_slurm, peer_nodes, with_addresses

HOLD_PREFIX = "held by fleet incident"
MAX_OPEN_COMPARED = 5000  # open job incidents compared for a shared cause (the newest)
MAX_ADDRESSED_NODES = 100_000  # nodes in fleet.addresses_file
RESTARTS, STORM_NOTIFIED = "fleet_restarts", "fleet_storm_notified_at"
DIAGNOSIS_WAIT = timedelta(
    seconds=5
)  # a job that may share its cause waits this long for the others' diagnoses

Notify = Callable[[int, Notice], Any]


def _failure(row: records.Row) -> fleet.JobFailure:
    diagnosis = row.get("diagnosis") or {}
    category = diagnosis.get("category") or (row.get("labels") or {}).get("error_class")
    culprits = frozenset(c["node"] for c in row.get("culprits") or () if c.get("confirmed") is not False)
    return fleet.JobFailure(
        row["id"], row.get("job") or "", row["opened_at"], category, culprits, diagnosed=bool(diagnosis)
    )


class FleetHolds:
    def __init__(self, deps: EngineDeps, notify: Notify):
        self.deps = deps
        self.notify = notify
        self.topology = load_topology(deps.settings.fleet)

    def lost_peers(self, log: str) -> tuple[list[str], set[str]]:
        """The nodes of the peers the job's log says its ranks lost (never the node that wrote the line), and the
        nodes that wrote such lines (reporters, not culprits for what they report)."""
        if not self.topology.addresses:
            return [], set()
        return peer_nodes(log, self.topology), loggers(log)

    def widen(self, inc: records.Row, culprits: Iterable[str]) -> tuple[tuple[str, ...], str] | None:
        """The nodes to exclude instead of ``culprits`` when they, or the culprits of the other jobs failing in
        the window, are all behind one leaf, rack or block: the domain's nodes, and why. Told once a domain."""
        if not self.topology.domains:
            return None
        with self.deps.store.read() as conn:
            others = [
                _failure(r)
                for r in records.list_incidents(conn, open_only=True, limit=MAX_OPEN_COMPARED)
                if r["kind"] == IncidentKind.JOB and r["id"] != inc["id"]
            ]
        me = fleet.JobFailure(inc["id"], inc.get("job") or "", inc["opened_at"], None, frozenset(culprits))
        cause = fleet.shared_cause(
            me, others, self.topology, self.deps.settings.fleet, self.deps.settings.episodes.max_culprits
        )
        if cause is None or cause.kind == "storage":
            return None
        domain = self.topology.domains[tuple(cause.key.split(":", 1))]  # type: ignore[index]
        if len(domain.nodes) > self.deps.settings.fleet.max_domain_nodes:
            return None  # never a fleet-wide exclusion: the culprits' own limits apply (and a person)
        key = f"fleet:{cause.key}"
        with self.deps.store.read() as conn:
            record = records.get_control(conn, key)
        window = timedelta(seconds=self.deps.settings.fleet.window_seconds)
        if record is None or datetime.fromisoformat(record["opened_at"]) < inc["opened_at"] - window:
            record = {
                "summary": cause.summary,
                "opened_at": self.deps.clock.now().isoformat(),
                "incidents": [],
            }
            self._open(inc, key, record, cause, held=False)
        return tuple(
            sorted(domain.nodes)
        ), f"{cause.summary}: excluding {domain.label}'s {len(domain.nodes)} nodes"

    def hold(self, inc: records.Row) -> datetime | None:
        """When to look at ``inc`` again if its recovery is held by a shared cause; None: go on with it."""
        deps, settings = self.deps, self.deps.settings.fleet
        failure = _failure(inc)
        if inc["kind"] != IncidentKind.JOB or failure.category not in fleet.SHARED_CATEGORIES:
            return None  # a domain's jobs are recovered off it (exclusion: widen), not held
        now = deps.clock.now()
        key = f"fleet:{failure.category}"
        with deps.store.read() as conn:
            record = records.get_control(conn, key)
            resolved = _all_resolved(records.get_alerts_for_incident(conn, inc["id"]))
        window = timedelta(seconds=settings.window_seconds)
        if record and record.get("cleared_at"):
            cleared = datetime.fromisoformat(record["cleared_at"])
            if inc["opened_at"] > cleared + window:
                record = None  # a new outage of the same kind: a new record
            else:
                due = cleared + fleet.release_delay(inc["id"], settings.release_jitter_seconds)
                return None if now >= due else due
        if record is None or inc["id"] not in record["incidents"]:
            with deps.store.read() as conn:
                others = [
                    _failure(r)
                    for r in records.list_incidents(conn, open_only=True, limit=MAX_OPEN_COMPARED)
                    if r["kind"] == IncidentKind.JOB and r["id"] != inc["id"]
                ]
            cause = fleet.shared_cause(failure, others, self.topology, settings)
            if cause is None:
                # The other jobs of the window may not be diagnosed yet: wait for them, inside the window only.
                if now >= inc["opened_at"] + window or not fleet.may_share(failure, others, settings):
                    return None
                reason = (
                    f"{failure.category}: waiting for the diagnoses of the other jobs failing in the window"
                )
                with deps.store.transaction() as conn:
                    if inc["reason"] != reason:
                        transitions.wait(conn, now, inc, reason, kind=LedgerKind.FLEET_WAIT)
                return now + DIAGNOSIS_WAIT
            if record is None:
                record = {
                    "summary": cause.summary,
                    "opened_at": now.isoformat(),
                    "incidents": [],
                    "cleared_at": None,
                }
                self._open(inc, key, record, cause)
        if resolved:
            self._clear(inc, key, record, now, f"the alerts of incident #{inc['id']} resolved")
            return now + fleet.release_delay(inc["id"], settings.release_jitter_seconds)
        if inc["id"] not in record["incidents"]:
            self._join(inc, key, record, now)
        return now + timedelta(seconds=settings.recheck_seconds)

    def hold_node(self, inc: records.Row) -> datetime | None:
        """A node incident among many at once behind one leaf or rack: the domain is the suspect, told once; the
        node waits (its alert resolving when the domain is back closes it), never repaired or paged one by one.
        None: the node's own fault, repaired as usual."""
        settings = self.deps.settings.fleet
        if not self.topology.domains or inc["kind"] != IncidentKind.NODE or not inc["node"]:
            return None
        now = self.deps.clock.now()
        window = timedelta(seconds=settings.window_seconds)
        with self.deps.store.read() as conn:
            failing = [
                r["node"]
                for r in records.list_incidents(conn, open_only=True, limit=MAX_OPEN_COMPARED)
                if r["kind"] == IncidentKind.NODE
                and r["node"]
                and abs(r["opened_at"] - inc["opened_at"]) <= window
            ]
        domain = fleet.node_domain(
            inc["node"],
            failing,
            self.topology,
            self.deps.settings.episodes.max_culprits,
            settings.max_domain_nodes,
        )
        if domain is None:
            return None
        key = f"fleet:{domain.kind}:{domain.name}"
        down = len({inc["node"], *failing} & domain.nodes)
        summary = f"{down} nodes behind {domain.label} failed within {settings.window_seconds}s"
        with self.deps.store.read() as conn:
            record = records.get_control(conn, key)
        if record is None or datetime.fromisoformat(record["opened_at"]) < inc["opened_at"] - window:
            record = {"summary": summary, "opened_at": now.isoformat(), "incidents": []}
            cause = fleet.SharedCause(f"{domain.kind}:{domain.name}", domain.kind, summary, (inc["id"],))
            self._open(inc, key, record, cause, held=False)
        reason = f"{HOLD_PREFIX} {domain.kind}:{domain.name}: {summary}; the node waits for it"
        if inc["reason"] != reason:
            with self.deps.store.transaction() as conn:
                transitions.wait(conn, now, inc, reason, kind=LedgerKind.FLEET_HOLD)
        return now + timedelta(seconds=settings.recheck_seconds)

    def storm_wait(self, inc: records.Row) -> datetime | None:
        """The fleet's storm guard: when ``fleet.storm_max_restarts`` jobs were restarted within the storm window,
        when this job's restart may go ahead (it waits, told once a window); None: now. Jobs released by a cleared
        fleet incident are not counted against it (their cause is known and over)."""
        settings = self.deps.settings.fleet
        if inc["kind"] != IncidentKind.JOB or settings.storm_max_restarts == 0 or is_held(inc):
            return None
        now = self.deps.clock.now()
        with self.deps.store.read() as conn:
            restarts = [datetime.fromisoformat(t) for t in records.get_control(conn, RESTARTS) or []]
        if not fleet.storm_tripped(restarts, now, settings):
            return None
        window = timedelta(seconds=settings.storm_window_seconds)
        until = min(t for t in restarts if t > now - window) + window
        reason = (
            f"fleet storm guard: {settings.storm_max_restarts} job restarts within {settings.storm_window_seconds}s; "
            f"job {inc['job']} waits until {until:%H:%M:%S}"
        )
        with self.deps.store.transaction() as conn:
            notified = records.get_control(conn, STORM_NOTIFIED)
            tell = not notified or datetime.fromisoformat(notified) <= now - window
            if tell:
                records.set_control(conn, STORM_NOTIFIED, now.isoformat(), now)
            transitions.wait(conn, now, inc, reason, held_by_guard=True, kind=LedgerKind.FLEET_STORM)
        if tell:
            self.notify(
                inc["id"],
                Notice(
                    NoticeKind.FLEET_STORM,
                    "[nightshift] fleet storm guard: job restarts paused",
                    f"{reason}. Many jobs failing at once usually share a cause Nightshift could not name; "
                    "a person should look.",
                    {"incident": inc["id"], "guard": "fleet_storm", "outcome": IncidentOutcome.NEEDS_HUMAN},
                ),
            )
        return until

    def count_restart(self, conn: Connection, now: datetime) -> None:
        """Count a job restart for the storm guard (in the caller's transaction); the newest few are kept."""
        keep = max(1, self.deps.settings.fleet.storm_max_restarts)
        restarts = [*(records.get_control(conn, RESTARTS) or []), now.isoformat()][-keep:]
        records.set_control(conn, RESTARTS, restarts, now)

    def release(self, cause: str, by: str) -> dict[str, Any]:
        """A person says the shared cause ``cause`` (e.g. ``storage_io``) is over: its held jobs are released."""
        key = f"fleet:{cause}"
        now = self.deps.clock.now()
        with self.deps.store.read() as conn:
            record = records.get_control(conn, key)
        if record is None:
            raise LookupError(f"no fleet incident {cause}")
        if record.get("cleared_at"):
            raise ValueError(f"fleet incident {cause} already cleared at {record['cleared_at']}")
        self._clear(None, key, record, now, f"released by {by}")
        with self.deps.store.transaction() as conn:
            transitions.fleet_released_by_person(conn, now, record["incidents"])
        return record

    def _open(
        self, inc: records.Row, key: str, record: dict[str, Any], cause: fleet.SharedCause, held: bool = True
    ) -> None:
        now = self.deps.clock.now()
        with self.deps.store.transaction() as conn:
            transitions.fleet_opened(conn, now, inc, key, record, cause.summary)
        jitter = self.deps.settings.fleet.release_jitter_seconds
        then = (
            "Every job failing with it is held, not requeued into the outage, until its alerts resolve (or a "
            f"person closes the job incidents); then they restart together, spread over {jitter}s."
            if held
            else "The jobs behind it are requeued off it; the domain itself needs a person (switch, rack power)."
        )
        self.notify(
            inc["id"],
            Notice(
                NoticeKind.FLEET_INCIDENT,
                f"[nightshift] fleet incident {cause.key}" + (": job recoveries held" if held else ""),
                f"{cause.summary}.\n{then} First incident #{inc['id']}.",
                {"incident": inc["id"], "fleet": cause.key, "outcome": IncidentOutcome.NEEDS_HUMAN},
            ),
        )

    def _join(self, inc: records.Row, key: str, record: dict[str, Any], now: datetime) -> None:
        record["incidents"] = sorted({*record["incidents"], inc["id"]})
        reason = f"{HOLD_PREFIX} {key.removeprefix('fleet:')}: {record['summary']}"
        with self.deps.store.transaction() as conn:
            records.set_control(conn, key, record, now)
            transitions.wait(conn, now, inc, reason, kind=LedgerKind.FLEET_HOLD)

    def _clear(
        self, inc: records.Row | None, key: str, record: dict[str, Any], now: datetime, why: str
    ) -> None:
        record["cleared_at"] = now.isoformat()
        jitter = self.deps.settings.fleet.release_jitter_seconds
        with self.deps.store.transaction() as conn:
            message = f"{key}: {why}: {len(record['incidents'])} held job(s) released, spread over {jitter}s"
            transitions.fleet_cleared(conn, now, inc, key, record, message)


def is_held(incident: records.Row) -> bool:
    """Whether a job incident waits on a shared cause (its recovery held, not to be closed when its alerts resolve)."""
    return (
        incident["kind"] == IncidentKind.JOB
        and incident["open_key"] is not None
        and (incident.get("reason") or "").startswith(HOLD_PREFIX)
    )


def _all_resolved(alerts: list[records.Row]) -> bool:
    return bool(alerts) and all(a["status"] == "resolved" for a in alerts)


def load_topology(settings: fleet.FleetSettings) -> Topology:
    """The topology the settings name (``fleet.topology_file``, ``fleet.addresses_file``), or none. A file that
    cannot be read or is malformed is a :class:`ConfigError` at start, with the file and line."""
    topology = EMPTY
    if settings.topology_file:
        try:
            text = Path(settings.topology_file).read_text()
        except OSError as exc:
            raise ConfigError(f"fleet.topology_file: {settings.topology_file}: {exc.strerror}") from None
        try:
            topology = parse_slurm(text, settings.topology_file, max_switch_nodes=settings.max_domain_nodes)
        except TopologyError as exc:
            raise ConfigError(f"fleet.topology_file: {exc}") from None
    if settings.addresses_file:
        topology = with_addresses(topology, _addresses(settings.addresses_file))
    return topology


def _addresses(path: str) -> dict[str, str]:
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"fleet.addresses_file: {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"fleet.addresses_file: {path}: invalid YAML: {exc}") from None
    if not isinstance(loaded, dict) or len(loaded) > MAX_ADDRESSED_NODES:
        raise ConfigError(f"fleet.addresses_file: {path}: a mapping of at most {MAX_ADDRESSED_NODES} nodes")
    addresses: dict[str, str] = {}
    for node, values in loaded.items():
        listed = values if isinstance(values, list) else [values]
        if not isinstance(node, str) or not all(isinstance(v, str) for v in listed) or len(listed) > 16:
            raise ConfigError(f"fleet.addresses_file: {path}: {node!r}: a node name and up to 16 addresses")
        for value in listed:
            if value in addresses and addresses[value] != node:
                raise ConfigError(
                    f"fleet.addresses_file: {path}: {value} is both {addresses[value]} and {node}"
                )
            addresses[value] = node
    return addresses
