"""The framework floors: bare Flask apps served like Nightshift, whose webhook only parses the JSON body
(``create_app``), or parses it and commits it to SQLite as Nightshift's store would (``create_durable_app``).

Whatever Nightshift's webhook costs above the first is Nightshift's own: validation, the store, metrics; the
second shows how much of that one durable commit costs by itself.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from flask import Flask, jsonify, request


def create_app() -> Flask:
    """``gunicorn 'bench.floor:create_app()'``."""
    app = Flask(__name__)

    @app.post("/api/v1/alerts")
    def receive():
        notification = request.get_json(force=True)
        return jsonify({"status": "ok", "alerts": len(notification["alerts"])})

    _readyz(app)
    return app


def create_durable_app(directory: str) -> Flask:
    """``gunicorn "bench.floor:create_durable_app('DIR')"``: the body committed to a SQLite table in ``DIR`` before
    the answer, with Nightshift's settings (WAL, ``synchronous=NORMAL``, ``BEGIN IMMEDIATE``), a connection per
    thread."""
    app = Flask(__name__)
    db = Path(directory) / "floor.db"
    local = threading.local()

    def connection() -> sqlite3.Connection:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("CREATE TABLE IF NOT EXISTS inbox (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        return conn

    @app.post("/api/v1/alerts")
    def receive():
        body = request.get_data()
        notification = request.get_json(force=True)
        conn = connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            inbox_id = conn.execute("INSERT INTO inbox (body) VALUES (?)", (body.decode(),)).lastrowid
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return jsonify({"status": "ok", "alerts": len(notification["alerts"]), "inbox_id": inbox_id})

    _readyz(app)
    return app


def _readyz(app: Flask) -> None:
    @app.get("/readyz")
    def ready():
        return jsonify({"status": "ok"})
