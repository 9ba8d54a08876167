"""Produce the real diagnosis corpus: real torchrun jobs (torch CPU build, gloo) with one fault each.

Every log in this directory named in ``cases.yaml`` with ``produced_by: produce.py`` comes from here, as written by
the processes (torchrun's agent and its workers, stdout and stderr joined in one file, as Slurm's output file joins
them), whole, or as it stood at one moment (``restarting``: the file copied when a line appeared, as a collector
reading it then would see it). Each simulated node is its own UTS namespace (``unshare --uts``) with its own host
name, so torchrun's failure summaries name nodes as on a cluster; the ENOSPC cases mount a 256 KiB tmpfs in a mount
namespace of their own. Needs root (namespaces, tmpfs), torch (``pip install torch==2.13.0``) and py-spy in the
interpreter's environment.

    .venv/bin/python tests/data/diagnosis/real/produce.py [--only NAME ...] [--out DIR]

Nothing here runs in the tests: the logs are committed; this script says how they were made and remakes them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"
BIN = Path(sys.executable).parent
TORCHRUN = str(BIN / "torchrun")
PY_SPY = shutil.which("py-spy", path=str(BIN)) or "py-spy"
RUN_SECONDS = 300  # every job is bounded


@dataclass
class Node:
    """One torchrun agent: its host name and its arguments."""

    host: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    tmpfs: str | None = None  # a directory to mount a small tmpfs on (ENOSPC)
    delay: float = 0.0  # seconds after the previous node started
    # srun -l's task label (one torchrun a node, srun's task N on node N): every line of the node's output prefixed
    # "N: ", as srun --label writes it ("%*d: ", the task number padded to the width of the largest; 2 tasks: 1)
    label: int | None = None


@dataclass
class Scenario:
    name: str
    nodes: list[Node]
    env: dict[str, str] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None  # before the job: e.g. write and corrupt a checkpoint
    during: Callable[[Job], None] | None = None  # while it runs: signals, stack dumps


class Job:
    """The running agents of one scenario, writing into one log file."""

    def __init__(self, scenario: Scenario, log: Path, work: Path):
        self.scenario, self.log, self.work = scenario, log, work
        self.procs: list[subprocess.Popen[bytes]] = []
        self.extra: list[str] = []  # sections appended after the job output (stack dumps, FR dumps)
        self.snapshot: bytes | None = None  # the log as it stood at a chosen moment, kept instead of the rest

    def start(self) -> None:
        out = self.log.open("ab", buffering=0)
        for node in self.scenario.nodes:
            time.sleep(node.delay)
            # The node's own name, resolving to loopback (as a cluster's DNS resolves its nodes), in namespaces.
            script = f"hostname {node.host} && mount --bind {self.hosts()} /etc/hosts"
            if node.tmpfs:
                script += f" && mkdir -p {node.tmpfs} && mount -t tmpfs -o size=256k tmpfs {node.tmpfs}"
            run = ' && exec "$@"' if node.label is None else f' && "$@" 2>&1 | sed -u "s/^/{node.label}: /"'
            argv = ["unshare", "--uts", "--mount", "sh", "-c", script + run, "sh", TORCHRUN]
            argv += [*node.args, str(WORKER)]
            env = {
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "GLOO_SOCKET_IFNAME": "lo",
                **self.scenario.env,
                **node.env,
            }
            self.procs.append(
                subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.work, start_new_session=True
                )
            )

    def hosts(self) -> Path:
        """An /etc/hosts naming every node of the scenario at a loopback address of its own."""
        path = self.work / "hosts"
        # Each node its own loopback address, its name first: socket.getfqdn() (torchrun's summary "host")
        # then says the node's name, not "localhost".
        own = "".join(f"127.0.1.{i} {node.host}\n" for i, node in enumerate(self.scenario.nodes, start=1))
        path.write_text(f"127.0.0.1 localhost\n{own}::1 localhost\n")
        return path

    def wait_for(
        self, pattern: str, count: int = 1, seconds: float = RUN_SECONDS, poll: float = 0.5
    ) -> bytes:
        """The log's bytes once ``pattern`` occurs ``count`` times in it (read every ``poll`` seconds)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            data = self.log.read_bytes()
            if len(re.findall(pattern, data.decode(errors="replace"))) >= count:
                return data
            time.sleep(poll)
        raise TimeoutError(f"{self.scenario.name}: {pattern!r} not seen in {seconds}s")

    def workers(self, node: int = 0) -> list[tuple[int, int]]:
        """(rank, pid) of the worker processes under agent ``node`` (its descendants: torchrun starts each
        worker in a session of its own)."""
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
            except (OSError, ValueError):
                continue
            if entry.name.isdigit():
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        found = []
        for pid in parents:
            ancestor = parents.get(pid)
            while ancestor and ancestor != self.procs[node].pid:
                ancestor = parents.get(ancestor)
            if not ancestor:
                continue
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            ranks = [v[5:] for v in environ if v.startswith(b"RANK=")]
            if ranks and b"worker.py" in cmdline:
                found.append((int(ranks[0]), pid))
        return sorted(found)

    def signal_node(self, node: int, signum: int) -> None:
        os.killpg(self.procs[node].pid, signum)

    def stack_dumps(self, node: int = 0) -> None:
        """py-spy dump of every worker, under the headers slurm.job_stacks writes."""
        host = self.scenario.nodes[node].host
        for rank, pid in self.workers(node):
            result = subprocess.run(
                [PY_SPY, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20, check=False
            )
            self.extra.append(f"==> py-spy node={host} rank={rank} pid={pid} <==")
            self.extra.extend((result.stdout + result.stderr).splitlines()[:200])

    def fr_dumps(self, node: int = 0) -> None:
        """Each worker's Flight Recorder dump (worker.py writes it on SIGUSR1), under one header per rank."""
        prefix = self.scenario.env["WORKER_FR_DUMP"]
        ranks = self.workers(node)
        for _, pid in ranks:
            os.kill(pid, signal.SIGUSR1)
        time.sleep(3)
        for rank, _ in ranks:
            dump = Path(f"{prefix}{rank}")
            self.extra.append(f"==> flight-recorder rank={rank} file={dump.name} <==")
            self.extra.append(dump.read_text() if dump.exists() else "(no dump written)")

    def finish(self, seconds: float = RUN_SECONDS) -> None:
        deadline = time.monotonic() + seconds
        for proc in self.procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self.extra:
            with self.log.open("a") as out:
                out.write("\n".join(self.extra) + "\n")


def standalone(nproc: int, *extra: str) -> list[str]:
    return ["--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc), *extra]


def multinode(nproc: int, port: int, *extra: str, endpoint: str = "127.0.0.1") -> list[str]:
    return [
        "--nnodes", "2", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{endpoint}:{port}", "--rdzv-id", f"job{port}", *extra,
    ]  # fmt: skip


def fault(name: str, rank: int = 1, step: int = 5, **more: str) -> dict[str, str]:
    return {"WORKER_FAULT": name, "WORKER_FAULT_RANK": str(rank), "WORKER_FAULT_STEP": str(step), **more}


def checkpoint_then(corrupt: Callable[[Path], None], path: str, nproc: int = 2) -> Callable[[Path], None]:
    """A setup that trains 3 steps writing a checkpoint at ``path`` (in the work directory), then corrupts it."""

    def setup(work: Path) -> None:
        env = {**os.environ, "WORKER_STEPS": "3", "WORKER_CKPT": path, "WORKER_CKPT_EVERY": "3"}
        subprocess.run(
            [TORCHRUN, *standalone(nproc), str(WORKER)],
            cwd=work,
            env=env,
            check=True,
            capture_output=True,
            timeout=RUN_SECONDS,
        )
        corrupt(work / path)

    return setup


def truncate_half(path: Path) -> None:
    """Cut a file, or every rank's DCP shard of a checkpoint directory, to half its size (an interrupted copy)."""
    files = sorted(path.glob("*.distcp")) if path.is_dir() else [path]
    for file in files[:1]:
        with file.open("r+b") as handle:
            handle.truncate(file.stat().st_size // 2)


def after_steps(step: int, ranks: int, then: Callable[[Job], None]) -> Callable[[Job], None]:
    def during(job: Job) -> None:
        job.wait_for(rf"\] step {step} loss", count=ranks)
        then(job)

    return during


def sigterm_all(job: Job) -> None:
    """As slurmstepd does on scancel: SIGTERM to every process of the step."""
    job.signal_node(0, signal.SIGTERM)


def host_lost(job: Job) -> None:
    """The node hosting the rendezvous store vanishes: its agent and workers are SIGKILLed at once."""
    job.signal_node(0, signal.SIGKILL)


def restarting(job: Job) -> None:
    """The log the moment the first agent reports a worker killed (torchrun's restart under way: no summary yet,
    the other agent not heard from), as a collector reading the file then would see it, up to its last whole line;
    then stop the run (SIGTERM: each agent ends its workers)."""
    data = job.wait_for(r"failed \(exitcode: -9\)", poll=0.02)
    job.snapshot = data[: data.rfind(b"\n") + 1]
    agents = ", ".join(
        f"{node.host}={proc.pid}" for node, proc in zip(job.scenario.nodes, job.procs, strict=True)
    )
    print(f"{job.scenario.name}: agents' pids {agents}", flush=True)  # whose pid the glog prefix names
    for node in range(len(job.procs)):
        job.signal_node(node, signal.SIGTERM)


def dump_while_hung(job: Job) -> None:
    time.sleep(8)  # well past the stuck rank's step: the others wait in the collective
    job.stack_dumps()
    if "WORKER_FR_DUMP" in job.scenario.env:
        job.fr_dumps()


SCENARIOS = [
    Scenario("ddp_sigkill_rank1", [Node("trn-a01", standalone(2))], fault("sigkill")),
    Scenario(
        "fsdp_sigkill_rank2_of3",
        [Node("trn-a02", standalone(3))],
        {**fault("sigkill", rank=2), "WORKER_PARALLEL": "fsdp"},
    ),
    Scenario(
        "ddp_sigstop_rank1_gloo_timeout",
        [Node("trn-a03", standalone(2))],
        {**fault("sigstop"), "WORKER_TIMEOUT": "15"},
    ),
    Scenario(
        "ddp_sigstop_rank1_of3_gloo_timeout",
        [Node("trn-a04", standalone(3))],
        {**fault("sigstop"), "WORKER_TIMEOUT": "20"},
    ),
    Scenario(
        "fsdp_sigstop_rank0_of3",
        [Node("trn-a05", standalone(3))],
        {**fault("sigstop", rank=0), "WORKER_TIMEOUT": "15", "WORKER_PARALLEL": "fsdp"},
    ),
    Scenario("ddp_exception_rank1", [Node("trn-a06", standalone(2))], fault("exception")),
    Scenario("ddp_sigabrt_rank0", [Node("trn-a07", standalone(2))], fault("sigabrt", rank=0)),
    Scenario("ddp_sigsegv_rank1", [Node("trn-a08", standalone(2))], fault("sigsegv")),
    Scenario("ddp_nan_all_ranks", [Node("trn-a09", standalone(2))], fault("nan", rank=0, step=4)),
    Scenario(
        "resume_truncated_torch_save",
        [Node("trn-a10", standalone(2))],
        {"WORKER_CKPT": "ckpt.pt", "WORKER_RESUME": "1"},
        setup=checkpoint_then(truncate_half, "ckpt.pt"),
    ),
    Scenario(
        "resume_truncated_dcp_shard",
        [Node("trn-a11", standalone(2))],
        {"WORKER_CKPT": "ckpt-dcp", "WORKER_RESUME": "1"},
        setup=checkpoint_then(truncate_half, "ckpt-dcp"),
    ),
    Scenario(
        "enospc_torch_save_tmpfs",
        [Node("trn-a12", standalone(2), tmpfs="/tmp/nightshift-enospc-pt")],
        {"WORKER_CKPT": "/tmp/nightshift-enospc-pt/ckpt.pt", "WORKER_CKPT_EVERY": "3"},
    ),
    Scenario(
        "enospc_dcp_save_tmpfs",
        [Node("trn-a13", standalone(2), tmpfs="/tmp/nightshift-enospc-dcp")],
        {"WORKER_CKPT": "/tmp/nightshift-enospc-dcp/step", "WORKER_CKPT_EVERY": "3"},
    ),
    Scenario(
        "elastic_restart_recovered",
        [Node("trn-a14", standalone(2, "--max-restarts", "2"))],
        fault("startup_first_attempt"),
    ),
    Scenario(
        "sigterm_scancel",
        [Node("trn-a15", standalone(2))],
        {"WORKER_STEPS": "200"},
        during=after_steps(4, 2, sigterm_all),
    ),
    Scenario("healthy_with_warnings", [Node("trn-a16", standalone(2))], fault("warnings")),
    Scenario(
        "two_nodes_sigkill_rank3",
        [
            Node("trn-b01", multinode(2, 29611, endpoint="trn-b01")),
            Node("trn-b02", multinode(2, 29611, endpoint="trn-b01"), delay=2),
        ],
        fault("sigkill", rank=3),
    ),
    Scenario(  # as two_nodes_sigkill_rank3, under srun -l: the label is the node's task, never a rank
        "srun_label_two_nodes_sigkill_rank3",
        [
            Node("trn-h01", multinode(2, 29616, endpoint="trn-h01"), label=0),
            Node("trn-h02", multinode(2, 29616, endpoint="trn-h01"), delay=2, label=1),
        ],
        fault("sigkill", rank=3),
    ),
    Scenario(  # the same with torchrun --tee 3: each worker's line tagged with its local rank, "[default1]:"
        "srun_label_tee_two_nodes_sigkill_rank3",
        [
            Node("trn-h03", multinode(2, 29617, "--tee", "3", endpoint="trn-h03"), label=0),
            Node("trn-h04", multinode(2, 29617, "--tee", "3", endpoint="trn-h03"), delay=2, label=1),
        ],
        fault("sigkill", rank=3),
    ),
    Scenario(
        "two_nodes_elastic_sigkill_rank1",
        [
            Node("trn-f01", multinode(1, 29614, "--max-restarts", "1", endpoint="trn-f01")),
            Node("trn-f02", multinode(1, 29614, "--max-restarts", "1", endpoint="trn-f01"), delay=2),
        ],
        {**fault("sigkill"), "WORKER_STEPS": "40", "WORKER_TIMEOUT": "20"},
    ),
    Scenario(
        "two_nodes_elastic_sigkill_rank1_restarting",
        [
            Node("trn-g01", multinode(1, 29615, "--max-restarts", "1", endpoint="trn-g01")),
            Node("trn-g02", multinode(1, 29615, "--max-restarts", "1", endpoint="trn-g01"), delay=2),
        ],
        {**fault("sigkill"), "WORKER_STEPS": "40", "WORKER_TIMEOUT": "20"},
        during=restarting,
    ),
    Scenario(
        "two_nodes_rendezvous_host_lost",
        [
            Node("trn-c01", multinode(1, 29612, endpoint="trn-c01")),
            Node("trn-c02", multinode(1, 29612, endpoint="trn-c01"), delay=2),
        ],
        {"WORKER_STEPS": "200", "WORKER_TIMEOUT": "20"},
        during=after_steps(3, 2, host_lost),
    ),
    Scenario(
        "rendezvous_unreachable",
        [
            Node(
                "trn-d02",
                multinode(1, 29613, "--rdzv-conf", "join_timeout=20,read_timeout=20", endpoint="trn-d01"),
            )
        ],
    ),
    Scenario(
        "hang_stuck_rank1_of3_pyspy_fr",
        [Node("trn-e01", standalone(3))],
        {
            **fault("stuck", step=4),
            "WORKER_TIMEOUT": "40",
            "WORKER_STUCK_SECONDS": "60",
            "TORCH_FR_BUFFER_SIZE": "200",
            "WORKER_FR_DUMP": "/tmp/nightshift-fr-rank",
        },
        during=after_steps(3, 3, dump_while_hung),
    ),
    Scenario(
        "hang_sigstop_rank2_of3_pyspy",
        [Node("trn-e02", standalone(3))],
        {**fault("sigstop", rank=2, step=4), "WORKER_TIMEOUT": "40"},
        during=after_steps(3, 3, dump_while_hung),
    ),
]


def produce(scenario: Scenario, out: Path) -> Path:
    log = out / f"{scenario.name}.log"
    log.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"nightshift-{scenario.name}-") as tmp:
        work = Path(tmp)
        if scenario.setup:
            scenario.setup(work)
        job = Job(scenario, log, work)
        job.start()
        try:
            if scenario.during:
                scenario.during(job)
        finally:
            job.finish()
    if job.snapshot is not None:
        log.write_bytes(job.snapshot)
    return log


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", help="scenario names (default: all)")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    chosen = [s for s in SCENARIOS if not args.only or s.name in args.only]
    for scenario in chosen:
        started = time.monotonic()
        log = produce(scenario, args.out)
        print(f"{scenario.name}: {log.stat().st_size} bytes in {time.monotonic() - started:.0f}s", flush=True)


if __name__ == "__main__":
    main()
