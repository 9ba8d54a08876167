"""The container image, built for real from the Dockerfile with buildah and run with it.

The base image is Debian's Python built by mmdebstrap (scripts/build-base-image.sh, cached), since no public
registry can be reached here; the Dockerfile's default (python:3.12-slim) is what users build on. The build
uses buildah's layer cache, so only a changed pyproject.toml reinstalls the dependencies. ``nightshift serve``
runs from the image on loopback (chroot isolation shares the host's network) as UID 10001 with the webhook
token mounted where the image's settings expect the chart's Secret, and must turn the Xid 79 example into an
incident. Limits of ``buildah run`` here: it applies neither ENTRYPOINT/CMD nor USER, so the test reads them
from the image and asserts them, then passes the entrypoint and the user itself.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.fixtures.containers import from_script, render
from tests.fixtures.procs import Daemon, free_port, require_binary, wait_until

# The first build on a fresh machine (base image, dependencies) takes minutes on 2 cores; later ones use the cache.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
TAG = "localhost/nightshift:test"
BUILD_TIMEOUT_SECONDS = 1200
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")  # the registries' TLS proxy CA, for pip in RUN steps
UID = 10001
SECRET_DIR = "/run/secrets/nightshift/nightshift-secrets"  # /var/run is a link to /run; mount the target


@dataclass
class Image:
    buildah: str
    tag: str
    config: dict[str, Any]  # the OCI image configuration (Entrypoint, Cmd, User, Labels, Env...)
    build_seconds: float


@pytest.fixture(scope="module")
def image() -> Image:
    buildah = require_binary("buildah", "run `make deps`")
    require_binary("podman", "run `make deps`")
    base = from_script("build-base-image.sh", "the Debian base image")
    command = [buildah, "bud", "--isolation", "chroot", "--layers", "--build-arg", f"BASE_IMAGE={base}",
               "--build-arg", "SOURCE=https://example.invalid/nightshift", "-t", TAG]  # fmt: skip
    if CA_BUNDLE.exists():
        command += ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
    started = time.monotonic()
    done = subprocess.run(
        [*command, str(REPO)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    inspected = subprocess.run(
        [buildah, "inspect", "--type", "image", TAG], capture_output=True, text=True, timeout=60, check=True
    )
    return Image(buildah, TAG, json.loads(inspected.stdout)["OCIv1"]["config"], time.monotonic() - started)


def test_the_image_runs_nightshift_serve_as_a_numeric_non_root_user(image: Image) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    config = image.config

    assert config["Entrypoint"] == ["/opt/nightshift-app/bin/nightshift"]
    assert config["Cmd"] == ["serve", "--bind", "0.0.0.0:8080"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["WorkingDir"] == "/var/lib/nightshift"
    assert "8080/tcp" in config["ExposedPorts"]
    assert "/var/lib/nightshift" in config["Volumes"]
    assert "NIGHTSHIFT_CONFIG=/etc/nightshift/settings.yaml" in config["Env"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.source"] == "https://example.invalid/nightshift"


@pytest.fixture
def container(image: Image) -> Iterator[str]:
    made = subprocess.run(
        [image.buildah, "from", "--pull-never", image.tag],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    name = made.stdout.strip().splitlines()[-1]
    yield name
    subprocess.run([image.buildah, "rm", name], capture_output=True, timeout=60, check=False)


def run_in(
    image: Image, container: str, *argv: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [image.buildah, "run", "--isolation", "chroot", "--user", f"{UID}:{UID}", container, "--", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_runtime_has_no_compiler_or_pip_and_imports_every_client(image: Image, container: str) -> None:
    """The runtime stage is slim (no build tools), yet the trimmed kubernetes package still serves our client."""
    python = "/opt/nightshift/bin/python"
    probe = (
        "import shutil, importlib.util as u; "
        "import app.clients.kube, app.clients.ssh, kubernetes.dynamic, psycopg; "
        "print(shutil.which('gcc'), shutil.which('cc'), u.find_spec('pip'))"
    )
    done = run_in(image, container, python, "-c", probe)

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "None", "None"]


def uids_of(port: int) -> set[int]:
    """The real UIDs of the processes the image's interpreter runs with ``--bind 127.0.0.1:<port>`` (gunicorn's
    master and workers; chroot isolation runs them as host processes, so /proc shows their credentials)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:  # not a process, or gone
            continue
        if cmdline[0].startswith(b"/opt/nightshift/bin/python") and f"127.0.0.1:{port}".encode() in cmdline:
            found.add(int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1]))
    return found


def write_secrets(folder: Path, **keys: str) -> Path:
    """A Secret volume as the kubelet writes it with the chart's fsGroup: one file per key, readable by UID 10001."""
    folder.mkdir()
    for key, value in keys.items():
        (folder / key.replace("_", "-")).write_text(value + "\n")
        (folder / key.replace("_", "-")).chmod(0o644)
    folder.chmod(0o755)
    return folder


@contextmanager
def serving(
    image: Image, container: str, workdir: Path, argv: list[str], mounts: dict[Path, str], env: dict[str, str]
) -> Iterator[tuple[str, Daemon]]:
    """``argv`` (the image's command line, its --bind on a free loopback port) run in ``container`` as UID 10001
    with ``mounts`` (host path -> container path) and ``env``; yields the base URL once /readyz answers 200."""
    port = free_port()
    argv = [f"127.0.0.1:{port}" if arg == "0.0.0.0:8080" else arg for arg in argv]
    options = [f"--volume={host}:{inside}" for host, inside in mounts.items()]
    options += [f"--env={name}={value}" for name, value in env.items()]
    server = Daemon(
        "nightshift-image",
        [
            image.buildah,
            "run",
            "--isolation",
            "chroot",
            "--user",
            f"{UID}:{UID}",
            *options,
            container,
            "--",
            *argv,
        ],
        workdir,
    )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert server.alive(), server.log_tail()
        try:
            return requests.get(f"{base}/readyz", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_until(ready, 120, "nightshift serve from the image to be ready", interval=0.5)
        assert uids_of(port) == {UID}, "the server must run as the image's non-root user"
        yield base, server
    finally:
        server.stop()


def test_serve_from_the_image_turns_an_alert_into_an_incident(
    image: Image, container: str, tmp_path: Path
) -> None:
    webhook_token, operator_token = secrets.token_hex(16), secrets.token_hex(16)
    secret_dir = write_secrets(
        tmp_path / "nightshift-secrets", webhook_token=webhook_token, operator_token=operator_token
    )
    env = {
        "NIGHTSHIFT_OPERATOR_TOKEN_FILE": f"{SECRET_DIR}/operator-token",
        "NIGHTSHIFT_LOG_FORMAT": "json",
        "NIGHTSHIFT_WORKER__POLL_SECONDS": "0.2",
    }
    argv = image.config["Entrypoint"] + image.config["Cmd"]
    with serving(image, container, tmp_path, argv, {secret_dir: f"{SECRET_DIR}:ro"}, env) as (base, server):
        posted = requests.post(
            f"{base}/api/v1/alerts",
            data=(REPO / "alerts" / "examples" / "gpu-xid-79.json").read_bytes(),
            headers={"Authorization": f"Bearer {webhook_token}", "Content-Type": "application/json"},
            timeout=10,
        )
        assert posted.status_code == 200, posted.text
        assert posted.json()["status"] == "ok"

        def incident() -> dict[str, Any] | None:
            listed = requests.get(
                f"{base}/api/v1/incidents", headers={"Authorization": f"Bearer {operator_token}"}, timeout=5
            )
            assert listed.status_code == 200, listed.text
            found = listed.json()["incidents"]
            return found[0] if found else None

        opened = wait_until(incident, 60, "the worker to open the incident", interval=0.5)
        assert opened["playbook"] == "gpu-xid-node-fault-slurm"

        refused = requests.post(
            f"{base}/api/v1/alerts", data=b"{}", headers={"Authorization": "Bearer wrong"}, timeout=5
        )
        assert refused.status_code == 401
        output = server.log_path.read_text()  # before buildah adds its own lines about the stopped process

    lines = [line for line in output.splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines if line.startswith("{")]
    assert len(entries) == len(lines), "log_format json: every line one JSON object"
    assert all({"time", "level", "logger", "message"} <= entry.keys() for entry in entries)
    access = [entry for entry in entries if entry["logger"] == "gunicorn.access"]
    assert {(e["method"], e["path"], e["status"]) for e in access} >= {("POST", "/api/v1/alerts", 200)}


def test_the_image_starts_as_the_charts_pod_runs_it(
    image: Image, container: str, helm: str, tmp_path: Path
) -> None:
    """The chart's default Deployment and ConfigMap with this image: the same command, environment, settings file
    and Secret mount start a server that stores an alert (in the image's /var/lib/nightshift, writable by the
    pod's user: buildah run here does not reliably bind a host folder over an image VOLUME)."""
    docs = render(helm)
    [deployment] = [doc for doc in docs if doc["kind"] == "Deployment"]
    [settings] = [doc for doc in docs if doc["kind"] == "ConfigMap"]
    [pod] = deployment["spec"]["template"]["spec"]["containers"]
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    for name, text in settings["data"].items():
        (config_dir / name).write_text(text)
    token = secrets.token_hex(16)
    mounts = {
        config_dir: "/etc/nightshift/config:ro",
        write_secrets(tmp_path / "nightshift-secrets", webhook_token=token): f"{SECRET_DIR}:ro",
    }
    env = {item["name"]: item["value"] for item in pod["env"]}
    mounted = {mount["mountPath"] for mount in pod["volumeMounts"]}

    assert {"/etc/nightshift/config", "/var/lib/nightshift", "/tmp"} <= mounted
    assert f"/var{SECRET_DIR}" in mounted
    with serving(image, container, tmp_path, image.config["Entrypoint"] + pod["args"], mounts, env) as (
        base,
        _,
    ):
        posted = requests.post(
            f"{base}/api/v1/alerts",
            data=(REPO / "alerts" / "examples" / "nccl-error.json").read_bytes(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=10,
        )
        assert posted.status_code == 200, posted.text  # committed to the store's inbox
