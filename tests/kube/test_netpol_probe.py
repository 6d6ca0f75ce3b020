"""Issue 33, item 6: NetworkPolicy enforcement is confirmed by a probe pod, not guessed from DaemonSet names.

A NetworkPolicy does nothing unless the network plugin implements it (Kubernetes docs, "Network
Policies": posting one "will have no effect unless your network plugin supports it"), and the API
server accepts it either way, so only a connection that the policy should refuse tells. The
emulator's pod network (``pod_network.py``) refuses it only while the test makes it enforce
(``enforce_network_policies``); the fake kubelet (``FakeControlPlane._run_probe``) runs the probe's
own command against a loopback port that accepts or refuses as that network decides.
"""

from __future__ import annotations

import json

from backend.store import RunStore
from targets.kube import manifests
from targets.kube.config import KubeConfig
from targets.kube.security import network_policy
from tests.kube.kube_world import KubeWorld, events, gpu_cluster, world
from tests.kube.pod_network import Source, admitted

__all__ = ["world"]  # the fixture, imported for pytest

NAMESPACE, CLUSTER = "rtui", "rtui-ray"
PROBE = "kube.probe.netpol"  # the probe's address (targets.kube.probe.PROBE)
ROLE = "rtui.dev/role"


def probe_pods(w: KubeWorld) -> list[str]:
    return [p["metadata"]["name"] for p in w.cluster.objects("Pod", NAMESPACE)
            if (p["metadata"].get("labels") or {}).get(ROLE) == "netpol-probe"]


def ledger_entry(w: KubeWorld, address: str) -> dict[str, object]:
    """The run's ledger entry for ``address`` (its status and outputs), as `rtui` saved it."""
    record = RunStore(w.state).latest()
    entry = record.resources[address]
    return {"status": entry.status.value, **entry.outputs}


def test_a_cluster_that_does_not_enforce_network_policies_is_reported_so(world: KubeWorld) -> None:
    """No CNI enforces: the policy is accepted and the probe pod connects to the head's GCS port."""
    gpu_cluster(world.cluster)
    plan = json.loads(world.rtui("plan", "--json").stdout)
    changes = {c["address"]: c for c in plan["changes"]}
    # Before the probe: the DaemonSets' hint, said to be a guess; the probe is a step of the plan.
    assert changes["kube.networkpolicy.ray"]["after"]["enforced"].startswith("guessed: "), changes
    assert changes[PROBE]["action"] == "create" and set(changes[PROBE]["depends_on"]) == {
        "kube.networkpolicy.ray", "kube.raycluster"}, changes[PROBE]

    up = world.rtui("up", "--yes", "--json", timeout=180)
    seen = events(up.stdout)
    assert seen[-1]["kind"] == "done" and seen[-1]["data"]["job_status"] == "SUCCEEDED", seen[-1]
    (said,) = [e for e in seen if e.get("step") == PROBE and e["kind"] == "done"]
    assert "NetworkPolicy NOT enforced" in said["message"] and "6379" in said["message"], said

    # The run record keeps the fact; the probe pod is gone; `rtui status` says it in one line.
    entry = ledger_entry(world, PROBE)
    assert entry["verdict"] == "not_enforced", entry
    assert probe_pods(world) == []
    status = world.rtui("status").stdout
    (line,) = [ln for ln in status.splitlines() if "NetworkPolicy" in ln and ln.startswith("notice")]
    assert "NOT enforced" in line and "only Ray's token refuses it" in line, status

    # A second plan changes nothing and still says it.
    again = json.loads(world.rtui("plan", "--json").stdout)
    assert {c["address"]: c["action"] for c in again["changes"] if c["action"] != "noop"} == {}
    (probe,) = [c for c in again["changes"] if c["address"] == PROBE]
    assert "NOT enforced" in probe["reason"], probe
    assert "NOT enforced" in world.rtui("plan").stdout

    world.rtui("down", "--yes", timeout=180)
    assert world.cluster.get("ConfigMap", f"{CLUSTER}-netpol-verdict", NAMESPACE) is None
    assert probe_pods(world) == []


def test_a_cluster_that_enforces_network_policies_refuses_the_probe(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    world.cluster.enforce_network_policies()
    up = world.rtui("up", "--yes", "--json", timeout=180)
    seen = events(up.stdout)
    assert seen[-1]["kind"] == "done" and seen[-1]["data"]["job_status"] == "SUCCEEDED", seen[-1]
    (said,) = [e for e in seen if e.get("step") == PROBE and e["kind"] == "done"]
    assert said["message"].startswith("NetworkPolicy enforced (confirmed"), said
    assert ledger_entry(world, PROBE)["verdict"] == "enforced"
    status = world.rtui("status").stdout
    assert "notice    NetworkPolicy enforced (confirmed" in status, status
    assert probe_pods(world) == []
    world.rtui("down", "--yes", timeout=180)
    assert world.labelled() == []


def test_down_deletes_a_probe_pod_a_crash_left_behind(world: KubeWorld) -> None:
    gpu_cluster(world.cluster)
    world.rtui("up", "--yes", "--until", PROBE, timeout=180)
    run_id = ledger_entry(world, PROBE)
    assert run_id["status"] == "ready"
    policy = world.cluster.get("NetworkPolicy", f"{CLUSTER}-ray", NAMESPACE)
    assert policy is not None
    labels = {k: v for k, v in policy["metadata"]["labels"].items()}
    # rtui was killed between the probe pod's create and its delete: the pod stays, labelled the run's.
    world.cluster.add_pod(NAMESPACE, f"{CLUSTER}-netpol-probe-dead01", labels={**labels, ROLE: "netpol-probe"},
                          phase="Running", node="system-0")
    plan = json.loads(world.rtui("plan", "--json").stdout)
    (probe,) = [c for c in plan["changes"] if c["address"] == PROBE]
    assert probe["action"] == "replace" and "left behind" in probe["reason"], probe
    world.rtui("down", "--yes", timeout=180)
    assert probe_pods(world) == []


def test_the_probe_pod_passes_pod_security_runs_the_pinned_image_and_is_no_pod_the_policy_admits() -> None:
    """Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards): baseline
    forbids privileged, host namespaces, added capabilities beyond its list, hostPath, host ports;
    restricted also requires allowPrivilegeEscalation false, runAsNonRoot, capabilities drop ALL and
    a seccomp profile of RuntimeDefault or Localhost. The probe meets restricted."""
    from targets.kube.probe import probe_pod

    config = KubeConfig(target="kube")
    digest = "sha256:" + "a" * 64
    image = manifests.pinned_image(config.image, digest)
    pod = probe_pod(config, "run1", f"{CLUSTER}-netpol-probe-x", image, "system-0", "10.244.0.2")
    spec = pod["spec"]
    assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC", "volumes"))
    assert spec["automountServiceAccountToken"] is False and spec["nodeName"] == "system-0"
    pod_sc = spec["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and isinstance(pod_sc["runAsUser"], int) and pod_sc["runAsUser"] > 0
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(p.get("hostPort") for p in container.get("ports") or [])
    assert container["image"] == image and container["image"].endswith("@" + digest)
    assert container["command"][-3:-1] == ["10.244.0.2", "6379"]
    labels = pod["metadata"]["labels"]
    assert labels[manifests.RUN_LABEL] == "run1" and "ray.io/cluster" not in labels

    # Not a source the policy admits: on an enforcing cluster it must be refused at the GCS port.
    policy = network_policy(config, "run1", ["172.20.0.10/32"])
    head = {"metadata": {"name": f"{CLUSTER}-head", "namespace": config.namespace,
                         "labels": {"ray.io/cluster": config.cluster_name}},
            "spec": {"nodeName": "system-0", "containers": [{"name": "ray-head"}]}}
    source = Source(ip="10.244.0.9", namespace=config.namespace, labels=labels, pod=pod["metadata"]["name"],
                    namespace_labels={"kubernetes.io/metadata.name": config.namespace})
    assert not admitted([policy], head, source, 6379)


def test_a_probe_that_could_not_tell_is_unconfirmed_never_enforced() -> None:
    from targets.kube.probe import Enforcement, read_verdict

    assert read_verdict(["rtui-probe: connected"], "Succeeded", "t")[0] is Enforcement.NOT_ENFORCED
    assert read_verdict(["rtui-probe: refused TimeoutError: timed out"], "Succeeded", "t")[0] is Enforcement.ENFORCED
    assert read_verdict(["rtui-probe: no-network OSError: unreachable"], "Succeeded", "t")[0] \
        is Enforcement.UNCONFIRMED
    verdict, detail = read_verdict(["exec /usr/bin/python: no such file"], "Failed", "t")
    assert verdict is Enforcement.UNCONFIRMED and "Failed" in detail
