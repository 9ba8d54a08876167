"""Fault injection from the command line: ``python -m sim.cli [--state-dir D] inject|clear|status ...``.

    inject xid 79 --node node1 --gpu 3            Xid on a GPU (also logged to D/nodes/node1/kern.log)
    inject ecc|row_remap|thermal|vanish --node N --gpu G
    inject nvlink --node N --gpu G [--rate 50]    NVLink CRC/replay errors per second
    inject hang|nccl|oom|io|s3_timeout|nan|corrupt_checkpoint --job NAME
    inject slowdown 4 --job NAME                  steps take 4x as long, until cleared
    inject validation fail|pass|hang --node N     what `dcgmi diag` on the node concludes (sim.dcgmi)
    clear [--node N [--gpu G]] [--job NAME]       nothing given: clear every fault
    status                                        faults and trainers, as JSON

``--state-dir`` defaults to ``$SIM_STATE_DIR``. The same operations are importable from :mod:`sim.faults`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from sim import faults, statedir


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sim.cli", description="Inject faults into the simulator."
    )
    parser.add_argument("--state-dir", type=Path, default=os.environ.get("SIM_STATE_DIR"))
    commands = parser.add_subparsers(dest="command", required=True)
    inject = commands.add_parser("inject", help="inject a fault")
    inject.add_argument("fault", choices=("xid", "validation", *faults.GPU_FAULTS, *faults.JOB_FAULTS))
    inject.add_argument(
        "value", nargs="?", help="the Xid code, the slowdown factor, or the validation verdict"
    )
    inject.add_argument("--node")
    inject.add_argument("--gpu", type=int)
    inject.add_argument("--job")
    inject.add_argument("--rate", type=float, help="nvlink: errors per second")
    clear = commands.add_parser("clear", help="clear faults (a GPU reset / node reboot / job fix)")
    clear.add_argument("--node")
    clear.add_argument("--gpu", type=int)
    clear.add_argument("--job")
    show = commands.add_parser("status", help="print faults and trainers as JSON")
    # Options may come before or after the subcommand (`--state-dir D inject ...` or `inject ... --state-dir D`).
    for sub in (inject, clear, show):
        sub.add_argument("--state-dir", type=Path, default=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.state_dir is None:
        parser.error("--state-dir (or $SIM_STATE_DIR) is required")
    return args


def inject(args: argparse.Namespace) -> str:
    """Apply one ``inject`` command; returns what was done, in words. ValueError on bad arguments."""
    if args.fault == "validation":
        if args.node is None or args.value is None:
            raise ValueError(
                "validation needs a verdict and --node, e.g. `inject validation fail --node node2`"
            )
        faults.inject_validation(args.state_dir, args.node, args.value)
        return f"dcgmi diag on {args.node} will {args.value}"
    value = _number(args.value)
    if args.fault == "xid" or args.fault in faults.GPU_FAULTS:
        if args.node is None or args.gpu is None:
            raise ValueError(f"{args.fault} needs --node and --gpu")
        if args.fault == "xid":
            if value is None or value != int(value) or value <= 0:
                raise ValueError("xid needs a positive integer code, e.g. `inject xid 79`")
            faults.inject_xid(args.state_dir, args.node, args.gpu, int(value))
            return f"Xid {int(value)} on {args.node} GPU {args.gpu}"
        faults.inject_gpu_fault(args.state_dir, args.node, args.gpu, args.fault, rate=args.rate)
        return f"{args.fault} on {args.node} GPU {args.gpu}"
    if args.job is None:
        raise ValueError(f"{args.fault} needs --job")
    faults.inject_job_fault(args.state_dir, args.job, args.fault, factor=value)
    return f"{args.fault} for job {args.job}"


def _number(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


def status(state_dir: Path) -> dict[str, object]:
    trainers = [
        {**t, "alive": statedir.pid_alive(int(t.get("pid", 0)))} for t in statedir.read_trainers(state_dir)
    ]
    return {"faults": faults.load(state_dir).data, "trainers": trainers}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "inject":
            print(f"injected: {inject(args)}")
        elif args.command == "clear":
            if args.gpu is not None and args.node is None:
                raise ValueError("--gpu needs --node")
            faults.clear(args.state_dir, node=args.node, gpu=args.gpu, job=args.job)
            print("cleared")
        else:
            print(json.dumps(status(args.state_dir), indent=2, sort_keys=True))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
