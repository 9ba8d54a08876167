"""app/domain/fleet.py: which job failures share one cause, the storm guard, the release jitter, the settings'
bounds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.domain.errors import ConfigError
from app.domain.fleet import (
    FleetRecord,
    FleetSettings,
    JobFailure,
    ProbeView,
    may_share,
    next_probe_wait,
    node_domain,
    probe_verdict,
    release_delay,
    shared_cause,
    storm_tripped,
)
from app.domain.topology import parse_slurm

T0 = datetime(2026, 1, 5, 2, 0, tzinfo=UTC)
TOPO = parse_slurm("SwitchName=leaf0 Nodes=n[0-7]\nSwitchName=leaf1 Nodes=n[8-15]\n")
SETTINGS = FleetSettings(min_jobs=3, window_seconds=300)


def failure(i: int, category: str | None, culprits: set[str] = frozenset(), seconds: int = 0) -> JobFailure:
    return JobFailure(i, f"slurm/{100 + i}", T0 + timedelta(seconds=seconds), category, frozenset(culprits))


@pytest.mark.parametrize(
    ("me", "others", "key", "members"),
    [
        # three jobs with storage I/O errors in the window: one storage cause
        (
            failure(1, "storage_io"),
            [failure(2, "storage_io"), failure(3, "storage_io", seconds=200)],
            "storage_io",
            (1, 2, 3),
        ),
        # two are not enough; one outside the window does not count
        (
            failure(1, "storage_io"),
            [failure(2, "storage_io"), failure(3, "storage_io", seconds=400)],
            None,
            (),
        ),
        # the same category is needed: an OOM is the job's own
        (failure(1, "cuda_oom"), [failure(2, "cuda_oom"), failure(3, "cuda_oom")], None, ()),
        (failure(1, "storage_io"), [failure(2, "cuda_oom"), failure(3, "storage_io")], None, ()),
        # culprits of two jobs all behind leaf1: one switch cause
        (
            failure(1, "nccl_network", {"n9"}),
            [failure(2, None, {"n10", "n11"}), failure(3, None, {"n2"})],
            "switch:leaf1",
            (1, 2),
        ),
        # one job, more culprits than the limit, all behind one leaf: the leaf
        (failure(1, "nccl_network", {"n9", "n12", "n13"}), [], "switch:leaf1", (1,)),
        # two culprits (the limit): the nodes themselves
        (failure(1, "nccl_network", {"n9", "n12"}), [], None, ()),
        # two jobs' single culprits on one leaf: two nodes' own faults
        (failure(1, "gpu_hardware", {"n9"}), [failure(2, "gpu_hardware", {"n10"})], None, ()),
        # one culprit, nobody else behind its leaf: the node's own fault
        (failure(1, "gpu_hardware", {"n9"}), [failure(2, None, {"n2"})], None, ()),
        # culprits across leaves: no shared domain
        (failure(1, "nccl_network", {"n1", "n9", "n10"}), [], None, ()),
    ],
)
def test_shared_cause(me, others, key, members):
    cause = shared_cause(me, others, TOPO, SETTINGS)
    assert (cause.key if cause else None) == key
    assert (cause.incidents if cause else ()) == members


def test_the_same_job_never_counts_twice():
    again = [failure(1, "storage_io"), failure(1, "storage_io")]
    assert shared_cause(failure(1, "storage_io"), again, TOPO, SETTINGS) is None


def test_release_jitter_is_stable_and_bounded():
    delays = [release_delay(i, 120) for i in range(200)]
    assert delays == [release_delay(i, 120) for i in range(200)]
    assert all(timedelta(0) <= d < timedelta(seconds=120) for d in delays)
    assert len(set(delays)) > 50  # spread, not one stampede
    assert release_delay(7, 0) == timedelta(0)


def test_storm_guard_counts_restarts_in_its_window():
    s = FleetSettings(storm_max_restarts=3, storm_window_seconds=600)
    recent = [T0 - timedelta(seconds=s) for s in (10, 20)]
    assert not storm_tripped(recent, T0, s)
    assert storm_tripped([*recent, T0 - timedelta(seconds=30)], T0, s)
    assert not storm_tripped([*recent, T0 - timedelta(seconds=700)], T0, s)
    assert not storm_tripped(recent * 10, T0, FleetSettings(storm_max_restarts=0))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("min_jobs", 1),
        ("window_seconds", 0),
        ("release_jitter_seconds", -1),
        ("max_domain_nodes", 0),
        ("storm_max_restarts", -1),
        ("recheck_seconds", 100_000),
        ("probe_after_seconds", 0),
        ("probe_max_seconds", 60),  # below probe_after_seconds
        ("diagnosis_sample", 0),
        ("topology_refresh_seconds", 0),
        ("clear_queries", {"cuda_oom": "up == 0"}),  # not a shared cause
        ("clear_queries", {"storage_io": ""}),
        ("clear_queries", {"storage_io": "x" * 2001}),
        ("clear_queries", ["storage_io"]),
        ("node_labels", {"row": "topology.kubernetes.io/row"}),  # not a domain kind
        ("node_labels", {"rack": "not a label key!"}),
    ],
)
def test_settings_out_of_bounds_are_refused(field, value):
    with pytest.raises(ConfigError, match=f"fleet.{field}"):
        FleetSettings(**{field: value})


def test_a_stored_record_reads_back_the_same_and_an_older_one_gets_defaults():
    record = FleetRecord("switch:leaf1", "switch", "3 jobs", T0, held=False, incidents=[4, 5], probe_at=T0)
    assert FleetRecord.from_json("switch:leaf1", record.as_json()) == record
    old = FleetRecord.from_json("storage_io", {"summary": "s", "opened_at": T0.isoformat(), "incidents": [1]})
    assert (old.kind, old.held, old.cleared_at, old.probe) == ("storage", True, None, None)


@pytest.mark.parametrize(
    ("view", "verdict"),
    [
        (None, "failed"),  # the probe's incident is gone
        (ProbeView(7, open=True, outcome=None, attempt=1, recovering=True), "running"),
        (ProbeView(7, open=True, outcome=None, attempt=0), "running"),  # chosen, its restart not started
        (ProbeView(7, open=True, outcome=None, attempt=1), "failed"),  # its restart ended without recovery
        (ProbeView(7, open=True, outcome=None, attempt=1, recovering=True, failed_again_at=T0), "failed"),
        (ProbeView(7, open=False, outcome="recovered", attempt=1), "cleared"),
        (ProbeView(7, open=False, outcome="needs_human", attempt=1), "failed"),
    ],
)
def test_the_probe_job_tells_whether_the_cause_cleared(view, verdict):
    record = FleetRecord("storage_io", "storage", "s", T0, probe=7, probe_at=T0, probe_attempt=0)
    assert probe_verdict(record, view)[0] == verdict


def test_each_failed_probe_doubles_the_wait_up_to_the_limit():
    s = FleetSettings(probe_after_seconds=300, probe_max_seconds=1000)
    assert [next_probe_wait(n, s).total_seconds() for n in (1, 2, 3, 50)] == [600, 1000, 1000, 1000]


def test_a_storage_failure_waits_for_the_undiagnosed_jobs_of_its_window():
    undiagnosed = [JobFailure(i, f"slurm/{i}", T0, "nccl", diagnosed=False) for i in (2, 3)]
    assert may_share(failure(1, "storage_io"), undiagnosed, SETTINGS)
    assert not may_share(failure(1, "storage_io"), undiagnosed[:1], SETTINGS)  # 2 jobs at most
    assert not may_share(failure(1, "cuda_oom"), undiagnosed, SETTINGS)
    diagnosed = [failure(2, "cuda_oom"), failure(3, "cuda_oom")]
    assert not may_share(failure(1, "storage_io"), diagnosed, SETTINGS)


@pytest.mark.parametrize(
    ("node", "failing", "domain"),
    [
        ("n9", ["n10", "n11"], "leaf1"),  # three behind leaf1: the leaf
        ("n9", ["n10"], None),  # two: the nodes' own faults
        ("n9", ["n1", "n2", "n3"], None),  # the others are behind another leaf
    ],
)
def test_many_nodes_failing_behind_one_leaf_blame_the_leaf(node, failing, domain):
    found = node_domain(node, failing, TOPO, max_nodes=2, max_domain_nodes=1024)
    assert (found.name if found else None) == domain


def test_a_domain_larger_than_the_limit_is_never_the_suspect():
    assert node_domain("n9", ["n10", "n11"], TOPO, max_nodes=2, max_domain_nodes=4) is None
