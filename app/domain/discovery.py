"""Prometheus HTTP service discovery of training jobs' progress endpoints on Slurm: pure parsing and building.

Convention (docs/slurm.md): a job announces the port its progress endpoint (``nightshift_progress``) serves on in
its Slurm comment, ``sbatch --comment=nightshift.progress_port=9464`` (the token may stand anywhere in the comment,
separated by blanks, commas or semicolons). Every node of a running job serves one endpoint on that port, at the
node's ``NodeAddr``. A job without the token, or with a port outside 1..65535, is listed nowhere.

The job owner writes the comment, so nothing else is taken from it: the job ids and node lists come from a
``squeue`` format holding no user text, and a comment line is only matched to a job id that query reported, once
(a comment forging a second line for another job makes that job id appear twice, and the job is left out).

Output: the ``http_sd_configs`` JSON (a list of ``{"targets": [...], "labels": {...}}``), one group per job and
node, labelled with ``__meta_slurm_job_id``, ``__meta_slurm_node``, ``__meta_slurm_partition`` and
``__meta_slurm_user`` (meta labels: available to relabelling, dropped after it, so they never clash with the
labels the job exports itself).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from app.domain.hostlist import HostlistError, expand_hostlist
from app.domain.params import NODE_NAME, SLURM_JOB_ID

PORT_TOKEN = re.compile(r"(?:^|[\s,;])nightshift\.progress_port=([0-9]{1,5})(?=$|[\s,;])")
# A job that answers checkpoint requests says with which signal (a signal it does not handle would terminate it)
# and, as sbatch --signal does, whether it goes to the batch shell (B:USR1) or to the job's steps (USR1).
SIGNAL_TOKEN = re.compile(r"(?:^|[\s,;])nightshift\.checkpoint_signal=((?:B:)?(?:USR1|USR2))(?=$|[\s,;])")
# squeue formats: the first holds no user-controlled text; the second ends with the comment (the rest of the line).
JOBS_FORMAT = "%i %P %u %N"
COMMENTS_FORMAT = "%i %k"
# Bound on the jobs listed (a larger cluster needs a larger bound).
MAX_JOBS = 10_000

_JOB_LINE = re.compile(rf"({SLURM_JOB_ID}) (\S+) (\S+) (\S+)")
_COMMENT_LINE = re.compile(rf"({SLURM_JOB_ID}) (.*)")


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    partition: str
    user: str
    nodes: tuple[str, ...]


def parse_jobs(text: str) -> dict[str, RunningJob]:
    """Running jobs from ``squeue --noheader --format='%i %P %u %N'``; malformed lines are skipped."""
    jobs: dict[str, RunningJob] = {}
    for line in text.splitlines()[:MAX_JOBS]:
        match = _JOB_LINE.fullmatch(line.strip())
        if not match:
            continue
        job_id, partition, user, hostlist = match.groups()
        try:
            nodes = tuple(n for n in expand_hostlist(hostlist) if re.fullmatch(NODE_NAME, n))
        except HostlistError:
            continue
        jobs[job_id] = RunningJob(job_id, partition, user, nodes)
    return jobs


def parse_ports(text: str, job_ids: Iterable[str]) -> tuple[dict[str, int], list[str]]:
    """(job id → port, job ids whose comment line appeared more than once) from
    ``squeue --noheader --format='%i %k'``, for the jobs of ``job_ids`` only."""
    known = set(job_ids)
    lines = [m.groups() for m in map(_COMMENT_LINE.fullmatch, text.splitlines()) if m and m.group(1) in known]
    seen = Counter(job_id for job_id, _ in lines)
    ports: dict[str, int] = {}
    for job_id, comment in lines:
        match = PORT_TOKEN.search(comment)
        if seen[job_id] == 1 and match and 1 <= int(match.group(1)) <= 65535:
            ports[job_id] = int(match.group(1))
    return ports, sorted(job_id for job_id, count in seen.items() if count > 1)


def checkpoint_signal(comment: str) -> str | None:
    """The signal a job's comment announces for checkpoint requests: ``USR1`` (to the job's steps, the processes
    srun started) or ``B:USR1`` (to the batch step: a script that is, or execs, the training process)."""
    match = SIGNAL_TOKEN.search(comment)
    return match.group(1) if match else None


def parse_node_addresses(text: str) -> dict[str, str]:
    """Node name → NodeAddr from ``sinfo --noheader --Node --format='%N %o'`` (one line per node and partition)."""
    addresses: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and re.fullmatch(NODE_NAME, fields[0]):
            addresses.setdefault(fields[0], fields[1])
    return addresses


def target_groups(
    jobs: Mapping[str, RunningJob], ports: Mapping[str, int], addresses: Mapping[str, str]
) -> list[dict[str, object]]:
    """The ``http_sd_configs`` JSON: one group per job (with a port) and node, sorted by job id and node."""
    groups: list[dict[str, object]] = []
    for job_id in sorted(ports, key=lambda j: (len(j), j)):
        job = jobs[job_id]
        for node in job.nodes:
            host = addresses.get(node, node)
            host = f"[{host}]" if ":" in host else host  # an IPv6 NodeAddr
            labels = {
                "__meta_slurm_job_id": job_id,
                "__meta_slurm_node": node,
                "__meta_slurm_partition": job.partition,
                "__meta_slurm_user": job.user,
            }
            groups.append({"targets": [f"{host}:{ports[job_id]}"], "labels": labels})
    return groups
