"""The results tables (Markdown) from the JSON files the benchmarks wrote; nothing is measured here.

    python -m bench.report [--results bench/results] [--out bench/results/summary.md]

Reads ``ingest.json``, ``contention.json``, ``engine_ingest.json``, ``lifecycle.json``, ``decision.json``,
``memory.json``, ``profile.json`` and ``e2e.json`` where present, and the same names under the history folders of
:data:`VERSIONS` for the rows of earlier code.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import record
from bench.e2e import SPANS
from bench.profile import TOP as TOP_FRAMES

# (label, folder under the results directory), oldest first; the last is the current code's run.
VERSIONS = (
    ("before fix", "before-fix"),  # before the profile-driven fix (prebuilt statements, one transaction)
    ("after fix", "after-fix"),  # that fix, before the lead's SQLite changes
    (
        "after SQLite changes",
        "after-sqlite-changes",
    ),  # writer lock, read-only snapshots, 1 worker x 8 threads
    ("inbox", "inbox"),  # the webhook commits the notification; the worker ingests it; cheaper parsing
    ("worker statements", "worker-statements"),  # the worker's statements built once; fewer transactions
    ("writer lock", "."),  # writers queue across processes (flock); the worker checkpoints SQLite's log
)
# The in-process writer lock (Store.transaction) as py-spy names the frame that waits on it.
WRITER_LOCK_FRAME = "Store.transaction (app/store/__init__.py)"


def _spread(spread: dict[str, float]) -> str:
    """``median (min-max)`` of a spread, one decimal, in whatever unit it was measured."""
    if spread["n"] == 1:
        return f"{spread['median']:.1f}"
    return f"{spread['median']:.1f} ({spread['min']:.1f}-{spread['max']:.1f})"


def _ratio(spread: dict[str, float] | None) -> str:
    if not spread:
        return ""
    if spread["n"] == 1:
        return f"{spread['median']:.1f}x"
    return f"{spread['median']:.1f}x ({spread['min']:.1f}-{spread['max']:.1f})"


def _cores(spread: dict[str, float] | None) -> str:
    if not spread:
        return ""
    return f"{spread['median']:.2f} ({spread['min']:.2f}-{spread['max']:.2f})"


def _pct(share: float | None) -> str:
    """A profile share, or "-" for a frame that was not among a run's top frames."""
    return "-" if share is None else f"{share}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def ingest_table(documents: dict[str, dict[str, Any]]) -> list[str]:
    """One row per (code version, load, server): percentiles median (min-max) over rounds, ratios to the floor."""
    header = ["code", "alerts/s", "notif/s", "server", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors"]
    header += ["done alerts/s", "server CPU, cores", "p50 / floor", "p99 / floor"]
    rows = []
    for label, doc in documents.items():
        for row in doc["results"]["summary"]:
            latency = row["latency_ms"]
            ratio = row.get("ratio_to_floor", {})
            rows.append(
                [
                    label,
                    f"{row['rate_alerts_per_s']:g}",
                    f"{row['notifications_per_s']['median']:.1f}",
                    row["server"],
                    _spread(latency["p50"]),
                    _spread(latency["p90"]),
                    _spread(latency["p99"]),
                    _spread(latency["max"]),
                    str(row["errors"]),
                    _spread(row["completed_alerts_per_s"]).replace(".0", ""),
                    _cores(row.get("server_cpu_cores")),  # measured since the writer-lock generation
                    _ratio(ratio.get("p50")),
                    _ratio(ratio.get("p99")),
                ]
            )
    lines = _table(header, rows)
    for label, doc in documents.items():
        results = doc["results"]
        # Runs before the split topology hold one verdict, for `nightshift`.
        for verdict in results.get("verdicts") or [{"server": "nightshift", **results["verdict"]}]:
            if verdict.get("measured"):
                met = "met" if verdict["met"] else "NOT met"
                lines.append(
                    f"\n{label}, {verdict['server']}: target (p99 <= 1.5x floor at {verdict['rate_alerts_per_s']}"
                    f" alerts/s, zero errors) {met}: p99 ratio {verdict['p99_ratio']}x, {verdict['errors']} errors."
                )
    return lines


def engine_ingest_table(documents: dict[str, dict[str, Any]]) -> list[str]:
    """Per code version: µs per alert inside Engine.ingest, median over rounds (min-max)."""
    rows = []
    for label, doc in documents.items():
        per_alert = doc["results"]["per_alert_us"]
        bound = 1e6 / per_alert["median"]
        rows.append([label, _spread(per_alert), f"{bound:,.0f}"])
    return _table(["code", "us per alert", "alerts/s one writer could take"], rows)


def lifecycle_table(documents: dict[str, dict[str, Any]]) -> list[str]:
    """Per code version: the worker's ms and store transactions per advisory incident, median over rounds."""
    rows = []
    for label, doc in documents.items():
        results = doc["results"]
        rows.append(
            [
                label,
                _spread(results["ms_per_incident"]),
                _spread(results["write_transactions_per_incident"]),
                _spread(results["read_transactions_per_incident"]),
            ]
        )
    return _table(["code", "ms per incident", "write transactions", "read transactions"], rows)


def decision_table(doc: dict[str, Any]) -> list[str]:
    header = ["series", "synthetic playbooks", "candidates/alert", "match µs", "match ratio"]
    header += ["decision µs", "decision ratio"]
    rows = []
    for series, entries in doc["results"]["series"].items():
        for row in entries:
            rows.append(
                [
                    series,
                    f"{row['synthetic_playbooks']:,}",
                    f"{row['candidates_per_alert']:g}",
                    _spread(row["match_us"]),
                    f"{row['ratio_to_first']['match_us']:.2f}x",
                    _spread(row["decision_us"]),
                    f"{row['ratio_to_first']['decision_us']:.2f}x",
                ]
            )
    return _table(header, rows)


def memory_table(documents: dict[str, dict[str, Any]]) -> list[str]:
    """One row per code version: RSS of the larger worker idle, at the end, at its peak, and its growth."""
    header = ["code", "alerts sent", "gunicorn workers", "idle RSS MiB", "final RSS MiB", "peak RSS MiB"]
    header += ["growth MiB", "2nd-half growth MiB", "MiB / 10k alerts (2nd half)", "errors"]
    rows = []
    for label, doc in documents.items():
        summary = doc["results"]["summary"]
        rows.append(
            [
                label,
                f"{summary['alerts']:,}",
                str(len(doc["results"]["checkpoints"][0]["rss_mib"])),
                f"{summary['idle_rss_mib']:.1f}",
                f"{summary['final_rss_mib']:.1f}",
                f"{summary['peak_rss_mib']:.1f}",
                f"{summary['growth_mib']:.1f}",
                f"{summary['second_half_growth_mib']:.1f}",
                f"{summary['second_half_mib_per_10k_alerts']}",
                str(summary["errors"]),
            ]
        )
    return _table(header, rows)


def profile_table(documents: dict[str, dict[str, Any]], at_least: float = 3.0) -> list[str]:
    """Every app/ function with an inclusive share of at least ``at_least``% in some run, with each run's share."""
    profiles = {label: doc["results"]["profile"] for label, doc in documents.items()}

    def largest(frame: str) -> float:
        return max(p["app_inclusive_pct"].get(frame, 0.0) for p in profiles.values())

    frames = {
        frame for p in profiles.values() for frame in p["app_inclusive_pct"] if largest(frame) >= at_least
    }
    rows = [
        [
            "waiting for the SQLite write lock (`BEGIN IMMEDIATE`)",
            *(f"{p['sqlite_write_lock_wait_pct']}%" for p in profiles.values()),
        ],
        [
            "self time in `Store.transaction` (waiting for the in-process writer lock)",
            *(_pct(p["self_pct"].get(WRITER_LOCK_FRAME)) for p in profiles.values()),
        ],
    ]
    for frame in sorted(frames, key=lambda f: (-largest(f), f)):
        shares = (p["app_inclusive_pct"].get(frame) for p in profiles.values())
        rows.append([f"`{frame}`", *(_pct(share) for share in shares)])
    rows.append(["samples", *(str(p["samples"]) for p in profiles.values())])
    lines = _table(["share of samples (inclusive)", *profiles], rows)
    lines.append(f"\n-: not among that run's top {TOP_FRAMES} app/ functions.")
    return lines


def e2e_floors(configured: dict[str, float], slurm_s: float) -> dict[str, tuple[float, str]]:
    """Per span key of :data:`bench.e2e.SPANS`, the floor the parts around Nightshift set and where it comes from;
    ``total`` is the sum along the critical path. Spans without an entry are Nightshift's or the job's own."""
    detect = configured["scrape_interval_s"] + configured["evaluation_interval_s"] + configured["rule_for_s"]
    after_steps = max(configured["verify_interval_s"], slurm_s + configured["scrape_interval_s"])
    return {
        "detect": (detect, "scrape interval + rule evaluation interval + `for` (worst case)"),
        "scrape": (configured["scrape_interval_s"], "scrape interval (worst case)"),
        "evaluate": (
            configured["evaluation_interval_s"] + configured["rule_for_s"],
            "rule evaluation interval + `for` (worst case)",
        ),
        "deliver": (configured["group_wait_s"], "Alertmanager group_wait"),
        "act": (slurm_s, "Slurm requeue → RUNNING, measured without Nightshift"),
        "slurm": (slurm_s, "Slurm requeue → RUNNING, measured without Nightshift"),
        "restart": (
            configured["scrape_interval_s"],
            "scrape interval (worst case), plus the job's own start",
        ),
        "verify_after_steps": (configured["verify_interval_s"], "the playbook's verify interval"),
        "total": (
            detect + configured["group_wait_s"] + after_steps,
            "detect + group_wait + max(verify interval, Slurm + scrape)",
        ),
    }


def e2e_table(doc: dict[str, Any]) -> list[str]:
    """Each stage's seconds (median, min-max over rounds) beside its floor; then Nightshift's own share."""
    results = doc["results"]
    summary, configured = results["summary"], results["configured"]
    slurm = results["slurm_requeue_to_running_s"]
    floors = e2e_floors(configured, slurm["median"])
    rows = []
    for key, label, _, _ in SPANS:
        floor, source = floors.get(key, (None, ""))
        name = f"&nbsp;&nbsp;{label.strip()}" if label.startswith(" ") else label
        rows.append([name, _spread(summary[key]), "" if floor is None else f"{floor:.1f}", source])
    rows.append(["Nightshift's own: decide + steps' execution", _spread(summary["own"]), "", ""])
    rows.append(["&nbsp;&nbsp;of which the steps' execution (SSH)", _spread(summary["steps"]), "", ""])
    share = {key: 100 * value if key != "n" else value for key, value in summary["share"].items()}
    lines = _table(["stage", "seconds", "floor s", "floor from"], rows)
    lines.append(
        f"\nNightshift's own share of fault → recovered: {_spread(share)} %. Slurm requeue → RUNNING without "
        f"Nightshift, per round: {', '.join(f'{s:.1f}' for s in slurm['rounds'])} s. Configured: "
        + ", ".join(f"{key} {value:g}" for key, value in configured.items())
        + "."
    )
    return lines


def contention_table(document: dict[str, Any]) -> list[str]:
    """Floor and webhook alone, without and beside a CPU-bound neighbour: p50/p99 and ratios to the lone floor."""
    rows = []
    for row in document["results"]["summary"]:
        latency, ratio = row["latency_ms"], row["ratio_to_floor"]
        rows.append(
            [
                row["server"],
                row["neighbour"],
                _cores(row.get("neighbour_cpu_cores")),
                _spread(latency["p50"]),
                _spread(latency["p99"]),
                str(row["errors"]),
                _ratio(ratio["p50"]),
                _ratio(ratio["p99"]),
            ]
        )
    header = ["server", "neighbour", "neighbour CPU, cores", "p50 ms", "p99 ms", "errors"]
    return _table([*header, "p50 / lone floor", "p99 / lone floor"], rows)


def render(results: Path) -> str:
    def load(name: str) -> dict[str, dict[str, Any]]:
        found = {}
        for label, folder in VERSIONS:
            if (results / folder / name).exists():
                found[label] = record.read(results / folder / name)
        return found

    lines: list[str] = []
    sections = (
        ("Webhook ingest", "ingest.json", ingest_table),
        (
            "A CPU-bound neighbour on the same cores",
            "contention.json",
            lambda docs: contention_table(docs[list(docs)[-1]]),
        ),
        (
            "Engine ingest, in-process (one thread, SQLite, no HTTP)",
            "engine_ingest.json",
            engine_ingest_table,
        ),
        ("Worker cost per advisory incident, in-process", "lifecycle.json", lifecycle_table),
        ("Decision cost", "decision.json", lambda docs: decision_table(docs[list(docs)[-1]])),
        ("Memory", "memory.json", memory_table),
        ("Profile (py-spy, 500 alerts/s)", "profile.json", profile_table),
        (
            "End to end (real stack, Xid 79 → recovered)",
            "e2e.json",
            lambda docs: e2e_table(docs[list(docs)[-1]]),
        ),
    )
    for title, name, table in sections:
        documents = load(name)
        if not documents:
            continue
        latest = documents[list(documents)[-1]]
        lines += [
            f"### {title}",
            "",
            f"Run finished {latest['finished_at']}, load average then {latest['loadavg_at_finish']}.",
            "",
        ]
        lines += table(documents)
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    parser.add_argument("--out", type=Path, default=record.RESULTS / "summary.md")
    args = parser.parse_args(argv)
    text = render(args.results)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
