"""A scheduler host simulated at Nightshift's CommandRunner seam (app/clients/ssh.py): the benchmarks' fakes of
Slurm answer the argv the Slurm client sends from their own model of the cluster (``_answer``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.clients.ssh import CommandResult


class AnsweringRunner:
    """A CommandRunner whose every command is answered by :meth:`_answer` (output, exit code), in no time."""

    def _answer(self, argv: tuple[str, ...]) -> tuple[str, int]:
        raise NotImplementedError

    def run(self, argv: Any, timeout: float | None = None) -> CommandResult:
        argv = tuple(argv)
        out, code = self._answer(argv)
        return CommandResult(
            argv, " ".join(argv), code, out if code == 0 else "", "" if code == 0 else out, 0.01
        )

    def run_all(self, argvs: Sequence[Sequence[str]], timeout: float | None = None) -> list[CommandResult]:
        return [self.run(argv) for argv in argvs]

    def close(self) -> None:
        pass
