"""Command-line tools a test needs (``kubectl``, ``checkov``, ``hadolint``, ``podman``): found beside the
interpreter (the ``test`` extra installs the Python-packaged ones there) or on ``PATH``. A missing tool
fails the test under CI (``CI`` set), where ``make test`` installs them all, and skips it elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("local", "azure")


def require(name: str, why: str) -> str:
    """The path of tool ``name``; skip the test (fail it under CI) when it is missing."""
    found = shutil.which(name, path=sysconfig.get_path("scripts")) or shutil.which(name)
    if found is None:
        message = f"{name} is not installed ({why})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def render(overlay: str) -> str:
    """``kubectl kustomize`` of one overlay of deploy/kubernetes: the manifests a cluster would get."""
    kubectl = require("kubectl", "renders the Kubernetes overlays; pip install -e '.[test]' brings it")
    done = subprocess.run(
        [kubectl, "kustomize", str(KUBERNETES / "overlays" / overlay)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
