"""The simulated cluster (sim/) as real processes: exporter contract, trainer checkpoints and faults, and the fast
rules firing on a real Prometheus that scrapes it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from app.domain.diagnosis import diagnose
from app.domain.diagnosis.xid import xid_from_line
from sim import checkpoints, faults, gpus, statedir
from sim.cluster import REPO_ROOT
from sim.procs import free_port
from tests.fixtures.procs import wait_until
from tests.fixtures.prometheus import PrometheusServer, launch_prometheus
from tests.fixtures.sim import SimCluster, SimProcess, launch_sim_cluster, scrape, sim_cluster

pytestmark = pytest.mark.integration
__all__ = ["sim_cluster"]  # the fixture, imported so pytest finds it

# The metric contract of the brief: name -> type.
DCGM_CONTRACT = {
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_EXP_XID_ERRORS_COUNT": "gauge",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "gauge",
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
}
GPU_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
TRAINING_CONTRACT = {
    "training_step_total",
    "training_samples_total",
    "training_last_checkpoint_timestamp_seconds",
    "training_checkpoint_in_progress",
    "training_eval_in_progress",
    "training_loss",
    "training_errors_total",
    "training_checkpoint_requested",
    "training_rank_step_seconds_sum",
    "training_rank_step_seconds_count",
}
FAST = {"step_seconds": 0.02, "checkpoint_every": 10, "linger": 2.0}


def samples(target: str, name: str, **labels: str) -> list[Sample]:
    """Samples of metric ``name`` on ``target`` whose labels include ``labels``.

    Matched by family: prometheus_client's parser appends ``_total`` to the sample names of every counter,
    even ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` (Prometheus itself keeps the exposed name).
    """
    return [
        sample
        for family in text_string_to_metric_families(scrape(target))
        if name in (family.name, f"{family.name}_total")
        for sample in family.samples
        if labels.items() <= sample.labels.items()
    ]


def value(target: str, name: str, **labels: str) -> float | None:
    found = samples(target, name, **labels)
    return found[0].value if found else None


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
    )


def newest_step(trainer: SimProcess) -> int:
    spec = trainer.spec
    root = spec.checkpoint_dir / f"rank{spec.rank}" if spec.world_size > 1 else spec.checkpoint_dir
    checkpoint = checkpoints.newest(root)
    return checkpoint.step if checkpoint else -1


# -- exporter ---------------------------------------------------------------------------------------------
def test_exporter_exposes_the_dcgm_contract(sim_cluster: SimCluster) -> None:
    sim_cluster.map_job("777", "node1", "prolog")  # deploy/slurm/hpc-job-mapping.sh, as Slurm's prolog
    target = sim_cluster.exporters["node1"].target
    text = scrape(target)
    families = {family.name: family for family in text_string_to_metric_families(text)}

    assert {name: families[name].type for name in DCGM_CONTRACT if name in families} == DCGM_CONTRACT
    # Exact exposition names: a counter named *_TOTAL keeps its name (no "_total" appended).
    assert "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter" in text
    for name in DCGM_CONTRACT:
        found = families[name].samples
        assert sorted(int(s.labels["gpu"]) for s in found) == list(range(8)), name
        for sample in found:
            assert sample.labels.keys() >= GPU_LABELS, (name, sample.labels)
            assert sample.labels["Hostname"] == "node1"
            assert sample.labels["hpc_job"] == "777"
            assert sample.labels["device"] == f"nvidia{sample.labels['gpu']}"
    xid = families["DCGM_FI_DEV_XID_ERRORS"].samples[0]
    assert (xid.labels["err_code"], xid.labels["err_msg"], xid.value) == ("0", "No Error", 0)
    count = families["DCGM_EXP_XID_ERRORS_COUNT"].samples[0]
    assert "xid" not in count.labels and count.labels["window_size_in_ms"] == "300000" and count.value == 0
    assert (
        samples(sim_cluster.exporters["node2"].target, "DCGM_FI_DEV_GPU_TEMP")[0].labels.get("hpc_job")
        is None
    )


def test_kubernetes_mode_labels_the_gpus_of_a_running_pod(tmp_path: Path) -> None:
    cluster = launch_sim_cluster(tmp_path / "k8s", nodes=("node1",), gpus=2, kubernetes=True)
    try:
        exporter = cluster.exporters["node1"].target
        assert "pod" not in samples(exporter, "DCGM_FI_DEV_GPU_UTIL")[0].labels
        cluster.start_trainer("llama-7b", "node1", namespace="ml", pod="llama-7b-master-0", **FAST)
        found = wait_until(
            lambda: [s for s in samples(exporter, "DCGM_FI_DEV_GPU_UTIL") if "pod" in s.labels],
            10,
            "pod labels on the GPUs",
        )
        assert {(s.labels["namespace"], s.labels["pod"], s.labels["container"]) for s in found} == {
            ("ml", "llama-7b-master-0", "trainer")
        }
    finally:
        cluster.close()


def test_xid_injection_shows_in_metrics_and_kern_log(sim_cluster: SimCluster) -> None:
    state = str(sim_cluster.state_dir)
    target = sim_cluster.exporters["node1"].target
    result = run_cli("inject", "xid", "79", "--node", "node1", "--gpu", "3", "--state-dir", state)
    assert result.returncode == 0, result.stderr

    gauge = samples(target, "DCGM_FI_DEV_XID_ERRORS", gpu="3")
    assert [(s.labels["err_code"], s.labels["err_msg"], s.value) for s in gauge] == [
        ("79", "GPU has fallen off the bus", 79)
    ]
    assert value(target, "DCGM_EXP_XID_ERRORS_COUNT", gpu="3", xid="79") == 1
    assert value(target, "DCGM_FI_DEV_XID_ERRORS", gpu="2") == 0
    line = statedir.kern_log_path(sim_cluster.state_dir, "node1").read_text().splitlines()[-1]
    event = xid_from_line(line)  # the diagnosis module's own parser reads the line
    assert event is not None and event.code == 79
    assert event.pci == gpus.pci_bus_id(3)[4:-2].lower() == "0000:5d:00"
    assert diagnose({}, line).xid_class == "reboot"

    assert run_cli("clear", "--node", "node1", "--state-dir", state).returncode == 0
    assert value(target, "DCGM_FI_DEV_XID_ERRORS", gpu="3") == 0
    assert samples(target, "DCGM_EXP_XID_ERRORS_COUNT", xid="79") == []


def test_cli_rejects_incomplete_commands(tmp_path: Path) -> None:
    result = run_cli("inject", "xid", "79", "--node", "node1", "--state-dir", str(tmp_path))
    assert result.returncode == 2 and "needs --node and --gpu" in result.stderr
    result = run_cli("inject", "hang", "--state-dir", str(tmp_path))
    assert result.returncode == 2 and "needs --job" in result.stderr
    assert not statedir.faults_path(tmp_path).exists()


def test_gpu_faults_show_in_metrics_and_survive_an_exporter_restart(sim_cluster: SimCluster) -> None:
    state = sim_cluster.state_dir
    faults.inject_gpu_fault(state, "node1", 0, "ecc")
    faults.inject_gpu_fault(state, "node1", 1, "row_remap")
    faults.inject_gpu_fault(state, "node1", 2, "nvlink", rate=100, now=time.time() - 10)
    faults.inject_gpu_fault(state, "node1", 4, "thermal")
    faults.inject_gpu_fault(state, "node1", 5, "vanish")

    def check(target: str) -> float:
        assert value(target, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="0") == 1
        assert value(target, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="1") == 1
        assert value(target, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu="1") == 1
        reasons = int(value(target, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu="4"))
        assert reasons & 0x48 == 0x48 and value(target, "DCGM_FI_DEV_GPU_TEMP", gpu="4") >= 90
        assert value(target, "DCGM_FI_DEV_GPU_TEMP", gpu="5") is None
        assert sorted(int(s.labels["gpu"]) for s in samples(target, "DCGM_FI_DEV_GPU_TEMP")) == [
            0,
            1,
            2,
            3,
            4,
            6,
            7,
        ]
        assert value(target, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="3") == 0
        return value(target, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", gpu="2")

    before = check(sim_cluster.exporters["node1"].target)
    assert before >= 1000
    sim_cluster.exporters["node1"].daemon.stop()
    after = check(sim_cluster.start_exporter("node1").target)
    assert after > before  # a counter: it keeps growing across the restart

    faults.clear(state, node="node1", gpu=5)
    assert value(sim_cluster.exporters["node1"].target, "DCGM_FI_DEV_GPU_TEMP", gpu="5") is not None


# -- trainer ----------------------------------------------------------------------------------------------
def test_trainer_exports_the_training_contract_and_labels_its_gpus(sim_cluster: SimCluster) -> None:
    trainer = sim_cluster.start_trainer("llama-7b", "node1", slurm_job_id="4242", **FAST)
    # The rank timing has a sample once a step is timed: scrape after the first step.
    wait_until(lambda: (value(trainer.target, "training_step_total") or 0) >= 1, 10, "the first step")
    families = {f.name: f for f in text_string_to_metric_families(scrape(trainer.target))}
    assert {s.name for f in families.values() for s in f.samples} == TRAINING_CONTRACT
    step = samples(trainer.target, "training_step_total")[0]
    assert step.labels == {
        "train_job": "llama-7b",
        "slurm_job_id": "4242",
        "namespace": "",
        "pod": "",
        "Hostname": "node1",
    }
    classes = {s.labels["error_class"]: s.value for s in samples(trainer.target, "training_errors_total")}
    assert classes == dict.fromkeys(
        ("nccl", "cuda", "cuda_oom", "storage_io", "object_store_timeout", "checkpoint_corrupt", "nan"), 0.0
    )
    assert (statedir.hpc_job_dir(sim_cluster.state_dir, "node1") / "0").read_text().split() == ["4242"]
    exporter = sim_cluster.exporters["node1"].target
    wait_until(lambda: value(exporter, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu="0") > 0.5, 10, "busy GPUs")
    assert value(exporter, "DCGM_FI_DEV_GPU_UTIL", gpu="0", hpc_job="4242") > 50


def test_trainer_checkpoints_and_resumes_after_kill(sim_cluster: SimCluster) -> None:
    trainer = sim_cluster.start_trainer("llama-7b", "node1", slurm_job_id="4242", **FAST)
    wait_until(lambda: newest_step(trainer) >= 30, 20, "three checkpoints")
    newest = checkpoints.newest(trainer.spec.checkpoint_dir)
    manifest = json.loads((newest.path / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.pt", "optim.pt"} and all(
        len(entry["sha256"]) == 64 for entry in manifest["files"].values()
    )
    assert len(checkpoints.listing(trainer.spec.checkpoint_dir)) <= 3  # older ones pruned

    trainer.daemon.kill()
    resumed_from = newest_step(trainer)
    again = sim_cluster.restart(trainer.spec)
    wait_until(lambda: f"resuming from step {resumed_from}" in again.log(), 10, "resume log line")
    assert value(again.target, "training_step_total") >= resumed_from
    assert value(again.target, "training_last_checkpoint_timestamp_seconds") >= manifest["created"]


@pytest.mark.parametrize(
    ("fault", "error_class", "text", "category"),
    [
        ("nccl", "nccl", "NCCL WARN NET/IB : Got completion from peer", "nccl_network"),
        ("oom", "cuda_oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", "cuda_oom"),
        ("io", "storage_io", "OSError: [Errno 5] Input/output error", "storage_io"),
        (
            "s3_timeout",
            "object_store_timeout",
            'botocore.exceptions.ReadTimeoutError: Read timeout on endpoint URL: "https://',
            "object_store_timeout",
        ),
    ],
)
def test_crash_fault_logs_counts_and_exits(
    sim_cluster: SimCluster, fault: str, error_class: str, text: str, category: str
) -> None:
    trainer = sim_cluster.start_trainer("job", "node2", slurm_job_id="51", **FAST)
    faults.inject_job_fault(sim_cluster.state_dir, "job", fault)
    # While it lingers, the error counter is there to be scraped.
    wait_until(
        lambda: value(trainer.target, "training_errors_total", error_class=error_class) == 1, 10, "count"
    )
    assert trainer.daemon.proc.wait(10) == 1
    log = trainer.log()
    assert text in log and "ChildFailedError" in log
    assert diagnose({}, log).category == category
    sim_cluster.map_job("51", "node2", "epilog")
    assert not (statedir.hpc_job_dir(sim_cluster.state_dir, "node2") / "0").exists()
    assert faults.load(sim_cluster.state_dir).job("job") == {}  # consumed: a restart runs clean
    assert sim_cluster.restart(trainer.spec).daemon.alive()


def start_ranks(
    cluster: SimCluster, name: str, nodes: tuple[str, ...], **options: object
) -> list[SimProcess]:
    """One rank per node of a multi-node job ``name`` (Slurm job 77), each on its own port."""
    return [
        cluster.start_trainer(
            name, node, slurm_job_id="77", rank=rank, world_size=len(nodes), port=free_port(), **options
        )
        for rank, node in enumerate(nodes)
    ]


def test_a_fatal_xid_ends_every_rank_of_a_multi_node_job(sim_cluster: SimCluster) -> None:
    lingering = {**FAST, "linger": 5.0}  # time to scrape each rank's error count, even on a busy machine
    ranks = start_ranks(sim_cluster, "llama-70b", ("node1", "node2"), exit_on_gpu_fault=True, **lingering)
    wait_until(lambda: all(newest_step(r) >= 10 for r in ranks), 30, "a checkpoint on every rank")
    faults.inject_xid(sim_cluster.state_dir, "node2", 3, 79)
    # Both count an NCCL error while they linger, then exit 1: the faulty rank first, its peer after the watchdog.
    for rank in reversed(ranks):
        wait_until(
            lambda r=rank: value(r.target, "training_errors_total", error_class="nccl") == 1, 15, "count"
        )
    assert [rank.daemon.proc.wait(15) for rank in ranks] == [1, 1]
    healthy, faulty = ranks[0].log(), ranks[1].log()
    assert "node2:" in faulty and "NCCL WARN Cuda failure 'unspecified launch failure'" in faulty
    assert "[PG 0 Rank 1] Process group watchdog thread terminated with exception: CUDA error" in faulty
    assert "[Rank 0] Watchdog caught collective operation timeout" in healthy
    assert "Got completion from peer 10.42.0.2<47534>" in healthy  # node2's address
    assert diagnose({}, healthy).category == "nccl_network"


def test_ranks_resume_together_from_the_newest_step_all_of_them_saved(sim_cluster: SimCluster) -> None:
    ranks = start_ranks(sim_cluster, "llama-70b", ("node1", "node2"), **FAST)
    wait_until(lambda: all(newest_step(r) >= 20 for r in ranks), 30, "two checkpoints on every rank")
    for rank in ranks:
        rank.daemon.kill()
    root = ranks[0].spec.checkpoint_dir
    assert sorted(p.name for p in root.iterdir()) == ["rank0", "rank1"]  # one shard directory per rank
    common = checkpoints.newest_common([root / "rank0", root / "rank1"])
    assert common is not None and common >= 20
    # The job comes back on other nodes (a requeue excluding a culprit): same ranks, same checkpoints.
    moved = [replace(r.spec, hostname=node) for r, node in zip(ranks, ("node1", "node3"), strict=True)]
    again = [sim_cluster.restart(spec) for spec in moved]
    for rank in again:
        wait_until(lambda r=rank: f"resuming from step {common} " in r.log(), 30, "resume log line")
    assert "[rank1]: resuming from step" in again[1].log()


def test_slowdown_nan_and_hang(sim_cluster: SimCluster) -> None:
    trainer = sim_cluster.start_trainer("llama-7b", "node1", slurm_job_id="4242", **FAST)
    exporter = sim_cluster.exporters["node1"].target
    state = sim_cluster.state_dir

    def steps_in(seconds: float) -> float:
        first = value(trainer.target, "training_step_total")
        time.sleep(seconds)  # a measurement window, not a wait for a condition
        return value(trainer.target, "training_step_total") - first

    normal = steps_in(1.0)
    faults.inject_job_fault(state, "llama-7b", "slowdown", factor=4)
    wait_until(lambda: value(exporter, "DCGM_FI_DEV_GPU_UTIL", gpu="0") < 40, 10, "slower GPUs")
    assert steps_in(1.0) < normal / 2
    faults.clear(state, job="llama-7b")

    faults.inject_job_fault(state, "llama-7b", "nan")
    wait_until(lambda: math.isnan(value(trainer.target, "training_loss")), 10, "NaN loss")
    assert "loss: nan" in trainer.log()

    faults.inject_job_fault(state, "llama-7b", "hang")
    wait_until(lambda: statedir.read_trainers(state)[0]["phase"] == "hung", 10, "hung phase")
    assert steps_in(0.5) == 0 and trainer.daemon.alive()
    assert value(exporter, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu="0") < 0.1
    assert value(exporter, "DCGM_FI_DEV_FB_USED", gpu="0") > 0  # memory still held by the hung process


def test_corrupt_checkpoint_fails_the_next_resume(sim_cluster: SimCluster) -> None:
    trainer = sim_cluster.start_trainer("llama-7b", "node1", slurm_job_id="4242", **FAST)
    wait_until(lambda: newest_step(trainer) >= 20, 20, "two checkpoints")
    faults.inject_job_fault(sim_cluster.state_dir, "llama-7b", "corrupt_checkpoint")
    assert trainer.daemon.proc.wait(10) == -9  # died mid-save
    torn = checkpoints.newest(trainer.spec.checkpoint_dir)
    with pytest.raises(checkpoints.CorruptCheckpoint):
        checkpoints.validate(torn)

    failed = sim_cluster.restart(trainer.spec)
    wait_until(
        lambda: value(failed.target, "training_errors_total", error_class="checkpoint_corrupt") == 1,
        10,
        "count",
    )
    assert failed.daemon.proc.wait(10) == 1
    log = failed.log()
    assert "PytorchStreamReader failed reading zip archive: failed finding central directory" in log
    assert diagnose({}, log).category == "checkpoint_corrupt"

    # What a remediation does: move the torn checkpoint aside; the job resumes from the one before.
    torn.path.rename(torn.path.with_name(f"quarantine-{torn.path.name}"))
    previous = newest_step(trainer)
    assert previous < torn.step
    resumed = sim_cluster.restart(trainer.spec)
    wait_until(lambda: f"resuming from step {previous}" in resumed.log(), 10, "resume from the previous one")


# -- the fast rules on a real Prometheus --------------------------------------------------------------------
class Live:
    def __init__(self, cluster: SimCluster, trainer: SimProcess, prometheus: PrometheusServer):
        self.cluster = cluster
        self.trainer = trainer
        self.prometheus = prometheus

    def alerts(self, name: str) -> list[dict[str, object]]:
        response = requests.get(f"{self.prometheus.url}/api/v1/alerts", timeout=5)
        response.raise_for_status()
        return [a for a in response.json()["data"]["alerts"] if a["labels"]["alertname"] == name]

    def firing(self, name: str, **labels: str) -> list[dict[str, object]]:
        return [
            alert
            for alert in self.alerts(name)
            if alert["state"] == "firing" and labels.items() <= alert["labels"].items()
        ]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    cluster = launch_sim_cluster(tmp_path_factory.mktemp("live"), nodes=("node1", "node2"), gpus=4)
    try:
        trainer = cluster.start_trainer("llama-7b", "node1", slurm_job_id="4242", checkpoint_every=10)
        rule_files = sorted((REPO_ROOT / "rules" / "sim").glob("*.yml"))
        prometheus = launch_prometheus(
            tmp_path_factory.mktemp("prometheus"),
            [*cluster.targets, trainer.target],
            rule_files,
            scrape_self=False,
        )
        try:
            yield Live(cluster, trainer, prometheus)
        finally:
            prometheus.stop()
    finally:
        cluster.close()


def test_fast_rules_evaluate_without_errors(live: Live) -> None:
    def rules() -> list[dict[str, object]]:
        response = requests.get(f"{live.prometheus.url}/api/v1/rules", timeout=5)
        return [rule for group in response.json()["data"]["groups"] for rule in group["rules"]]

    wait_until(lambda: all(rule["health"] != "unknown" for rule in rules()), 15, "every rule evaluated")
    broken = [(rule["name"], rule.get("lastError")) for rule in rules() if rule["health"] != "ok"]
    assert broken == []
    shipped = [
        rule["alert"]
        for path in sorted((REPO_ROOT / "rules" / "sim").glob("*.yml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]
    assert sorted(rule["name"] for rule in rules()) == sorted(shipped)  # every fast rule loaded, none dropped


def test_xid_79_fires_gpu_xid_error_with_the_contract_labels(live: Live) -> None:
    faults.inject_xid(live.cluster.state_dir, "node1", 3, 79)
    try:
        alerts = wait_until(lambda: live.firing("GpuXidError", xid="79"), 30, "GpuXidError firing")
        labels = alerts[0]["labels"]
        assert {
            k: labels.get(k) for k in ("Hostname", "gpu", "xid", "xid_class", "slurm_job_id", "severity")
        } == {
            "Hostname": "node1",
            "gpu": "3",
            "xid": "79",
            "xid_class": "reboot",
            "slurm_job_id": "4242",
            "severity": "critical",
        }
        assert len(alerts) == 1  # both Xid sources, one alert
    finally:
        faults.clear(live.cluster.state_dir, node="node1")


def test_hang_fires_training_hang(live: Live) -> None:
    assert live.firing("TrainingHang") == []
    faults.inject_job_fault(live.cluster.state_dir, "llama-7b", "hang")
    alerts = wait_until(lambda: live.firing("TrainingHang"), 60, "TrainingHang firing")
    labels = alerts[0]["labels"]
    assert {k: labels.get(k) for k in ("train_job", "slurm_job_id", "Hostname", "severity")} == {
        "train_job": "llama-7b",
        "slurm_job_id": "4242",
        "Hostname": "node1",
        "severity": "critical",
    }
