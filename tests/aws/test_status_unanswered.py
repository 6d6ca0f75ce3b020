"""Issue 34, item 5 (with item 2): `rtui status` when the cluster's API does not answer the caller.

The EKS endpoint admits only the address `up` learned (``publicAccessCidrs``); EKS drops a client outside
them (tests/aws/conftest.py ``endpoint_admits_caller``), so a laptop that moved networks gets no answer.
`rtui up` and `rtui plan` then say why in one line (``AwsLayer.explain_unanswered``); `rtui status` must say
the same, not a raw timeout or a traceback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.aws.checkip import CHECKIP
from tests.aws.conftest import World
from tests.aws.provision_world import session_for, up
from tests.conftest import run_rtui
from tests.kube.crds import crd_dir

pytestmark = pytest.mark.usefixtures("fast_backoff")

MOVED_TO = "52.94.76.99"  # a public address outside the /32 learned at `up` (CHECKIP's default answer)


async def test_status_says_the_endpoint_admits_only_the_learned_address(world: World, kube_file: Path,
                                                                         tmp_path: Path) -> None:
    session = session_for(kube_timeout_s="8", kuberay_crds=str(crd_dir(tmp_path)))
    made = await up(session, until="kube.kuberay-operator")
    assert made.ok, made.failures()
    CHECKIP.answer = MOVED_TO

    # The emulated API serves on this test's event loop: the binary runs beside it, not blocking it.
    proc = await asyncio.to_thread(run_rtui, "status", session.run_id, timeout=240)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    said = [line for line in text.splitlines() if "admits only" in line]
    assert len(said) == 1, text
    assert f"admits only 52.94.76.10/32 and your address is now {MOVED_TO}" in said[0], said
    assert f"--api-cidrs {MOVED_TO}/32" in text, text
