"""``checkpoint.rollback``: quarantine the checkpoint the training framework resumes from and make the previous
one current, for DeepSpeed, Megatron-LM, Hugging Face Trainer and PyTorch DCP layouts
(:mod:`app.domain.checkpoint_layouts` decides; this module only reads the directory and carries the plan out).

Over SSH on the Slurm host, which shares the checkpoint filesystem with the compute nodes, with the same root
checks as ``checkpoint.quarantine_latest`` (:func:`app.actions.checkpoint.resolve_below_root`). Order: the tracker
file is rewritten first (written beside it, then renamed over it), so at every moment it names a checkpoint that
exists; then the current checkpoint moves into ``nightshift-quarantine/`` with ``mv -n -T`` (never overwrites).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from app.actions.base import ActionContext, Plan
from app.actions.checkpoint import CheckpointDirAction, resolve_below_root
from app.actions.slurm import executed_commands
from app.domain.checkpoint_layouts import (
    DCP_FORMAT,
    DCP_METADATA,
    ENTRY_FORMAT,
    MAX_TRACKER_BYTES,
    QUARANTINE_DIR,
    TRACKERS,
    LayoutRefused,
    Listing,
    parse_dcp_dirs,
    parse_entries,
    plan_rollback,
)
from app.domain.outcome import Failed, Ok, Outcome, tail
from app.domain.params import ABS_PATH, Param

if TYPE_CHECKING:
    from app.clients.slurm import SlurmClient
    from app.clients.ssh import CommandResult

# Writes $1 to $2, then renames $2 over $3: the values travel as arguments, never as shell text.
_WRITE_THEN_RENAME = 'printf %s "$1" > "$2" && mv -f -T -- "$2" "$3"'


class CheckpointRollback(CheckpointDirAction):
    """Make the framework resume from the checkpoint before the current one; the current one is kept aside."""

    name = "checkpoint.rollback"
    description = "Set aside the checkpoint the framework resumes from; the previous one becomes current"
    params = {
        "dir": Param(
            pattern=ABS_PATH,
            max_length=1024,
            description="the job's checkpoint directory (absolute, below a root)",
        ),
    }

    def plan(self, params: Mapping[str, Any]) -> Plan:
        directory = params["dir"]
        return Plan(
            f"roll {directory} back one checkpoint: detect the layout (DeepSpeed 'latest', Megatron "
            "'latest_checkpointed_iteration.txt', Hugging Face 'checkpoint-N', DCP '.metadata'), point the "
            f"tracker at the previous checkpoint, move the current one into {QUARANTINE_DIR}/",
            "\n".join(
                [
                    shlex.join(["realpath", "-e", "--", directory]),
                    shlex.join(_entries_command(directory)),
                    shlex.join(_dcp_command(directory)),
                    "head -c 256 -- <tracker>   # latest | latest_checkpointed_iteration.txt, when present",
                    f"sh -c '{_WRITE_THEN_RENAME}' sh <previous> <tracker>.nightshift-tmp <tracker>",
                    f"mkdir -p -- <dir>/{QUARANTINE_DIR}",
                    f"env LC_ALL=C mv -n -T -v -- <dir>/<current> <dir>/{QUARANTINE_DIR}/<current>.<UTC time>",
                ]
            ),
        )

    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        resolved = resolve_below_root(slurm, params["dir"], executed, ctx)
        if isinstance(resolved, Failed):
            return resolved
        executed.append(slurm.run(_entries_command(resolved)))
        entries = parse_entries(executed[-1].stdout)
        executed.append(slurm.run(_dcp_command(resolved)))
        dcp_dirs = parse_dcp_dirs(executed[-1].stdout)
        trackers = {}
        for tracker in TRACKERS:
            if entries.get(tracker) == "f":
                executed.append(
                    slurm.run(["head", "-c", str(MAX_TRACKER_BYTES), "--", f"{resolved}/{tracker}"])
                )
                trackers[tracker] = executed[-1].stdout
        stamp = ctx.clock.now().strftime("%Y%m%dT%H%M%SZ")
        try:
            rollback = plan_rollback(Listing(entries, dcp_dirs, trackers), stamp)
        except LayoutRefused as exc:
            return Failed(reason=f"{resolved}: {exc}", command=executed_commands(executed))
        if rollback.tracker is not None and rollback.tracker_content is not None:
            tracker = f"{resolved}/{rollback.tracker}"
            write = [
                "sh",
                "-c",
                _WRITE_THEN_RENAME,
                "sh",
                rollback.tracker_content,
                f"{tracker}.nightshift-tmp",
            ]
            executed.append(slurm.run([*write, tracker]))
        executed.append(slurm.run(["mkdir", "-p", "--", f"{resolved}/{QUARANTINE_DIR}"]))
        current, target = f"{resolved}/{rollback.current}", f"{resolved}/{rollback.quarantined}"
        # -n: never overwrite. -v under LC_ALL=C says "renamed" only when it did.
        executed.append(slurm.run(["env", "LC_ALL=C", "mv", "-n", "-T", "-v", "--", current, target]))
        if "renamed" not in executed[-1].stdout:
            return Failed(
                reason=f"{target} already exists; {rollback.current} not moved"
                + (f" ({rollback.tracker} already names {rollback.previous})" if rollback.tracker else ""),
                command=executed_commands(executed),
            )
        return Ok(
            command=executed_commands(executed),
            output=tail(f"{executed[-1].stdout}{rollback.layout} resumes from: {rollback.previous}"),
            exit_code=0,
            data={
                "layout": str(rollback.layout),
                "quarantined": current,
                "to": target,
                "previous": f"{resolved}/{rollback.previous}",
                "tracker": rollback.tracker,
            },
        )


def _entries_command(directory: str) -> list[str]:
    # Type letter and name of each top-level entry, NUL-separated; symlinks are reported as 'l', never followed.
    return ["find", directory, "-mindepth", "1", "-maxdepth", "1", "-printf", ENTRY_FORMAT]


def _dcp_command(directory: str) -> list[str]:
    return ["find", directory, "-mindepth", "2", "-maxdepth", "2", "-type", "f", "-name", DCP_METADATA,
            "-printf", DCP_FORMAT]  # fmt: skip


ACTIONS = (CheckpointRollback(),)
