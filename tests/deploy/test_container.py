"""The image, built and run for real with Podman: a 100,000-row batch through the three roles as
containers (``--network host``, reaching the session's Azurite and a PostgreSQL database on
127.0.0.1; a SQLite file would have to be shared between the host's user and the image's), exact to
the minor unit; each role, on a read-only root file system as the manifests run it, passes the
image's health check, runs as the image's non-root user and exits 0 on ``podman stop`` (SIGTERM).

The image is built once per session by deploy/build-image.sh (its debootstrap base is made once and
kept in Podman's storage). Podman missing: skipped here, failed under CI, where .ci/run installs it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from billing.sample import generate
from shared.settings import Settings
from support.exact import assert_batch_exact, billing
from support.references import sample_flags
from support.tools import ROOT, require

ROWS = 100_000
ROLES = ("initiator", "processor", "controller")
IMAGE_USER = "10001"
IMAGE_HOME = "/var/lib/billing"

# The image builds share one Podman store and its base image (see docs/testing.md).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("podman")]


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "CONTAINERS_CONF": str(ROOT / "deploy" / "containers.conf")},
    )
    assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr}"
    return done


@pytest.fixture(scope="session")
def image() -> str:
    """The billing image, built from the working tree once per session."""
    require("podman", "builds and runs the image; deploy/install-podman.sh installs it")
    tag = "localhost/billing:test"
    done = subprocess.run(
        ["bash", str(ROOT / "deploy" / "build-image.sh"), tag], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr
    return tag


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def containers(
    image: str, settings_env: Settings, sql_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """The three roles as containers on the host's network, with the test's settings and ``sql_url``
    (the test's ``billing`` commands use it too); yields role -> container name; removed afterwards
    whatever happened."""
    monkeypatch.setenv("BILLING_SQL_URL", sql_url)
    env = {k: v for k, v in Settings().as_env().items() if k != "BILLING_HOME"}  # the image's own home
    names = {role: f"billing-test-{uuid.uuid4().hex[:8]}-{role}" for role in ROLES}
    try:
        for role, name in names.items():
            role_env = {**env, "BILLING_HEALTH_PORT": str(free_port())}
            options = [f"--env={k}={v}" for k, v in role_env.items()]
            # As the manifests run it: a read-only root; BILLING_HOME an empty directory of the image's
            # user (an emptyDir there), /tmp writable (podman adds it).
            options += ["--read-only", f"--tmpfs={IMAGE_HOME}:rw,U"]
            podman("run", "--detach", "--name", name, "--network", "host", *options, image, role)
        yield names
    finally:
        for name in names.values():
            logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True, check=False)
            (tmp_path / f"{name}.log").write_text(logs.stdout + logs.stderr)
            subprocess.run(["podman", "rm", "--force", name], capture_output=True, check=False)


@pytest.mark.timeout(1200)  # the first build of the session (its base too, on a fresh machine) comes first
@pytest.mark.parametrize("sql_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
def test_a_batch_through_the_roles_as_containers_is_exact(
    containers: dict[str, str], settings_env: Settings, tmp_path: Path
) -> None:
    batch = tmp_path / "batch.csv"
    generate(ROWS, batch, seed=13, reject_rate=0.02)

    billing(
        "submit", str(batch), "--batch-id", "containers", "--wait", "--timeout", "300", *sample_flags(tmp_path / "ref")
    )
    assert_batch_exact("containers", batch)

    for name in containers.values():
        assert podman("exec", name, "id", "-u").stdout.strip() == IMAGE_USER
        assert podman("healthcheck", "run", name).returncode == 0  # the image's HEALTHCHECK: /healthz answers
    podman("stop", "--time", str(int(settings_env.shutdown_deadline) + 15), *containers.values(), timeout=120)
    for role, name in containers.items():
        state = podman("inspect", "--format", "{{.State.ExitCode}} {{.State.OOMKilled}}", name).stdout.split()
        assert state == ["0", "false"], f"{role} exited {state} on SIGTERM"
