"""The results tables (Markdown) from the JSON files the benchmarks wrote; nothing is measured here.

    python -m bench.report [--results bench/results] [--out bench/results/summary.md]

Reads ``ingest.json``, ``engine_ingest.json``, ``decision.json``, ``memory.json`` and ``profile.json`` where
present, and the same names under ``before-fix/`` (runs made before the profile-driven fixes) for the before/after
rows.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import record
from bench.profile import TOP as TOP_FRAMES


def _ms(spread: dict[str, float]) -> str:
    """``median (min-max)`` of a spread, in ms."""
    if spread["n"] == 1:
        return f"{spread['median']:.1f}"
    return f"{spread['median']:.1f} ({spread['min']:.1f}-{spread['max']:.1f})"


def _ratio(spread: dict[str, float] | None) -> str:
    if not spread:
        return ""
    if spread["n"] == 1:
        return f"{spread['median']:.1f}x"
    return f"{spread['median']:.1f}x ({spread['min']:.1f}-{spread['max']:.1f})"


def _table(header: Sequence[str], rows: list[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def ingest_table(documents: dict[str, dict[str, Any]]) -> list[str]:
    """One row per (code version, load, server): percentiles median (min-max) over rounds, ratios to the floor."""
    header = ["code", "alerts/s", "notif/s", "server", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors"]
    header += ["done alerts/s", "p50 / floor", "p99 / floor"]
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
                    _ms(latency["p50"]),
                    _ms(latency["p90"]),
                    _ms(latency["p99"]),
                    _ms(latency["max"]),
                    str(row["errors"]),
                    _ms(row["completed_alerts_per_s"]).replace(".0", ""),
                    _ratio(ratio.get("p50")),
                    _ratio(ratio.get("p99")),
                ]
            )
    lines = _table(header, rows)
    for label, doc in documents.items():
        verdict = doc["results"]["verdict"]
        if verdict.get("measured"):
            met = "met" if verdict["met"] else "NOT met"
            lines.append(
                f"\n{label}: target (p99 <= 1.5x floor at {verdict['rate_alerts_per_s']} alerts/s, zero errors) "
                f"{met}: p99 ratio {verdict['p99_ratio']}x, {verdict['errors']} errors."
            )
    return lines


def engine_ingest_table(documents: dict[str, dict[str, Any]]) -> list[str]:
    """Per code version: µs per alert inside Engine.ingest, median over rounds (min-max)."""
    rows = []
    for label, doc in documents.items():
        per_alert = doc["results"]["per_alert_us"]
        bound = 1e6 / per_alert["median"]
        rows.append([label, _ms(per_alert), f"{bound:,.0f}"])
    return _table(["code", "us per alert", "alerts/s one writer could take"], rows)


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
                    _ms(row["match_us"]),
                    f"{row['ratio_to_first']['match_us']:.2f}x",
                    _ms(row["decision_us"]),
                    f"{row['ratio_to_first']['decision_us']:.2f}x",
                ]
            )
    return _table(header, rows)


def memory_table(doc: dict[str, Any]) -> list[str]:
    summary = doc["results"]["summary"]
    header = ["alerts sent", "idle RSS MiB", "final RSS MiB", "peak RSS MiB", "growth MiB"]
    header += ["2nd-half growth MiB", "MiB / 10k alerts (2nd half)", "errors"]
    row = [
        f"{summary['alerts']:,}",
        f"{summary['idle_rss_mib']:.1f}",
        f"{summary['final_rss_mib']:.1f}",
        f"{summary['peak_rss_mib']:.1f}",
        f"{summary['growth_mib']:.1f}",
        f"{summary['second_half_growth_mib']:.1f}",
        f"{summary['second_half_mib_per_10k_alerts']}",
        str(summary["errors"]),
    ]
    return _table(header, [row])


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
            "waiting for the SQLite write lock",
            *(f"{p['sqlite_write_lock_wait_pct']}%" for p in profiles.values()),
        ]
    ]
    for frame in sorted(frames, key=lambda f: (-largest(f), f)):
        shares = (p["app_inclusive_pct"].get(frame) for p in profiles.values())
        rows.append([f"`{frame}`", *("-" if share is None else f"{share}%" for share in shares)])
    rows.append(["samples", *(str(p["samples"]) for p in profiles.values())])
    lines = _table(["share of samples (inclusive)", *profiles], rows)
    lines.append(f"\n-: not among that run's top {TOP_FRAMES} app/ functions.")
    return lines


def render(results: Path) -> str:
    def load(name: str) -> dict[str, dict[str, Any]]:
        found = {}
        for label, folder in (("before fix", results / "before-fix"), ("after fix", results)):
            if (folder / name).exists():
                found[label] = record.read(folder / name)
        return found

    lines: list[str] = []
    sections = (
        ("Webhook ingest", "ingest.json", ingest_table),
        (
            "Engine ingest, in-process (one thread, SQLite, no HTTP)",
            "engine_ingest.json",
            engine_ingest_table,
        ),
        ("Decision cost", "decision.json", lambda docs: decision_table(docs[list(docs)[-1]])),
        ("Memory", "memory.json", lambda docs: memory_table(docs[list(docs)[-1]])),
        ("Profile (py-spy, 500 alerts/s)", "profile.json", profile_table),
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
