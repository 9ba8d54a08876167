"""Fixtures for every tier. Real-daemon fixtures live in tests/fixtures/ and are registered here; the engine and
the app under test are built by tests/worlds.py and tests/webapps.py, and offered here as fixtures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from app.config import Settings
from app.store import Store
from tests.fakes import FakeClock
from tests.webapps import make_app, reader_client, webhook_settings
from tests.worlds import World, make_world

pytest_plugins: list[str] = [
    "tests.fixtures.reaper",
    "tests.fixtures.prometheus",
    "tests.fixtures.containers",
    "tests.fixtures.kube",
    "tests.fixtures.kube_nodes",
    "tests.fixtures.slurm",
    "tests.fixtures.postgres",
    "tests.fixtures.alertmanager",
    "tests.fixtures.sim",
]


@pytest.fixture
def clock() -> FakeClock:
    """A clock that moves only when a test moves it."""
    return FakeClock()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Default settings, with the data (SQLite store, wake-up socket) in the test's directory."""
    return Settings(data_dir=str(tmp_path))


@pytest.fixture
def store(settings: Settings, clock: FakeClock) -> Iterator[Store]:
    """A fresh store of ``settings`` (SQLite in the test's directory unless ``settings.store_url`` names another),
    its schema created; disposed after the test."""
    fresh = Store.from_url(settings.resolved_store_url, clock, settings.store)
    fresh.create_schema()
    yield fresh
    fresh.dispose()


@pytest.fixture
def world(tmp_path: Path) -> Callable[..., World]:
    """Factory: :func:`tests.worlds.make_world` in the test's directory (grants, playbooks, guard settings)."""

    def build(*args: Any, **kwargs: Any) -> World:
        return make_world(tmp_path, *args, **kwargs)

    return build


@pytest.fixture
def app(tmp_path: Path) -> Flask:
    """The real app with the webhook's, the operator's and a viewer's credentials (tests/webapps.py)."""
    return make_app(webhook_settings(tmp_path))


@pytest.fixture
def client(app: Flask) -> Any:
    """A test client of ``app`` that reads with the viewer token."""
    return reader_client(app)
