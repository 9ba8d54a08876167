"""The e2e tier's stacks: :func:`sim.stack.launch_stack` around the session's Slurm cluster, one per module.

``stack`` whitelists the Slurm actions (examples/permissions.yaml); ``advisory_stack`` has no permissions file.
Both start from an idle Slurm and leave it idle. A missing binary skips locally and fails under ``CI=true``. When
a test using a stack fails, the tails of its daemons' logs are attached to the report.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sim.stack import Stack, running_stack
from tests.fixtures.procs import require_binary
from tests.fixtures.slurm import SlurmCluster


def _stack(factory: pytest.TempPathFactory, slurm: SlurmCluster, permissions: bool) -> Iterator[Stack]:
    slurm.reset()
    with running_stack(
        factory.mktemp("stack"), slurm, permissions=permissions, find_binary=require_binary
    ) as stack:
        yield stack
    slurm.reset()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, slurm_cluster: SlurmCluster) -> Iterator[Stack]:
    """The whole loop, Slurm actions whitelisted."""
    yield from _stack(tmp_path_factory, slurm_cluster, permissions=True)


@pytest.fixture(scope="module")
def advisory_stack(tmp_path_factory: pytest.TempPathFactory, slurm_cluster: SlurmCluster) -> Iterator[Stack]:
    """The whole loop without a permissions file: Nightshift only advises."""
    yield from _stack(tmp_path_factory, slurm_cluster, permissions=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    stacks = [v for v in getattr(item, "funcargs", {}).values() if isinstance(v, Stack)]
    if report.failed:
        for stack in stacks:
            for name, tail in (
                ("nightshift", stack.nightshift.log_tail()),
                ("prometheus", stack.prometheus.log_tail()),
                ("alertmanager", stack.alertmanager.log_tail()),
            ):
                report.sections.append((f"{name} log", tail))
    return report
