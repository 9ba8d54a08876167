"""The engine's side of fleet incidents (app/domain/fleet.py decides): hold a job's recovery while a shared cause lasts.

Called by the lifecycle before a job incident plans its recovery. The shared cause is one record (a control row
``fleet:<key>``, :class:`app.domain.fleet.FleetRecord`: its incidents, its sampled diagnosis, how its cause was checked,
whether it cleared), told once (one notice, asking a person). Its cause is checked once every
``fleet.recheck_seconds`` for the whole fleet incident (not once per held job): the cause's clear query where one
is set, else a probe job restarted alone; once it cleared (or a person released it, :meth:`FleetHolds.release`),
every held job goes on to its recovery after its jitter (:func:`app.domain.fleet.release_delay`). The held jobs' own
alerts resolving says nothing about the cause (a dead job stops erring) and clears nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from app.domain import fleet
from app.domain import incident_policy as policy
from app.domain.errors import BackendError, ConfigError
from app.domain.paging import Notice
from app.domain.states import IncidentKind, IncidentOutcome, LedgerKind, NoticeKind, State
from app.domain.topology import Topology, loggers, peer_nodes
from app.engine import transitions
from app.engine.deps import EngineDeps
from app.engine.fleet_topology import TopologySource
from app.store import records
from app.store.rows import Incident

HOLD_PREFIX = "held by fleet incident"
STORM_PREFIX = "fleet storm guard"
MAX_OPEN_COMPARED = 5000  # open job incidents compared for a shared cause (the newest)
RESTARTS, STORM_NOTIFIED = "fleet_restarts", "fleet_storm_notified_at"
PREFIX = "fleet:"
HISTORY_PREFIX = "fleet-history:"  # + "<key>#<number>": the earlier fleet incidents of a cause
MAX_HISTORY = 20  # earlier fleet incidents kept a cause, beside its current one (the oldest is dropped)
DIAGNOSIS_WAIT = timedelta(
    seconds=5
)  # a job that may share its cause waits this long for the others' diagnoses
RECOVERING = frozenset({State.ACTING, State.VERIFYING, State.WAITING_FOR_RESOURCES})

Notify = Callable[[int, Notice], Any]


def _failure(inc: Incident) -> fleet.JobFailure:
    category = (inc.diagnosis or {}).get("category")
    return fleet.JobFailure.of(
        inc.id, inc.job, inc.opened_at, category, inc.labels.get("error_class"), inc.culprits
    )


def read_record(conn: Connection, key: str, *, for_update: bool = False) -> fleet.FleetRecord | None:
    """The fleet incident ``key`` (e.g. ``storage_io``, ``switch:leaf1``) as stored, or None."""
    value = records.get_control(conn, PREFIX + key, for_update=for_update)
    return fleet.FleetRecord.from_json(key, value) if isinstance(value, dict) else None


def write_record(conn: Connection, record: fleet.FleetRecord, now: datetime) -> None:
    records.set_control(conn, PREFIX + record.key, record.as_json(), now)


def archive_record(conn: Connection, record: fleet.FleetRecord, now: datetime) -> None:
    """Keep ``record`` (its cause's current one until now) among the cause's earlier fleet incidents, at most
    :data:`MAX_HISTORY` of them."""
    records.set_control(conn, f"{HISTORY_PREFIX}{record.key}#{record.number}", record.as_json(), now)
    if record.number > MAX_HISTORY:
        records.delete_control(conn, f"{HISTORY_PREFIX}{record.key}#{record.number - MAX_HISTORY}")


def _history(conn: Connection) -> list[fleet.FleetRecord]:
    stored = records.controls_with_prefix(conn, HISTORY_PREFIX)
    return [
        fleet.FleetRecord.from_json(name.rpartition("#")[0], value)
        for name, value in stored.items()
        if isinstance(value, dict) and "#" in name
    ]


class FleetHolds:
    def __init__(self, deps: EngineDeps, notify: Notify):
        self.deps = deps
        self.notify = notify
        self.source = TopologySource(deps)

    @property
    def topology(self) -> Topology:
        """The fleet's topology (files, the Slurm host, Kubernetes node labels: :mod:`app.engine.fleet_topology`)."""
        return self.source.current()

    def lost_peers(self, log: str) -> tuple[list[str], set[str]]:
        """The nodes of the peers the job's log says its ranks lost (never the node that wrote the line), and the
        nodes that wrote such lines (reporters, not culprits for what they report)."""
        if not self.topology.addresses:
            return [], set()
        return peer_nodes(log, self.topology), loggers(log)

    def _others(self, inc: Incident) -> list[fleet.JobFailure]:
        with self.deps.store.read() as conn:
            failures = records.open_job_failures(conn, limit=MAX_OPEN_COMPARED)
        return [f for f in failures if f.incident_id != inc.id]

    def _current(self, key: str, inc: Incident) -> fleet.FleetRecord | None:
        """The fleet incident ``key`` that ``inc`` belongs to (None: none does)."""
        with self.deps.store.read() as conn:
            record = read_record(conn, key)
        return record if record is not None and self._belongs(inc, record) else None

    def _belongs(self, inc: Incident, record: fleet.FleetRecord) -> bool:
        """Whether ``inc`` belongs to ``record``: not when it cleared before ``inc``'s fault began (the cause is
        back: a new fleet incident), nor, for a domain's, when ``inc`` opened more than a window after it."""
        window = timedelta(seconds=self.deps.settings.fleet.window_seconds)
        if record.cleared_at is not None:
            return inc.alert_starts_at <= record.cleared_at
        return record.held or inc.opened_at <= record.opened_at + window

    # --- blame: a domain's nodes, or too many culprits for a person ----------------------------------------------

    def blame(self, inc: Incident, culprits: Iterable[str]) -> policy.Blame:
        """What to exclude instead of ``culprits``: a domain's nodes when they, or the culprits of the other jobs
        failing in the window, are all behind one leaf, rack or block (told once a domain); when they are more than
        ``episodes.max_culprits`` and no domain within ``fleet.max_domain_nodes`` explains them, the job waits on
        the ``unexplained`` fleet incident for a person (told once), and after a person's release it is recovered
        excluding none of them. Else the culprits themselves (an empty Blame)."""
        settings = self.deps.settings
        suspects = frozenset(culprits)
        cause = None
        if self.topology.domains:
            me = fleet.JobFailure(inc.id, inc.job or "", inc.opened_at, None, suspects)
            others = self._others(inc)
            cause = fleet.shared_cause(
                me, others, self.topology, settings.fleet, settings.episodes.max_culprits
            )
            now = self.deps.clock.now()
            window = timedelta(seconds=settings.fleet.window_seconds)
            # The other jobs of the window, once diagnosed, may name the same domain: wait for them (bounded).
            waiting = cause is None and now < inc.opened_at + window
            if waiting and fleet.may_share_domain(me, others, self.topology, settings.fleet):
                return policy.Blame(until=now + DIAGNOSIS_WAIT)
        if cause is not None and cause.kind != "storage":
            domain = self.topology.domains[tuple(cause.key.split(":", 1))]  # type: ignore[index]
            if len(domain.nodes) <= settings.fleet.max_domain_nodes:
                self._told(inc, cause, held=False)
                nodes = tuple(sorted(domain.nodes))
                return policy.Blame(
                    nodes, f"{cause.summary}: excluding {domain.label}'s {len(domain.nodes)} nodes"
                )
        if len(suspects) <= settings.episodes.max_culprits:
            return policy.Blame()
        return self._unexplained(inc, suspects)

    def _unexplained(self, inc: Incident, suspects: frozenset[str]) -> policy.Blame:
        settings = self.deps.settings
        record = self._current(fleet.UNEXPLAINED, inc)
        if record is not None and record.cleared_at is not None:
            return policy.Blame(
                message=f"fleet incident {fleet.UNEXPLAINED} {record.why}: recovering without excluding "
                f"{len(suspects)} suspects",
                waived=True,
            )
        listed = ", ".join(sorted(suspects)[:8])
        summary = (
            f"{len(suspects)} suspect nodes ({listed}) are more than episodes.max_culprits "
            f"({settings.episodes.max_culprits}) and no leaf, rack or block of at most "
            f"{settings.fleet.max_domain_nodes} nodes holds them all: excluding none; a person decides"
        )
        now = self.deps.clock.now()
        if record is None:
            cause = fleet.SharedCause(fleet.UNEXPLAINED, fleet.UNEXPLAINED, summary, (inc.id,))
            record = self._told(inc, cause, held=True)
        self._join(inc, record, now)
        return policy.Blame(until=now + timedelta(seconds=settings.fleet.recheck_seconds))

    def _told(self, inc: Incident, cause: fleet.SharedCause, held: bool) -> fleet.FleetRecord:
        """The fleet incident of ``cause``, opened and told once (a new one once the last cleared or, for a
        domain's, a window after it opened)."""
        record = self._current(cause.key, inc)
        if record is None:
            record = fleet.FleetRecord(cause.key, cause.kind, cause.summary, self.deps.clock.now(), held=held)
            record = self._open(inc, record)
        return record

    # --- holding the jobs of a shared cause ------------------------------------------------------------------

    def hold(self, inc: Incident) -> tuple[datetime | None, Incident]:
        """When to look at ``inc`` again if its recovery is held by a shared cause (None: go on with it), and its
        row as it is now (holding it writes it)."""
        deps, settings = self.deps, self.deps.settings.fleet
        failure = _failure(inc)
        if inc.kind != IncidentKind.JOB or failure.category not in fleet.SHARED_CATEGORIES:
            return None, inc  # a domain's jobs are recovered off it (exclusion: blame), not held
        now = deps.clock.now()
        record = self._current(failure.category, inc)
        if record is not None and record.cleared_at is not None:
            due = record.cleared_at + fleet.release_delay(inc.id, settings.release_jitter_seconds)
            return None if now >= due else due, inc
        if record is None or inc.id not in record.incidents:
            cause = fleet.shared_cause(failure, self._others(inc), self.topology, settings)
            if cause is None:
                return self._await_diagnoses(inc, failure, now)
            if record is None:
                record = self._told(inc, cause, held=True)
            inc = self._join(inc, record, now)
        return self._check(inc, record, now)

    def _await_diagnoses(
        self, inc: Incident, failure: fleet.JobFailure, now: datetime
    ) -> tuple[datetime | None, Incident]:
        """The other jobs of the window may not be diagnosed yet: wait for them, inside the window only."""
        settings = self.deps.settings.fleet
        others = self._others(inc)
        window = timedelta(seconds=settings.window_seconds)
        if now >= inc.opened_at + window or not fleet.may_share(failure, others, settings):
            return None, inc
        reason = f"{failure.category}: waiting for the diagnoses of the other jobs failing in the window"
        with self.deps.store.transaction() as conn:
            if inc.reason != reason:
                inc = transitions.wait(conn, now, inc, reason, kind=LedgerKind.FLEET_WAIT)
        return now + DIAGNOSIS_WAIT, inc

    def _check(
        self, inc: Incident, record: fleet.FleetRecord, now: datetime
    ) -> tuple[datetime | None, Incident]:
        """Whether the cause persists, checked once a recheck interval for the whole fleet incident: its clear
        query, else its probe. None: ``inc`` goes on (it is the probe, or the cause cleared)."""
        settings = self.deps.settings.fleet
        later = now + timedelta(seconds=settings.recheck_seconds)
        if record.probe == inc.id and inc.attempt == record.probe_attempt:
            return None, inc  # chosen as the probe, its restart not started yet
        if not inc.reason.startswith(HOLD_PREFIX):
            inc = self._join(
                inc, record, now
            )  # the probe back from a restart that did not recover it: held again
        if record.checked_at is not None and now < record.checked_at + timedelta(
            seconds=settings.recheck_seconds
        ):
            return later, inc
        query = settings.clear_queries.get(record.key)
        if query:
            verdict, why = self._query(query)
        elif record.probe is None:
            if now < (
                record.next_probe_at or record.opened_at + timedelta(seconds=settings.probe_after_seconds)
            ):
                verdict, why = "waiting", "no clear query: a probe job restarts at the next probe time"
            else:
                verdict, why = (
                    "probe",
                    f"no clear query: job {inc.job} (incident #{inc.id}) restarts alone",
                )
        else:
            verdict, why = fleet.probe_verdict(record, self._probe_view(record))
        with self.deps.store.transaction() as conn:
            current = read_record(conn, record.key, for_update=True)
            if current is None or current.checked_at != record.checked_at or current.cleared_at is not None:
                return later, inc  # another worker checked it meanwhile
            record = current
            record.checked_at, record.why = now, why
            if verdict == "cleared":
                self._clear(conn, record, now, "query" if query else "probe", why)
                return now + fleet.release_delay(inc.id, settings.release_jitter_seconds), inc
            if verdict == "probe" and inc.id in record.probed:
                verdict, record.why = "waiting", "a probe is due: the next held job not yet probed restarts"
            elif verdict == "probe":
                record.probe, record.probe_at, record.probe_attempt = inc.id, now, inc.attempt
                record.probed.append(inc.id)
                transitions.note(conn, now, inc.id, LedgerKind.FLEET_PROBE, f"{PREFIX}{record.key}: {why}")
            elif verdict == "failed":
                self._end_probe(conn, record, why, now)
                record.probes_failed += 1
                record.probe, record.probe_at = None, None
                record.next_probe_at = now + fleet.next_probe_wait(record.probes_failed, settings)
                transitions.note(
                    conn,
                    now,
                    None,
                    LedgerKind.FLEET_PROBE_FAILED,
                    f"{PREFIX}{record.key}: {why}: the cause persists; the jobs stay held, the next probe at "
                    f"{record.next_probe_at:%H:%M:%S}",
                    record.as_json(),
                )
            write_record(conn, record, now)
        return None if verdict == "probe" else later, inc

    def _end_probe(self, conn: Connection, record: fleet.FleetRecord, why: str, now: datetime) -> None:
        """The probe failed: its attempt ends now (not at its verification's timeout) and it is held again on its
        next tick (left alone while a worker holds it: it then ends on its own)."""
        assert record.probe is not None
        probe = records.get_incident(conn, record.probe)
        if probe is None or probe.open_key is None or probe.state not in RECOVERING:
            return
        if (
            probe.claimed_by is not None
            and probe.claim_expires_at is not None
            and probe.claim_expires_at > now
        ):
            return
        transitions.fleet_probe_failed(conn, now, probe, f"fleet incident {record.key}: {why}")

    def _query(self, expr: str) -> tuple[str, str]:
        try:
            samples = self.deps.clients.prometheus.query(expr)
        except (BackendError, ConfigError) as exc:
            return "persists", f"clear query {expr} failed ({exc}): the cause is taken to persist"
        if samples:
            return "persists", f"clear query {expr}: {len(samples)} series: the cause persists"
        return "cleared", f"clear query {expr} returned nothing: the cause cleared"

    def _probe_view(self, record: fleet.FleetRecord) -> fleet.ProbeView | None:
        assert record.probe is not None and record.probe_at is not None
        with self.deps.store.read() as conn:
            probe = records.get_incident(conn, record.probe)
            alerts = records.get_alerts_for_incident(conn, record.probe) if probe else []
        if probe is None:
            return None
        again = [a.starts_at for a in alerts if a.status == "firing" and a.starts_at > record.probe_at]
        return fleet.ProbeView(
            probe.id,
            probe.open_key is not None,
            probe.outcome,
            probe.attempt,
            recovering=probe.state in RECOVERING,
            failed_again_at=max(again, default=None),
        )

    # --- one diagnosis for the fleet incident ----------------------------------------------------------------

    def adopted_diagnosis(self, inc: Incident) -> dict[str, Any] | None:
        """The fleet incident's diagnosis for a job whose alerts name its shared cause, once
        ``fleet.diagnosis_sample`` member jobs' logs were read for it (None: read this job's own log)."""
        category = inc.labels.get("error_class")
        if inc.kind != IncidentKind.JOB or category not in fleet.SHARED_CATEGORIES:
            return None
        record = self._current(category, inc)
        sample = self.deps.settings.fleet.diagnosis_sample
        if record is None or record.cleared_at or record.diagnosis is None or len(record.sampled) < sample:
            return None
        sampled = ", ".join(f"#{i}" for i in record.sampled)
        return {
            **record.diagnosis,
            "summary": f"{record.diagnosis.get('summary', '')} (fleet incident {record.key}: diagnosed from "
            f"the logs of {len(record.sampled)} member jobs, incidents {sampled}; this job's log was not read)",
            "fleet": record.key,
        }

    # --- nodes behind a failing domain -----------------------------------------------------------------------

    def hold_node(self, inc: Incident) -> datetime | None:
        """A node incident among many at once behind one leaf or rack: the domain is the suspect, told once; the
        node waits (its alert resolving when the domain is back closes it), never repaired or paged one by one,
        until a person releases the domain's fleet incident. None: the node's own fault, repaired as usual."""
        settings = self.deps.settings.fleet
        if not self.topology.domains or inc.kind != IncidentKind.NODE or not inc.node:
            return None
        now = self.deps.clock.now()
        window = timedelta(seconds=settings.window_seconds)
        if not self.topology.of(inc.node):
            return None
        # Nodes behind one leaf fail within seconds of each other: wait out the correlation window (a node that
        # runs no job loses nothing by it) before deciding it is the node's own fault.
        settle = inc.opened_at + timedelta(seconds=self.deps.settings.episodes.correlation_seconds)
        member = self._held_on(inc, now)
        if member is not None:
            return member
        with self.deps.store.read() as conn:
            failing = [
                node
                for node, opened_at in records.open_node_incidents(conn, limit=MAX_OPEN_COMPARED)
                if node and abs(opened_at - inc.opened_at) <= window
            ]
        domain = fleet.node_domain(
            inc.node,
            failing,
            self.topology,
            self.deps.settings.episodes.max_culprits,
            settings.max_domain_nodes,
        )
        if domain is None:
            return settle if now < settle else None
        key = f"{domain.kind}:{domain.name}"
        down = len({inc.node, *failing} & domain.nodes)
        summary = f"{down} nodes behind {domain.label} failed within {settings.window_seconds}s"
        record = self._told(inc, fleet.SharedCause(key, domain.kind, summary, (inc.id,)), held=False)
        if record.cleared_at is not None:
            return None  # released by a person: each node goes through its own repair
        reason = f"{HOLD_PREFIX} {key}: {summary}; the node waits for it"
        if inc.reason != reason:
            with self.deps.store.transaction() as conn:
                current = read_record(conn, key, for_update=True) or record
                current.incidents = sorted({*current.incidents, inc.id})
                write_record(conn, current, now)
                transitions.wait(conn, now, inc, reason, kind=LedgerKind.FLEET_HOLD)
        return now + timedelta(seconds=settings.recheck_seconds)

    def _held_on(self, inc: Incident, now: datetime) -> datetime | None:
        """For a node incident already held on its domain's fleet incident: when to look again while the domain
        still looks down (another of its nodes' incidents open, or one closed less than the correlation window
        ago: their alerts resolve one by one when the domain is back). None: not held on one, released by a
        person, or the last one left (its own fault: it goes on to its repair)."""
        if not inc.reason.startswith(HOLD_PREFIX):
            return None
        grace = timedelta(seconds=self.deps.settings.episodes.correlation_seconds)
        later = now + timedelta(seconds=self.deps.settings.fleet.recheck_seconds)
        for domain in self.topology.of(inc.node or ""):
            with self.deps.store.read() as conn:
                record = read_record(conn, f"{domain.kind}:{domain.name}")
                if record is None or inc.id not in record.incidents:
                    continue
                if record.cleared_at is not None:
                    return None
                others = [records.get_incident(conn, i) for i in record.incidents if i != inc.id]
            if any(o is not None and o.open_key is not None for o in others):
                return later
            closed = max((o.closed_at for o in others if o is not None and o.closed_at), default=None)
            return min(later, closed + grace) if closed is not None and now < closed + grace else None
        return None

    # --- the storm guard -------------------------------------------------------------------------------------

    def storm_wait(self, inc: Incident) -> datetime | None:
        """The fleet's storm guard: when ``fleet.storm_max_restarts`` jobs were restarted within the storm window,
        when this job's restart may go ahead (it waits, told once a window); None: now. Jobs released by a cleared
        fleet incident are not counted against it (their cause is known and over)."""
        settings = self.deps.settings.fleet
        if inc.kind != IncidentKind.JOB or settings.storm_max_restarts == 0 or is_held(inc):
            return None
        if self._released(inc):
            return None
        now = self.deps.clock.now()
        with self.deps.store.read() as conn:
            restarts = [datetime.fromisoformat(t) for t in records.get_control(conn, RESTARTS) or []]
        if not fleet.storm_tripped(restarts, now, settings):
            return None
        window = timedelta(seconds=settings.storm_window_seconds)
        until = min(t for t in restarts if t > now - window) + window
        reason = (
            f"{STORM_PREFIX}: {settings.storm_max_restarts} job restarts within {settings.storm_window_seconds}s; "
            f"job {inc.job} waits until {until:%H:%M:%S}"
        )
        with self.deps.store.transaction() as conn:
            notified = records.get_control(conn, STORM_NOTIFIED)
            tell = not notified or datetime.fromisoformat(notified) <= now - window
            if tell:
                records.set_control(conn, STORM_NOTIFIED, now.isoformat(), now)
            transitions.wait(conn, now, inc, reason, held_by_guard=True, kind=LedgerKind.FLEET_STORM)
        if tell:
            self.notify(
                inc.id,
                Notice(
                    NoticeKind.FLEET_STORM,
                    "[nightshift] fleet storm guard: job restarts paused",
                    f"{reason}. Many jobs failing at once usually share a cause Nightshift could not name; "
                    "a person should look.",
                    {"incident": inc.id, "guard": "fleet_storm", "outcome": IncidentOutcome.NEEDS_HUMAN},
                ),
            )
        return until

    def _released(self, inc: Incident) -> bool:
        """Whether ``inc`` is a job of a fleet incident that has cleared (released, whatever its reason says now:
        a failed probe's reason is its failure)."""
        category = _failure(inc).category
        if category not in fleet.SHARED_CATEGORIES:
            return False
        record = self._current(category, inc)
        return record is not None and record.cleared_at is not None and inc.id in record.incidents

    def count_restart(self, conn: Connection, now: datetime) -> None:
        """Count a job restart for the storm guard (in the caller's transaction); the newest few are kept."""
        keep = max(1, self.deps.settings.fleet.storm_max_restarts)
        restarts = [*(records.get_control(conn, RESTARTS) or []), now.isoformat()][-keep:]
        records.set_control(conn, RESTARTS, restarts, now)

    # --- a person's word ---------------------------------------------------------------------------------------

    def release(self, key: str, by: str, note: str = "") -> fleet.FleetRecord:
        """A person says the cause of fleet incident ``key`` (e.g. ``storage_io``) is over: its held jobs are
        released (after their jitter), ledgered with their name. LookupError: no such fleet incident; ValueError:
        it cleared already."""
        now = self.deps.clock.now()
        with self.deps.store.transaction() as conn:
            record = read_record(conn, key, for_update=True)
            if record is None:
                raise LookupError(f"no fleet incident {key}")
            if record.cleared_at is not None:
                raise ValueError(
                    f"fleet incident {key} already cleared at {record.cleared_at:%Y-%m-%d %H:%M:%S}"
                )
            why = f"released by {by}" + (f": {note}" if note else "")
            self._clear(conn, record, now, f"operator {by}", why)
        return record

    def fleet_incidents(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` fleet incidents, newest first (a cause's current one ``current``, its earlier ones
        kept: at most :data:`MAX_HISTORY` a cause), each with up to ``limit`` of its job incidents (state, why)."""
        with self.deps.store.read() as conn:
            stored = records.controls_with_prefix(conn, PREFIX)
            found = [
                (fleet.FleetRecord.from_json(k, v), True) for k, v in stored.items() if isinstance(v, dict)
            ]
            found += [(record, False) for record in _history(conn)]
            found.sort(key=lambda pair: pair[0].opened_at, reverse=True)
            out = []
            for record, current in found[:limit]:
                members = []
                for incident_id in record.incidents[:limit]:
                    row = records.get_incident(conn, incident_id)
                    if row is not None:
                        members.append(
                            {
                                "id": row.id,
                                "job": row.job,
                                "node": row.node,
                                "state": row.state,
                                "outcome": row.outcome,
                                "reason": row.reason,
                            }
                        )
                out.append(
                    {
                        **record.as_json(),
                        "current": current,
                        "members": members,
                        "member_count": len(record.incidents),
                    }
                )
        return out

    # --- writing -----------------------------------------------------------------------------------------------

    def _open(self, inc: Incident, record: fleet.FleetRecord) -> fleet.FleetRecord:
        """Open ``record`` and tell it once; the cause's earlier one (cleared, or a domain's a window old) is kept
        in its history. Returns the fleet incident ``inc`` belongs to: another worker's, where one opened it since
        ``inc`` looked."""
        now = self.deps.clock.now()
        with self.deps.store.transaction() as conn:
            earlier = read_record(conn, record.key, for_update=True)
            if earlier is not None and self._belongs(inc, earlier):
                return earlier  # opened meanwhile, and told by whoever opened it
            if earlier is not None:
                archive_record(conn, earlier, now)
                record.number = earlier.number + 1
            write_record(conn, record, now)
            transitions.fleet_opened(
                conn, now, inc, f"{PREFIX}{record.key}: {record.summary}", record.as_json()
            )
        settings = self.deps.settings.fleet
        jitter = settings.release_jitter_seconds
        if record.kind == "storage":
            query = settings.clear_queries.get(record.key)
            check = (
                f"the cause is checked every {settings.recheck_seconds}s with {query}"
                if query
                else f"after {settings.probe_after_seconds}s one held job restarts alone as a probe (doubling "
                f"the wait after each failure, at most {settings.probe_max_seconds}s)"
            )
            then = (
                f"Every job failing with it is held, not requeued into the outage; {check}. Once the cause has "
                f"cleared (or a person releases it: POST /api/v1/fleet/{record.key}/release, or the Fleet page), "
                f"they restart together, spread over {jitter}s. The first {settings.diagnosis_sample} jobs' logs "
                "are read for the diagnosis; the others adopt it."
            )
        elif record.kind == fleet.UNEXPLAINED:
            then = (
                "The jobs wait, excluding nothing, for a person: take the bad nodes out, then release the fleet "
                f"incident (POST /api/v1/fleet/{record.key}/release, or the Fleet page); they restart then."
            )
        else:
            then = "The jobs behind it are requeued off it; the domain itself needs a person (switch, rack power)."
        self.notify(
            inc.id,
            Notice(
                NoticeKind.FLEET_INCIDENT,
                f"[nightshift] fleet incident {record.key}"
                + (": job recoveries held" if record.held else ""),
                f"{record.summary}.\n{then} First incident #{inc.id}.{_back(earlier)}",
                {
                    "incident": inc.id,
                    "fleet": record.key,
                    "number": record.number,
                    "outcome": IncidentOutcome.NEEDS_HUMAN,
                },
            ),
        )
        return record

    def _join(self, inc: Incident, record: fleet.FleetRecord, now: datetime) -> Incident:
        """``inc`` joins the fleet incident and waits for it (its diagnosis joins the sample while it is short).
        Returns its row as it is now."""
        reason = f"{HOLD_PREFIX} {record.key}: {record.summary}"
        sample = self.deps.settings.fleet.diagnosis_sample
        with self.deps.store.transaction() as conn:
            current = read_record(conn, record.key, for_update=True) or record
            current.incidents = sorted({*current.incidents, inc.id})
            diagnosis = inc.diagnosis or {}
            own = diagnosis.get("category") == current.key and "fleet" not in diagnosis
            if own and len(current.sampled) < sample and inc.id not in current.sampled:
                current.sampled.append(inc.id)
                current.diagnosis = current.diagnosis or dict(diagnosis)
            write_record(conn, current, now)
            if inc.reason != reason:
                inc = transitions.wait(conn, now, inc, reason, kind=LedgerKind.FLEET_HOLD)
        record.incidents, record.sampled, record.diagnosis = (
            current.incidents,
            current.sampled,
            current.diagnosis,
        )
        return inc

    def _clear(self, conn: Connection, record: fleet.FleetRecord, now: datetime, by: str, why: str) -> None:
        """In the caller's transaction: the fleet incident cleared; each held job looked at after its jitter."""
        settings = self.deps.settings.fleet
        record.cleared_at, record.cleared_by, record.why = now, by, why
        record.probe = None
        write_record(conn, record, now)
        transitions.fleet_cleared(
            conn,
            now,
            f"{PREFIX}{record.key}: {why}: {len(record.incidents)} held job(s) released, spread over "
            f"{settings.release_jitter_seconds}s",
            {**record.as_json(), "by": by},
            {i: now + fleet.release_delay(i, settings.release_jitter_seconds) for i in record.incidents},
        )


def _back(earlier: fleet.FleetRecord | None) -> str:
    """What the notice of a cause that comes back says of its last fleet incident."""
    if earlier is None:
        return ""
    if earlier.cleared_at is None:
        return f" The same cause's fleet incident #{earlier.number} opened at {earlier.opened_at:%Y-%m-%d %H:%M:%S}."
    return (
        f" The cause is back: its fleet incident #{earlier.number} cleared at "
        f"{earlier.cleared_at:%Y-%m-%d %H:%M:%S} ({earlier.cleared_by or 'unknown'})."
    )


def is_held(incident: Incident) -> bool:
    """Whether a job incident waits on a shared cause (its recovery held, not to be closed when its alerts resolve)."""
    return (
        incident.kind == IncidentKind.JOB
        and incident.open_key is not None
        and incident.reason.startswith(HOLD_PREFIX)
    )


def waits_for_restart(incident: Incident) -> bool:
    """Whether a job incident's restart waits: on a shared cause, or on a guard (the storm guard's turn, the budget's
    backoff, a cooldown, the blast radius, the kill switch). Its alerts resolving meanwhile says nothing about the
    job (a dead job's error rate, an Xid's count window, fall back within minutes whether or not it runs again): it
    is not closed for it; once allowed, the policy reads the job (running: closed, nothing to recover) and restarts
    a dead one without the playbook's re-check of those alerts."""
    guarded = incident.held_by_guard and incident.kind == IncidentKind.JOB and incident.open_key is not None
    return is_held(incident) or guarded
