"""`rtui manifest --target aws` is what `up` sends to the new EKS cluster (issue 38: the plan carries
the object that is applied): cluster-autoscaler's objects and the Ray pods' service account included,
which the printout once left out while `up` applied them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.aws.conftest import EksKube, World
from tests.aws.provision_world import REGION, down, session_for, up
from tests.conftest import run_rtui
from tests.kube.applied import applied, differences, printed
from tests.kube.crds import crd_dir


@pytest.mark.slow
@pytest.mark.usefixtures("fast_backoff")
async def test_rtui_manifest_for_aws_prints_exactly_the_objects_up_applies(
        world: World, eks_kube: EksKube, kube_file: Path, tmp_path: Path) -> None:
    crds = str(crd_dir(tmp_path))
    session = session_for(kuberay_crds=crds)
    assert (await up(session)).ok  # the aws layer: cluster-autoscaler is its resource
    assert (await up(session, until="kube")).ok
    manifest = run_rtui("manifest", "--target", "aws", "--region", REGION, "--run-id", session.run_id,
                        "--kuberay-crds", crds,
                        timeout=60, check=True).stdout
    live = applied(eks_kube.cluster, session.run_id)
    assert {"Deployment kube-system/cluster-autoscaler", "ServiceAccount rtui/rtui-ray"} <= live.keys()
    found = differences(printed(manifest), live)
    assert not found, "\n".join(found)
    assert (await down(session)).ok
