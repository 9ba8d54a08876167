"""The ETTR benchmark's figures: aggregates of the runs, and the markdown written into bench/README.md (section 8,
between :data:`BEGIN` and :data:`END`) and README.md (the Performance sentence, between :data:`SUMMARY_BEGIN`
and :data:`SUMMARY_END`). Everything here is a function of the results JSON, so the README can be checked
against it (tests/unit/test_ettr.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BENCH_README = REPO / "bench" / "README.md"
README = REPO / "README.md"
BEGIN, END = "<!-- ettr:begin -->", "<!-- ettr:end -->"
SUMMARY_BEGIN, SUMMARY_END = "<!-- ettr-summary:begin -->", "<!-- ettr-summary:end -->"

LABELS = {
    "oracle": "oracle (the bound)",
    "nightshift": "**Nightshift** (shipped playbooks; the team answers its pages)",
    "nightshift-no-issue25": "Nightshift without the straggler and planned-swap playbooks",
    "nightshift-no-person": "Nightshift, nobody answering",
    "on-call": "staffed on-call, no automation (5 min by day, 30 by night)",
    "team": "people only (20 min by day, 2 h by night): the baseline",
    "health-check-loop": "requeue loop with a node health check (+ the team)",
    "naive-loop": "naive requeue loop (+ the team)",
}
COUNTS = ("restarts", "restarts_onto_faulty_node", "wrong_actions", "human_minutes", "pages")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def dumps(result: Mapping[str, Any]) -> str:
    """The results JSON (no NaN or infinity: null)."""
    return json.dumps(_finite(dict(result)), indent=1) + "\n"


def spread(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": median(ordered), "min": ordered[0], "max": ordered[-1]}


def aggregate(runs: Mapping[str, Sequence[Mapping[str, Any]]], baseline: str = "team") -> dict[str, Any]:
    """Per policy: ETTR (median, min, max over seeds), the share of the achievable gain (paired per seed:
    (policy - baseline) / (oracle - baseline)), the medians of the counts, and lost hours by class (mean)."""
    table: dict[str, Any] = {}
    for policy, results in runs.items():
        row: dict[str, Any] = {"ettr": spread([r["ettr"] for r in results])}
        if "oracle" in runs and baseline in runs:
            shares = [
                (r["ettr"] - b["ettr"]) / (o["ettr"] - b["ettr"])
                for r, b, o in zip(results, runs[baseline], runs["oracle"], strict=True)
                if o["ettr"] > b["ettr"]
            ]
            row["gain_share"] = spread(shares) if shares else None
        for key in COUNTS:
            row[key] = median(float(r.get(key, 0)) for r in results)
        classes = sorted({c for r in results for c in r["lost_hours"]})
        row["lost_hours"] = {
            c: sum(r["lost_hours"].get(c, 0.0) for r in results) / len(results) for c in classes
        }
        row["exclusion_list_at_end"] = [r["exclusion_list_at_end"] for r in results]
        table[policy] = row
    return table


def _ettr(cell: Mapping[str, float]) -> str:
    return f"{cell['median']:.4f} ({cell['min']:.4f}-{cell['max']:.4f})"


def _share(cell: Mapping[str, float] | None) -> str:
    if not cell:
        return "-"
    return f"{cell['median']:.0%} ({cell['min']:.0%}-{cell['max']:.0%})"


def main_table(report: Mapping[str, Any]) -> list[str]:
    main = report["main"]
    p = main["physics"]
    lines = [
        f"A job of {p['nodes'] * p['gpus_per_node']:,} GPUs ({p['nodes']} nodes x {p['gpus_per_node']}, "
        f"{p['spares']} spare nodes) for {p['days']:g} simulated days, {len(main['seeds'])} seeds (the same faults "
        "replayed against every policy); ETTR = training progress / wall time, median (min-max); share of the "
        "achievable gain = (policy - people only) / (oracle - people only), paired per seed; the other columns "
        "are medians per simulated month.",
        "",
        "| policy | ETTR | share of the achievable gain | human minutes | restarts | restarts onto a faulty node "
        "| wrong actions | pages |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for policy, row in main["table"].items():
        lines.append(
            f"| {LABELS.get(policy, policy)} | {_ettr(row['ettr'])} | {_share(row.get('gain_share'))} "
            f"| {row['human_minutes']:.0f} | {row['restarts']:.0f} | {row['restarts_onto_faulty_node']:.0f} "
            f"| {row['wrong_actions']:.0f} | {row['pages']:.0f} |"
        )
    ends = main["table"].get("nightshift-no-person", {}).get("exclusion_list_at_end")
    if ends:
        lines += [
            "",
            f"Nightshift with nobody answering: its job's exclusion list at the end, per seed: {ends}.",
        ]
    return lines


def lost_table(report: Mapping[str, Any], policies: Sequence[str]) -> list[str]:
    main = report["main"]
    gpus = main["physics"]["nodes"] * main["physics"]["gpus_per_node"]
    shown = [p for p in policies if p in main["table"]]
    classes = sorted({c for p in shown for c in main["table"][p]["lost_hours"]})
    lines = [
        "Lost GPU-hours per simulated month by fault class (mean over seeds; the job's lost training hours x "
        f"{gpus:,} GPUs); `checkpointing` is the checkpoints' own stalls:",
        "",
        "| fault class | " + " | ".join(LABELS.get(p, p).replace("**", "") for p in shown) + " |",
        "|---|" + "---|" * len(shown),
    ]
    for cause in classes:
        cells = [f"{main['table'][p]['lost_hours'].get(cause, 0.0) * gpus:,.0f}" for p in shown]
        lines.append(f"| {cause} | " + " | ".join(cells) + " |")
    totals = [f"**{sum(main['table'][p]['lost_hours'].values()) * gpus:,.0f}**" for p in shown]
    lines.append("| all | " + " | ".join(totals) + " |")
    return lines


def calibration_table(report: Mapping[str, Any]) -> list[str]:
    cal = report["calibration"]
    p = cal["physics"]
    fit = cal["fit"]
    lines = [
        f"Calibration at Llama 3's scale: {p['nodes'] * p['gpus_per_node']:,} GPUs, {p['days']:g} days, "
        f"{len(cal['seeds'])} seeds; checkpoint every {p['checkpoint_interval'] / 60:.1f} min (Young/Daly for this "
        f"job's MTBF of {cal['mtbf_hours']:.1f} h and a {p['checkpoint_seconds']:g} s checkpoint stall). The "
        f"restart cost fitted so that the health-check loop's median is {cal['target']:.2f}: "
        f"**{fit['restart_minutes']:.1f} min** (bisection: "
        + ", ".join(f"{r:.1f} min → {e:.4f}" for r, e in fit["steps"])
        + ").",
        "",
        "| policy at 16,384 GPUs | ETTR |",
        "|---|---|",
    ]
    for policy, cell in cal["policies"].items():
        lines.append(f"| {LABELS.get(policy, policy).replace('**', '')} | {_ettr(cell)} |")
    return lines


def sweep_table(report: Mapping[str, Any]) -> list[str]:
    sweep = report["sweeps"]["checkpoint_restart"]
    policies = sweep["policies"]
    if not sweep["points"]:
        return []
    lines = [
        f"Sweep of the checkpoint interval and the restart cost ({sweep['gpus']:,} GPUs, {sweep['days']:g} days, "
        f"seeds {sweep['seeds']}; median ETTR):",
        "",
        "| interval | restart | "
        + " | ".join(LABELS.get(p, p).split(" (")[0].replace("**", "") for p in policies)
        + " | Nightshift's share of the gain |",
        "|---|---|" + "---|" * (len(policies) + 1),
    ]
    for point in sweep["points"]:
        cells = [f"{point['ettr'][p]:.4f}" for p in policies]
        lines.append(
            f"| {point['interval_minutes']:.0f} min | {point['restart_minutes']:.1f} min | "
            + " | ".join(cells)
            + f" | {_share(point.get('gain_share'))} |"
        )
    return lines


def assumption_table(report: Mapping[str, Any]) -> list[str]:
    rows = report["sweeps"]["assumptions"]
    if not rows:
        return []
    policies = rows[0]["policies"]
    lines = [
        "Sweeps of the assumed rates (median ETTR, same seeds as the sweep above):",
        "",
        "| assumption | value | "
        + " | ".join(LABELS.get(p, p).split(" (")[0].replace("**", "") for p in policies)
        + " |",
        "|---|---|" + "---|" * len(policies),
    ]
    for row in rows:
        cells = ["-" if row["ettr"][p] is None else f"{row['ettr'][p]:.4f}" for p in policies]
        lines.append(f"| {row['name']} | {row['value']} | " + " | ".join(cells) + " |")
    return lines


def detection_table(report: Mapping[str, Any]) -> list[str]:
    lines = [
        "What the shipped rules raise for each fault (`promtool test rules` over the series of "
        "`bench/ettr/signals.py`, a job that has trained 70 min; seconds from the fault to the first firing, "
        "before Alertmanager's 10 s group_wait):",
        "",
        "| fault | alerts (first firing, s) |",
        "|---|---|",
    ]
    for key, row in report["detection"].items():
        if not key.endswith("@4200"):
            continue
        cells = ", ".join(f"{name} {delay:.0f}" for name, delay in sorted(row.items(), key=lambda kv: kv[1]))
        lines.append(f"| {key.removesuffix('@4200')} | {cells or 'none'} |")
    return lines


def sources_table(report: Mapping[str, Any]) -> list[str]:
    lines = ["| figure | source |", "|---|---|"]
    for name, source in report["sources"].items():
        lines.append(f"| {name} | {source} |")
    lines += [
        "",
        "Table 5 as used (count per row; the share from the count):",
        "",
        "| component | category | count | share | simulated as |",
        "|---|---|---|---|---|",
    ]
    total = sum(row["count"] for row in report["table5"])
    for row in report["table5"]:
        lines.append(
            f"| {row['component']} | {row['category']} | {row['count']} | {row['count'] / total:.1%} | "
            f"`{row['kind']}` |"
        )
    return lines


def markdown(report: Mapping[str, Any]) -> str:
    """The block of bench/README.md's section 8."""
    head = (
        f"Run on the code of commit {report['commit']} (`python -m bench.ettr {report['argv']}`): "
        f"{report['seconds'] / 60:.0f} min of wall time and {report['cpu_seconds'] / 60:.0f} min of CPU on "
        f"{report['machine']}, shared with other work (on 2 free cores the wall time is about half the CPU time)."
    )
    parts = [
        [head],
        main_table(report),
        lost_table(report, ("oracle", "nightshift", "nightshift-no-issue25", "health-check-loop", "team")),
        calibration_table(report),
        sweep_table(report),
        assumption_table(report),
        detection_table(report),
        sources_table(report),
    ]
    return "\n\n".join("\n".join(part) for part in parts if part)


def summary_sentence(report: Mapping[str, Any]) -> str:
    """README.md's Performance sentence about this benchmark."""
    table = report["main"]["table"]
    p = report["main"]["physics"]

    def m(policy: str) -> str:
        return f"{table[policy]['ettr']['median']:.3f}"

    share = table["nightshift"].get("gain_share")
    return (
        f"A simulated month of a {p['nodes'] * p['gpus_per_node']:,}-GPU job (`bench/ettr/`, physics calibrated to "
        f"Llama 3's 90% at 16,384 GPUs): effective training time (median of {len(report['main']['seeds'])} seeds) "
        f"{m('nightshift')} with Nightshift, {m('oracle')} for an oracle, {m('on-call')} with a staffed on-call, "
        f"{m('health-check-loop')} with a requeue loop and a node health check, {m('team')} with people alone, "
        f"{m('nightshift-no-person')} with Nightshift and nobody answering; Nightshift takes "
        f"{_share(share)} of the achievable gain over people alone."
    )


def replace_block(text: str, begin: str, end: str, block: str) -> str:
    if begin not in text or end not in text:
        raise ValueError(f"markers {begin} ... {end} not found")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def block_of(text: str, begin: str, end: str) -> str:
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def write_readmes(
    report: Mapping[str, Any], bench_readme: Path = BENCH_README, readme: Path = README
) -> None:
    bench_readme.write_text(replace_block(bench_readme.read_text(), BEGIN, END, markdown(report)))
    readme.write_text(replace_block(readme.read_text(), SUMMARY_BEGIN, SUMMARY_END, summary_sentence(report)))
