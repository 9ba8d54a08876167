"""nightshift_progress: per-rank step timing handed from the ranks of a node to its endpoint, and the checkpoint
request (signal and request file) answered by a checkpoint."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from nightshift_progress import Progress, identity_from_env
from nightshift_progress.checkpoint_request import CheckpointRequest, ask, signal_from_env
from nightshift_progress.timing import MAX_RANKS_PER_NODE, METRIC, STALE_SECONDS, RankTiming, exchange_dir
from prometheus_client import generate_latest

NODE_ENV = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node3", "SLURM_JOB_NAME": "llama"}


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def rank_env(rank: int, local_rank: int) -> dict[str, str]:
    return {**NODE_ENV, "RANK": str(rank), "LOCAL_RANK": str(local_rank)}


def sample(progress: Progress, suffix: str, rank: int) -> float | None:
    labels = {**progress.identity.labels(), "rank": str(rank)}
    return progress.registry.get_sample_value(f"{METRIC}{suffix}", labels)


def test_the_serving_rank_exports_its_own_and_its_siblings_timing(tmp_path: Path) -> None:
    clock = Clock()
    serving = Progress(identity_from_env(rank_env(8, 0)), exchange=tmp_path, clock=clock)
    serving.rank_timing.publishing = False  # as after serve()
    siblings = [
        Progress(identity_from_env(rank_env(8 + i, i)), exchange=tmp_path, clock=clock) for i in (1, 2)
    ]
    for _ in range(3):
        serving.step_time(0.5)
        siblings[0].step_time(0.5)
        siblings[1].step_time(2.0)  # the slow GPU of the node
        clock.now += 1.5  # past the publish interval, so each step's figure is written
    assert sample(serving, "_count", 8) == 3 and sample(serving, "_sum", 8) == 1.5
    assert sample(serving, "_sum", 9) == 1.5
    assert sample(serving, "_sum", 10) == 6.0 and sample(serving, "_count", 10) == 3
    assert not (tmp_path / "rank-8.json").exists()  # the serving rank publishes nothing


def test_a_rank_gone_quiet_is_left_out_and_a_closed_rank_removes_its_record(tmp_path: Path) -> None:
    clock = Clock()
    serving = Progress(identity_from_env(rank_env(0, 0)), exchange=tmp_path, clock=clock)
    serving.rank_timing.publishing = False
    quiet = Progress(identity_from_env(rank_env(1, 1)), exchange=tmp_path, clock=clock)
    ending = Progress(identity_from_env(rank_env(2, 2)), exchange=tmp_path, clock=clock)
    quiet.step_time(1.0)
    ending.step_time(1.0)
    ending.close(linger=0)
    assert sample(serving, "_sum", 1) == 1.0 and sample(serving, "_sum", 2) is None
    clock.now += STALE_SECONDS + 1
    assert sample(serving, "_sum", 1) is None


def test_malformed_records_and_bad_values_are_skipped(tmp_path: Path) -> None:
    serving = Progress(identity_from_env(rank_env(0, 0)), exchange=tmp_path)
    (tmp_path / "rank-5.json").write_text("{not json")
    (tmp_path / "rank-6.json").write_text('{"rank": 6, "count": 1, "sum": NaN, "updated": 1}')
    (tmp_path / "rank-7.json").write_bytes(b"\xff\xfe")
    serving.step_time(float("nan"))
    serving.step_time(-1.0)
    serving.step_time(0.25)
    text = generate_latest(serving.registry).decode()
    assert f"{METRIC}_count{{" in text and 'rank="0"' in text
    assert 'rank="5"' not in text and 'rank="6"' not in text and 'rank="7"' not in text
    assert sample(serving, "_count", 0) == 1


def test_the_rank_label_is_bounded(tmp_path: Path) -> None:
    clock = Clock()
    for rank in range(1, MAX_RANKS_PER_NODE + 20):
        timing = RankTiming(identity_from_env(rank_env(rank, rank)), tmp_path, clock=clock)
        timing.record(1.0)
    serving = Progress(identity_from_env(rank_env(0, 0)), exchange=tmp_path, clock=clock)
    serving.step_time(1.0)
    families = list(serving.rank_timing.collect())
    ranks = {s.labels["rank"] for s in families[0].samples}
    assert len(ranks) == MAX_RANKS_PER_NODE


def test_an_unwritable_exchange_directory_loses_the_figure_not_the_step(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    progress = Progress(identity_from_env(rank_env(1, 1)), exchange=blocker / "sub")
    progress.step_time(1.0)  # no exception
    progress.step()
    assert progress.registry.get_sample_value("training_step_total", progress.identity.labels()) == 1


def test_the_exchange_directory_is_per_user_and_job_and_safe() -> None:
    identity = identity_from_env({**NODE_ENV, "SLURM_JOB_ID": "../../etc"})
    path = exchange_dir(identity, {})
    assert "/" not in path.name and str(os.getuid()) in path.name
    assert exchange_dir(identity, {"NIGHTSHIFT_PROGRESS_DIR": "/x/y"}) == Path("/x/y")


def test_timing_context_records_the_duration_unless_it_raises(tmp_path: Path) -> None:
    progress = Progress(identity_from_env(rank_env(0, 0)), exchange=tmp_path)
    with progress.timing():
        pass
    with pytest.raises(RuntimeError), progress.timing():
        raise RuntimeError("boom")
    assert sample(progress, "_count", 0) == 1


# --- checkpoint requests -----------------------------------------------------------------------------------------


def requested_gauge(progress: Progress) -> float | None:
    return progress.registry.get_sample_value("training_checkpoint_requested", progress.identity.labels())


def test_a_request_file_asks_until_a_checkpoint_is_saved(tmp_path: Path) -> None:
    clock = Clock(now=2_000_000_000.0)
    progress = Progress(identity_from_env(rank_env(0, 0)), exchange=tmp_path, clock=clock)
    assert not progress.checkpoint_requested() and requested_gauge(progress) == 0
    ask(tmp_path / "checkpoint-request")
    os.utime(tmp_path / "checkpoint-request", (clock.now - 5, clock.now - 5))
    clock.now += 2  # past the poll interval
    assert progress.checkpoint_requested() and requested_gauge(progress) == 1
    with progress.checkpointing():
        pass
    assert not progress.checkpoint_requested()
    clock.now += 2
    assert not progress.checkpoint_requested()  # the file is older than the checkpoint: answered


def test_a_signal_asks_and_a_checkpoint_answers(tmp_path: Path) -> None:
    request = CheckpointRequest(tmp_path / "none")
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        assert request.install_signal(signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert request.requested()
        request.saved(1.0)
        assert not request.requested()
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_signal_somebody_else_handles_is_left_alone(tmp_path: Path) -> None:
    def theirs(signum: int, frame: object) -> None:
        return None

    previous = signal.signal(signal.SIGUSR2, theirs)
    try:
        assert not CheckpointRequest(tmp_path / "x").install_signal(signal.SIGUSR2)
        assert signal.getsignal(signal.SIGUSR2) is theirs
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_the_signal_setting() -> None:
    assert signal_from_env({}) is signal.SIGUSR1
    assert signal_from_env({"NIGHTSHIFT_CHECKPOINT_SIGNAL": "usr2"}) is signal.SIGUSR2
    assert signal_from_env({"NIGHTSHIFT_CHECKPOINT_SIGNAL": "none"}) is None
    with pytest.raises(ValueError, match="not a signal"):
        signal_from_env({"NIGHTSHIFT_CHECKPOINT_SIGNAL": "gremlin"})


def test_a_request_older_than_the_checkpoint_resumed_from_was_answered(tmp_path: Path) -> None:
    """A requeued job finds the request file its previous run answered: it does not checkpoint again at once; a
    request made after that checkpoint still asks."""
    clock = Clock(now=2_000_000_000.0)
    ask(tmp_path / "checkpoint-request")
    os.utime(tmp_path / "checkpoint-request", (clock.now - 60, clock.now - 60))
    progress = Progress(identity_from_env(rank_env(0, 0)), exchange=tmp_path, clock=clock)
    assert progress.checkpoint_requested()  # polled before the resume: pending
    progress.resumed(step=40, checkpoint_time=clock.now - 30)
    assert not progress.checkpoint_requested()
    os.utime(tmp_path / "checkpoint-request", (clock.now - 10, clock.now - 10))
    clock.now += 2
    assert progress.checkpoint_requested()
