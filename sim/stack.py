"""The real daemons around Nightshift on loopback, for ``python -m sim.demo`` and the test fixtures.

Launchers: :func:`launch_prometheus`, :func:`launch_alertmanager`, :func:`launch_slurm` (munged, slurmctld, four
slurmd, sshd), :func:`launch_grafana_standin`, :func:`launch_nightshift`; and :func:`launch_stack`, the whole loop
(simulated cluster, Grafana stand-in, Alertmanager, Prometheus with the fast rules, ``nightshift serve``) around a
Slurm cluster. Each launcher binds 127.0.0.1 on free ports, keeps every file under the directory it is given, waits
until its daemon answers, and returns a handle whose ``stop()`` ends it by PID. A launcher that fails stops what it
started and raises AssertionError with the daemon's log tail.

Binaries are looked up with ``find_binary(name, hint)``: :func:`find_binary` raises :class:`MissingBinary`; the test
fixtures pass ``tests.fixtures.procs.require_binary`` (skip locally, fail under ``CI=true``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
import yaml

from app.config import CheckpointSettings, Settings, SlurmSettings
from app.domain import states
from sim import faults, torch_job
from sim.cluster import HPC_JOB_MAPPING, REPO_ROOT, SimCluster, TrainerSpec, launch_sim_cluster
from sim.procs import Daemon, free_port, wait_until
from sim.webhook_sink import WebhookSink

BinaryFinder = Callable[[str, str], str]
START_TIMEOUT = 20.0
SLURM_START_TIMEOUT = 30.0
NIGHTSHIFT_START_TIMEOUT = 30.0
KILL_WAIT_SECONDS = 30  # slurm.conf's KillWait


class MissingBinary(RuntimeError):
    """A daemon's binary is not installed."""


def find_binary(name: str, hint: str = "run `make deps`") -> str:
    """Path of ``name`` on PATH or in /usr/sbin, /usr/bin (daemons live in sbin, often off a user's PATH)."""
    path = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"]))
    if path is None:
        raise MissingBinary(f"{name} not found ({hint})")
    return path


def _started(daemon: Daemon, ready: Callable[[], object], what: str, timeout: float = START_TIMEOUT) -> None:
    """Wait until ``ready``; on timeout stop the daemon and raise with its log tail."""
    try:
        wait_until(lambda: daemon.alive() and ready(), timeout, what)
    except AssertionError as exc:
        daemon.stop()
        raise AssertionError(f"{exc}\n{daemon.log_tail()}") from None


def _http_ok(url: str) -> bool:
    return requests.get(url, timeout=1).status_code == 200


# --- Prometheus --------------------------------------------------------------------------------------------------


def prometheus_config(
    targets: Sequence[str],
    rule_files: Sequence[str | Path] = (),
    alertmanager_url: str | None = None,
    self_address: str | None = None,
    discovered: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A prometheus.yml as a dict: job ``targets`` scrapes ``host:port`` targets every second.

    ``self_address`` adds job ``prometheus`` scraping the server itself (a series that always exists);
    ``discovered`` adds scrape jobs as they are (e.g. ``http_sd_configs``).
    """
    scrape_configs: list[dict[str, Any]] = []
    if self_address:
        scrape_configs.append({"job_name": "prometheus", "static_configs": [{"targets": [self_address]}]})
    if targets:
        scrape_configs.append({"job_name": "targets", "static_configs": [{"targets": list(targets)}]})
    scrape_configs += [dict(job) for job in discovered]
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(Path(path).resolve()) for path in rule_files],
        "scrape_configs": scrape_configs,
    }
    if alertmanager_url:
        parts = urlsplit(alertmanager_url)
        config["alerting"] = {
            "alertmanagers": [
                {
                    "scheme": parts.scheme or "http",
                    "path_prefix": parts.path or "/",
                    "static_configs": [{"targets": [parts.netloc]}],
                }
            ]
        }
    return config


class PrometheusServer:
    """A running Prometheus; ``config`` is the dict in force (copy, change, pass it to :meth:`reload`)."""

    def __init__(self, daemon: Daemon, url: str, config_path: Path, config: dict[str, Any]):
        self.daemon = daemon
        self.url = url
        self.config_path = config_path
        self.config = config

    def reload(self, config: Mapping[str, Any] | None = None) -> None:
        """Write ``config`` (default: the current one, e.g. after editing a rule file) and apply it now."""
        if config is not None:
            self.config = copy.deepcopy(dict(config))
        self.config_path.write_text(yaml.safe_dump(self.config))
        response = requests.post(f"{self.url}/-/reload", timeout=10)
        assert response.status_code == 200, f"reload failed: {response.status_code} {response.text}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now (``metric`` and ``value`` of each series)."""
        response = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = response.json()
        assert body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def alerts(self, name: str | None = None, state: str = "firing") -> list[dict[str, Any]]:
        """Alerts ``name`` (None: every alert) in ``state`` (pending | firing) as the rule manager holds them now."""
        response = requests.get(f"{self.url}/api/v1/alerts", timeout=10)
        response.raise_for_status()
        return [
            alert
            for alert in response.json()["data"]["alerts"]
            if name in (None, alert["labels"].get("alertname")) and alert["state"] == state
        ]

    def log_tail(self) -> str:
        return self.daemon.log_tail()

    def stop(self) -> None:
        self.daemon.stop()


def launch_prometheus(
    base_dir: Path,
    targets: Sequence[str],
    rule_files: Sequence[str | Path] = (),
    alertmanager_url: str | None = None,
    scrape_self: bool = True,
    find_binary: BinaryFinder = find_binary,
    discovered: Sequence[Mapping[str, Any]] = (),
) -> PrometheusServer:
    """Start Prometheus under ``base_dir`` and wait until ``/-/ready``. The caller must ``stop()`` it.

    Prometheus scrapes new targets only about 5 s after start or reload (its discovery manager throttles
    updates), so poll for the first samples.
    """
    binary = find_binary("prometheus", "apt-get install prometheus")
    base_dir.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{free_port()}"
    config = prometheus_config(
        targets,
        rule_files,
        alertmanager_url,
        self_address=address if scrape_self else None,
        discovered=discovered,
    )
    config_path = base_dir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    daemon = Daemon(
        "prometheus",
        [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={base_dir / 'data'}",
            f"--web.listen-address={address}",
            "--web.enable-lifecycle",
            "--log.level=warn",
        ],
        base_dir,
    )
    server = PrometheusServer(daemon, f"http://{address}", config_path, config)
    _started(daemon, lambda: _http_ok(f"{server.url}/-/ready"), "prometheus /-/ready")
    return server


# --- Alertmanager ------------------------------------------------------------------------------------------------

SHIPPED_ALERTMANAGER_CONFIG = REPO_ROOT / "alerts" / "alertmanager.yml"


def nightshift_config(
    webhook_url: str,
    credentials_file: Path,
    group_wait: str = "1s",
    group_interval: str = "1s",
    people_url: str | None = None,
) -> dict[str, Any]:
    """The shipped configuration with the webhook URL, the token file and the group timers replaced.

    ``people_url`` replaces the people receiver's chat webhook URL; without it the people route and receiver are
    dropped (nothing here would answer them). Everything else (grouping, routes, receiver options, inhibition) is
    what ships, so tests and the demo exercise it.
    """
    config = yaml.safe_load(SHIPPED_ALERTMANAGER_CONFIG.read_text())
    config["route"].update(group_wait=group_wait, group_interval=group_interval)
    nightshift, people = config["receivers"]
    (webhook,) = nightshift["webhook_configs"]
    webhook["url"] = webhook_url
    webhook["http_config"]["authorization"]["credentials_file"] = str(credentials_file)
    if people_url is None:
        config["receivers"] = [nightshift]
        config["route"]["receiver"] = nightshift["name"]
        config["route"]["routes"] = [
            r for r in config["route"]["routes"] if r["receiver"] == nightshift["name"]
        ]
    else:
        (chat,) = people["slack_configs"]
        del chat["api_url_file"]
        chat["api_url"] = people_url
    return config


class AlertmanagerServer:
    """A running Alertmanager and its API v2."""

    def __init__(self, daemon: Daemon, url: str, config_path: Path):
        self.daemon = daemon
        self.url = url
        self.config_path = config_path

    def post_alerts(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """POST ``alerts`` (``labels``, ``annotations``, optional ``startsAt``/``endsAt``) as Prometheus does."""
        response = requests.post(f"{self.url}/api/v2/alerts", json=list(alerts), timeout=10)
        assert response.status_code == 200, f"{response.status_code} {response.text}"

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert Alertmanager holds, with ``status.state`` (active|suppressed) and ``status.inhibitedBy``."""
        response = requests.get(f"{self.url}/api/v2/alerts", timeout=10)
        response.raise_for_status()
        return response.json()

    def reload(self, config: Mapping[str, Any]) -> None:
        self.config_path.write_text(yaml.safe_dump(dict(config)))
        response = requests.post(f"{self.url}/-/reload", timeout=10)
        assert response.status_code == 200, f"reload failed: {response.status_code} {response.text}"

    def log_tail(self) -> str:
        return self.daemon.log_tail()

    def stop(self) -> None:
        self.daemon.stop()


def launch_alertmanager(
    base_dir: Path, config: Mapping[str, Any], find_binary: BinaryFinder = find_binary
) -> AlertmanagerServer:
    """Start Alertmanager with ``config`` under ``base_dir`` and wait for ``/-/ready``; the caller stops it."""
    binary = find_binary("prometheus-alertmanager", "apt-get install prometheus-alertmanager")
    base_dir.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{free_port()}"
    config_path = base_dir / "alertmanager.yml"
    config_path.write_text(yaml.safe_dump(copy.deepcopy(dict(config))))
    daemon = Daemon(
        "alertmanager",
        [
            binary,
            f"--config.file={config_path}",
            f"--storage.path={base_dir / 'data'}",
            f"--web.listen-address={address}",
            "--cluster.listen-address=",  # no gossip: it would bind *:9094 and collide between instances
            "--log.level=warn",
        ],
        base_dir,
    )
    server = AlertmanagerServer(daemon, f"http://{address}", config_path)
    _started(daemon, lambda: _http_ok(f"{server.url}/-/ready"), "alertmanager /-/ready")
    return server


# --- Slurm + munge + sshd ----------------------------------------------------------------------------------------

NODES = ("node1", "node2", "node3", "node4")
# Each node's NodeAddr: a loopback address of its own (all of 127.0.0.0/8 reaches this host), so a job's progress
# endpoint is <its node's address>:<the job's port> on every node, as on a real cluster, and a requeue moves it.
NODE_ADDRESSES = {node: f"127.0.0.{index}" for index, node in enumerate(NODES, start=1)}
TOPOLOGY_CONF = """\
SwitchName=leaf0 Nodes=node[1-2]
SwitchName=leaf1 Nodes=node[3-4]
SwitchName=spine Switches=leaf[0-1]
"""

SLURM_CONF = """\
ClusterName=nightshift
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
AuthType=auth/munge
CredType=cred/munge
# cred_expire=5 with bf_interval=1 makes a requeued job eligible again after ~6 s instead of ~141 s.
AuthInfo=socket={base}/munge/munge.socket,cred_expire=5
StateSaveLocation={base}/slurm/state
SlurmdSpoolDir={base}/slurm/spool-%n
SlurmctldPidFile={base}/slurm/slurmctld.pid
SlurmdPidFile={base}/slurm/slurmd-%n.pid
SlurmctldLogFile={base}/slurm/log/slurmctld.log
SlurmdLogFile={base}/slurm/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
SlurmctldTimeout=30
SlurmdTimeout=30
# Seconds between a cancelled job's SIGTERM and its SIGKILL (Slurm's default, said here: reset() waits on it).
KillWait={kill_wait}
# dcgm-exporter's HPC job mapping, written on every node of a job at allocation (deploy/slurm/hpc-job-mapping.sh,
# configured by the .conf beside it: SlurmCluster.attach_sim).
Prolog={base}/slurm/hpc-job-mapping.sh
Epilog={base}/slurm/hpc-job-mapping.sh
PrologFlags=Alloc
# Two leaf switches under a spine (topology.conf beside this file): `scontrol show topology` answers with them.
TopologyPlugin=topology/tree
{node_lines}
PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP
"""
NODE_LINE = (
    "NodeName={name} NodeHostname=localhost NodeAddr={addr} Port={port} "
    "CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN"
)

SSHD_CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {base}/ssh/host_ed25519_key
PidFile {base}/ssh/sshd.pid
AuthorizedKeysFile {base}/ssh/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
SetEnv SLURM_CONF={slurm_conf} HOME={base}/ssh/home
LogLevel VERBOSE
"""
# The login shell of SSH commands (`bash -lc`) reads $HOME/.profile after /etc/profile has reset PATH: it puts the
# simulator's node tools (dcgmi) first and points them at the simulated cluster attached to this Slurm.
SSH_PROFILE = """\
PATH="{bin}:$PATH"
SIM_STATE_DIR="{sim_state}"
export PATH SIM_STATE_DIR
"""
# The simulator's node tools, as executables on the PATH of SSH commands: `dcgmi` runs sim.dcgmi.
TOOL_SHIM = """\
#!/bin/sh
PYTHONPATH={repo} exec {python} -m {module} "$@"
"""
NODE_TOOLS = {"dcgmi": "sim.dcgmi"}


@dataclass
class SlurmCluster:
    """The running cluster. ``settings`` reach it over SSH; the methods drive it locally (setup, checks)."""

    base: Path
    env: dict[str, str]
    settings: Settings
    ssh_port: int
    client_key: Path
    known_hosts: Path
    jobs_dir: Path
    checkpoint_root: Path
    daemons: dict[str, Daemon] = field(default_factory=dict)

    @property
    def sim_state(self) -> Path:
        """The link to the state directory of the simulated cluster attached to this Slurm (:meth:`attach_sim`),
        which the node tools on the SSH commands' PATH (dcgmi) read as ``$SIM_STATE_DIR``."""
        return self.base / "sim-state"

    def attach_sim(self, state_dir: Path | None) -> None:
        """Point the node tools at the simulated cluster of ``state_dir`` (None: at none; dcgmi then cannot
        reach a host engine), and the prolog/epilog's HPC job mapping at its ``hpc-jobs/<node>`` directories,
        which its exporters read (None: at ``base/hpc-jobs``, read by nobody)."""
        link = self.sim_state
        link.unlink(missing_ok=True)
        if state_dir is not None:
            link.symlink_to(state_dir.resolve(), target_is_directory=True)
        _write_mapping_conf(self.base, state_dir)

    def command(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command here, against this cluster."""
        return subprocess.run(
            argv, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=30, check=check
        )

    def sbatch(self, wrap: str | None = None, *args: str, script: str | None = None) -> str:
        """Submit ``--wrap`` text or a script (file contents) with extra sbatch ``args``; the job id.

        The job's output goes to ``jobs_dir/<id>.out``."""
        argv = ["sbatch", "--parsable", f"--chdir={self.jobs_dir}", f"--output={self.jobs_dir}/%j.out", *args]
        if script is not None:
            path = Path(tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.jobs_dir)[1])
            path.write_text(script)
            argv.append(str(path))
        else:
            assert wrap is not None, "sbatch needs wrap text or a script"
            argv.append(f"--wrap={wrap}")
        return self.command(*argv).stdout.strip().split(";")[0]

    def squeue_state(self, job_id: str) -> str:
        """RUNNING, PENDING, COMPLETING, CANCELLED...; "" once Slurm forgot the job."""
        result = self.command(
            "squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--format=%T", check=False
        )
        return result.stdout.strip() if result.returncode == 0 else ""

    def job_nodes(self, job_id: str) -> str:
        """The job's node list as squeue prints it (a hostlist expression: ``node[1-2]``)."""
        return self.command(
            "squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--format=%N"
        ).stdout.strip()

    def job_node_list(self, job_id: str) -> list[str]:
        """The names of the job's nodes (``scontrol show hostnames`` of :meth:`job_nodes`), [] when it has none."""
        hostlist = self.job_nodes(job_id)
        return self.command("scontrol", "show", "hostnames", hostlist).stdout.split() if hostlist else []

    def job_field(self, job_id: str, name: str) -> str:
        """One field of ``scontrol show job`` (``Restarts``, ``ExcNodeList``: ``(null)`` when unset)."""
        record = self.command("scontrol", "show", "job", "--oneliner", job_id).stdout
        match = re.search(rf"(?:^|\s){name}=(\S*)", record)
        assert match, f"no {name}= in {record!r}"
        return match.group(1)

    def job_restarts(self, job_id: str) -> int:
        """How many times the job was requeued (``Restarts=`` of ``scontrol show job``)."""
        return int(self.job_field(job_id, "Restarts"))

    def job_excluded_nodes(self, job_id: str) -> list[str]:
        """The names of the nodes the job may not run on (``ExcNodeList=``, a hostlist), [] when none."""
        hostlist = self.job_field(job_id, "ExcNodeList")
        if hostlist in ("", "(null)"):
            return []
        return self.command("scontrol", "show", "hostnames", hostlist).stdout.split()

    def node_state(self, node: str) -> str:
        """scontrol's state, lower case: idle, mixed, idle+drain, mixed+drain, idle+not_responding...

        Not sinfo's: right after a requeued job ends, 22.05's sinfo can report its first node as mixed for
        ~20 s while scontrol already shows it idle with no CPU allocated."""
        record = self.command("scontrol", "show", "node", "--oneliner", node).stdout
        match = re.search(r"(?:^|\s)State=(\S+)", record)
        assert match, f"no State= in {record!r}"
        return match.group(1).lower()

    def node_reason(self, node: str) -> str:
        """The drain reason as sinfo shows it (without scontrol's [user@time] suffix)."""
        return self.command("sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%E").stdout.strip()

    def reset(self) -> None:
        """Cancel every job and resume every drained or down node; wait until every node is idle."""
        jobs = self.command("squeue", "--noheader", "--format=%i").stdout.split()
        if jobs:
            self.command("scancel", *jobs)
        for node in NODES:
            state = self.node_state(node).split("+")
            if "drain" in state or state[0] == "down":
                self.command("scontrol", "update", f"NodeName={node}", "State=RESUME")
        seen: list[tuple[list[str], str]] = []

        def settled() -> bool:
            seen.append(
                ([self.node_state(node) for node in NODES], self.command("squeue", "--noheader").stdout)
            )
            return seen[-1] == (["idle"] * len(NODES), "")

        try:
            # A cancelled job's processes get SIGTERM, then SIGKILL after Slurm's KillWait (30 s by default): its
            # node shows completing until they are gone (four torch processes take a while on two loaded cores).
            wait_until(settled, timeout=KILL_WAIT_SECONDS + 30, what="idle nodes and an empty queue")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nlast seen: {seen[-3:]}\n{self.log_tails()}") from None

    def log_tails(self, lines: int = 25) -> str:
        """The last lines of every daemon's output and of Slurm's own log files."""
        tails = [(name, daemon.log_tail(lines)) for name, daemon in self.daemons.items()]
        for path in sorted((self.base / "slurm" / "log").glob("*.log")):
            tails.append((path.name, "\n".join(path.read_text(errors="replace").splitlines()[-lines:])))
        return "\n".join(f"--- {name} ---\n{text}" for name, text in tails)

    def stop(self) -> None:
        """Cancel the jobs (their processes belong to slurmstepd, not to a daemon's process group), then stop
        every daemon by PID, newest first."""
        if self.daemons.get("slurmctld") and self.daemons["slurmctld"].alive():
            jobs = self.command("squeue", "--noheader", "--format=%i", check=False).stdout.split()
            if jobs:
                self.command("scancel", *jobs, check=False)
                with contextlib.suppress(AssertionError):  # stop the daemons anyway
                    wait_until(
                        lambda: not self.command("squeue", "--noheader").stdout.strip(), 15, "jobs to end"
                    )
        for daemon in reversed(list(self.daemons.values())):
            daemon.stop()


def _write_node_tools(base: Path) -> Path:
    """The shims of :data:`NODE_TOOLS` in ``base/bin`` (run with this Python, importing this repository)."""
    bin_dir = base / "bin"
    bin_dir.mkdir()
    for name, module in NODE_TOOLS.items():
        shim = bin_dir / name
        shim.write_text(
            TOOL_SHIM.format(
                repo=shlex.quote(str(REPO_ROOT)), python=shlex.quote(sys.executable), module=module
            )
        )
        shim.chmod(0o755)
    return bin_dir


def _write_mapping_conf(base: Path, state_dir: Path | None) -> None:
    """The configuration of deploy/slurm/hpc-job-mapping.sh, beside the link slurm.conf names as Prolog/Epilog."""
    root = (state_dir.resolve() if state_dir is not None else base) / "hpc-jobs"
    conf = f"HPC_JOB_MAPPING_DIR={root}/%n\nNODE_GPUS=0-7\nLOG_FILE={base}/slurm/log/hpc-job-mapping.log\n"
    (base / "slurm" / "hpc-job-mapping.conf").write_text(conf)


def _write_ssh_files(base: Path, port: int, slurm_conf: Path, keygen: str) -> tuple[Path, Path]:
    ssh_dir = base / "ssh"
    ssh_dir.mkdir()
    (ssh_dir / "home").mkdir()
    profile = SSH_PROFILE.format(bin=_write_node_tools(base), sim_state=base / "sim-state")
    (ssh_dir / "home" / ".profile").write_text(profile)
    for name in ("host_ed25519_key", "client_ed25519"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(ssh_dir / name)], check=True)
    shutil.copy(ssh_dir / "client_ed25519.pub", ssh_dir / "authorized_keys")
    host_key = (ssh_dir / "host_ed25519_key.pub").read_text().split()
    known_hosts = ssh_dir / "known_hosts"
    # Non-22 ports are listed as [host]:port.
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
    (ssh_dir / "sshd_config").write_text(SSHD_CONFIG.format(port=port, base=base, slurm_conf=slurm_conf))
    return ssh_dir / "client_ed25519", known_hosts


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _start(cluster: SlurmCluster, name: str, argv: Sequence[str]) -> Daemon:
    daemon = Daemon(name, argv, cluster.base / "log", env=cluster.env)
    cluster.daemons[name] = daemon
    return daemon


def _ready(cluster: SlurmCluster, check: Callable[[], object], what: str) -> None:
    dead = [name for name, daemon in cluster.daemons.items() if not daemon.alive()]
    assert not dead, f"{', '.join(dead)} exited while starting\n{cluster.log_tails()}"
    try:
        wait_until(check, SLURM_START_TIMEOUT, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.log_tails()}") from None


def launch_slurm(base: Path, find_binary: BinaryFinder = find_binary) -> SlurmCluster:
    """Start munged, slurmctld, slurmd node1..node4 (each at its own loopback address, :data:`NODE_ADDRESSES`,
    and told apart by its ``Port=``; Prolog/Epilog: deploy/slurm/hpc-job-mapping.sh) and an
    sshd whose ``SetEnv SLURM_CONF`` reaches commands run under ``bash -lc``, all state under ``base``. Those
    commands also find the simulator's node tools (``dcgmi``, :data:`NODE_TOOLS`) on their PATH, through the
    ``.profile`` of the home directory the sshd gives them; :meth:`SlurmCluster.attach_sim` points the tools at a
    simulated cluster.

    ``base`` may exist but must be empty, and every directory above it must be world-executable: munged
    insists on that for its socket. The caller must ``stop()`` the cluster.
    """
    hint = "apt-get install slurmctld slurmd slurm-client munge openssh-server"
    names = ("munged", "mungekey", "slurmctld", "slurmd", "sshd", "ssh-keygen")
    binaries = {name: find_binary(name, hint) for name in names}
    for directory in ("munge", "slurm/state", "slurm/log", "log", "jobs", "checkpoints"):
        (base / directory).mkdir(parents=True)
    (base / "munge").chmod(0o755)
    (base / "jobs").chmod(0o1777)  # jobs of other users (tests) write their output here
    key = base / "munge" / "munge.key"
    subprocess.run([binaries["mungekey"], "--create", f"--keyfile={key}"], check=True)
    key.chmod(0o400)

    ctld_port, ssh_port, *node_ports = (free_port() for _ in range(2 + len(NODES)))
    slurm_conf = base / "slurm" / "slurm.conf"
    node_lines = "\n".join(
        NODE_LINE.format(name=n, port=p, addr=NODE_ADDRESSES[n])
        for n, p in zip(NODES, node_ports, strict=True)
    )
    slurm_conf.write_text(
        SLURM_CONF.format(
            base=base,
            ctld_port=ctld_port,
            node_lines=node_lines,
            nodes=",".join(NODES),
            kill_wait=KILL_WAIT_SECONDS,
        )
    )
    (base / "slurm" / "topology.conf").write_text(TOPOLOGY_CONF)
    client_key, known_hosts = _write_ssh_files(base, ssh_port, slurm_conf, binaries["ssh-keygen"])
    (base / "slurm" / "hpc-job-mapping.sh").symlink_to(HPC_JOB_MAPPING)  # the shipped script, run by slurmd
    _write_mapping_conf(base, None)
    settings = Settings(
        data_dir=str(base / "data"),
        slurm=SlurmSettings(
            host="127.0.0.1",
            port=ssh_port,
            user="root",
            key_file=str(client_key),
            known_hosts_file=str(known_hosts),
            connect_timeout_seconds=5.0,
            command_timeout_seconds=20.0,
            login_shell=True,
            node_ssh_host="127.0.0.1",  # every node's commands (a validation) run through the one sshd
        ),
        checkpoint=CheckpointSettings(allowed_roots=[str(base / "checkpoints")]),
    )
    cluster = SlurmCluster(
        base=base,
        env={"SLURM_CONF": str(slurm_conf)},
        settings=settings,
        ssh_port=ssh_port,
        client_key=client_key,
        known_hosts=known_hosts,
        jobs_dir=base / "jobs",
        checkpoint_root=base / "checkpoints",
    )
    try:
        munge = base / "munge"
        _start(
            cluster,
            "munged",
            [
                binaries["munged"], "-F", f"--key-file={key}", f"--socket={munge}/munge.socket",
                f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/munged.seed",
                f"--log-file={munge}/munged.log",
            ],
        )  # fmt: skip
        _ready(cluster, lambda: (munge / "munge.socket").exists(), "munged socket")
        _start(cluster, "slurmctld", [binaries["slurmctld"], "-D", "-f", str(slurm_conf)])
        _ready(
            cluster, lambda: "UP" in cluster.command("scontrol", "ping", check=False).stdout, "slurmctld UP"
        )
        for node in NODES:
            _start(cluster, f"slurmd-{node}", [binaries["slurmd"], "-D", "-N", node, "-f", str(slurm_conf)])
        _ready(cluster, lambda: all(cluster.node_state(n) == "idle" for n in NODES), "every slurmd idle")
        # sshd refuses to start without its compiled-in privilege separation directory.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        sshd_config = base / "ssh" / "sshd_config"
        subprocess.run([binaries["sshd"], "-t", "-f", str(sshd_config)], check=True)
        # -D: stay in the foreground (stoppable by PID); -e: log to stderr, i.e. the daemon log file.
        _start(cluster, "sshd", [binaries["sshd"], "-D", "-e", "-f", str(sshd_config)])
        _ready(cluster, lambda: _port_open(ssh_port), "sshd listening")
    except BaseException:
        cluster.stop()
        raise
    return cluster


# --- Grafana stand-in --------------------------------------------------------------------------------------------


class GrafanaStandin:
    """A running ``sim.grafana_standin`` and the annotations it holds."""

    def __init__(self, daemon: Daemon, url: str, token_file: Path):
        self.daemon = daemon
        self.url = url
        self.token_file = token_file

    def annotations(self, *tags: str) -> list[dict[str, Any]]:
        """Annotations carrying every one of ``tags``, newest first (``id``, ``time``, ``timeEnd``, ``tags``...)."""
        response = requests.get(
            f"{self.url}/api/annotations",
            params={"tags": list(tags), "limit": "1000"},
            headers={"Authorization": f"Bearer {self.token_file.read_text().strip()}"},
            timeout=5,
        )
        response.raise_for_status()
        return response.json()

    def log_tail(self) -> str:
        return self.daemon.log_tail()

    def stop(self) -> None:
        self.daemon.stop()


def launch_grafana_standin(base_dir: Path, token_file: Path) -> GrafanaStandin:
    """Start the Grafana stand-in, expecting the service-account token in ``token_file``."""
    base_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [sys.executable, "-m", "sim.grafana_standin", "--port", str(port), "--token-file", str(token_file)]
    daemon = Daemon("grafana-standin", argv, base_dir, cwd=REPO_ROOT)
    standin = GrafanaStandin(daemon, f"http://127.0.0.1:{port}", token_file)
    _started(daemon, lambda: _http_ok(f"{standin.url}/api/health"), "grafana stand-in /api/health")
    return standin


# --- Nightshift --------------------------------------------------------------------------------------------------


class NightshiftServer:
    """A running ``nightshift serve`` and the reads of its JSON API the demo and the e2e tests make."""

    def __init__(self, daemon: Daemon, url: str, settings_path: Path, reader_token: str | None = None):
        self.daemon = daemon
        self.url = url
        self.settings_path = settings_path
        self.reader_token = reader_token  # reads of the API need a viewer (or operator) token

    def get(self, path: str, **params: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.reader_token}"} if self.reader_token else {}
        response = requests.get(f"{self.url}{path}", params=params, headers=headers, timeout=10)
        response.raise_for_status()
        return response.json()

    def incidents(self, **filters: Any) -> list[dict[str, Any]]:
        """Incidents, newest first (filters: state, outcome, playbook, node, job)."""
        return self.get("/api/v1/incidents", **filters)["incidents"]

    def incident(self, incident_id: int) -> dict[str, Any]:
        """``incident``, ``alerts``, ``steps`` and ``ledger`` of one incident."""
        return self.get(f"/api/v1/incidents/{incident_id}")

    def metrics(self) -> str:
        response = requests.get(f"{self.url}/metrics", timeout=10)
        response.raise_for_status()
        return response.text

    def log_tail(self) -> str:
        return self.daemon.log_tail()

    def stop(self) -> None:
        self.daemon.stop()


def launch_nightshift(
    base_dir: Path, settings: Mapping[str, Any], port: int | None = None, workers: int = 2
) -> NightshiftServer:
    """Write ``settings`` to ``base_dir/settings.yaml`` and run ``nightshift serve`` on it; wait for /readyz."""
    base_dir.mkdir(parents=True, exist_ok=True)
    settings_path = base_dir / "settings.yaml"
    settings_path.write_text(yaml.safe_dump(dict(settings), sort_keys=False))
    port = port or free_port()
    argv = [sys.executable, "-m", "app.cli", "serve", "--config", str(settings_path)]
    argv += ["--bind", f"127.0.0.1:{port}", "--workers", str(workers), "--threads", "4"]
    daemon = Daemon("nightshift", argv, base_dir, cwd=REPO_ROOT)
    token_file = settings.get("access", {}).get("viewer_token_file") or settings.get("operator_token_file")
    token = Path(token_file).read_text().strip() if token_file else None
    server = NightshiftServer(daemon, f"http://127.0.0.1:{port}", settings_path, token)
    _started(daemon, lambda: _http_ok(f"{server.url}/readyz"), "nightshift /readyz", NIGHTSHIFT_START_TIMEOUT)
    return server


# --- fast playbooks ----------------------------------------------------------------------------------------------

PLAYBOOKS = REPO_ROOT / "playbooks"
FAST_RULES = sorted((REPO_ROOT / "rules" / "sim").glob("*.yml"))
# The fast rules (rules/sim/) judge a job over 10 s windows, the shipped playbooks over minutes.
FAST_WINDOW = "10s"
# Longer than FAST_WINDOW: the first verification poll, one interval after the last step, then only sees samples
# written after the steps, so progress from before the fault (or by the process that was just killed) cannot pass.
FAST_VERIFY_INTERVAL = "12s"
FAST_VERIFY_TIMEOUT = "3m"
# Repair states in which a node stays until a person acts (held) or that end a repair (the API's words for them).
REPAIR_SETTLED = frozenset(str(state) for state in states.REPAIR_SETTLED)
REPAIR_DEFERRED = "deferred"  # return_node's word for a repair a guard keeps from taking its node out
# The checkpoint root the shipped playbooks name (``<root>/<train_job>``, a site adjusts it).
SHIPPED_CHECKPOINT_ROOT = "/shared/checkpoints"
_MINUTE_RANGE = re.compile(r"\[\d+[mh]\]")


def fast_playbooks(dest: Path, source: Path = PLAYBOOKS, checkpoint_root: Path | None = None) -> Path:
    """Copy the playbooks of ``source`` into ``dest`` with PromQL range windows (``[2m]``) in ``recheck`` and
    ``verify`` shortened to :data:`FAST_WINDOW` and verification polled every :data:`FAST_VERIFY_INTERVAL`, to
    match the fast rules, node repairs that this cluster can run (:func:`_simulated_repair`), and (with
    ``checkpoint_root``) the shipped checkpoint root (:data:`SHIPPED_CHECKPOINT_ROOT`) replaced by the simulated
    cluster's in the steps' ``dir`` (checkpoint.rollback, checkpoint.latest). Everything else
    is unchanged; ``source`` is never edited. Returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.glob("*.yaml")):
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        for doc in documents:
            if doc.get("node_repair") and doc["target"]["scheduler"] == "slurm":
                _simulated_repair(doc["node_repair"])
            for step in doc.get("steps", []) if checkpoint_root else ():
                where = step.get("with", {})
                if isinstance(where.get("dir"), str) and where["dir"].startswith(SHIPPED_CHECKPOINT_ROOT):
                    where["dir"] = str(checkpoint_root) + where["dir"][len(SHIPPED_CHECKPOINT_ROOT) :]
            for step in doc.get("collect", []):
                if (
                    step["action"] == "slurm.job_stacks"
                ):  # py-spy is this repository's (its dev extra), not on PATH
                    step["with"]["py_spy"] = str(Path(sys.executable).with_name("py-spy"))
            if doc.get("recheck"):
                doc["recheck"] = _MINUTE_RANGE.sub(f"[{FAST_WINDOW}]", doc["recheck"])
            if doc.get("verify"):
                doc["verify"]["promql"] = _MINUTE_RANGE.sub(f"[{FAST_WINDOW}]", doc["verify"]["promql"])
                doc["verify"].update(interval=FAST_VERIFY_INTERVAL, timeout=FAST_VERIFY_TIMEOUT)
        header = (
            f"# GENERATED from {path.relative_to(REPO_ROOT)} by sim.stack.fast_playbooks: recheck/verify windows"
            f" shortened to {FAST_WINDOW} for the fast rules (rules/sim/); Slurm node repairs without reboot,"
            f" validated by `{SIM_VALIDATION}`.\n"
        )
        (dest / path.name).write_text(header + yaml.safe_dump_all(documents, sort_keys=False, width=1000))
    return dest


# The validation of a Slurm node in the simulator: every node's commands go through one sshd, so the command names
# the node it validates (sim.dcgmi's --host, as dcgmi reaches a host engine).
SIM_VALIDATION = "dcgmi diag -r 2 --host {{ node.name }}"
SIM_VALIDATION_TIMEOUT = 60


def _simulated_repair(section: dict[str, Any]) -> None:
    """Make a Slurm ``node_repair`` section runnable here: no ``slurm.reboot_node`` step (the slurmd of this
    cluster share one machine, whose boot time never moves, so slurmctld would never see a reboot end; a real
    cluster reboots), and the validation names its node (:data:`SIM_VALIDATION`) with a short timeout."""
    section["repair"] = [step for step in section.get("repair", []) if step["action"] != "slurm.reboot_node"]
    validate = section.get("validate")
    if validate and validate["action"] == "slurm.validate_node":
        validate["with"].update(command=SIM_VALIDATION, timeout_seconds=SIM_VALIDATION_TIMEOUT)


# --- the whole loop ----------------------------------------------------------------------------------------------

PERMISSIONS_EXAMPLE = REPO_ROOT / "examples" / "permissions.yaml"
# Granted in the stack beyond the example, so node repairs run (validate, then resume) instead of advising.
REPAIR_GRANTS = """\
  - action: slurm.validate_node
    nodes: "node[0-9]+"
"""
# The trainer's identity under Slurm comes from SLURMD_NODENAME and SLURM_JOB_ID (they change on a requeue), its
# place in the job from SLURM_PROCID and SLURM_NTASKS (srun sets them per rank).
_IDENTITY_OPTIONS = ("--hostname", "--slurm-job-id", "--rank", "--world-size")


def batch_argv(spec: TrainerSpec) -> list[str]:
    """The trainer's command line for a Slurm batch job: ``spec.argv()`` without the identity options."""
    argv = spec.argv()
    for option in _IDENTITY_OPTIONS:
        index = argv.index(option)
        del argv[index : index + 2]
    return argv


def submit_trainer_job(slurm: SlurmCluster, spec: TrainerSpec, nodes: Sequence[str]) -> str:
    """Submit ``spec`` as a requeueable batch job pinned to ``nodes``; the job id. One node: the batch script
    runs the trainer. Several: ``sbatch --nodes=N --ntasks-per-node=1 -w node1,node2`` and ``srun`` starts one
    rank per node, which takes its rank, world size, node and job id from srun's environment. A spec with one
    ``port`` for every node announces it in the job's comment (``nightshift.progress_port``, the convention
    Nightshift's service discovery reads)."""
    launcher = "srun " if len(nodes) > 1 else ""
    comment = [f"nightshift.progress_port={spec.port}"] if spec.port and not spec.node_ports else []
    # sim.trainer checkpoints when asked (planned swaps): the ranks srun started, or the batch step that execs it
    comment.append(f"nightshift.checkpoint_signal={'USR1' if len(nodes) > 1 else 'B:USR1'}")
    announce = [f"--comment={','.join(comment)}"]
    wrap = f"cd {shlex.quote(str(REPO_ROOT))} && exec {launcher}{shlex.join(batch_argv(spec))}"
    placement = [f"--nodes={len(nodes)}", "--ntasks-per-node=1"] if len(nodes) > 1 else []
    # --open-mode=append: a requeued run adds to the log instead of replacing the first run's lines.
    return slurm.sbatch(
        wrap,
        "--requeue",
        *placement,
        f"--nodelist={','.join(nodes)}",
        f"--job-name={spec.name}",
        "--open-mode=append",
        *announce,
    )


def _secret_file(path: Path) -> Path:
    path.write_text(secrets.token_urlsafe(24) + "\n")
    path.chmod(0o600)
    return path


@dataclass
class Stack:
    """The whole loop on loopback around a Slurm cluster; :meth:`close` stops what :func:`launch_stack` started
    (and cancels the jobs submitted through it), not the Slurm cluster."""

    base: Path
    slurm: SlurmCluster
    sim: SimCluster
    grafana: GrafanaStandin
    alertmanager: AlertmanagerServer
    prometheus: PrometheusServer
    nightshift: NightshiftServer
    playbooks: Path
    operator_token_file: Path
    notices: (
        WebhookSink  # what people hear: Nightshift's notifications (/notify), Alertmanager's chat (/people)
    )
    jobs: list[str] = field(default_factory=list)
    closers: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def submit_trainer(self, name: str, nodes: str | Sequence[str], **options: Any) -> str:
        """Submit ``sim.trainer`` to ``nodes`` (a node name, or several for a multi-node job) with
        :func:`submit_trainer_job`; the job id. The job gets a port of its own, announced in its comment
        (``nightshift.progress_port``); each rank serves metrics on that port at its node's address
        (:data:`NODE_ADDRESSES`), where Prometheus finds it through Nightshift's service discovery, and
        checkpoints under ``sim/checkpoints/<name>/``.
        ``options`` are :class:`TrainerSpec` fields (step_seconds, checkpoint_every...); ``exit_on_gpu_fault``
        defaults to True for a multi-node job (a fatal Xid on one of its nodes ends every rank with its NCCL
        error) and to False for one node (the job keeps stepping; the exporter shows the fault)."""
        names = [nodes] if isinstance(nodes, str) else list(nodes)
        options.setdefault("exit_on_gpu_fault", len(names) > 1)
        spec = TrainerSpec(
            name=name,
            port=free_port(),
            node_hosts=tuple(NODE_ADDRESSES.items()),
            state_dir=self.sim.state_dir,
            checkpoint_dir=self.sim.base_dir / "checkpoints" / name,
            hostname="",
            **options,
        )
        job = submit_trainer_job(self.slurm, spec, names)
        self.jobs.append(job)
        return job

    def submit_torch(
        self, name: str, nodes: Sequence[str], sbatch_args: Sequence[str] = (), **options: Any
    ) -> str:
        """Submit a real ``torch.distributed`` job (:mod:`sim.torch_job`: sbatch → srun → torchrun →
        :mod:`sim.torch_trainer`) to ``nodes``; the job id. Like :meth:`submit_trainer`, it serves its metrics on a
        port of its own at each node's address and checkpoints (DCP) under ``sim/checkpoints/<name>/``.
        ``options`` are :class:`sim.torch_job.TorchJobSpec` fields (strategy, max_restarts, step_seconds...);
        ``sbatch_args`` more sbatch options (``--time=2``)."""
        spec = torch_job.TorchJobSpec(
            name=name,
            port=free_port(),
            rdzv_port=free_port(),
            state_dir=self.sim.state_dir,
            checkpoint_dir=self.checkpoint_dir(name),
            node_hosts=NODE_ADDRESSES,
            **options,
        )
        job = torch_job.submit(self.slurm, spec, nodes, self.base / "torch-jobs" / name, *sbatch_args)
        self.jobs.append(job)
        return job

    def return_node(self, node: str, timeout: float = 180) -> None:
        """Wait until Nightshift's repair of ``node`` (if it opened one) settles; release it as an operator when it
        is held (``POST /api/v1/nodes/<node>/release``, what a person does once the node is fixed), and wait until
        Slurm has it idle again. For scenarios that share a cluster after a culprit node was taken out.

        A repair that a guard defers before the node is taken out (still ``requested``, the guard's reason in
        ``held_reason``) does not settle by itself: the blast radius lets one node of this 4-node partition out per
        hour (``guards.blast_radius_max_share`` 25%), so a second culprit node within the hour waits for the window
        to pass. A person who knows the node is fine holds it and releases it: nothing of ours to undo."""

        def settled() -> str | None:
            try:
                current = self.nightshift.get(f"/api/v1/nodes/{node}")["current"]
            except requests.HTTPError:
                return "none"  # no repair of the node
            if current["state"] == "requested" and current.get("held_reason"):
                return REPAIR_DEFERRED
            return current["state"] if current["state"] in REPAIR_SETTLED else None

        state = wait_until(settled, timeout, f"{node}'s repair to settle")
        if state == REPAIR_DEFERRED:
            self._operator(node, "hold", "its repair waits at a guard: held by the test between scenarios")
            state = "held"
        if state == "held":
            self._operator(node, "release", "fixed by the test between scenarios")
        wait_until(lambda: "drain" not in self.slurm.node_state(node), timeout, f"{node} back in service")

    def _operator(self, node: str, verb: str, reason: str, timeout: float = 30) -> None:
        """``POST /api/v1/nodes/<node>/<verb>`` as the operator (hold, release); again while a step of the node's
        repair is in flight (409), at most ``timeout`` seconds."""
        token = self.operator_token_file.read_text().strip()

        def done() -> requests.Response | None:
            response = requests.post(
                f"{self.nightshift.url}/api/v1/nodes/{node}/{verb}",
                json={"reason": reason},
                headers={"Authorization": f"Bearer {token}"},
                timeout=10,
            )
            return response if response.status_code != 409 else None

        response: requests.Response = wait_until(done, timeout, f"{verb} {node}")  # type: ignore[assignment]
        assert response.status_code == 200, f"{verb} {node}: {response.status_code} {response.text}"

    def checkpoint_dir(self, name: str) -> Path:
        """Where job ``name`` checkpoints (under checkpoint.allowed_roots)."""
        return self.sim.base_dir / "checkpoints" / name

    def wait_running(
        self, job: str, nodes: Sequence[str] | None = None, avoid: Sequence[str] = (), timeout: float = 60
    ) -> list[str]:
        """Wait until ``job`` is RUNNING on exactly ``nodes`` (any nodes when None) and on none of ``avoid``;
        its node names."""

        def running() -> list[str] | None:
            if self.slurm.squeue_state(job) != "RUNNING":
                return None
            names = self.slurm.job_node_list(job)
            placed = nodes is None or sorted(names) == sorted(nodes)
            return names if names and placed and not set(names) & set(avoid) else None

        where = f" on {','.join(nodes)}" if nodes else ""
        avoiding = f", not on {','.join(avoid)}" if avoid else ""
        return wait_until(running, timeout, f"job {job} RUNNING{where}{avoiding}")  # type: ignore[return-value]

    def wait_training(self, job: str, nodes: str | Sequence[str], timeout: float = 60) -> int:
        """Wait until ``job`` runs on ``nodes``, Prometheus scrapes its steps on each, and each node's GPUs are
        mapped to it (dcgm-exporter's ``hpc_job``: only then does a GPU alert name the job); the lowest step
        Prometheus saw."""
        names = [nodes] if isinstance(nodes, str) else list(nodes)
        self.wait_running(job, names, timeout=timeout)
        steps = []
        for node in names:
            selector = f'slurm_job_id="{job}",Hostname="{node}"'
            found = wait_until(
                functools.partial(self.prometheus.query, f"training_step_total{{{selector}}} > 0"),
                timeout,
                f"job {job}'s steps on {node} in Prometheus",
            )
            steps.append(int(float(found[0]["value"][1])))  # type: ignore[index]
            wait_until(
                functools.partial(
                    self.prometheus.query, f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{node}",hpc_job="{job}"}}'
                ),
                timeout,
                f"{node}'s GPUs mapped to job {job}",
            )
        return min(steps)

    def inject_xid(self, node: str, xid: int = 79, gpu: int = 3) -> faults.XidEvent:
        """An Xid on ``node``'s GPU ``gpu`` (:func:`sim.faults.inject_xid`): the exporter reports it, the ranks of
        a multi-node job there fail, and ``dcgmi diag`` on the node fails while it is not cleared."""
        return faults.inject_xid(self.sim.state_dir, node, gpu, xid)

    def inject_validation(self, node: str, verdict: str) -> None:
        """Make ``dcgmi diag`` on ``node`` end ``verdict`` (fail | pass | hang) whatever its faults."""
        faults.inject_validation(self.sim.state_dir, node, verdict)

    def wait_window(self, job: str, node: str, timeout: float = 60) -> None:
        """Wait until the job's series on ``node`` is older than the fast rules' window: TrainingHang (``offset
        10s`` in the rule) cannot fire for a job younger than that."""
        wait_until(
            lambda: self.prometheus.query(
                f'training_step_total{{slurm_job_id="{job}",Hostname="{node}"}} offset {FAST_WINDOW}'
            ),
            timeout,
            f"job {job} on {node} for {FAST_WINDOW}",
        )

    def wait_incident(self, playbook: str, after: int = 0, timeout: float = 30) -> dict[str, Any]:
        """The oldest incident of ``playbook`` with an id above ``after``, once Nightshift has opened it."""

        def opened() -> dict[str, Any] | None:
            newer = [i for i in self.nightshift.incidents(playbook=playbook) if i["id"] > after]
            return min(newer, key=lambda i: i["id"]) if newer else None

        return wait_until(opened, timeout, f"an incident of playbook {playbook}")  # type: ignore[return-value]

    def wait_closed(self, incident_id: int, timeout: float = 90) -> dict[str, Any]:
        """The incident (``incident``, ``alerts``, ``steps``, ``ledger``) once it has an outcome."""

        def closed() -> dict[str, Any] | None:
            detail = self.nightshift.incident(incident_id)
            return detail if detail["incident"]["outcome"] else None

        return wait_until(closed, timeout, f"incident #{incident_id} to close")  # type: ignore[return-value]

    def job_log(self, job: str) -> str:
        """The job's output so far (every run of it)."""
        path = self.slurm.jobs_dir / f"{job}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def resumes(self, job: str) -> list[int]:
        """The checkpoint step each run of the job resumed from, per rank 0's lines of its log (a run with no
        checkpoint yet starts from 0 and is not listed; the other ranks resume from the same step)."""
        return [int(step) for step in re.findall(r"\[rank0\]: resuming from step (\d+)", self.job_log(job))]

    def close(self) -> None:
        if self.jobs:
            self.slurm.command("scancel", *self.jobs, check=False)
        self.closers.close()


def launch_stack(
    base: Path, slurm: SlurmCluster, permissions: bool = True, find_binary: BinaryFinder = find_binary
) -> Stack:
    """Start, under ``base``: the simulated exporters of every node of :data:`NODES` (and ``slurm``'s node tools
    pointed at them: :meth:`SlurmCluster.attach_sim`), the Grafana stand-in, Alertmanager (the shipped
    alerts/alertmanager.yml pointed at Nightshift, 1 s group timers), Prometheus (rules/sim/, scraping the
    exporters, Nightshift's /metrics and the training jobs Nightshift's ``/api/v1/sd/training`` lists) and
    ``nightshift serve`` acting on ``slurm`` over SSH with the fast playbooks (:func:`fast_playbooks`).
    ``permissions``: whitelist the Slurm actions (examples/permissions.yaml: drain, requeue, resume; and
    :data:`REPAIR_GRANTS`: validate), else Nightshift is advisory."""
    base.mkdir(parents=True, exist_ok=True)
    closers = contextlib.ExitStack()
    with closers:
        webhook_token = _secret_file(base / "webhook.token")
        operator_token = _secret_file(base / "operator.token")
        viewer_token = _secret_file(base / "viewer.token")
        grafana_token = _secret_file(base / "grafana.token")
        sim = launch_sim_cluster(base / "sim", nodes=NODES)
        closers.callback(sim.close)
        slurm.attach_sim(sim.state_dir)
        closers.callback(slurm.attach_sim, None)
        nightshift_port = free_port()
        nightshift_url = f"http://127.0.0.1:{nightshift_port}"
        grafana = launch_grafana_standin(base / "grafana", grafana_token)
        closers.callback(grafana.stop)
        notices = WebhookSink()
        closers.callback(notices.close)
        alertmanager = launch_alertmanager(
            base / "alertmanager",
            nightshift_config(
                f"{nightshift_url}/api/v1/alerts", webhook_token, people_url=notices.url("/people")
            ),
            find_binary,
        )
        closers.callback(alertmanager.stop)
        # Training jobs are found the way a real deployment finds them: Nightshift's Slurm service discovery.
        training = {
            "job_name": "training",
            "http_sd_configs": [
                {
                    "url": f"{nightshift_url}/api/v1/sd/training",
                    "refresh_interval": "1s",
                    # type explicitly: Prometheus 2.42's http_sd omits the default "Bearer" (sends the bare token).
                    "authorization": {"type": "Bearer", "credentials_file": str(viewer_token)},
                }
            ],
        }
        prometheus = launch_prometheus(
            base / "prometheus",
            [*sim.targets, f"127.0.0.1:{nightshift_port}"],
            FAST_RULES,
            alertmanager.url,
            find_binary=find_binary,
            discovered=[training],
        )
        closers.callback(prometheus.stop)
        playbooks = fast_playbooks(base / "playbooks", checkpoint_root=sim.base_dir / "checkpoints")
        permissions_file = None
        if permissions:
            permissions_file = base / "permissions.yaml"
            permissions_file.write_text(PERMISSIONS_EXAMPLE.read_text() + REPAIR_GRANTS)
        settings = {
            "data_dir": str(base / "nightshift" / "data"),
            "playbook_paths": [str(playbooks)],
            "permissions_file": str(permissions_file) if permissions_file else None,
            "operator_token_file": str(operator_token),
            "external_url": nightshift_url,
            "webhook": {"token_file": str(webhook_token)},
            "access": {"viewer_token_file": str(viewer_token)},
            # A guard that holds an incident looks again after 5 s (default 30 s): the demo runs in minutes.
            "guards": {"defer_seconds": 5},
            "prometheus": {"url": prometheus.url},
            "grafana": {"url": grafana.url, "token_file": str(grafana_token)},
            "notify": {"webhook_url": notices.url("/notify")},
            "slurm": {**dataclasses.asdict(slurm.settings.slurm), "discovery_cache_seconds": 1},
            "checkpoint": {"allowed_roots": [str(sim.base_dir / "checkpoints")]},
            "worker": {"poll_seconds": 0.5},
            # A repair looks again every second while a validation runs (default 15 s): the demo runs in minutes.
            "repair": {"poll_seconds": 1},
        }
        nightshift = launch_nightshift(base / "nightshift", settings, nightshift_port)
        closers.callback(nightshift.stop)
        stack = Stack(
            base=base,
            slurm=slurm,
            sim=sim,
            grafana=grafana,
            alertmanager=alertmanager,
            prometheus=prometheus,
            nightshift=nightshift,
            playbooks=playbooks,
            operator_token_file=operator_token,
            notices=notices,
            closers=closers.pop_all(),
        )
    return stack


@contextlib.contextmanager
def running_stack(base: Path, slurm: SlurmCluster, **options: Any) -> Iterator[Stack]:
    """:func:`launch_stack` as a context manager: closed on exit, whatever happened."""
    stack = launch_stack(base, slurm, **options)
    try:
        yield stack
    finally:
        stack.close()
