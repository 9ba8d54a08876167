"""The framework floor: a bare Flask app whose webhook only parses the JSON body, served like Nightshift.

Whatever Nightshift's webhook costs above this app's latency is Nightshift's own: validation, the store, metrics.
"""

from __future__ import annotations

from flask import Flask, jsonify, request


def create_app() -> Flask:
    """``gunicorn 'bench.floor:create_app()'``."""
    app = Flask(__name__)

    @app.post("/api/v1/alerts")
    def receive():
        notification = request.get_json(force=True)
        return jsonify({"status": "ok", "alerts": len(notification["alerts"])})

    @app.get("/readyz")
    def ready():
        return jsonify({"status": "ok"})

    return app
