"""The progress endpoints of running Slurm jobs, read over the Slurm client's SSH runner (:mod:`app.domain.discovery`
parses; this module runs the commands).

Three read-only commands, independent of each other, run at once (:meth:`SlurmClient.run_all`, one round
trip): the running jobs with their nodes (``squeue``, no user text), their comments (``squeue``, the port
convention), and the nodes' addresses (``sinfo``). A non-zero exit of any is
:class:`~app.domain.errors.CommandFailed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.clients.slurm import NODE_ADDRESSES
from app.domain import discovery

if TYPE_CHECKING:
    from app.clients.slurm import SlurmClient

# RUNNING and COMPLETING: a job whose process lingers to be scraped one last time is COMPLETING.
STATES = "RUNNING,COMPLETING"
COMMANDS = (
    ["squeue", "--noheader", f"--states={STATES}", f"--format={discovery.JOBS_FORMAT}"],
    ["squeue", "--noheader", f"--states={STATES}", f"--format={discovery.COMMENTS_FORMAT}"],
    list(NODE_ADDRESSES),
)


@dataclass(frozen=True)
class Discovered:
    """The target groups, the running jobs without a port, and the jobs left out for a forged comment line."""

    groups: list[dict[str, object]]
    without_port: list[str]
    ambiguous: list[str]


def discover(slurm: SlurmClient) -> Discovered:
    """The ``http_sd_configs`` target groups of the running jobs that announce a progress port."""
    results = [slurm.checked(result) for result in slurm.run_all([list(argv) for argv in COMMANDS])]
    jobs = discovery.parse_jobs(results[0].stdout)
    ports, ambiguous = discovery.parse_ports(results[1].stdout, jobs)
    addresses = discovery.parse_node_addresses(results[2].stdout)
    return Discovered(
        groups=discovery.target_groups(jobs, ports, addresses),
        without_port=sorted(set(jobs) - set(ports) - set(ambiguous)),
        ambiguous=ambiguous,
    )
