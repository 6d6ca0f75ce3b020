"""The aws tests' network guard (tests/aws/netguard.py) catches what product code swallows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from targets.kube.registry import image_size
from tests.aws import netguard


def test_a_swallowed_attempt_to_reach_the_internet_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(netguard.LOG_ENV)  # this test's own record, not the fixture's
    attempts: list[str] = []
    uninstall = netguard.install(attempts)
    try:
        # The image-size lookup never raises: without the record the attempt would go unseen.
        size = image_size("public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1", timeout_s=1)
    finally:
        uninstall()
    assert size.compressed_bytes is None
    assert attempts == ["resolve 'public.ecr.aws'"]


def test_an_rtui_subprocess_is_guarded_too(tmp_path: Path) -> None:
    log = tmp_path / "attempts.log"
    env = {**os.environ, netguard.LOG_ENV: str(log)}
    code = "import socket; s = socket.socket()\ntry: s.connect(('192.0.2.1', 443))\nexcept OSError: pass"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert log.read_text().splitlines() == ["connect 192.0.2.1:443"]
    assert netguard.is_loopback("127.0.0.1") and netguard.is_loopback("[::1]") and not netguard.is_loopback("10.0.0.1")
