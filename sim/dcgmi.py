"""A ``dcgmi`` look-alike for the simulator: ``dcgmi diag -r LEVEL [-i GPUS] [--host NODE]``.

The verdict follows the faults injected on the node (:mod:`sim.faults`), read from ``$SIM_STATE_DIR``: a fatal
Xid (:data:`sim.gpus.FATAL_XIDS`) fails ``software`` ("Detected XID 79 for GPU 3"), a double-bit ECC error fails
``memory``, a failed row remap fails ``software``, NVLink errors fail ``pcie``, a vanished GPU fails ``memory``;
thermal throttling does not fail a level-2 run. ``faults.inject_validation(node, verdict)`` overrides that:
``fail`` (the software test finds pending page retirements with a DBE on the first GPU, in addition to what the
faults cause), ``pass``, or ``hang`` (the diagnostic never returns,
as a wedged GPU makes it; it returns once whoever waits on it has gone, e.g. an SSH channel closed at its
timeout).

The node is ``--host`` (real dcgmi talks to the nv-hostengine of that host) or ``$SIM_NODE`` (set where the
command runs "on" a node). Output and exit status are dcgmi 4.x's (``Diag.cpp``, ``HelperDisplayAsCli``):
"Successfully ran diagnostic for group." and the result table with one line per test, one per GPU, and a
"Warning: GPUn" line per finding wrapped at 45 characters; exit status 0 when every test passed, 226
(``DCGM_ST_NVVS_ERROR`` = -30) when one failed. An unknown host prints dcgmi's connection error and exits 255;
that status is this simulator's choice, not checked against a real dcgmi. A run lasts ``$SIM_DIAG_SECONDS``
(default 1; a real level 2 lasts about two minutes).

:func:`report` is pure (no I/O); :func:`main` reads the state and prints.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sim import faults, gpus

DCGM_VERSION = "4.4.2"
EXIT_PASS = 0
EXIT_FAIL = 226  # dcgmReturn_t DCGM_ST_NVVS_ERROR (-30) as a process exit status
EXIT_NO_HOST = 255
DEFAULT_GPUS = 8
H100_DEVICE_ID = "2330"
# Tests of each level, in dcgmi's display order of categories (Deployment, Hardware, Integration, Stress).
LEVELS: dict[int, tuple[tuple[str, str], ...]] = {
    1: (("software", "Deployment"),),
    2: (("software", "Deployment"), ("memory", "Hardware"), ("pcie", "Integration")),
    3: (
        ("software", "Deployment"),
        ("memory", "Hardware"),
        ("diagnostic", "Hardware"),
        ("pcie", "Integration"),
        ("targeted_stress", "Stress"),
        ("targeted_power", "Stress"),
        ("memory_bandwidth", "Stress"),
    ),
}
LEVELS[4] = (*LEVELS[3], ("memtest", "Hardware"), ("pulse_test", "Stress"))
LEVEL_NAMES = {"quick": 1, "short": 1, "medium": 2, "long": 3, "xlong": 4}
CATEGORIES = ("Deployment", "Hardware", "Integration", "Stress")

# The table: "| " + name (25) + " | " + info (46) + " |"; messages wrap at 45 characters (DATA_INFO_TAG_LEN).
_NAME, _INFO, _WRAP = 25, 46, 45
_RULE = "+" + "-" * (_NAME + 2) + "+" + "-" * (_INFO + 2) + "+"
_HEADER = "\n".join(
    [_RULE, f"| {'Diagnostic':<{_NAME}} | {'Result':<{_INFO}} |", _RULE.replace("-", "="), ""]
)


def _section(title: str, first: bool = False) -> str:
    """A category header line, e.g. ``|-----  Metadata  ----------+---...---|``."""
    left = f"-----  {title}  ".ljust(_NAME + 2, "-")
    edge, corner = ("|", "|") if first else ("+", "+")
    return f"{edge}{left}+{'-' * (_INFO + 2)}{corner}"


def _row(name: str, info: str) -> str:
    return f"| {name:<{_NAME}} | {info:<{_INFO}} |"


@dataclass(frozen=True)
class Finding:
    """One failure of one test on one GPU, with dcgm_errors.h's message."""

    test: str
    gpu: int
    message: str


@dataclass(frozen=True)
class Diagnosis:
    """What one ``dcgmi diag`` run found: exit status and the text dcgmi prints."""

    exit_code: int
    output: str
    findings: tuple[Finding, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return self.exit_code == EXIT_PASS


def findings(state: faults.FaultState, node: str, gpu_ids: Sequence[int]) -> list[Finding]:
    """The failures ``node``'s injected faults cause on ``gpu_ids`` (validation verdict overrides applied)."""
    verdict = state.validation(node)
    if verdict == "pass":
        return []
    found = []
    if verdict == "fail":
        message = f"Pending page retirements together with a DBE were detected on GPU {gpu_ids[0]}."
        found.append(Finding("software", gpu_ids[0], message))
    for gpu in gpu_ids:
        fatal = [e for e in state.xid_events(node, gpu) if e.xid in gpus.FATAL_XIDS]
        if fatal:
            found.append(Finding("software", gpu, f"Detected XID {fatal[-1].xid} for GPU {gpu}"))
        gpu_faults = state.gpu(node, gpu)
        if gpu_faults.vanished:
            message = f"Unable to find a corresponding CUDA device for GPU {gpu}: 'no CUDA-capable device is detected'"
            found.append(Finding("memory", gpu, message))
        if gpu_faults.ecc_dbe:
            message = f"CUDA APIs have indicated that a double-bit ECC error has occured on GPU {gpu}."
            found.append(Finding("memory", gpu, message))
        if gpu_faults.row_remap_failure:
            message = f"GPU {gpu} had uncorrectable memory errors and row remapping failed."
            found.append(Finding("software", gpu, message))
        if gpu_faults.nvlink_rate > 0:
            rate = f"{gpu_faults.nvlink_rate:.0f}"
            message = f"Detected {rate} CRC FLIT NvLink errors on GPU {gpu}'s NVLink (should be 0)"
            found.append(Finding("pcie", gpu, message))
    return found


def _wrapped(name: str, message: str) -> list[str]:
    return [_row(name if i == 0 else "", message[i : i + _WRAP]) for i in range(0, len(message), _WRAP)]


def report(
    level: int, gpu_ids: Sequence[int], found: Sequence[Finding], driver: str = gpus.DRIVER_VERSION
) -> Diagnosis:
    """dcgmi's output and exit status for a level-``level`` run over ``gpu_ids`` with ``found`` failures."""
    lines = ["Successfully ran diagnostic for group.", _HEADER.rstrip("\n"), _section("Metadata", first=True)]
    lines += [
        _row("DCGM Version", DCGM_VERSION),
        _row("Driver Version Detected", driver),
        _row("GPU Device IDs Detected", ",".join([H100_DEVICE_ID] * len(gpu_ids))),
    ]
    tests = LEVELS[level]
    for number, category in enumerate(CATEGORIES):
        in_category = [name for name, cat in tests if cat == category]
        if not in_category:
            continue
        lines.append(_section(category, first=number == 0))
        for name in in_category:
            failed = {f.gpu for f in found if f.test == name}
            lines.append(_row(name, "Fail" if failed else "Pass"))
            for gpu in gpu_ids:
                lines.append(_row("", f"GPU{gpu}: {'Fail' if gpu in failed else 'Pass'}"))
                for finding in (f for f in found if f.test == name and f.gpu == gpu):
                    lines += _wrapped(f"Warning: GPU{gpu}", finding.message)
    lines.append(_RULE)
    relevant = tuple(f for f in found if any(f.test == name for name, _ in tests))
    return Diagnosis(EXIT_FAIL if relevant else EXIT_PASS, "\n".join(lines) + "\n", relevant)


def diagnose(state: faults.FaultState, node: str, level: int, gpu_ids: Sequence[int]) -> Diagnosis:
    """A ``dcgmi diag -r level`` run on ``node`` given the injected faults."""
    return report(level, gpu_ids, findings(state, node, gpu_ids))


# --- command line ------------------------------------------------------------------------------------------------


class UsageError(Exception):
    """dcgmi refuses the command line (printed, exit status 1)."""


def _level(text: str) -> int:
    level = LEVEL_NAMES.get(text.lower()) or (int(text) if text.isdigit() else 0)
    if level not in LEVELS:
        raise UsageError(
            f"Error: invalid run level {text!r}: expected 1-4, quick, short, medium, long or xlong."
        )
    return level


def _gpu_list(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"Error: invalid GPU list {text!r}.") from None
    if not ids or any(i < 0 for i in ids):
        raise UsageError(f"Error: invalid GPU list {text!r}.")
    return ids


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dcgmi", description="DCGM command line (simulator look-alike).")
    commands = parser.add_subparsers(dest="command", required=True)
    diag = commands.add_parser("diag", help="run DCGM diagnostics")
    diag.add_argument("-r", "--run", required=True, help="level 1-4 or quick|short|medium|long|xlong")
    diag.add_argument("-i", "--entity-id", help="comma-separated GPU ids (default: every GPU)")
    diag.add_argument("--host", help="the node whose nv-hostengine runs the diagnostic (default: $SIM_NODE)")
    return parser.parse_args(argv)


def hang_until_hangup(fd: int | None = None) -> None:
    """Return only once the reader of ``fd`` (default: stdout) is gone: a hung diagnostic that whoever waits on
    it (an SSH channel closed at its timeout) can still end, instead of a process left behind forever."""
    poller = select.poll()
    poller.register(sys.stdout.fileno() if fd is None else fd, 0)  # 0: only POLLERR/POLLHUP/POLLNVAL
    while not poller.poll(1000):
        pass


def run(
    args: argparse.Namespace,
    env: Mapping[str, str],
    sleep: Callable[[float], None] = time.sleep,
    hang: Callable[[], None] = hang_until_hangup,
) -> tuple[int, str]:
    """Exit status and output of a parsed command line; the node and state directory come from ``env``. A
    ``hang`` verdict calls ``hang`` and prints nothing (exit status 1 if it ever returns)."""
    level = _level(args.run)
    node = args.host or env.get("SIM_NODE", "")
    state_dir = env.get("SIM_STATE_DIR", "")
    if not node or not state_dir or not Path(state_dir).is_dir():
        host = node or "localhost"
        return EXIT_NO_HOST, (
            f"Error: unable to establish a connection to the specified host: {host}\n"
            "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"
        )
    count = int(env.get("SIM_GPUS", DEFAULT_GPUS))
    gpu_ids = _gpu_list(args.entity_id) if args.entity_id else list(range(count))
    state = faults.load(Path(state_dir))
    if state.validation(node) == "hang":  # a wedged GPU: only the caller's timeout ends it
        hang()
        return 1, ""
    sleep(float(env.get("SIM_DIAG_SECONDS", "1")))
    diagnosis = diagnose(state, node, level, gpu_ids)
    return diagnosis.exit_code, diagnosis.output


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        code, output = run(args, os.environ)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(output, end="", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
