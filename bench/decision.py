"""Decision cost per alert against the number of playbooks: match, then match + target + plan + guards.

The playbook set is the shipped ``playbooks/`` plus N synthetic playbooks (10, 100, 1,000, 10,000), built in memory
from a shipped one (real actions from the default registry, new names and matchers). Two series:

- ``indexed``: every synthetic playbook names its alertname with ``alertname="..."`` (two playbooks per name, like
  the shipped Slurm/Kubernetes pairs), so :class:`app.domain.playbooks.PlaybookSet` looks only at that name's playbooks;
- ``unindexed_1pct``: as above, but 1% of them match the alertname by regex, which the index cannot key on:
  those are examined for every alert, so this series shows what writing ``alertname=~`` costs at scale.

The alerts are the load generator's fleet alerts (firing; half of them renamed to a synthetic alertname). The full
decision is :func:`app.engine.explain.explain`: match, target, diagnosis from labels, plan, guard chain (with
Slurm and Kubernetes actions granted, so the chain runs to its end), no store. Median per-alert time over
``--repeats`` timed passes (min..max alongside), and the ratio to N=10.

    python -m bench.decision [--sizes 10,100,1000,10000] [--alerts 400] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from app import build_engine
from app.actions import default_registry
from app.actions.registry import ActionRegistry
from app.config import Settings
from app.domain.alertmanager import Notification, parse_notification
from app.domain.matchers import parse_matcher_list
from app.domain.permissions import Grant, Permissions
from app.domain.playbooks import Playbook, PlaybookSet, load_playbooks
from app.engine import Engine
from app.store import Store
from bench import record
from bench.stats import spread
from bench.workload import Fleet

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = "gpu-xid-node-fault-slurm"
SERIES = {"indexed": 0.0, "unindexed_1pct": 0.01}


def synthetic(template: Playbook, count: int, unindexed_share: float) -> list[Playbook]:
    """``count`` copies of ``template``, two per synthetic alertname; every 1/share-th keyed by regex instead."""
    stride = round(1 / unindexed_share) if unindexed_share else 0
    made = []
    for i in range(count):
        alertname = f"SyntheticAlert{i // 2:05d}"
        first = (
            f'alertname=~"{alertname}|SyntheticNever"'
            if stride and i % stride == 0
            else f'alertname="{alertname}"'
        )
        matchers = parse_matcher_list([first, f'severity=~"{"critical" if i % 2 else "critical|warning"}"'])
        made.append(
            replace(template, name=f"synthetic-{i:05d}", match=matchers, source="<synthetic>", line=0)
        )
    return made


def fleet_alerts(count: int, synthetic_names: int, seed: int = 7) -> Notification:
    """``count`` firing fleet alerts in one notification; half renamed to synthetic alertnames."""
    rng = random.Random(seed)
    fleet = Fleet(seed, repeat=0.0)
    alerts: list[dict[str, Any]] = []
    while len(alerts) < count:
        alerts.extend(json.loads(fleet.next().body)["alerts"])
    alerts = alerts[:count]
    for alert in alerts[::2]:
        alert["labels"]["alertname"] = f"SyntheticAlert{rng.randrange(max(synthetic_names, 1)):05d}"
    body = {"version": "4", "status": "firing", "receiver": "bench", "groupKey": "bench", "alerts": alerts}
    return parse_notification(json.dumps(body), max_alerts=len(alerts))


def _engine(playbooks: PlaybookSet, registry: ActionRegistry) -> Engine:
    grants = [
        Grant(action=pattern, nodes=re.compile(r"gpu-node[0-9]+")) for pattern in ("slurm.*", "kubernetes.*")
    ]
    return build_engine(
        Settings(),
        store=Store.unread(),
        playbooks=playbooks,
        registry=registry,
        permissions=Permissions(grants),
    )


def _timed_us(work: Callable[[], object], alerts: int) -> float:
    start = time.perf_counter()
    work()
    return (time.perf_counter() - start) / alerts * 1e6


def measure(sizes: list[int], alerts: int, repeats: int) -> dict[str, list[dict[str, Any]]]:
    """Per series and size: per-alert match and decision times. Sizes are timed in turn within each repeat, so
    a burst of load from elsewhere on the machine lands on every size rather than on one."""
    registry = default_registry()
    shipped = load_playbooks([REPO / "playbooks"], registry).playbooks
    template = next(p for p in shipped if p.name == TEMPLATE)
    cases: list[dict[str, Any]] = []
    for series, share in SERIES.items():
        for size in sizes:
            started = time.perf_counter()
            playbooks = PlaybookSet([*shipped, *synthetic(template, size, share)])
            build_ms = (time.perf_counter() - started) * 1000
            notification = fleet_alerts(alerts, size // 2)
            engine = _engine(playbooks, registry)
            matched = sum(len(playbooks.match(a.labels)) for a in notification.alerts)
            engine.explain(notification)  # warm caches (compiled regexes, templates) before timing
            cases.append(
                {
                    "series": series,
                    "size": size,
                    "playbooks": playbooks,
                    "examined": playbooks.candidates_examined,
                    "matched": matched,
                    "build_ms": build_ms,
                    "match": lambda p=playbooks, n=notification: [p.match(a.labels) for a in n.alerts],
                    "decision": lambda e=engine, n=notification: e.explain(n),
                    "samples": {"match_us": [], "decision_us": []},
                }
            )
    for _ in range(repeats):
        for case in cases:
            case["samples"]["match_us"].append(_timed_us(case["match"], alerts))
            case["samples"]["decision_us"].append(_timed_us(case["decision"], alerts))
    results: dict[str, list[dict[str, Any]]] = {}
    for case in cases:
        row = {
            "synthetic_playbooks": case["size"],
            "playbooks": len(case["playbooks"]),
            "build_index_ms": round(case["build_ms"], 2),
            "candidates_per_alert": round(case["examined"] / alerts, 2),
            "matches_per_alert": round(case["matched"] / alerts, 2),
            **{
                key: {k: round(v, 2) for k, v in spread(values).items()}
                for key, values in case["samples"].items()
            },
        }
        results.setdefault(case["series"], []).append(row)
        print(
            f"{case['series']:>15} N={case['size']:>6}: match {row['match_us']['median']:.1f}us "
            f"decision {row['decision_us']['median']:.1f}us per alert",
            flush=True,
        )
    for rows in results.values():
        for row in rows:
            row["ratio_to_first"] = {
                key: round(row[key]["median"] / rows[0][key]["median"], 2)
                for key in ("match_us", "decision_us")
            }
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000,10000", help="synthetic playbook counts")
    parser.add_argument("--alerts", type=int, default=200, help="alerts per timed pass")
    parser.add_argument("--repeats", type=int, default=15, help="timed passes per size")
    parser.add_argument("--out", type=Path, default=record.RESULTS / "decision.json")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = measure(sizes, args.alerts, args.repeats)
    params = {"sizes": sizes, "alerts": args.alerts, "repeats": args.repeats, "series": SERIES}
    print(f"wrote {record.write(args.out, 'decision', params, {'series': results})}")
    medians = [r["decision_us"]["median"] for r in results["indexed"]]
    print(f"indexed decision median per alert: {statistics.median(medians):.1f}us")


if __name__ == "__main__":
    main()
