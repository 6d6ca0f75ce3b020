"""What closes the run's Ray cluster: its auth token as a Secret of the run.

Ray 2.58 in token mode (``RAY_AUTH_MODE=token``) takes no request to its dashboard, Jobs API or
GCS without the token. rtui makes the token when it applies the Secret, keeps it nowhere else (not
in the record, the ledger or a log) and reads it back from the cluster whenever it talks to Ray,
with the kubeconfig's credentials: whoever can read Secrets in the namespace can use the cluster.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from backend.errors import OperationError, UserError
from backend.jobspec import build_job_spec, passed_env_values
from backend.layers.base import Context
from backend.resources import Action, Observed, Resource
from backend.runner import Progress
from targets.kube import manifests, rights
from targets.kube.config import KubeConfig, kube_config
from targets.kube.handlers import LAYER, NAMESPACE, KubeHandler, delete_ours, object_id, ours
from targets.kube.specs import JobEnvSpec, NetworkPolicySpec, RayTokenSpec

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

RAY_TOKEN = "kube.secret.ray-token"
# 32 random bytes, as KubeRay's own generated Secret holds (raycluster_controller.go generateRandomToken(32)).
TOKEN_BYTES = 32


def secret_value(secret: manifests.Manifest | None, key: str) -> str | None:
    """A key of a Secret as the API server returns it (``data``, base64); None when absent or unreadable."""
    raw = ((secret or {}).get("data") or {}).get(key)
    if not raw:
        return None
    try:
        return base64.b64decode(raw, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


async def ray_token(api: KubeApi, config: KubeConfig, run_id: str) -> str | None:
    """The run's Ray token from its Secret; None when there is none of this run's."""
    live = await api.get("v1", "Secret", manifests.ray_token_secret_name(config), config.namespace)
    if live is None or not ours(live, run_id):
        return None
    return secret_value(live, manifests.RAY_TOKEN_KEY)


class RayTokenHandler(KubeHandler):
    kind = "kube-ray-token"
    spec_model = RayTokenSpec
    title = "Store the Ray cluster's auth token as a Secret"
    expected_s = 1.0

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        config = kube_config(ctx)
        name = manifests.ray_token_secret_name(config)
        live = await api.get("v1", "Secret", name, config.namespace)
        if live is None or not ours(live, ctx.record.run_id):
            return None
        usable = secret_value(live, manifests.RAY_TOKEN_KEY) is not None
        return Observed(address=RAY_TOKEN, layer=LAYER, kind=self.kind, id=object_id(live),
                        state={"key": manifests.RAY_TOKEN_KEY}, depends_on=(NAMESPACE,), healthy=usable,
                        reason="exists" if usable else f"no {manifests.RAY_TOKEN_KEY} in it")

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        # Never a new token under a running cluster: its pods read it once, at start.
        return (Action.NOOP, have.reason) if have.healthy else (Action.REPLACE, have.reason)

    def kube_objects(self, ctx: Context, want: Resource) -> list[manifests.Manifest]:
        return [manifests.ray_token_secret(kube_config(ctx), ctx.record.run_id, "<random, made when applied>")]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = kube_config(ctx)
        api = self.api(ctx)
        if await ray_token(api, config, ctx.record.run_id) is None:
            (secret,) = self.kube_objects(ctx, want)
            secret["stringData"] = {manifests.RAY_TOKEN_KEY: secrets.token_urlsafe(TOKEN_BYTES)}
            await api.apply(secret)
        ctx.ledger.update(want.address, id=f"Secret/{config.namespace}/"
                                           f"{manifests.ray_token_secret_name(config)}")
        yield Progress("Ray's auth token stored in the cluster", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        secret = manifests.ray_token_secret(kube_config(ctx), ctx.record.run_id, "")
        async for p in delete_ours(self.api(ctx), ctx, [secret]):
            yield p


# ---- the NetworkPolicy -----------------------------------------------------------------------------
NETWORK_POLICY = "kube.networkpolicy.ray"
NETWORK_POLICY_API = "networking.k8s.io/v1"
CLUSTER_LABEL = "ray.io/cluster"  # KubeRay puts it on every pod of a RayCluster
# Where the API server's proxy connects from: the addresses behind the ``kubernetes`` Service. On EKS
# they are the control plane's ENIs in the cluster's subnets, and AWS's own answer for admitting the
# control plane in a policy is "allow the endpoint IPs behind the kubernetes service, and update the
# policy when they change" (aws/aws-network-policy-agent issue 281): they change when EKS replaces
# its API servers, so every plan compares them with the policy's and updates it.
APISERVER_ENDPOINTS = ("default", "kubernetes")
# DaemonSets whose presence means NetworkPolicies are enforced (best effort: a CNI is known by its agent).
ENFORCERS = ("calico-node", "cilium", "antrea-agent", "kube-router", "weave-net", "canal", "anetd")
VPC_CNI = "aws-node"
VPC_CNI_POLICY_AGENT_FLAG = "--enable-network-policy=true"


def network_policy_name(config: KubeConfig) -> str:
    return f"{config.cluster_name}-ray"


def network_policy(config: KubeConfig, run_id: str, apiserver: list[str]) -> manifests.Manifest:
    """Ingress to the Ray pods only from each other (any port: GCS, object store, workers) and from the
    API server's addresses (``apiserver``: CIDRs) to the dashboard port, for its service proxy: rtui's
    fallback when it may not port-forward (portforward.py; a port-forward passes no policy). Egress
    is left open (the job downloads its model). The kubelet's probes come from the node, which no
    policy blocks (Kubernetes docs, Network Policies: traffic to and from a pod's own node is always
    allowed)."""
    ray_pods = {"matchLabels": {CLUSTER_LABEL: config.cluster_name}}
    ingress: list[manifests.Manifest] = [{"from": [{"podSelector": ray_pods}]}]
    if apiserver:
        ingress.append({"from": [{"ipBlock": {"cidr": cidr}} for cidr in apiserver],
                        "ports": [{"protocol": "TCP", "port": manifests.DASHBOARD_PORT}]})
    return {"apiVersion": NETWORK_POLICY_API, "kind": "NetworkPolicy",
            "metadata": {"name": network_policy_name(config), "namespace": config.namespace,
                         "labels": manifests.labels(run_id)},
            "spec": {"podSelector": ray_pods, "policyTypes": ["Ingress"], "ingress": ingress}}


async def apiserver_cidrs(api: KubeApi) -> list[str]:
    """The API server's addresses as /32 (or /128) CIDRs, from the ``kubernetes`` Service's Endpoints;
    with namespace-only rights, which cannot read them, any address (``rights.ANYWHERE``)."""
    mode = rights.known(api)
    if mode is not None and not mode.cluster_wide:
        return list(rights.ANYWHERE)
    live = await api.get("v1", "Endpoints", APISERVER_ENDPOINTS[1], APISERVER_ENDPOINTS[0])
    out = set()
    for subset in (live or {}).get("subsets") or []:
        for address in subset.get("addresses") or []:
            try:
                out.add(str(ipaddress.ip_network(address.get("ip", ""))))
            except ValueError:
                continue
    return sorted(out)


def _policy_cidrs(policy: manifests.Manifest) -> list[str]:
    return sorted(peer["ipBlock"]["cidr"] for rule in policy.get("spec", {}).get("ingress") or []
                  for peer in rule.get("from") or [] if "ipBlock" in peer)


def policy_enforcer(daemonsets: list[manifests.Manifest]) -> str | None:
    """The agent that enforces NetworkPolicies in this cluster, as ``namespace/name``, or None when none
    is recognised. Best effort: known CNI agents by name, and EKS's VPC CNI only when its network
    policy agent runs with ``--enable-network-policy=true`` (the add-on's ``enableNetworkPolicy``)."""
    for ds in daemonsets:
        meta = ds.get("metadata") or {}
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        containers = (((ds.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
        if meta.get("name") == VPC_CNI:
            if any(VPC_CNI_POLICY_AGENT_FLAG in (c.get("args") or []) for c in containers):
                return f"{where} (network policy agent on)"
            continue
        if meta.get("name") in ENFORCERS or any(name in str(c.get("image", "")) for c in containers
                                                 for name in ENFORCERS):
            return where
    return None


class NetworkPolicyHandler(KubeHandler):
    kind = "kube-networkpolicy"
    spec_model = NetworkPolicySpec
    title = "Admit to the Ray pods only each other and the API server"
    expected_s = 1.0
    updatable = True

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        config = kube_config(ctx)
        live = await api.get(NETWORK_POLICY_API, "NetworkPolicy", network_policy_name(config), config.namespace)
        if live is None or not ours(live, ctx.record.run_id):
            return None
        have, now = _policy_cidrs(live), await apiserver_cidrs(api)
        current = have == now
        return Observed(address=NETWORK_POLICY, layer=LAYER, kind=self.kind, id=object_id(live),
                        state={"apiserver": have}, depends_on=(NAMESPACE,), healthy=current,
                        reason="admits the API server's addresses" if current else
                        f"the API server's addresses are now {', '.join(now) or 'unknown'}")

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        return (Action.NOOP, have.reason) if have.healthy else (Action.UPDATE, have.reason)

    def kube_objects(self, ctx: Context, want: Resource) -> list[manifests.Manifest]:
        """Without the API server's addresses: read when applied (`rtui manifest` says so)."""
        return [network_policy(kube_config(ctx), ctx.record.run_id, [])]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        cidrs = await apiserver_cidrs(api)
        if not cidrs:
            raise OperationError(
                f"cannot read the API server's addresses (Endpoints {'/'.join(APISERVER_ENDPOINTS)}), which the "
                "NetworkPolicy must admit for rtui to reach Ray through the API server",
                remedy="check that your credentials may get endpoints in the default namespace")
        policy = network_policy(kube_config(ctx), ctx.record.run_id, cidrs)
        await api.apply(policy)
        ctx.ledger.update(want.address, id=object_id(policy))
        yield Progress(f"Ray pods admit each other and the API server ({', '.join(cidrs)})", 1.0)

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self.create(ctx, want):
            yield p

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        async for p in delete_ours(self.api(ctx), ctx, [network_policy(kube_config(ctx), ctx.record.run_id, [])]):
            yield p


# ---- the --job-env values ----------------------------------------------------------------------------
JOB_ENV = "kube.secret.job-env"


def _job_env_values(config: KubeConfig) -> dict[str, str]:
    return passed_env_values(build_job_spec(config))


class JobEnvHandler(KubeHandler):
    """The ``--job-env`` values in a Secret of the run (always there, ``{}`` without any: the Ray pods
    mount it from their start, so naming variables later never remakes the cluster)."""

    kind = "kube-job-env"
    spec_model = JobEnvSpec
    title = "Store the --job-env values as a Secret"
    expected_s = 1.0
    updatable = True

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        config = kube_config(ctx)
        live = await api.get("v1", "Secret", manifests.job_env_secret_name(config), config.namespace)
        if live is None or not ours(live, ctx.record.run_id):
            return None
        try:
            stored = json.loads(secret_value(live, manifests.JOB_ENV_KEY) or "{}")
        except ValueError:
            stored = None
        names = sorted(stored) if isinstance(stored, dict) else []
        try:
            current = stored == _job_env_values(config)
        except UserError:  # a variable not set here (status, down): nothing to compare with
            current = True
        return Observed(address=JOB_ENV, layer=LAYER, kind=self.kind, id=object_id(live), state={"names": names},
                        depends_on=(NAMESPACE,), healthy=current,
                        reason="in place" if current else "the values in rtui's environment changed")

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        names = JobEnvSpec.of(want).names
        if have.state.get("names") != names:
            return Action.UPDATE, f"variables now: {', '.join(names) or 'none'}"
        return (Action.NOOP, have.reason) if have.healthy else (Action.UPDATE, have.reason)

    def kube_objects(self, ctx: Context, want: Resource) -> list[manifests.Manifest]:
        return [manifests.job_env_secret(kube_config(ctx), ctx.record.run_id, {
            n: "<read from rtui's environment when applied>" for n in JobEnvSpec.of(want).names})]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = kube_config(ctx)
        values = _job_env_values(config)
        secret = manifests.job_env_secret(config, ctx.record.run_id, values)
        await self.api(ctx).apply(secret)
        ctx.ledger.update(want.address, id=object_id(secret))
        yield Progress(f"{len(values)} --job-env values stored in the cluster" if values else "no --job-env values",
                       1.0)

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self.create(ctx, want):
            yield p

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        secret = manifests.job_env_secret(kube_config(ctx), ctx.record.run_id, {})
        async for p in delete_ours(self.api(ctx), ctx, [secret]):
            yield p
