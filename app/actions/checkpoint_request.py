"""Planned swaps: ask a running job to checkpoint now, then wait until it has.

The contract with the training job is the progress library's (``progress/src/nightshift_progress/
checkpoint_request.py``): a signal (Slurm: ``scancel --signal=USR1``) asks; the job answers by writing a
checkpoint, which moves ``training_last_checkpoint_timestamp_seconds`` past the moment of the request. A job that
does not answer within the timeout is left running (the step fails, so nothing after it runs) and a person is
told by the incident's own escalation.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from app.actions.base import Action, ActionContext, Plan
from app.actions.slurm import _JOB, SlurmAction, executed_commands
from app.clients.slurm import comment_command, signal_command
from app.domain.discovery import checkpoint_signal
from app.domain.errors import BackendError, ConfigError, ParamError
from app.domain.outcome import Failed, Ok, Outcome, Retry, tail
from app.domain.params import Param
from app.domain.states import LedgerKind

if TYPE_CHECKING:
    from app.clients.slurm import CommandResult, SlurmClient

# Bounds of the wait (seconds): a checkpoint of a large model takes minutes; an hour is the most worth waiting.
MIN_WAIT_SECONDS = 30
MAX_WAIT_SECONDS = 3600
MIN_POLL_SECONDS = 5
MAX_POLL_SECONDS = 300


class RequestCheckpoint(SlurmAction):
    """Ask a Slurm job to checkpoint now: ``scancel --signal=<sig>`` to its running steps (the job runs on).

    Only a job that announces the signal it handles is signalled (``sbatch
    --comment=nightshift.checkpoint_signal=USR1``, read with ``squeue``): SIGUSR1's default action terminates a
    process, so asking a job that does not handle it would kill it. Such a job is Failed, not signalled.
    """

    name = "slurm.request_checkpoint"
    description = "Ask a running Slurm job to checkpoint now, with the signal its comment announces (scancel)"
    params = {"job": _JOB}
    scope_keys = ("node", "partition")

    def plan(self, params: Mapping[str, Any]) -> Plan:
        argv = signal_command(params["job"], "USR1")
        return Plan(
            f"ask job {params['job']} to checkpoint with the signal its comment announces "
            "(nightshift.checkpoint_signal=USR1|USR2)",
            shlex.join(argv).replace("USR1", "<signal>"),
        )

    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        signal = checkpoint_signal(slurm.job_comment(params["job"]))
        if signal is None:
            return Failed(
                reason=f"job {params['job']} announces no checkpoint signal (sbatch "
                "--comment=nightshift.checkpoint_signal=USR1): not signalled, as a process that does not handle "
                "SIGUSR1 is terminated by it",
                command=shlex.join(comment_command(params["job"])),
            )
        executed.append(slurm.signal(params["job"], signal))
        return Ok(
            command=executed_commands(executed),
            output=tail(executed[-1].output),
            exit_code=0,
            data={"job": params["job"], "signal": signal, "requested_at": ctx.clock.now().timestamp()},
        )


class WaitForCheckpoint(Action):
    """Wait until the job has written a checkpoint after this step started: ``query`` gives the job's newest
    checkpoint time (Unix seconds, the progress library's ``training_last_checkpoint_timestamp_seconds``).

    Polls every ``interval`` seconds for at most ``timeout``; each poll is ledgered. Failed when the time runs
    out (the job is left running: a person decides), Retry when Prometheus cannot be reached.
    """

    name = "training.wait_for_checkpoint"
    description = "Wait (bounded) until the job's newest checkpoint is newer than the request"
    read_only = True
    params = {
        "query": Param(max_length=2000, promql=True, description="PromQL: the job's newest checkpoint time"),
        "timeout": Param(
            kind="integer",
            required=False,
            default=900,
            description=f"{MIN_WAIT_SECONDS}..{MAX_WAIT_SECONDS} s",
        ),
        "interval": Param(
            kind="integer",
            required=False,
            default=15,
            description=f"{MIN_POLL_SECONDS}..{MAX_POLL_SECONDS} s",
        ),
    }

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        params = super().validate(raw)
        if not MIN_WAIT_SECONDS <= params["timeout"] <= MAX_WAIT_SECONDS:
            raise ParamError(
                self.name, "timeout", f"must be between {MIN_WAIT_SECONDS} and {MAX_WAIT_SECONDS}"
            )
        if not MIN_POLL_SECONDS <= params["interval"] <= min(MAX_POLL_SECONDS, params["timeout"]):
            raise ParamError(self.name, "interval", f"must be between {MIN_POLL_SECONDS} and the timeout")
        return params

    def plan(self, params: Mapping[str, Any]) -> Plan:
        return Plan(
            f"wait up to {params['timeout']}s for a checkpoint newer than the request (poll every "
            f"{params['interval']}s)",
            params["query"],
        )

    def run(self, params: Mapping[str, Any], ctx: ActionContext) -> Outcome:
        query = params["query"]
        asked = ctx.clock.now().timestamp()
        deadline = asked + params["timeout"]
        newest: float | None = None
        while True:
            try:
                samples = ctx.clients.prometheus.query(query)
            except BackendError as exc:
                return Retry(reason=f"Prometheus: {exc}", command=query, after=params["interval"])
            except ConfigError as exc:
                return Failed(reason=str(exc), command=query)
            values = [s.value for s in samples if math.isfinite(s.value)]
            newest = max(values) if values else None
            ctx.record(
                LedgerKind.CHECKPOINT_POLL,
                f"newest checkpoint {_when(newest)}, asked at {asked:.0f}",
                {"newest": newest, "asked": asked},
            )
            if newest is not None and newest > asked:
                return Ok(
                    command=query,
                    output=f"checkpoint written {newest - asked:.0f}s after the request",
                    data={"checkpoint_time": newest, "asked": asked},
                )
            now = ctx.clock.now().timestamp()
            if now >= deadline:
                return Failed(
                    reason=f"no checkpoint within {params['timeout']}s of the request (newest {_when(newest)}): "
                    "the job is left running",
                    command=query,
                    data={"newest": newest, "asked": asked},
                )
            ctx.clock.sleep(min(params["interval"], deadline - now))


def _when(timestamp: float | None) -> str:
    return "none" if timestamp is None else f"at {timestamp:.0f}"


ACTIONS = (RequestCheckpoint(), WaitForCheckpoint())
