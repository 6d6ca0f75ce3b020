"""A laptop that moved networks: the EKS endpoint admits only the address `up` learned (its
``publicAccessCidrs``), and the caller now has another one, so the cluster's API never answers
(tests/aws/conftest.py ``endpoint_admits_caller``: EKS drops such clients, it does not refuse them).

Issue 34, item 2: discovery of the kubernetes and ray-job layers then stopped all of `rtui down`: it
exited 1 and left the EKS cluster, the NAT gateway and every other tagged resource billing."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend import flows
from backend.resources import EventKind
from tests.aws.checkip import CHECKIP
from tests.aws.conftest import World
from tests.aws.provision_world import collect, eks, session_for, tagged, up
from tests.kube.crds import crd_dir

pytestmark = pytest.mark.usefixtures("fast_backoff")

MOVED_TO = "198.51.100.7"  # TEST-NET-2: the café's address, outside the /32 learned at `up`


@pytest.mark.slow
@pytest.mark.parametrize("until", ["aws", "kube.kuberay-operator"])
async def test_down_finishes_when_the_clusters_api_does_not_answer(world: World, kube_file: Path, tmp_path: Path,
                                                                     until: str) -> None:
    session = session_for(kube_timeout_s="5", kuberay_crds=str(crd_dir(tmp_path)))
    made = await up(session, until=until)
    assert made.ok, made.failures()
    CHECKIP.answer = MOVED_TO

    gone = await collect(flows.down(session))
    assert gone.ok, gone.failures()
    assert +tagged(session.run_id) == {}
    assert eks().list_clusters()["clusters"] == []
    said = [e.message for e in gone.events if e.kind in (EventKind.PROGRESS, EventKind.DONE)]
    assert any("does not answer" in m and "goes with the EKS cluster" in m for m in said), said
