"""Checkpoint quarantine: move the newest checkpoint aside so the job resumes from the one before.

The commands run over SSH on the Slurm host (``ctx.clients.slurm``), which is expected to share the
checkpoint filesystem with the compute nodes. On Kubernetes, ``kubernetes.checkpoint_rollback``
(app/actions/kubernetes_rollback.py) rolls a directory back in-cluster, by Jobs mounting the job's volume.

Which checkpoint is "newest": the subdirectories of ``dir`` matching ``pattern`` (symlinks are never
candidates, earlier quarantines are skipped). When every candidate name ends in a number (``step_1200``,
``checkpoint-500``, ``global_step30``) they are ordered by that number, so ``step_10`` is newer than
``step_9``; otherwise by modification time. The newest one is renamed, never deleted.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from app.actions.base import ActionContext, Plan
from app.actions.slurm import SlurmAction, executed_commands
from app.domain.errors import ParamError
from app.domain.outcome import Failed, Ok, Outcome, tail
from app.domain.params import ABS_PATH, Param

if TYPE_CHECKING:
    from app.clients.slurm import SlurmClient
    from app.clients.ssh import CommandResult

QUARANTINE_MARK = ".quarantined-"
# A find(1) -name pattern: a file name with * ? [ ] wildcards, no slash, no leading dash.
NAME_PATTERN = r"[A-Za-z0-9._*?\[\]][A-Za-z0-9._*?\[\]-]{0,99}"


def below(path: str, roots: Sequence[str]) -> bool:
    """Whether the resolved ``path`` lies strictly below one of the resolved ``roots`` (never a root itself: the
    root holds every job's checkpoint directories, and quarantining "its newest" would hit another job)."""
    return any(path != root and path.startswith(root.rstrip("/") + "/") for root in roots)


def path_problem(path: str) -> str | None:
    """Why a rendered checkpoint directory is refused before anything runs, or None: every component named, none
    ``.`` or ``..``, no trailing slash (``/shared/checkpoints/`` and ``/shared/checkpoints/.`` are the root)."""
    parts = path.split("/")[1:]
    if not parts or any(part in ("", ".", "..") for part in parts):
        return "must name a directory below its root: no empty, '.' or '..' component, no trailing '/'"
    return None


def parse_listing(output: str) -> list[tuple[float, str]]:
    """(mtime, name) pairs of ``find -printf '%T@ %f\\0'`` output, without earlier quarantines."""
    entries = []
    for record in output.split("\0"):
        mtime, _, name = record.partition(" ")
        if name and QUARANTINE_MARK not in name:
            entries.append((float(mtime), name))
    return entries


def by_age(entries: Sequence[tuple[float, str]]) -> list[str]:
    """Checkpoint names, oldest first: by trailing number when every name has one, else by mtime."""
    numbers = [re.search(r"([0-9]+)$", name) for _, name in entries]
    if entries and all(numbers):
        keyed = [
            (int(m.group(1)), mtime, name) for m, (mtime, name) in zip(numbers, entries, strict=True) if m
        ]
        return [name for *_, name in sorted(keyed)]
    return [name for _, name in sorted(entries)]


def resolve_below_root(
    slurm: SlurmClient, directory: str, executed: list[CommandResult], ctx: ActionContext
) -> str | Failed:
    """``directory`` resolved on the Slurm host (``realpath -e``), or Failed unless it lies strictly below one of
    ``settings.checkpoint.allowed_roots`` (resolved there too), so a symlink cannot lead out of a root."""
    roots = list(ctx.settings.checkpoint.allowed_roots)
    if not roots or not all(re.fullmatch(ABS_PATH, root) for root in roots):
        return Failed(reason=f"checkpoint.allowed_roots must list absolute paths (got {roots!r})")
    executed.append(slurm.run(["realpath", "-e", "--", directory]))
    resolved = executed[-1].stdout.rstrip("\n")
    executed.append(slurm.run(["realpath", "-m", "--", *roots]))
    resolved_roots = executed[-1].stdout.splitlines()
    if not below(resolved, resolved_roots):
        return Failed(
            reason=f"{directory} resolves to {resolved}, not strictly below an allowed root "
            f"({', '.join(resolved_roots)})",
            command=executed_commands(executed),
        )
    return resolved


def quarantine_name(name: str, ctx: ActionContext) -> str:
    return f"{name}{QUARANTINE_MARK}{ctx.clock.now().strftime('%Y%m%dT%H%M%SZ')}"


class CheckpointDirAction(SlurmAction):
    """An action on one job's checkpoint directory, the ``dir`` parameter: a value with an empty, ``.`` or ``..``
    component (it would name a root) is refused before anything runs (:func:`path_problem`)."""

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        params = super().validate(raw)
        problem = path_problem(params["dir"])
        if problem:
            raise ParamError(self.name, "dir", f"{params['dir']!r} {problem}")
        return params


class QuarantineLatest(CheckpointDirAction):
    """Rename the newest checkpoint under an allowed root to ``<name>.quarantined-<UTC timestamp>``.

    ``dir`` is resolved on the remote host (``realpath -e``) and must lie strictly below one of
    ``settings.checkpoint.allowed_roots`` (also resolved there), so a symlink cannot lead out of a root, nor
    back to the root itself; a ``dir`` rendered from an empty label is refused before anything runs; the
    candidates are listed with ``find -type d``, which does not follow symlinks; the rename is ``mv -n -T``,
    which never overwrites.
    """

    name = "checkpoint.quarantine_latest"
    description = "Move the newest checkpoint aside so the job resumes from the previous one"
    params = {
        "dir": Param(pattern=ABS_PATH, max_length=1024, description="checkpoint directory (absolute)"),
        "pattern": Param(
            pattern=NAME_PATTERN, required=False, default="*", description="checkpoint name glob"
        ),
    }

    def plan(self, params: Mapping[str, Any]) -> Plan:
        listing = _list_command(params["dir"], params["pattern"])
        return Plan(
            f"rename the newest checkpoint matching {params['pattern']!r} in {params['dir']} "
            f"to <name>{QUARANTINE_MARK}<UTC time>",
            "\n".join(
                [
                    shlex.join(["realpath", "-e", "--", params["dir"]]),
                    shlex.join(listing),
                    "env LC_ALL=C mv -n -T -v -- <newest> <newest>.quarantined-<UTC time>",
                ]
            ),
        )

    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        resolved = resolve_below_root(slurm, params["dir"], executed, ctx)
        if isinstance(resolved, Failed):
            return resolved
        executed.append(slurm.run(_list_command(resolved, params["pattern"])))
        names = by_age(parse_listing(executed[-1].stdout))
        if not names:
            return Failed(
                reason=f"no checkpoint directory matching {params['pattern']!r} in {resolved}",
                command=executed_commands(executed),
            )
        newest = f"{resolved}/{names[-1]}"
        target = f"{resolved}/{quarantine_name(names[-1], ctx)}"
        # -n: never overwrite. -v under LC_ALL=C says "renamed" only when it did (9.1 -n is silent).
        executed.append(slurm.run(["env", "LC_ALL=C", "mv", "-n", "-T", "-v", "--", newest, target]))
        if "renamed" not in executed[-1].stdout:
            return Failed(
                reason=f"{target} already exists; nothing renamed", command=executed_commands(executed)
            )
        previous = f"{resolved}/{names[-2]}" if len(names) > 1 else None
        return Ok(
            command=executed_commands(executed),
            output=tail(f"{executed[-1].stdout}job resumes from: {previous or 'scratch (no older one)'}"),
            exit_code=0,
            data={"quarantined": newest, "to": target, "previous": previous},
        )


def _list_command(directory: str, pattern: str) -> list[str]:
    # -type d without -L: symlinks are never candidates. NUL-separated "mtime name" records.
    return ["find", directory, "-mindepth", "1", "-maxdepth", "1", "-type", "d", "-name", pattern,
            "-printf", r"%T@ %f\0"]  # fmt: skip


ACTIONS = (QuarantineLatest(),)
