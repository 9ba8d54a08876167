"""Fault to recovery on the real stack, split into stages, against the floors of the parts around Nightshift.

One real Slurm cluster (:func:`sim.stack.launch_slurm`: munged, slurmctld, slurmd node1 + node2, sshd) serves every
round. A round first measures Slurm's own requeue time without Nightshift, then starts a fresh
:func:`sim.stack.running_stack` (simulated DCGM exporters, Prometheus with the fast rules, Alertmanager with the
shipped configuration, the Grafana stand-in, ``nightshift serve`` with the Slurm actions whitelisted), submits the
training job to node1 and injects Xid 79 on node1 GPU 3. Each moment is read from the component that saw it:

==========  ======================================================================================================
fault       the Xid written to the simulator's fault state (this process's clock)
scraped     first Prometheus sample of ``DCGM_FI_DEV_XID_ERRORS`` > 0 for that GPU (the scrape's timestamp)
firing      first ``ALERTS{alertname="GpuXidError",alertstate="firing"}`` sample (the rule evaluation's timestamp)
opened      the incident's ``opened_at`` (the webhook records the alert and opens the incident in one transaction)
acting      ``started_at`` of the playbook's first step (after collect, diagnosis, guards and the live re-check)
requeued    ``started_at`` of the requeue step
steps_done  ``finished_at`` of the last step
running     the job RUNNING on node2 (``squeue``, polled every :data:`POLL_S` seconds)
progress    first ``training_step_total`` sample on node2 above the step the job resumed from (scrape timestamp)
recovered   the incident's ``closed_at`` (the verification query passed)
==========  ======================================================================================================

Floors, from the same run: Prometheus's scrape and rule evaluation intervals and the rule's ``for`` (its
configuration), Alertmanager's ``group_wait`` (its configuration), the verify interval of the fast playbook (the
playbook file Nightshift loaded), and Slurm's requeue-to-RUNNING time measured directly: the same trainer, submitted
the same way (``sbatch --requeue -w node1``), then node1 drained, ``scontrol requeue`` and ``scontrol update
ExcNodeList=node1 ReqNodeList=`` run locally, as Nightshift's two steps run them over SSH, with no Nightshift up.

Nightshift's own share is (opened → acting) plus the execution time of its steps (the SSH commands); the rest is
detection, delivery, Slurm, the job's restart and the verification interval.

    python -m bench.e2e [--rounds 3] [--out bench/results/e2e.json]
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
import yaml

from app.domain.playbooks import parse_duration
from bench import record
from bench.stats import spread
from sim import faults
from sim.cluster import REPO_ROOT, TrainerSpec
from sim.procs import free_port, wait_until
from sim.stack import (
    FAST_RULES,
    BinaryFinder,
    MissingBinary,
    SlurmCluster,
    Stack,
    batch_argv,
    find_binary,
    launch_slurm,
    running_stack,
)

PLAYBOOK = "gpu-xid-node-fault-slurm"
ALERTNAME = "GpuXidError"
JOB_NAME = "llama-7b"
FAULT_NODE, OTHER_NODE = "node1", "node2"
XID, XID_GPU = 79, 3
POLL_S = 0.2  # squeue polling: the resolution of "RUNNING", in the rounds and in the Slurm floor alike
ROUND_TIMEOUT_S = 120.0

# (key, description, from mark, to mark). Indented descriptions split the stage above them.
SPANS: tuple[tuple[str, str, str, str], ...] = (
    ("detect", "fault → alert firing in Prometheus", "fault", "firing"),
    ("scrape", "  fault → first scrape showing the Xid", "fault", "scraped"),
    ("evaluate", "  that scrape → rule evaluation fires the alert", "scraped", "firing"),
    ("deliver", "alert firing → incident opened (Alertmanager → webhook)", "firing", "opened"),
    ("decide", "incident opened → first step started (Nightshift)", "opened", "acting"),
    ("act", "first step started → job RUNNING on node2", "acting", "running"),
    ("slurm", "  requeue step started → job RUNNING on node2 (Slurm)", "requeued", "running"),
    ("restart", "job RUNNING → progress visible in Prometheus", "running", "progress"),
    ("verify", "progress visible → incident recovered", "progress", "recovered"),
    ("verify_after_steps", "  last step finished → incident recovered", "steps_done", "recovered"),
    ("total", "fault → incident recovered", "fault", "recovered"),
)


# --- pure: stages from the moments -------------------------------------------------------------------------------


def spans(marks: Mapping[str, float], step_seconds: Sequence[float]) -> dict[str, float]:
    """Each :data:`SPANS` duration from ``marks`` (seconds since the fault), and Nightshift's own share:
    ``own`` = decide + the steps' execution times, ``share`` = own / total."""
    result = {key: round(marks[end] - marks[start], 3) for key, _, start, end in SPANS}
    result["steps"] = round(sum(step_seconds), 3)
    result["own"] = round(result["decide"] + result["steps"], 3)
    result["share"] = round(result["own"] / result["total"], 4)
    return result


def summarize(rounds: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Median, min and max over rounds of every span."""
    return {key: spread([r["spans"][key] for r in rounds]) for key in rounds[0]["spans"]}


def first_sample(
    series: Sequence[Mapping[str, Any]], after: float, above: float | None = None
) -> float | None:
    """Earliest timestamp at or after ``after`` (and with a value above ``above``) in a range query's result."""
    times = [
        float(ts)
        for s in series
        for ts, value in s["values"]
        if float(ts) >= after and (above is None or float(value) > above)
    ]
    return min(times, default=None)


def seconds(value: str) -> float:
    """A Prometheus/Alertmanager/playbook duration (``1s``, ``12s``, ``3m``) in seconds."""
    return parse_duration(value).total_seconds()


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


# --- the parts around Nightshift ---------------------------------------------------------------------------------


def configured_floors(stack: Stack) -> dict[str, float]:
    """The intervals the stack runs with, read from the files the daemons loaded."""
    prometheus = stack.prometheus.config["global"]
    groups = [g for path in FAST_RULES for g in yaml.safe_load(path.read_text())["groups"]]
    xid_rules = [(g, r) for g in groups for r in g["rules"] if r.get("alert") == ALERTNAME]
    route = yaml.safe_load(stack.alertmanager.config_path.read_text())["route"]
    playbook = next(
        doc
        for path in sorted(stack.playbooks.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc["metadata"]["name"] == PLAYBOOK
    )
    settings = yaml.safe_load(stack.nightshift.settings_path.read_text())
    return {
        "scrape_interval_s": seconds(prometheus["scrape_interval"]),
        "evaluation_interval_s": max(
            seconds(g.get("interval", prometheus["evaluation_interval"])) for g, _ in xid_rules
        ),
        "rule_for_s": max(seconds(r.get("for", "0s")) for _, r in xid_rules),
        "group_wait_s": seconds(route["group_wait"]),
        "verify_interval_s": seconds(playbook["verify"]["interval"]),
        "worker_poll_s": float(settings["worker"]["poll_seconds"]),
    }


def wait_running(slurm: SlurmCluster, job: str, node: str, timeout: float) -> float:
    """Poll ``squeue`` every :data:`POLL_S` s until ``job`` is RUNNING on ``node``; the Unix time of the poll that
    saw it (the state changed between the previous poll and that one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = time.time()
        found = slurm.command(
            "squeue", "--noheader", "--states=all", f"--jobs={job}", "--format=%T %N", check=False
        ).stdout.split()
        if found == ["RUNNING", node]:
            return seen
        time.sleep(POLL_S)
    raise AssertionError(f"timed out after {timeout}s waiting for job {job} RUNNING on {node}")


def _stepping(port: int) -> bool:
    """The trainer serving on ``port`` has made a step."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    return any(float(v) > 0 for v in re.findall(r"^training_step_total\{[^}]*\} (\S+)$", text, re.M))


def slurm_requeue_floor(slurm: SlurmCluster, base: Path) -> float:
    """Seconds from ``scontrol requeue`` to RUNNING on node2 for the trainer on node1, with no Nightshift: the same
    submission and the same scontrol commands as Nightshift's drain and requeue steps, run locally. Leaves the
    cluster idle. The trainer serves on a port nothing scrapes, so no alert can fire."""
    slurm.reset()
    spec = TrainerSpec(
        name="requeue-probe",
        port=free_port(),
        state_dir=base / "state",
        checkpoint_dir=base / "checkpoints",
        hostname="",
    )
    spec.state_dir.mkdir(parents=True)
    wrap = f"cd {shlex.quote(str(REPO_ROOT))} && exec {shlex.join(batch_argv(spec))}"
    job = slurm.sbatch(
        wrap, "--requeue", f"--nodelist={FAULT_NODE}", f"--job-name={spec.name}", "--open-mode=append"
    )
    wait_running(slurm, job, FAULT_NODE, 60)
    wait_until(lambda: _stepping(spec.port), 60, f"job {job} stepping")
    slurm.command("scontrol", "update", f"NodeName={FAULT_NODE}", "State=DRAIN", "Reason=bench requeue floor")
    started = time.time()
    slurm.command("scontrol", "requeue", job)
    slurm.command("scontrol", "update", f"JobId={job}", f"ExcNodeList={FAULT_NODE}", "ReqNodeList=")
    running = wait_running(slurm, job, OTHER_NODE, 60)
    slurm.reset()
    return round(running - started, 3)


# --- one round with Nightshift -----------------------------------------------------------------------------------


def _range(stack: Stack, selector: str, since: float) -> list[dict[str, Any]]:
    """Every raw sample of ``selector`` since ``since`` (a range vector selector, evaluated now)."""
    return stack.prometheus.query(f"{selector}[{int(time.time() - since) + 10}s]")


def xid_round(stack: Stack) -> dict[str, Any]:
    """Train on node1, inject Xid 79, wait until the incident closes; the moments (seconds since the fault), the
    spans, the steps and the ledger kinds over time. Raises RuntimeError when the incident does not recover."""
    job = stack.submit_trainer(JOB_NAME, FAULT_NODE)
    stack.wait_training(job, FAULT_NODE)
    fault = time.time()
    faults.inject_xid(stack.sim.state_dir, FAULT_NODE, XID_GPU, XID)
    running = wait_running(stack.slurm, job, OTHER_NODE, ROUND_TIMEOUT_S)
    incident = stack.wait_incident(PLAYBOOK, timeout=ROUND_TIMEOUT_S)
    detail = stack.wait_closed(incident["id"], timeout=ROUND_TIMEOUT_S)
    row = detail["incident"]
    steps = [s for s in detail["steps"] if s["phase"] == "steps"]
    if row["outcome"] != "recovered" or not steps or any(s["status"] != "ok" for s in steps):
        raise RuntimeError(f"incident #{row['id']} ended {row['outcome']}: {row['reason']}")
    resumed = (stack.resumes(job) or [0])[-1]
    xid = f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{FAULT_NODE}",gpu="{XID_GPU}"}}'
    firing = f'ALERTS{{alertname="{ALERTNAME}",alertstate="firing",Hostname="{FAULT_NODE}"}}'
    progress = f'training_step_total{{slurm_job_id="{job}",Hostname="{OTHER_NODE}"}}'
    moments = {
        "fault": fault,
        "scraped": first_sample(_range(stack, xid, fault), fault, above=0),
        "firing": first_sample(_range(stack, firing, fault), fault),
        "opened": _epoch(row["opened_at"]),
        "acting": min(_epoch(s["started_at"]) for s in steps),
        "requeued": next(_epoch(s["started_at"]) for s in steps if s["action"] == "slurm.requeue_job"),
        "steps_done": max(_epoch(s["finished_at"]) for s in steps),
        "running": running,
        "progress": wait_until(
            lambda: first_sample(_range(stack, progress, fault), fault, above=resumed),
            30,
            f"job {job}'s progress on {OTHER_NODE} in Prometheus",
        ),
        "recovered": _epoch(row["closed_at"]),
    }
    missing = [name for name, value in moments.items() if value is None]
    if missing:
        raise RuntimeError(f"not seen in Prometheus: {', '.join(missing)}")
    marks = {name: round(value - fault, 3) for name, value in moments.items()}  # type: ignore[operator]
    collect = [s for s in detail["steps"] if s["phase"] == "collect"]
    return {
        "job": job,
        "incident": row["id"],
        "resumed_from_step": resumed,
        "marks_s": marks,
        "spans": spans(marks, [s["duration"] for s in steps]),
        "steps": [
            {"phase": s["phase"], "name": s["name"], "action": s["action"], "duration_s": s["duration"]}
            for s in [*collect, *steps]
        ],
        "ledger": [(r["kind"], round(_epoch(r["ts"]) - fault, 3)) for r in detail["ledger"]],
    }


def _line(number: int, result: Mapping[str, Any], floor: float) -> str:
    s = result["spans"]
    return (
        f"round {number}: total {s['total']:.1f}s = detect {s['detect']:.1f} + deliver {s['deliver']:.1f}"
        f" + decide {s['decide']:.1f} + act {s['act']:.1f} + restart {s['restart']:.1f} + verify {s['verify']:.1f};"
        f" Nightshift's own {s['own']:.1f}s ({100 * s['share']:.0f}%); Slurm requeue floor {floor:.1f}s"
    )


def measure(
    slurm: SlurmCluster, rounds: int, base: Path, find_binary: BinaryFinder = find_binary
) -> dict[str, Any]:
    """``rounds`` rounds on ``slurm`` (left idle), each a Slurm floor then an Xid round on a fresh stack under
    ``base``; the configured floors, the Slurm floors, the spread of every span and each round's details."""
    results: list[dict[str, Any]] = []
    floors: list[float] = []
    for number in range(1, rounds + 1):
        floors.append(slurm_requeue_floor(slurm, base / f"floor{number}"))
        with running_stack(base / f"round{number}", slurm, find_binary=find_binary) as stack:
            results.append(xid_round(stack))
            configured = configured_floors(stack)
        slurm.reset()
        print(_line(number, results[-1], floors[-1]), flush=True)
    return {
        "configured": configured,
        "slurm_requeue_to_running_s": {"rounds": floors, **spread(floors)},
        "summary": summarize(results),
        "rounds": results,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=record.RESULTS / "e2e.json")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        base = Path(tmp)
        base.chmod(0o755)  # munged checks that every directory above its socket is world-executable
        try:
            slurm = launch_slurm(base / "slurm")
        except MissingBinary as exc:
            sys.exit(f"bench.e2e: {exc}")
        try:
            results = measure(slurm, args.rounds, base)
        finally:
            slurm.stop()
    params = {
        "rounds": args.rounds,
        "playbook": PLAYBOOK,
        "fault": f"Xid {XID} on {FAULT_NODE} GPU {XID_GPU}",
        "squeue_poll_s": POLL_S,
        "stack": "sim.stack.running_stack, fresh per round; Slurm actions whitelisted; fast rules and playbooks",
    }
    print(f"wrote {record.write(args.out, 'e2e', params, results)}")


if __name__ == "__main__":
    main()
