"""Which alerts the shipped rules raise for each fault, when, and with which labels: ``promtool test rules``
evaluates rules/*.yml (the production rule files, as shipped) over the series of :mod:`bench.ettr.signals`.

One promtool run evaluates every scenario (a test group each). Each group asks one question at the scenario's
end: ``min_over_time(timestamp(ALERTS{alertstate="firing"})[...])``, the first moment each alert was firing (its
``for`` included), tagged with the scenario's name; promtool prints what it got when it differs from the expected
nothing, and that is the answer. Nothing here decides which alert a fault raises: an alert missing from a scenario
is one the rules did not raise.

The detection of a scenario: every alert, its labels (the rule's and the series', ``alertstate`` dropped), the
seconds from the fault to its first firing, and whose it is: the culprit node's, each peer's (the same for every
peer: the benchmark raises it for every peer of the job), or the job's alone.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.ettr import signals
from bench.ettr.causes import KINDS

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = ("gpu_xid.yml", "gpu.yml", "node.yml", "training.yml")
# The job ages at which each fault is evaluated: a restart onto a node still at fault (it fails again within
# minutes), a job half an hour into its run, and one that has run for hours (rules with an hour of history).
AGES = (180.0, 4200.0)
PROMTOOL_TIMEOUT = 600
_LABELS = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_SAMPLE = re.compile(r'\{((?:[^{}"]|"(?:[^"\\]|\\.)*")*)\}\s+([-+0-9.eE]+|NaN)')


@dataclass(frozen=True)
class Detected:
    """One alert of a scenario: ``delay`` seconds after the fault; ``role`` culprit | peer | job."""

    alertname: str
    labels: tuple[tuple[str, str], ...]
    delay: float
    role: str

    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


class PromtoolError(RuntimeError):
    """promtool failed for another reason than the scenarios' answers."""


def scenario_kinds() -> list[str]:
    """Every fault kind with metrics (planned maintenance is silenced: none), and each warning signal."""
    kinds = [name for name, kind in KINDS.items() if kind.effect != "planned"]
    return kinds + [f"warn:{signal}" for signal in signals.WARNING_RATES]


def scenarios(
    watchdog: float, straggler_speed: float, kinds: Sequence[str] | None = None
) -> list[signals.Scenario]:
    """Every scenario (of ``kinds``, default all): each kind at each of :data:`AGES` (a warning at the last)."""
    out = []
    for kind in kinds or scenario_kinds():
        for age in (AGES[-1],) if kind.startswith("warn:") else AGES:
            out.append(signals.Scenario(kind, age, watchdog=watchdog, straggler_speed=straggler_speed))
    return out


def scenario_id(s: signals.Scenario) -> str:
    return f"{s.kind}@{s.age:g}"


def encode(values: Sequence[signals.Value]) -> str:
    """promtool's expanding notation: runs of a constant step become ``a+bxn``, missing samples ``_xn``."""
    parts: list[str] = []
    i = 0
    while i < len(values):
        v = values[i]
        if v is None:
            j = i
            while j < len(values) and values[j] is None:
                j += 1
            parts.append(f"_x{j - i}")
            i = j
            continue
        if isinstance(v, str):
            parts.append(v)
            i += 1
            continue
        if math.isnan(v):
            parts.append("NaN")
            i += 1
            continue
        j = i + 1
        step = None
        while j < len(values) and isinstance(values[j], float | int) and not math.isnan(values[j]):  # type: ignore[arg-type]
            delta = float(values[j]) - float(values[j - 1])  # type: ignore[arg-type]
            if step is None:
                step = delta
            elif abs(delta - step) > 1e-9:
                break
            j += 1
        count = j - i - 1
        step = step or 0.0
        sign = "+" if step >= 0 else "-"
        parts.append(f"{_num(v)}{sign}{_num(abs(step))}x{count}" if count else _num(v))
        i = j
    return " ".join(parts)


def _num(v: float) -> str:
    return repr(float(v)).removesuffix(".0")


def test_file(items: Iterable[signals.Scenario], rules_dir: Path) -> str:
    """The promtool unit-test file (YAML, written as text: the values are long) that asks every scenario."""
    lines = [
        "rule_files:",
        *(f"  - {rules_dir / name}" for name in RULE_FILES),
        f"evaluation_interval: {signals.SCRAPE}s",
        "tests:",
    ]
    for s in items:
        lines += [f"  - interval: {signals.SCRAPE}s", "    input_series:"]
        for selector, values in signals.series(s).items():
            lines += [f"      - series: '{selector}'", f"        values: '{encode(values)}'"]
        end = int(s.end)
        expr = (
            f'label_replace(min_over_time(timestamp(ALERTS{{alertstate="firing"}})[{end}s:{signals.SCRAPE}s]), '
            f'"scenario", "{scenario_id(s)}", "", "")'
        )
        lines += [
            "    promql_expr_test:",
            f"      - expr: '{expr}'",
            f"        eval_time: {end}s",
            "        exp_samples: []",
        ]
    return "\n".join(lines) + "\n"


def parse(output: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The ``got:`` samples of promtool's report, by scenario: (labels, value)."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in output.splitlines():
        text = line.strip()
        if not text.startswith("got:"):
            continue
        for match in _SAMPLE.finditer(text):
            labels = {
                k: bytes(v, "utf-8").decode("unicode_escape") for k, v in _LABELS.findall(match.group(1))
            }
            scenario = labels.pop("scenario", None)
            if scenario is None:
                continue
            found.setdefault(scenario, []).append((labels, float(match.group(2))))
    return found


def run_promtool(texts: Sequence[str], promtool: str = "promtool") -> str:
    """Run promtool on each test file (concurrently: one process each) and return their reports together."""
    with tempfile.TemporaryDirectory(prefix="ettr-rules-") as tmp:
        running = []
        for i, text in enumerate(texts):
            path = Path(tmp) / f"scenarios_{i}_test.yml"
            path.write_text(text)
            running.append(
                subprocess.Popen(
                    [promtool, "test", "rules", str(path)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        outputs = []
        for process in running:
            try:
                output, _ = process.communicate(timeout=PROMTOOL_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                raise PromtoolError(f"promtool test rules ran over {PROMTOOL_TIMEOUT}s") from None
            if process.returncode not in (0, 1) or (process.returncode and "got:" not in output):
                raise PromtoolError(f"promtool test rules exited {process.returncode}: {output[-2000:]}")
            outputs.append(output)
    return "\n".join(outputs)


def role(labels: dict[str, str]) -> str:
    host = labels.get("Hostname") or labels.get("node_name") or labels.get("instance", "").split(":")[0]
    if host == signals.CULPRIT:
        return "culprit"
    if host in signals.PEERS:
        return "peer"
    return "job"


@dataclass(frozen=True)
class Detection:
    """Every scenario's alerts, keyed by (kind, age)."""

    alerts: dict[tuple[str, float], tuple[Detected, ...]]

    def of(self, kind: str, age: float) -> tuple[Detected, ...]:
        """The alerts of ``kind`` striking a job that has run ``age`` seconds (the nearest age evaluated below it;
        warnings have one)."""
        ages = sorted(a for k, a in self.alerts if k == kind)
        chosen = max((a for a in ages if a <= age), default=ages[0])
        return self.alerts[(kind, chosen)]

    def to_json(self) -> list[dict[str, Any]]:
        return [
            {"kind": kind, "age": age, "alerts": [asdict(d) for d in alerts]}
            for (kind, age), alerts in sorted(self.alerts.items())
        ]

    @classmethod
    def from_json(cls, rows: list[dict[str, Any]]) -> Detection:
        return cls(
            {
                (row["kind"], row["age"]): tuple(
                    Detected(a["alertname"], tuple((k, v) for k, v in a["labels"]), a["delay"], a["role"])
                    for a in row["alerts"]
                )
                for row in rows
            }
        )

    def table(self) -> dict[str, dict[str, float]]:
        """kind@age → alertname → first delay (for the report)."""
        out: dict[str, dict[str, float]] = {}
        for (kind, age), alerts in sorted(self.alerts.items()):
            row: dict[str, float] = {}
            for a in alerts:
                row[a.alertname] = min(row.get(a.alertname, math.inf), a.delay)
            out[f"{kind}@{age:g}"] = row
        return out


def evaluate(
    watchdog: float,
    straggler_speed: float,
    rules_dir: Path = REPO / "rules",
    promtool: str = "promtool",
    processes: int = 2,
    kinds: Sequence[str] | None = None,
) -> Detection:
    """Run promtool over every scenario (split over ``processes`` promtool runs) and collect each one's alerts.
    An alert firing before the fault (none, with the shipped rules) would be noise of a healthy job: refused."""
    items = scenarios(watchdog, straggler_speed, kinds)
    chunks = [items[i::processes] for i in range(processes)]
    found = parse(run_promtool([test_file(chunk, rules_dir) for chunk in chunks if chunk], promtool))
    alerts: dict[tuple[str, float], tuple[Detected, ...]] = {}
    for s in items:
        detected = []
        for labels, first in found.get(scenario_id(s), []):
            labels.pop("alertstate", None)
            if first < s.fault:
                raise PromtoolError(f"{labels.get('alertname')} fires before the fault in {scenario_id(s)}")
            who = role(labels)
            if who == "peer" and signals.PEERS[0] not in labels.values():
                continue  # the peers' alerts are the same for each: keep peer0's as the template
            detected.append(
                Detected(
                    alertname=labels["alertname"],
                    labels=tuple(sorted(labels.items())),
                    delay=first - s.fault,
                    role=who,
                )
            )
        alerts[(s.kind, s.age)] = tuple(sorted(detected, key=lambda d: (d.delay, d.alertname)))
    return Detection(alerts)


def inputs_digest(watchdog: float, straggler_speed: float, rules_dir: Path = REPO / "rules") -> str:
    """What a detection depends on: the rule files, the series' model, the kinds, this module, the two figures."""
    digest = hashlib.sha256(
        f"{float(watchdog):g}/{float(straggler_speed):g}/{sorted(KINDS.items())}".encode()
    )
    for path in [*(rules_dir / name for name in RULE_FILES), Path(signals.__file__), Path(__file__)]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cached(
    watchdog: float, straggler_speed: float, cache: Path | None, promtool: str = "promtool"
) -> Detection:
    """:func:`evaluate`, or its saved answer in ``cache`` when the rules, the series' model and the figures are
    the same (the digest says so); saved there after a fresh evaluation."""
    digest = inputs_digest(watchdog, straggler_speed)
    if cache is not None and cache.exists():
        saved = json.loads(cache.read_text())
        if saved.get("digest") == digest:
            return Detection.from_json(saved["alerts"])
    detection = evaluate(watchdog, straggler_speed, promtool=promtool)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"digest": digest, "alerts": detection.to_json()}, indent=1) + "\n")
    return detection
