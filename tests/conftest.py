"""Fixtures for every tier. Real-daemon fixtures live in tests/fixtures/ and are registered here."""

pytest_plugins: list[str] = [
    "tests.fixtures.prometheus",
    "tests.fixtures.containers",
    "tests.fixtures.kube",
    "tests.fixtures.kube_nodes",
    "tests.fixtures.slurm",
    "tests.fixtures.postgres",
    "tests.fixtures.alertmanager",
    "tests.fixtures.sim",
]
