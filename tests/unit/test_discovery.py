"""Slurm service discovery of progress endpoints (app/domain/discovery.py, pure) and the cache that logs portless jobs
once (app/web/discovery.py). The endpoint on a real Slurm: tests/integration/test_slurm_discovery.py."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

import pytest

from app.clients.slurm_discovery import Discovered
from app.domain import discovery, hostlist
from app.domain.errors import Unavailable
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


class _Later:
    """Runs the refreshes the cache starts when the test says so (the cache's background threads, by hand)."""

    def __init__(self) -> None:
        self.started: list[Callable[[], None]] = []

    def __call__(self, refresh: Callable[[], None]) -> None:
        self.started.append(refresh)

    def run(self) -> int:
        ran, self.started = self.started, []
        for refresh in ran:
            refresh()
        return len(ran)


def test_cache_refreshes_once_per_ttl_and_logs_a_portless_job_once(caplog: pytest.LogCaptureFixture):
    now = [0.0]
    portless = Discovered(groups=[], without_port=["7"], ambiguous=[])
    fetch = _Fetches(portless, portless, Discovered(groups=[], without_port=[], ambiguous=[]), portless)
    later = _Later()
    cache = DiscoveryCache(10, fetch, clock=lambda: now[0], spawn=later)
    with caplog.at_level(logging.INFO, logger="app.web.discovery"):
        for t in (0, 5, 10, 15):  # two fetches
            now[0] = t
            with contextlib.suppress(Unavailable):  # the very first request: nothing cached yet
                cache.get()
            later.run()
        assert fetch.calls == 2
        assert sum("slurm job 7 runs without" in r.message for r in caplog.records) == 1
        for t in (20, 30):  # job 7 leaves the queue, then a job 7 again (ids are reused): logged again
            now[0] = t
            cache.get()
            later.run()
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
    from app.domain.discovery import checkpoint_signal

    assert checkpoint_signal(comment) == signal


def test_requests_never_run_a_refresh_and_a_failure_is_cached():
    """Issue 22 item 3 and its caveat: a refresh stuck on a login node that never speaks SSH held discovery
    requests (first behind a lock, then the one request that ran it). Structural: no request thread ever calls
    fetch; each answers at once (stale value, or 503), while one background refresh at a time runs."""
    now = [0.0]
    fetching_threads: list[int] = []
    answers: list[Discovered | Exception] = [Unavailable("ssh: banner timeout"), Discovered([], [], [])]

    def fetch() -> Discovered:
        fetching_threads.append(threading.get_ident())
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    later = _Later()
    cache = DiscoveryCache(5, fetch, clock=lambda: now[0], spawn=later)
    for _ in range(10):  # the refresh has not run: every request answers without it
        with pytest.raises(Unavailable, match="still running"):
            cache.get()
    assert len(later.started) == 1 and fetching_threads == []  # one refresh started, none run by a request
    refresher = threading.Thread(target=later.run)
    refresher.start()
    refresher.join(10)
    assert fetching_threads == [refresher.ident]
    with pytest.raises(Unavailable, match="banner"):  # the failure, cached: no second refresh yet
        cache.get()
    assert later.started == []
    now[0] = 11  # past the backoff (5 s doubled)
    with pytest.raises(Unavailable, match="banner"):  # still the last answer, while the retry runs
        cache.get()
    assert later.run() == 1
    assert cache.get() == Discovered([], [], [])


def test_the_default_refresh_runs_on_a_background_thread():
    ran_on: list[str] = []
    done = threading.Event()

    def fetch() -> Discovered:
        ran_on.append(threading.current_thread().name)
        done.set()
        return Discovered([], [], [])

    cache = DiscoveryCache(5, fetch)
    with pytest.raises(Unavailable):
        cache.get()
    assert done.wait(10)
    assert ran_on == ["nightshift-sd-refresh"]
