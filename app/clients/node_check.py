"""A command run in the background on a node over SSH and looked at later: start, probe, stop.

A node validation (``dcgmi diag -r 2``: minutes) must not hold the worker that also recovers jobs, so it is started
detached on the node and probed on later ticks, as a Kubernetes validation pod is. Its state lives on the node in
``/tmp/nightshift-check-<run>/`` (``started``: the node's clock at start, ``pid``: its process group, ``out``: its
output, ``rc``: its exit status once it has ended). ``run`` (the repair's id) names the directory, so a result is
never read from another run.

The scripts are built here from an argv (every element quoted with :func:`shlex.quote`) and a run number (an int),
so no alert text reaches a shell unquoted; :func:`parse_probe` is pure. :class:`NodeCheck` runs them through a
:class:`app.clients.slurm.CommandRunner`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.domain.errors import CommandFailed

if TYPE_CHECKING:
    from app.clients.slurm import CommandRunner

OUTPUT_BYTES = 4000  # the tail of the output a probe brings back
_PROBE = re.compile(r"(absent|running|done)(?: (-?[0-9]+))?(?: (-?[0-9]+))?")


@dataclass(frozen=True)
class Probe:
    """What a probe found: ``absent`` (never started, or cleaned up), ``running`` or ``done``."""

    state: str
    elapsed: int = 0  # seconds since the start, by the node's clock
    exit_code: int | None = None
    output: str = ""


def workdir(run: int) -> str:
    if isinstance(run, bool) or not isinstance(run, int) or run < 0:
        raise ValueError(f"run must be a non-negative int, got {run!r}")
    return f"/tmp/nightshift-check-{run}"


def start_script(run: int, argv: Sequence[str]) -> str:
    """Start ``argv`` detached (its own session, no terminal, no inherited descriptors, so the SSH channel closes at
    once); print ``started``."""
    d = workdir(run)
    inner = f"{shlex.join(argv)} > {d}/out 2>&1; echo $? > {d}/rc.tmp && mv {d}/rc.tmp {d}/rc"
    return (
        f"set -e; d={d}; rm -rf $d; mkdir -p $d; date +%s > $d/started; "
        f"setsid nohup bash -c {shlex.quote(inner)} < /dev/null > /dev/null 2>&1 & "
        "echo $! > $d/pid; echo started"
    )


def probe_script(run: int) -> str:
    """Print ``absent``, ``running <elapsed>`` or ``done <elapsed> <exit code>`` then the output's tail."""
    d = workdir(run)
    return (
        f"d={d}; if [ -e $d/rc ]; then echo done $(( $(date +%s) - $(cat $d/started) )) $(cat $d/rc); "
        f"tail -c {OUTPUT_BYTES} $d/out; elif [ -e $d/started ]; then echo running $(( $(date +%s) - "
        "$(cat $d/started) )); else echo absent; fi"
    )


def stop_script(run: int) -> str:
    """End the run's process group if it still runs, and remove its directory; print ``stopped``."""
    d = workdir(run)
    return (
        f"d={d}; if [ -e $d/pid ]; then kill -TERM -- -$(cat $d/pid) 2> /dev/null || true; fi; "
        "rm -rf $d; echo stopped"
    )


def parse_probe(text: str) -> Probe:
    """The :class:`Probe` of :func:`probe_script`'s output. Raises ValueError for anything else."""
    first, _, rest = text.partition("\n")
    found = _PROBE.fullmatch(first.strip())
    if found is None:
        raise ValueError(f"unexpected probe output: {first[:200]!r}")
    state, elapsed, code = found.groups()
    return Probe(
        state=state,
        elapsed=int(elapsed or 0),
        exit_code=int(code) if code is not None else None,
        output=rest if state == "done" else "",
    )


class NodeCheck:
    """A background check on one node, through a command runner (SSH on the node)."""

    def __init__(self, runner: CommandRunner):
        self.runner = runner

    def start(self, run: int, argv: Sequence[str]) -> None:
        self._run(start_script(run, argv), "started")

    def probe(self, run: int) -> Probe:
        result = self.runner.run(["bash", "-c", probe_script(run)])
        try:
            return parse_probe(result.stdout)
        except ValueError as exc:
            raise CommandFailed(
                f"on the node: {exc}", exit_code=result.exit_code, output=result.output[-2000:]
            ) from None

    def stop(self, run: int) -> None:
        self._run(stop_script(run), "stopped")

    def _run(self, script: str, expected: str) -> None:
        result = self.runner.run(["bash", "-c", script])
        if result.exit_code != 0 or result.stdout.strip() != expected:
            raise CommandFailed(
                f"on the node: exited {result.exit_code}: {(result.stderr or result.stdout).strip()[:300]}",
                exit_code=result.exit_code,
                output=result.output[-2000:],
            )
