"""Open-loop HTTP load generator for the webhook: a fixed timetable of notifications, sent from this process.

Run it as its own process (``python -m bench.loadgen``) so that it never shares an interpreter with the server.
Bodies are built before the clock starts. A dispatcher hands each notification to a pool of sender threads at its
scheduled time; each sender keeps one keep-alive connection, as Alertmanager does. Latency is measured from the
*scheduled* send time, so a slow server is charged for the requests that queued behind it (no coordinated
omission); ``send_lag`` shows how late requests actually left.

Offered load is counted in alerts/s (the notifications/s follow from the group sizes and are reported too).
Errors are any answer but 200, and any connection failure left after one reconnect of a stale keep-alive
connection (gunicorn closes idle ones after 2 s).
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.stats import latency_summary
from bench.workload import Fleet, Notification, schedule

REPO = Path(__file__).resolve().parents[1]
# Reconnect a connection idle this long rather than race gunicorn's 2 s keep-alive timeout.
IDLE_RECONNECT_S = 1.5
STALE_CONNECTION = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


@dataclass(frozen=True)
class Sent:
    due: float
    started: float
    done: float
    alerts: int
    status: int | None
    error: str | None


class _Sender:
    """One keep-alive connection, reopened when idle too long or found closed by the server."""

    def __init__(self, host: str, port: int, path: str, headers: dict[str, str], timeout_s: float):
        self.host, self.port, self.path, self.headers, self.timeout_s = host, port, path, headers, timeout_s
        self.conn: http.client.HTTPConnection | None = None
        self.last_used = 0.0
        self.reconnects = 0

    def post(self, body: bytes) -> tuple[int | None, str | None]:
        for attempt in (1, 2):
            if self.conn is None or time.perf_counter() - self.last_used > IDLE_RECONNECT_S:
                self._close()
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
                fresh = True
            else:
                fresh = False
            try:
                self.conn.request("POST", self.path, body=body, headers=self.headers)
                response = self.conn.getresponse()
                response.read()
            except STALE_CONNECTION as exc:
                self._close()
                if not fresh and attempt == 1:
                    self.reconnects += 1
                    continue
                return None, type(exc).__name__
            except (OSError, http.client.HTTPException) as exc:
                self._close()
                return None, type(exc).__name__
            self.last_used = time.perf_counter()
            if response.will_close:
                self._close()
            return response.status, None
        raise AssertionError("unreachable")

    def _close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def run(
    url: str,
    token: str | None,
    planned: list[tuple[float, Notification]],
    *,
    concurrency: int = 32,
    warmup_s: float = 2.0,
    timeout_s: float = 30.0,
) -> dict[str, object]:
    """Send ``planned`` on its timetable; summarise what happened after the first ``warmup_s`` seconds."""
    parts = urlsplit(url)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    jobs: queue.SimpleQueue[tuple[float, Notification] | None] = queue.SimpleQueue()
    sent: list[Sent] = []
    senders = [
        _Sender(parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/", headers, timeout_s)
        for _ in range(concurrency)
    ]

    def work(sender: _Sender) -> None:
        while (job := jobs.get()) is not None:
            due, notification = job
            started = time.perf_counter()
            status, error = sender.post(notification.body)
            sent.append(Sent(due, started, time.perf_counter(), notification.alerts, status, error))

    threads = [threading.Thread(target=work, args=(s,), daemon=True) for s in senders]
    for thread in threads:
        thread.start()
    t0 = time.perf_counter() + 0.1
    for offset, notification in planned:
        due = t0 + offset
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        jobs.put((due, notification))
    for _ in threads:
        jobs.put(None)
    for thread in threads:
        thread.join()
    return _summary(planned, sent, t0, warmup_s, sum(s.reconnects for s in senders))


def _summary(
    planned: list[tuple[float, Notification]], sent: list[Sent], t0: float, warmup_s: float, reconnects: int
) -> dict[str, object]:
    span = planned[-1][0] if planned else 0.0
    offered_alerts = sum(n.alerts for _, n in planned)
    measured = [s for s in sent if s.due >= t0 + warmup_s] or sent
    window_start = min(s.due for s in measured)
    ok = [s for s in measured if s.status == 200]
    errors = Counter(s.error or f"HTTP {s.status}" for s in measured if s.status != 200)
    last_done = max(s.done for s in measured)
    elapsed = max(last_done - window_start, 1e-9)
    return {
        "offered": {
            "alerts_per_s": round(offered_alerts / span, 1) if span else None,
            "notifications_per_s": round(len(planned) / span, 2) if span else None,
            "mean_alerts_per_notification": round(offered_alerts / len(planned), 2),
            "notifications": len(planned),
            "alerts": offered_alerts,
            "schedule_s": round(span, 3),
        },
        "measured": {
            "notifications": len(measured),
            "alerts": sum(s.alerts for s in measured),
            "warmup_s": warmup_s,
            "completed_alerts_per_s": round(sum(s.alerts for s in ok) / elapsed, 1),
            "completed_notifications_per_s": round(len(ok) / elapsed, 2),
            "drain_s": round(last_done - (t0 + span), 3),
        },
        "latency_ms": latency_summary([s.done - s.due for s in measured]),
        "send_lag_ms": latency_summary([s.started - s.due for s in measured]),
        "errors": sum(errors.values()),
        "errors_by_kind": dict(errors),
        "reconnects": reconnects,
    }


def spawn(
    webhook: str,
    token_file: Path,
    rate: float,
    *,
    duration_s: float | None = None,
    alerts: int | None = None,
    warmup_s: float = 2.0,
    seed: int = 1,
) -> dict[str, Any]:
    """Run the load generator in a separate process (this module's CLI) and return its summary.

    Raises subprocess.CalledProcessError when it fails, TimeoutExpired when it outlives its schedule by 2 minutes.
    """
    if alerts is not None:
        span_s = alerts / rate
    elif duration_s is not None:
        span_s = duration_s
    else:
        raise ValueError("spawn: give duration_s or alerts")
    argv = [sys.executable, "-m", "bench.loadgen", "--url", webhook, "--token-file", str(token_file)]
    argv += ["--rate", str(rate), "--warmup", str(warmup_s), "--seed", str(seed)]
    argv += ["--duration", str(duration_s)] if alerts is None else ["--alerts", str(alerts)]
    with tempfile.TemporaryDirectory(prefix="loadgen-") as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run([*argv, "--out", str(out)], check=True, cwd=REPO, timeout=span_s + 120)
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8080/api/v1/alerts")
    parser.add_argument("--token-file", help="bearer token for the webhook")
    parser.add_argument("--rate", type=float, required=True, help="offered load in alerts/s")
    stop = parser.add_mutually_exclusive_group(required=True)
    stop.add_argument("--duration", type=float, help="seconds of schedule")
    stop.add_argument("--alerts", type=int, help="stop once this many alerts are scheduled")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds left out of the statistics")
    parser.add_argument("--max-group", type=int, default=50, help="alerts per notification: uniform 1..N")
    parser.add_argument("--repeat", type=float, default=0.5, help="share of each group already sent before")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=32, help="sender threads (keep-alive connections)")
    parser.add_argument("--out", type=Path, help="write the JSON summary here (default: stdout)")
    args = parser.parse_args(argv)
    fleet = Fleet(args.seed, max_group=args.max_group, repeat=args.repeat)
    planned = schedule(fleet, args.rate, duration_s=args.duration, total_alerts=args.alerts)
    token = args.token_file and Path(args.token_file).read_text().strip()
    result = run(args.url, token or None, planned, concurrency=args.concurrency, warmup_s=args.warmup)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
