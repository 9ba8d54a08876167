"""nightshift_progress (progress/): identity from the environment, the metric contract, serving and the linger,
the error-line classifier (in sync with app/domain/diagnosis/signatures.yaml), the Hugging Face callback driven by the
real ``transformers`` CallbackHandler, and the package's dependency boundary."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from nightshift_progress import ERROR_CLASSES, Progress, identity_from_env, packaged_classifier, start
from nightshift_progress.classify import build_classifier
from prometheus_client import generate_latest

from progress import sync_signatures
from sim.procs import free_port
from tests.fixtures.procs import require_module

REPO = Path(__file__).resolve().parents[2]
SLURM_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURMD_NODENAME": "node7",
    "SLURM_JOB_NAME": "llama",
    "SLURM_LOCALID": "0",
}


def value(progress: Progress, name: str, **extra: str) -> float | None:
    return progress.registry.get_sample_value(name, {**progress.identity.labels(), **extra})


# --- identity --------------------------------------------------------------------------------------------------


def test_identity_on_slurm_names_the_node_and_job():
    identity = identity_from_env(SLURM_ENV)
    assert identity.labels() == {
        "train_job": "llama",
        "slurm_job_id": "4242",
        "namespace": "",
        "pod": "",
        "Hostname": "node7",
    }
    assert identity.serves() and not identity.warnings


def test_identity_on_kubernetes_takes_the_node_from_the_downward_api_not_the_pod_hostname():
    env = {
        "POD_NAME": "llama-0",
        "POD_NAMESPACE": "ml",
        "NODE_NAME": "gpu-17",
        "NIGHTSHIFT_TRAIN_JOB": "llama",
    }
    assert identity_from_env(env).labels()["Hostname"] == "gpu-17"
    missing = identity_from_env({"POD_NAME": "llama-0", "POD_NAMESPACE": "ml"}, job="llama")
    assert missing.labels()["Hostname"] == ""  # the pod's host name would name the pod
    assert "NODE_NAME" in missing.warnings[0]


def test_only_local_rank_zero_serves_per_node_and_only_rank_zero_otherwise():
    second_gpu = identity_from_env({**SLURM_ENV, "SLURM_LOCALID": "1", "SLURM_PROCID": "1"})
    other_node = identity_from_env({**SLURM_ENV, "SLURM_LOCALID": "0", "SLURM_PROCID": "8"})
    assert not second_gpu.serves()
    assert other_node.serves(per_node=True) and not other_node.serves(per_node=False)
    torchrun = identity_from_env({**SLURM_ENV, "LOCAL_RANK": "3", "SLURM_LOCALID": "0"})
    assert not torchrun.serves()  # LOCAL_RANK (torchrun) wins over Slurm's task-local id


def test_label_values_are_bounded():
    assert len(identity_from_env({**SLURM_ENV, "SLURM_JOB_NAME": "x" * 10_000}).train_job) == 256


# --- the contract ------------------------------------------------------------------------------------------------


def test_every_error_class_starts_at_zero_and_counts():
    progress = Progress(identity_from_env(SLURM_ENV))
    assert [value(progress, "training_errors_total", error_class=c) for c in ERROR_CLASSES] == [0.0] * 7
    progress.error("nccl")
    assert value(progress, "training_errors_total", error_class="nccl") == 1.0
    with pytest.raises(ValueError, match="unknown error class"):
        progress.error("gremlins")


def test_steps_samples_loss_checkpoint_and_evaluation():
    progress = Progress(identity_from_env(SLURM_ENV), clock=lambda: 1234.5)
    progress.resumed(100, samples=6400, checkpoint_time=1000.0)
    progress.step(samples=64)
    progress.loss(2.5)
    assert value(progress, "training_step_total") == 101
    assert value(progress, "training_samples_total") == 6464
    assert value(progress, "training_loss") == 2.5
    assert value(progress, "training_last_checkpoint_timestamp_seconds") == 1000.0
    with progress.checkpointing():
        assert value(progress, "training_checkpoint_in_progress") == 1
    assert value(progress, "training_checkpoint_in_progress") == 0
    assert value(progress, "training_last_checkpoint_timestamp_seconds") == 1234.5
    with pytest.raises(OSError), progress.checkpointing():
        raise OSError("disk full")
    assert value(progress, "training_checkpoint_in_progress") == 0
    with progress.evaluating():
        assert value(progress, "training_eval_in_progress") == 1
    assert value(progress, "training_eval_in_progress") == 0


def test_sync_step_follows_a_framework_global_step():
    progress = Progress(identity_from_env(SLURM_ENV))
    progress.sync_step(500, samples_per_step=8)  # a resumed run: one jump
    progress.sync_step(501, samples_per_step=8)
    progress.sync_step(400)  # an older value changes nothing
    assert value(progress, "training_step_total") == 501
    assert value(progress, "training_samples_total") == 501 * 8


# --- serving ---------------------------------------------------------------------------------------------------


def test_serves_metrics_and_lingers_after_the_last_change_so_every_scraper_sees_it():
    port = free_port()
    progress = start(env={**SLURM_ENV, "NIGHTSHIFT_PROGRESS_PORT": str(port)}, addr="127.0.0.1")
    assert progress.port == port
    progress.error("storage_io")
    scraped: list[str] = []

    def scrape_twice() -> (
        None
    ):  # two Prometheus servers of an HA pair, one after the other, while close lingers
        time.sleep(0.3)
        for _ in range(2):
            scraped.append(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)

    scraper = threading.Thread(target=scrape_twice)
    scraper.start()
    progress.close(linger=3.0)
    scraper.join()
    assert len(scraped) == 2  # a close that did not linger refuses them (the thread dies on ConnectionError)
    for text in scraped:
        (line,) = [
            ln for ln in text.splitlines() if ln.startswith("training_errors_total") and "storage_io" in ln
        ]
        assert line.endswith(" 1.0") and 'Hostname="node7"' in line
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_close_returns_at_once_when_the_last_change_is_older_than_the_linger_and_was_scraped():
    port = free_port()
    progress = start(env=SLURM_ENV, port=port, addr="127.0.0.1")
    progress.step()
    time.sleep(0.4)
    assert progress.serving_left(linger=0.3, scrape_wait=60) > 59  # never scraped: it would wait for one
    requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert progress.serving_left(linger=0.3, scrape_wait=60) == 0
    progress.close(linger=0.3, scrape_wait=60)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


class Ticks:
    """A monotonic clock that moves only when slept on."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_change_no_scrape_has_seen_is_served_until_the_first_scrape_within_the_bound():
    """A rank that fails within seconds of its start: its error must reach a scrape before it exits; without one
    it serves scrape_wait seconds after the change at most, with one the linger counts from the change."""
    ticks = Ticks()
    progress = Progress(identity_from_env(SLURM_ENV), monotonic=ticks, sleep=ticks.sleep)
    progress.error("checkpoint_corrupt")  # the change
    ticks.now += 10
    assert progress.serving_left(linger=3, scrape_wait=60) == 50  # not scraped: up to 60 s after the change
    generate_latest(progress.registry)  # a scrape collects every collector
    assert progress.serving_left(linger=3, scrape_wait=60) == 0  # seen, and the linger is over
    progress.error("checkpoint_corrupt")
    generate_latest(progress.registry)
    assert progress.serving_left(linger=3, scrape_wait=60) == 3  # seen at once: the linger still runs
    progress.loss(1.0)  # a change after the scrape
    ticks.now += 70
    assert progress.serving_left(linger=3, scrape_wait=60) == 0  # never seen, but the bound is over


def test_a_process_that_is_not_local_rank_zero_serves_nothing():
    progress = start(env={**SLURM_ENV, "SLURM_LOCALID": "2"}, port=free_port(), addr="127.0.0.1")
    assert progress.port is None
    progress.step()  # records, serves nothing, closes at once
    progress.close()


# --- error lines -------------------------------------------------------------------------------------------------


def test_signatures_json_is_in_sync_with_the_diagnosis_catalogue():
    packaged = REPO / "progress" / "src" / "nightshift_progress" / "signatures.json"
    assert packaged.read_text() == sync_signatures.rendered(), (
        "run: .venv/bin/python progress/sync_signatures.py"
    )


def test_classifier_agrees_with_the_diagnosis_on_the_simulated_jobs_error_texts():
    """Each crash text the simulator's trainer logs (real NCCL, PyTorch, botocore formats) counts as the error
    class of its fault, and the diagnosis reads the same text as that class's category."""
    from app.domain.diagnosis.signatures import load_catalogue
    from sim import faults, logtext
    from sim.trainer import CRASH_TEXT

    catalogue = load_catalogue()
    classes = json.loads((REPO / "progress/src/nightshift_progress/signatures.json").read_text())["classes"]
    context = logtext.Context("node1", 4242, "llama", 100)
    texts = {faults.CRASH_FAULTS[kind]: text(context, 1.8e9) for kind, text in CRASH_TEXT.items()}
    texts["checkpoint_corrupt"] = logtext.checkpoint_corrupt("/ckpt/step_000100/model.pt")
    for error_class, text in texts.items():
        assert packaged_classifier().classify_event(text) == error_class, text
        matched = [m for m in map(catalogue.match_line, text.splitlines()) if m is not None]
        heaviest = max(matched, key=lambda m: m.weight)
        assert classes[heaviest.category] == error_class, (error_class, heaviest)
    assert packaged_classifier().classify("[rank0]: step 100 loss: 2.3100 samples/s: 1280.0") is None


def test_classifier_rejects_a_document_with_an_unknown_class():
    with pytest.raises(ValueError, match="unknown error classes"):
        build_classifier({"classes": {"nccl_network": "network"}, "signatures": []})


def test_log_handler_counts_error_lines_of_messages_and_tracebacks():
    progress = Progress(identity_from_env(SLURM_ENV))
    logger = logging.getLogger("test_progress.handler")
    logger.propagate = False
    logger.addHandler(progress.log_handler())
    logger.error("step 7 done")  # no signature
    logger.info("CUDA out of memory. Tried to allocate 2.00 GiB")  # below the handler's level
    try:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    except RuntimeError:
        logger.exception("training failed")
    assert value(progress, "training_errors_total", error_class="cuda_oom") == 1.0


# --- frameworks --------------------------------------------------------------------------------------------------


@dataclass
class _Args:
    """The TrainingArguments fields the callback reads (TrainingArguments itself needs PyTorch)."""

    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 2
    world_size: int = 8
    device: str = "cpu"


def test_hugging_face_callback_through_the_real_callback_handler():
    transformers = require_module("transformers")  # a dev dependency: make deps installs it (pyproject.toml)
    from nightshift_progress.hf import ProgressCallback
    from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState

    assert transformers.__version__
    progress = Progress(identity_from_env(SLURM_ENV), clock=lambda: 99.0)
    handler = CallbackHandler([ProgressCallback(progress, linger=0)], None, None, None, None)
    args, state, control = _Args(), TrainerState(), TrainerControl()
    state.global_step = 300  # resumed from a checkpoint at step 300
    handler.on_step_end(args, state, control)
    state.global_step = 301
    handler.on_step_end(args, state, control)
    handler.on_log(args, state, control, logs={"loss": 1.75, "learning_rate": 1e-4})
    handler.on_prediction_step(args, state, control)
    assert value(progress, "training_eval_in_progress") == 1
    handler.on_evaluate(args, state, control, metrics={"eval_loss": 1.8})
    handler.on_save(args, state, control)
    assert value(progress, "training_step_total") == 301
    assert value(progress, "training_samples_total") == 301 * 4 * 2 * 8
    assert value(progress, "training_loss") == 1.75
    assert value(progress, "training_eval_in_progress") == 0
    assert value(progress, "training_last_checkpoint_timestamp_seconds") == 99.0


# --- packaging ---------------------------------------------------------------------------------------------------


def test_the_package_depends_on_prometheus_client_only():
    project = tomllib.loads((REPO / "progress" / "pyproject.toml").read_text())["project"]
    assert [d.split(">")[0] for d in project["dependencies"]] == ["prometheus-client"]


def test_importing_the_package_loads_no_framework_or_nightshift_library():
    code = (
        "import sys, nightshift_progress; "
        "bad = {'app','flask','yaml','paramiko','kubernetes','requests','transformers','torch','lightning'}; "
        "print(sorted(bad & {m.split('.')[0] for m in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]"


def test_the_endpoint_serves_no_created_series():
    """Issue 23 item 7: the library's /metrics carried a *_created series beside every counter (only the
    simulated trainer switched them off, process-wide). The library serves its registry without them."""
    port = free_port()
    progress = start(env={**SLURM_ENV, "NIGHTSHIFT_PROGRESS_PORT": str(port)}, addr="127.0.0.1")
    progress.step()
    progress.error("nccl")
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    progress.close(linger=0)
    assert "training_step_total{" in text and "training_errors_total{" in text
    assert [line for line in text.splitlines() if "_created" in line] == []
    assert any(s.name.endswith("_created") for f in progress.registry.collect() for s in f.samples)
