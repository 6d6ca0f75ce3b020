"""A moto server over real HTTP for the aws backend, reached through AWS_ENDPOINT_URL only."""

from __future__ import annotations

import base64
import ipaddress
import logging
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.eks.models import eks_backends

from tests.aws import eks_nodes, iam_strict, netguard
from tests.aws.checkip import CHECKIP
from tests.aws.moto_ext import SCRIPT, Script, ScriptedMotoServer, install, offer, reservation
from tests.aws.moto_provision import install_provisioning
from tests.fake_hub import FakeHub
from tests.kube.conftest import KubeCluster
from tests.kube.fake_control import FakeControlPlane
from tests.kube.fake_registry import FakeRegistry

G, P, STANDARD = "L-DB2E81BA", "L-417A185B", "L-1216C47A"
SPOT_G, SPOT_STANDARD = "L-3819A6DF", "L-34B43A08"  # Spot's own quotas (EC2 User Guide, "Spot Instance quotas")

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
# (targets/aws/infra/common.py system_disk_gb), never by reaching public.ecr.aws.
DEFAULT_IMAGE_LAYERS = [6_000_000_000, 5_000_000_000, 3_000_000_000]
DEFAULT_IMAGE_ENV = "RTUI_IMAGE"
ADDON_REGISTRY_ENV = "RTUI_ADDON_REGISTRY"
# moto and the EKS API double answer from this process, so their answers wait on this machine's load: a
# loaded 2-core CI machine once left moto's first listing unanswered past the 12 s a user's dead endpoint
# gets. The world sets the deadlines a user on a slow link would (tests/kube does the same); the
# deadlines themselves are tested in test_dead_endpoint.py and with explicit values where a test is about one.
WAIT_ENV = {"RTUI_AWS_TIMEOUT_S": "60", "RTUI_KUBE_TIMEOUT_S": "30"}


def image_env() -> dict[str, str]:
    """The environment a config resolved inside a test takes (its images from the registry double)."""
    env = {name: os.environ[name] for name in (DEFAULT_IMAGE_ENV, ADDON_REGISTRY_ENV)}
    return env | {name: os.environ[name] for name in WAIT_ENV if name in os.environ}  # the world's


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
def _nothing_but_aws(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The real Hub is not reached from here, and a test may point at a registry that does not answer:
    the aws tests plan on with tags where a digest cannot be had (as --allow-unpinned does) and a given
    model commit (a full sha is used without asking the Hub); the default dataset's commit comes from the
    Hub double (tests/fake_hub.py). Set after tests/conftest.py's isolated_env, which clears every RTUI_*
    variable; pinning is tested in tests/kube and tests/test_hub_dataset.py."""
    monkeypatch.setenv("RTUI_ALLOW_UNPINNED", "true")
    monkeypatch.setenv("RTUI_MODEL_REVISION", "0" * 40)
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield


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
    kube: KubeCluster | None = None  # the Kubernetes API every EKS cluster answers at (``kube_file``)

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
    for name, value in WAIT_ENV.items():
        monkeypatch.setenv(name, value)
    request = urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")
    # A bound, not a pace: moto rebuilds every backend the previous test made (each region's), in this
    # process, beside what that test left behind (calls to a hung region, retried once released); a
    # loaded CI machine once took over 10 s.
    urllib.request.urlopen(request, timeout=120).close()
    # A generous account by default; tests tighten what they are about.
    SCRIPT.default_quotas.update({G: 192, P: 0, STANDARD: 640, SPOT_G: 192, SPOT_STANDARD: 640})
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


@dataclass
class EksKube:
    """The Kubernetes API every new EKS cluster answers at, and the test as its controllers."""

    cluster: KubeCluster
    control: FakeControlPlane


@pytest.fixture
def eks_authz(world: World, kube_file: Path) -> KubeCluster:
    """The emulated Kubernetes API authorizes each request as EKS does (``tests.aws.eks_authz``)."""
    from tests.aws.eks_authz import eks_authorizer

    cluster = world.kube
    assert cluster is not None
    cluster.authorize_with(eks_authorizer(cluster.kube))
    return cluster


def endpoint_admits_caller(script: Script) -> bool:
    """Whether the EKS clusters' public endpoint lets the caller in: with ``publicAccessCidrs`` set, only
    clients whose public address is in one of them reach it; the others get no answer at all (EKS User
    Guide, "Cluster API server endpoint": access is limited to the CIDR blocks listed; the endpoint
    does not refuse, it is unreachable). The caller's public address is the one CHECKIP answers."""
    address = CHECKIP.answer
    with script.lock:
        regions = {region for service, region, _ in script.calls if service == "eks"}
    for region in regions:
        for cluster in list(eks_backends[iam_strict.ACCOUNT][region].clusters.values()):
            vpc = cluster.resources_vpc_config or {}
            if vpc.get("endpointPublicAccess") is False:
                return False  # private only: nothing from the internet
            cidrs = vpc.get("publicAccessCidrs") or ["0.0.0.0/0"]
            if address is None or not any(ipaddress.ip_address(address) in ipaddress.ip_network(c) for c in cidrs):
                return False
    return True


@pytest.fixture
def eks_kube(world: World, image_registry: FakeRegistry) -> Iterator[EksKube]:
    """The Kubernetes API every new EKS cluster answers at (emulated, taking only EKS tokens), with
    its controllers and scheduler (``FakeControlPlane``) and the nodegroups' nodes joining it as they
    turn ACTIVE (``eks_nodes``)."""
    cluster = KubeCluster()
    cluster.start()
    cluster.require_token(lambda token: token.startswith("k8s-aws-v1."))
    cluster.reachable_when(lambda: endpoint_admits_caller(world.script))
    world.script.cluster_endpoint = cluster.url
    world.kube = cluster
    world.script.cluster_ca = base64.b64encode(cluster.ca_pem).decode()
    world.script.on_nodegroup_active = lambda eks, group, info: eks_nodes.register(cluster, eks, group, info)
    world.script.on_nodegroup_deleted = lambda eks, group, info: eks_nodes.deregister(cluster, eks, group, info)
    try:
        with FakeControlPlane(cluster, registry=image_registry, tick_s=0.05) as control:
            yield EksKube(cluster, control)
    finally:
        world.script.on_nodegroup_active = world.script.on_nodegroup_deleted = None
        cluster.stop()


@pytest.fixture
def kube_file(eks_kube: EksKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The kubeconfig rtui writes (its cluster: ``eks_kube``)."""
    path = tmp_path / "kube" / "config"
    monkeypatch.setenv("KUBECONFIG", str(path))
    return path
