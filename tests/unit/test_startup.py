"""The startup summary: what is configured and what is not, in words."""

from __future__ import annotations

from app.config import Settings
from app.domain.permissions import Grant, Permissions
from app.domain.startup import startup_summary


def test_a_bare_install_says_advisory_unset_and_closed():
    lines = startup_summary(Settings(), 3, Permissions())
    assert lines[0].startswith("mode: advisory")
    assert any(line.startswith("prometheus: unset") for line in lines)
    assert any(line.startswith("slurm: unset") for line in lines)
    assert any(line.startswith("reads: closed") for line in lines)


def test_a_configured_install_says_what_is_set_and_hides_the_store_password():
    settings = Settings(store_url="postgresql://ns:s3cret@db:5432/ns", permissions_file="/etc/p.yaml")
    settings.prometheus.url = "http://prom:9090"
    settings.slurm.host = "login1"
    settings.access.anonymous_read = True
    lines = startup_summary(settings, 3, Permissions([Grant(action="slurm.requeue_job")]))
    assert lines[0] == "mode: active: 1 action(s) granted by /etc/p.yaml (slurm.requeue_job)"
    assert "store: postgresql://ns:***@db:5432/ns" in lines and "prometheus: http://prom:9090" in lines
    assert "slurm: nightshift@login1:22 (sudo -n)" in lines
    assert "reads: OPEN to anyone (access.anonymous_read: true)" in lines
    assert not any("s3cret" in line for line in lines)
