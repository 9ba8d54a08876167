"""Slurm service discovery of progress endpoints (app/discovery.py, pure) and the cache that logs portless jobs
once (app/web/discovery.py). The endpoint on a real Slurm: tests/integration/test_slurm_discovery.py."""

from __future__ import annotations

import logging

import pytest

from app import discovery, hostlist
from app.clients.slurm_discovery import Discovered
from app.web.discovery import DiscoveryCache


def test_hostlists_expand_like_slurm():
    assert hostlist.expand_hostlist("node1") == ["node1"]
    assert hostlist.expand_hostlist("gpu[01-03,7],login1") == ["gpu01", "gpu02", "gpu03", "gpu7", "login1"]
    assert hostlist.expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    for bad in ("node[1-", "node]1[", "node[a-b]", "node[3-1]"):
        with pytest.raises(hostlist.HostlistError):
            hostlist.expand_hostlist(bad)
    with pytest.raises(hostlist.HostlistError, match="larger than 16384"):
        hostlist.expand_hostlist("n[1-100000]")
    with pytest.raises(hostlist.HostlistError, match="more than"):
        hostlist.expand_hostlist("a[1-200]b[1-200]")  # 40,000 names from two small ranges


JOBS = "101 gpu alice node[1-2]\n102 gpu bob node3\n103 debug carol node4\n104_7 gpu dave node5\n"


def test_jobs_with_a_port_become_one_target_group_per_node():
    jobs = discovery.parse_jobs(JOBS)
    comments = (
        "101 nightshift.progress_port=9464\n"
        "102 run 12, nightshift.progress_port=9500; owner bob\n"
        "103 no port here\n"
        "104_7 nightshift.progress_port=70000\n"  # not a port
    )
    ports, ambiguous = discovery.parse_ports(comments, jobs)
    assert ports == {"101": 9464, "102": 9500} and ambiguous == []
    addresses = discovery.parse_node_addresses("node1 10.0.0.1\nnode1 10.0.0.1\nnode2 fd00::2\nnode3 node3\n")
    groups = discovery.target_groups(jobs, ports, addresses)
    assert [g["targets"] for g in groups] == [["10.0.0.1:9464"], ["[fd00::2]:9464"], ["node3:9500"]]
    assert groups[0]["labels"] == {
        "__meta_slurm_job_id": "101",
        "__meta_slurm_node": "node1",
        "__meta_slurm_partition": "gpu",
        "__meta_slurm_user": "alice",
    }


def test_a_comment_forging_a_line_for_another_job_gets_that_job_left_out():
    jobs = discovery.parse_jobs(JOBS)
    # Job 103's owner put a newline and a fake line for job 101 in the comment.
    comments = "101 nightshift.progress_port=9464\n103 x\n101 nightshift.progress_port=22\n"
    ports, ambiguous = discovery.parse_ports(comments, jobs)
    assert ports == {} and ambiguous == ["101"]
    # A forged line naming a job that is not running is ignored: ids come from the first query only.
    ports, _ = discovery.parse_ports("999 nightshift.progress_port=22\n", jobs)
    assert ports == {}


def test_malformed_squeue_lines_and_node_names_are_skipped():
    jobs = discovery.parse_jobs("garbage\n105 gpu eve node[1-\n106 gpu eve n;rm\n107 gpu eve (null)\n")
    assert set(jobs) == {"106", "107"} and jobs["106"].nodes == () and jobs["107"].nodes == ()
    assert discovery.target_groups(jobs, {"106": 9000}, {}) == []


class _Fetches:
    def __init__(self, *results: Discovered):
        self.results = list(results)
        self.calls = 0

    def __call__(self) -> Discovered:
        self.calls += 1
        return self.results.pop(0)


def test_cache_refreshes_once_per_ttl_and_logs_a_portless_job_once(caplog: pytest.LogCaptureFixture):
    now = [0.0]
    portless = Discovered(groups=[], without_port=["7"], ambiguous=[])
    fetch = _Fetches(portless, portless, Discovered(groups=[], without_port=[], ambiguous=[]), portless)
    cache = DiscoveryCache(10, fetch, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="app.web.discovery"):
        for t in (0, 5, 10, 15):  # two fetches
            now[0] = t
            cache.get()
        assert fetch.calls == 2
        assert sum("slurm job 7 runs without" in r.message for r in caplog.records) == 1
        now[0] = 20
        cache.get()  # job 7 left the queue
        now[0] = 30
        cache.get()  # a job 7 again (ids are reused): logged again
    assert sum("slurm job 7 runs without" in r.message for r in caplog.records) == 2


# Expressions whose product is over the bound: each is refused before the product is built (issue 22 item 7:
# ``a[1-3000]b[1-3000]`` allocated 644 MiB before refusing). Peak allocation stays under a few MiB.
OVER_THE_BOUND = [
    "a[1-3000]b[1-3000]",
    "a[1-200]b[1-200]c[1-200]",
    "x[1-16384]y[1-2]",
    "a[1-100],b[1-16300]",
    "r[1-9000]n[1-9000]g[1-8]",
]


@pytest.mark.parametrize("expression", OVER_THE_BOUND)
def test_a_product_over_the_bound_is_refused_before_it_is_built(expression):
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(hostlist.HostlistError, match=r"more than|larger than"):
            hostlist.expand_hostlist(expression)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, f"{expression}: {peak / 2**20:.0f} MiB allocated before refusing"


@pytest.mark.parametrize(
    ("comment", "signal"),
    [
        ("nightshift.checkpoint_signal=USR1", "USR1"),
        ("nightshift.progress_port=9464,nightshift.checkpoint_signal=USR2", "USR2"),
        ("nightshift.checkpoint_signal=B:USR1", "B:USR1"),
        ("nightshift.checkpoint_signal=KILL", None),
        ("nightshift.checkpoint_signal=X:USR1", None),
        ("xnightshift.checkpoint_signal=USR1", None),
        ("nightshift.checkpoint_signal=USR1x", None),
        ("", None),
    ],
)
def test_the_checkpoint_signal_a_job_announces(comment: str, signal: str | None) -> None:
    from app.discovery import checkpoint_signal

    assert checkpoint_signal(comment) == signal


def test_a_stuck_refresh_never_holds_another_request_and_a_failure_is_cached():
    """Issue 22 item 3: a refresh stuck on a login node that never speaks SSH held every discovery request
    behind a lock. Structural: while one refresh is stuck, other requests answer without waiting for it."""
    import threading

    from app.errors import Unavailable

    now = [0.0]
    release, entered = threading.Event(), threading.Event()
    calls = [0]

    def stuck() -> Discovered:
        calls[0] += 1
        entered.set()
        release.wait(30)
        raise Unavailable("ssh: banner timeout")

    cache = DiscoveryCache(5, stuck, clock=lambda: now[0])

    def refresh() -> None:
        with pytest.raises(Unavailable):
            cache.get()

    first = threading.Thread(target=refresh)
    first.start()
    assert entered.wait(10)
    for _ in range(10):  # answered at once: the refresh is someone else's
        with pytest.raises(Unavailable, match="still running"):
            cache.get()
    release.set()
    first.join(10)
    with pytest.raises(Unavailable, match="banner"):  # the failure, cached: no second refresh yet
        cache.get()
    assert calls[0] == 1
    now[0] = 11  # past the backoff (5 s doubled)
    with pytest.raises(Unavailable):
        cache.get()
    assert calls[0] == 2
