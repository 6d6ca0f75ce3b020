"""A moto server over real HTTP for the aws backend, reached through AWS_ENDPOINT_URL only."""

from __future__ import annotations

import base64
import logging
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.aws import netguard
from tests.aws.checkip import CHECKIP
from tests.aws.moto_ext import SCRIPT, Script, ScriptedMotoServer, install, offer, reservation
from tests.aws.moto_provision import install_provisioning
from tests.kubernetes.conftest import KubeCluster
from tests.kubernetes.fake_registry import FakeRegistry

G, P, STANDARD = "L-DB2E81BA", "L-417A185B", "L-1216C47A"

_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_CONFIG_FILE": "/nonexistent/rtui-test-aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/rtui-test-aws-credentials",
    "AWS_EC2_METADATA_DISABLED": "true",
}
_UNSET = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION")
# The image every aws test runs unless it names one: served by the registry double on loopback, its
# linux/amd64 layers 14 GB compressed, so the system disk is sized from the registry to 100 GB
# (backend/layers/aws/base.py system_disk_gb), never by reaching public.ecr.aws.
DEFAULT_IMAGE_LAYERS = [6_000_000_000, 5_000_000_000, 3_000_000_000]
DEFAULT_IMAGE_ENV = "RTUI_IMAGE"
ADDON_REGISTRY_ENV = "RTUI_ADDON_REGISTRY"


def image_env() -> dict[str, str]:
    """The environment a config resolved inside a test takes (its images from the registry double)."""
    return {name: os.environ[name] for name in (DEFAULT_IMAGE_ENV, ADDON_REGISTRY_ENV)}


@pytest.fixture(scope="session")
def image_registry() -> Iterator[FakeRegistry]:
    """The registry double the default image of every aws test is pulled from."""
    with FakeRegistry(layers={"rtui/ray:test": DEFAULT_IMAGE_LAYERS}) as registry:
        yield registry


@pytest.fixture(autouse=True)
def no_real_network(image_registry: FakeRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Points every config at the registry double (``RTUI_IMAGE`` and ``RTUI_ADDON_REGISTRY``, as a user
    picks an image and a mirror) and fails
    the test that tried to reach a non-loopback address, here or in an ``rtui`` it started (the guard's
    site dir on PYTHONPATH)."""
    log = tmp_path / "netguard-attempts.log"
    log.touch()
    monkeypatch.setenv(DEFAULT_IMAGE_ENV, image_registry.image())
    # The add-ons' images (device plugins, KubeRay operator) from the same double, as from a mirror.
    monkeypatch.setenv(ADDON_REGISTRY_ENV, image_registry.host)
    monkeypatch.setenv(netguard.LOG_ENV, str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(netguard.SITE_DIR), os.environ.get("PYTHONPATH")) if p))
    attempts: list[str] = []
    uninstall = netguard.install(attempts)
    try:
        yield
    finally:
        uninstall()
    attempts += [line for line in log.read_text().splitlines() if line]
    assert not attempts, f"the test reached beyond loopback: {sorted(set(attempts))}"


@pytest.fixture(autouse=True)
def _nothing_but_aws(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub does not answer here, and a test may point at a registry that does not: the
    aws tests plan on with tags where a digest cannot be had (as --allow-unpinned does) and
    a given model commit (a full sha is used without asking the Hub). Set after tests/conftest.py's
    isolated_env, which clears every RTUI_* variable; pinning is tested in tests/kubernetes."""
    monkeypatch.setenv("RTUI_ALLOW_UNPINNED", "true")
    monkeypatch.setenv("RTUI_MODEL_REVISION", "0" * 40)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    uninstall = install()
    uninstall_provisioning = install_provisioning()
    server = ScriptedMotoServer(SCRIPT)
    server.start()
    CHECKIP.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:  # restores the environment whatever happens
        for key, value in _ENV.items():
            mp.setenv(key, value)
        for key in _UNSET:
            mp.delenv(key, raising=False)
        mp.setenv("AWS_ENDPOINT_URL", endpoint)
        try:
            yield endpoint
        finally:
            SCRIPT.reset()
            CHECKIP.stop()
            server.stop()
            uninstall_provisioning()
            uninstall()


@dataclass
class World:
    """The scripted AWS account a test arranges before it runs the preflight."""

    endpoint: str
    script: Script

    def quota(self, region: str, code: str, value: float) -> None:
        self.script.quotas[(region, code)] = value

    def run_instances(self, region: str, instance_type: str, count: int = 1) -> None:
        ec2 = boto3.client("ec2", region_name=region)
        ec2.run_instances(ImageId="ami-12c6146b", InstanceType=instance_type, MinCount=count, MaxCount=count)

    def reserve(self, region: str, zone: str, **kwargs: Any) -> dict[str, Any]:
        cr = reservation(zone, **kwargs)
        self.script.reservations.setdefault(region, []).append(cr)
        return cr

    def offer(self, region: str, zone: str, instance_type: str) -> None:
        offer(self.script, region, zone, instance_type)

    def actions(self) -> set[str]:
        return {action for _, _, action in self.script.calls}


@pytest.fixture
def world(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    SCRIPT.reset()
    CHECKIP.reset()
    # The caller's public address, never asked of the internet (set here: tests/conftest.py clears RTUI_*).
    monkeypatch.setenv("RTUI_CHECKIP_URL", CHECKIP.url)
    request = urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(request, timeout=10).close()
    # A generous account by default; tests tighten what they are about.
    SCRIPT.default_quotas.update({G: 192, P: 0, STANDARD: 640})
    yield World(moto_endpoint, SCRIPT)
    SCRIPT.reset()
    from tests.aws.provision_world import close_sessions  # it imports this module

    close_sessions()


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shrink botocore's standard-mode backoff 50×: we test that retries happen, not how long they wait."""
    from botocore.retries.standard import ExponentialBackoff

    monkeypatch.setattr(
        ExponentialBackoff,
        "_DEFAULT_BACKOFF_CONFIG",
        {"throttling_base_scale": 0.02, "non_throttling_base_scale": 0.001},
    )


@pytest.fixture
def kube_file(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The kubeconfig rtui writes, and the Kubernetes API every new EKS cluster answers at (emulated,
    taking only EKS tokens)."""
    path = tmp_path / "kube" / "config"
    monkeypatch.setenv("KUBECONFIG", str(path))
    cluster = KubeCluster()
    cluster.start()
    cluster.require_token(lambda token: token.startswith("k8s-aws-v1."))
    world.script.cluster_endpoint = cluster.url
    world.script.cluster_ca = base64.b64encode(cluster.ca_pem).decode()
    try:
        yield path
    finally:
        cluster.stop()
