"""Why workers cannot fit on the nodes, and why a pod is not running: one line each, fatal or not."""

from __future__ import annotations

from typing import Any

from targets.kube.pods import (
    PodProblem,
    allocatable_problems,
    pod_problem,
    pod_ready,
    pod_running,
)

IMAGE = "public.ecr.aws/x:y"


def node(name: str, *, gpus: str | None = "4", efa: str | None = "1", label: bool = True,
         taints: list[dict[str, str]] | None = None, ready: bool = True, cordoned: bool = False) -> dict[str, Any]:
    allocatable = {"cpu": "47810m", "memory": "189261804Ki", "pods": "234", "ephemeral-storage": "95491281146"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = gpus
    if efa is not None:
        allocatable["vpc.amazonaws.com/efa"] = efa
    labels = {"kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "g6.12xlarge"}
    if label:
        labels["nvidia.com/gpu.present"] = "true"
    spec: dict[str, Any] = {"providerID": f"aws:///us-east-1a/i-0{name[-1]}", "taints": taints if taints is not None
                            else [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]}
    if cordoned:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": spec,
            "status": {"allocatable": allocatable, "capacity": dict(allocatable), "conditions": [
                {"type": "Ready", "status": "True" if ready else "Unknown",
                 "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                 "message": "kubelet is posting ready status" if ready else "Kubelet stopped posting node status."}]}}


SYSTEM = {"apiVersion": "v1", "kind": "Node",
          "metadata": {"name": "ip-10-0-0-7", "labels": {"node.kubernetes.io/instance-type": "m7i.xlarge"}},
          "spec": {}, "status": {"allocatable": {"cpu": "3920m", "memory": "15147388Ki", "pods": "58"}}}


def check(nodes: list[dict[str, Any]], *, require_efa: bool = True, node_count: int = 2) -> list[str]:
    return allocatable_problems(nodes, gpus_per_node=4, node_count=node_count, require_efa=require_efa)


def test_two_healthy_gpu_nodes_have_no_problem() -> None:
    assert check([SYSTEM, node("ip-10-0-1-5"), node("ip-10-0-1-6")]) == []


WORKER = {"cpu": "40", "memory": "160Gi", "nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "1"}


def test_cpu_and_memory_are_checked_against_allocatable_with_the_shortfall() -> None:
    # A real g6.12xlarge (47810m CPU, about 180Gi) holds the seed's worker.
    assert allocatable_problems([node("a"), node("b")], gpus_per_node=4, node_count=2, require_efa=True,
                                requests=WORKER) == []
    small = node("ip-10-0-1-7")
    small["status"]["allocatable"].update(cpu="31500m", memory="150Gi")
    problems = allocatable_problems([small, node("b")], gpus_per_node=4, node_count=2, require_efa=True,
                                    requests=WORKER)
    assert problems == ["node ip-10-0-1-7: allocatable cpu is 31.5, a worker needs 40 (8.5 short)",
                        "node ip-10-0-1-7: allocatable memory is 150Gi, a worker needs 160Gi (10Gi short)",
                        "only 1 GPU node(s) advertise 4 nvidia.com/gpu and 1 vpc.amazonaws.com/efa and accept "
                        "workers, need 2"]


def test_a_node_without_efa_is_named_with_the_resource_and_the_likely_cause() -> None:
    problems = check([SYSTEM, node("ip-10-0-1-5", efa="0"), node("ip-10-0-1-6")])
    assert problems[0] == ("node ip-10-0-1-5: allocatable vpc.amazonaws.com/efa is 0 (the EFA device plugin is not "
                           "running there, or the instance has no EFA interface)")
    assert problems[1] == ("only 1 GPU node(s) advertise 4 nvidia.com/gpu and 1 vpc.amazonaws.com/efa and accept "
                           "workers, need 2")
    assert len(problems) == 2
    # Without EFA required, TCP will do: no problem at all.
    assert check([SYSTEM, node("ip-10-0-1-5", efa=None), node("ip-10-0-1-6", efa=None)], require_efa=False) == []


def test_gpus_missing_or_too_few() -> None:
    problems = check([node("ip-10-0-1-5", gpus="0"), node("ip-10-0-1-6", gpus="2")], require_efa=False)
    assert problems == [
        "node ip-10-0-1-5: allocatable nvidia.com/gpu is 0 (the NVIDIA device plugin is not running there)",
        "node ip-10-0-1-6: allocatable nvidia.com/gpu is 2, a worker needs 4",
        "only 0 GPU node(s) advertise 4 nvidia.com/gpu and accept workers, need 2",
    ]


def test_no_gpu_nodes_says_how_to_mark_them() -> None:
    (problem,) = check([SYSTEM, node("ip-10-0-1-5", gpus=None, label=False, taints=[])])
    assert problem.startswith("no GPU nodes") and "kubectl label node NAME nvidia.com/gpu.present=true" in problem


def test_an_unlabelled_node_advertising_gpus_counts_as_a_gpu_node() -> None:
    assert check([node("a1", label=False), node("a2", label=False)]) == []


def test_untolerated_taints_cordoned_and_unready_nodes_cannot_take_workers() -> None:
    tainted = node("ip-10-0-1-5", taints=[{"key": "dedicated", "value": "inference", "effect": "NoSchedule"}])
    problems = check([tainted, node("ip-10-0-1-6", cordoned=True), node("ip-10-0-1-7", ready=False)], node_count=1)
    assert problems == [
        "node ip-10-0-1-5: the workers do not tolerate its taint dedicated=inference:NoSchedule",
        "node ip-10-0-1-6 is cordoned (spec.unschedulable)",
        "node ip-10-0-1-7 is not Ready (NodeStatusUnknown)",
        "only 0 GPU node(s) advertise 4 nvidia.com/gpu and 1 vpc.amazonaws.com/efa and accept workers, need 1",
    ]
    # A PreferNoSchedule taint does not keep a pod off.
    soft = node("ip-10-0-1-8", taints=[{"key": "dedicated", "value": "x", "effect": "PreferNoSchedule"}])
    assert check([soft], node_count=1) == []


# ----- pods -----

UID = "5f0b6a1e-8d9c-4c1f-9d8a-2a6f1c3e7b10"


def pod(phase: str = "Pending", *, conditions: list[dict[str, Any]] | None = None,
        containers: list[dict[str, Any]] | None = None, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "rtui-ray-gpu-worker-x7k2p", "namespace": "rtui", "uid": UID},
        "spec": {"containers": [{"name": "ray-worker", "image": IMAGE,
                                 "resources": {"limits": {"memory": "160Gi", "nvidia.com/gpu": "4"}}}]},
        "status": {"phase": phase, "conditions": conditions or [], "containerStatuses": containers or [], **status},
    }


def event(reason: str, message: str, *, type_: str = "Warning", count: int = 1,
          last: str = "2026-01-01T12:00:30Z", uid: str = UID) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"rtui-ray-gpu-worker-x7k2p.18{reason.lower()}", "namespace": "rtui"},
            "involvedObject": {"kind": "Pod", "namespace": "rtui", "name": "rtui-ray-gpu-worker-x7k2p", "uid": uid,
                               "apiVersion": "v1", "fieldPath": "spec.containers{ray-worker}"},
            "reason": reason, "message": message, "type": type_, "count": count,
            "firstTimestamp": "2026-01-01T12:00:00Z", "lastTimestamp": last,
            "source": {"component": "kubelet", "host": "ip-10-0-1-5.ec2.internal"}}


def waiting(why: str, message: str = "", restarts: int = 0, **last: Any) -> dict[str, Any]:
    """A container status waiting for ``why``; ``last``: its lastState.terminated."""
    return {"name": "ray-worker", "image": IMAGE, "imageID": "", "ready": False, "started": False,
            "restartCount": restarts, "state": {"waiting": {"reason": why, "message": message}},
            "lastState": {"terminated": last} if last else {}}


UNSCHEDULABLE = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                  "lastTransitionTime": "2026-01-01T12:00:00Z",
                  "message": "0/3 nodes are available: 3 Insufficient vpc.amazonaws.com/efa."}]
FAILED_SCHEDULING = ("0/3 nodes are available: 1 node(s) had untolerated taint {node-role: system}, 2 Insufficient "
                     "vpc.amazonaws.com/efa. preemption: 0/3 nodes are available: 1 Preemption is not helpful for "
                     "scheduling, 2 No preemption victims found for incoming pod.")
NOT_FOUND = (f'Failed to pull image "{IMAGE}": rpc error: code = NotFound desc = failed to pull and unpack image '
             f'"{IMAGE}": failed to resolve reference "{IMAGE}": {IMAGE}: not found')
TIMEOUT = (f'Failed to pull image "{IMAGE}": rpc error: code = Unknown desc = failed to pull and unpack image '
           f'"{IMAGE}": failed to copy: read tcp 10.0.1.5:41234->52.46.154.10:443: read: connection timed out')


def test_failed_scheduling_names_the_missing_resource_from_the_latest_event() -> None:
    old = event("FailedScheduling", "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
                last="2026-01-01T11:59:00Z")
    problem = pod_problem(pod(conditions=UNSCHEDULABLE), [event("FailedScheduling", FAILED_SCHEDULING), old])
    assert problem == PodProblem(
        "not scheduled: 2 nodes lack vpc.amazonaws.com/efa — 0/3 nodes are available: 1 node(s) had untolerated "
        "taint {node-role: system}, 2 Insufficient vpc.amazonaws.com/efa", fatal=False,
        insufficient=("vpc.amazonaws.com/efa",), unscheduled=True)
    # When the allocatable check says no node will ever offer EFA, waiting is pointless.
    fatal = pod_problem(pod(conditions=UNSCHEDULABLE), [event("FailedScheduling", FAILED_SCHEDULING)],
                        unobtainable={"vpc.amazonaws.com/efa"})
    assert fatal is not None and fatal.fatal and "(no node can offer it)" in fatal.message
    # Without events, the condition's own message.
    alone = pod_problem(pod(conditions=UNSCHEDULABLE), [])
    assert alone is not None and alone.insufficient == ("vpc.amazonaws.com/efa",)
    affinity = pod_problem(pod(conditions=UNSCHEDULABLE), [old])
    assert affinity is not None and "didn't match Pod's node affinity" in affinity.message and not affinity.fatal


def test_events_about_another_pod_are_ignored() -> None:
    other = event("FailedScheduling", FAILED_SCHEDULING, uid="another-uid")
    problem = pod_problem(pod(conditions=UNSCHEDULABLE), [other])
    assert problem is not None and problem.message.endswith("0/3 nodes are available: 3 Insufficient "
                                                            "vpc.amazonaws.com/efa")


def test_an_image_that_does_not_exist_is_fatal_and_named() -> None:
    p = pod(containers=[waiting("ErrImagePull", "rpc error: code = NotFound desc = failed to pull and unpack image")])
    problem = pod_problem(p, [event("Pulling", f'Pulling image "{IMAGE}"', type_="Normal"), event("Failed", NOT_FOUND),
                              event("Failed", "Error: ErrImagePull")])
    assert problem is not None and problem.fatal
    assert problem.message == f"cannot pull image {IMAGE} for container ray-worker: {NOT_FOUND}"


def test_a_slow_registry_is_transient_until_pulls_keep_failing() -> None:
    p = pod(containers=[waiting("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"')])
    backoff = event("BackOff", f'Back-off pulling image "{IMAGE}"', type_="Normal")
    few = pod_problem(p, [event("Failed", TIMEOUT, count=2), backoff])
    assert few is not None and not few.fatal and IMAGE in few.message and "connection timed out" in few.message
    many = pod_problem(p, [event("Failed", TIMEOUT, count=5), backoff])
    assert many is not None and many.fatal


def test_crash_loops_oom_kills_and_missing_secrets() -> None:
    backoff = "back-off 40s restarting failed container=ray-worker pod=rtui-ray-gpu-worker-x7k2p_rtui(" + UID + ")"
    crash = pod("Running", containers=[waiting("CrashLoopBackOff", backoff, restarts=3, exitCode=1, reason="Error")])
    assert pod_problem(crash, []) == PodProblem(
        "container ray-worker keeps crashing (restarted 3 times, last exit code 1 (Error))", fatal=True)
    once = pod("Running", containers=[waiting("CrashLoopBackOff", restarts=1, exitCode=1, reason="Error")])
    assert pod_problem(once, []) == PodProblem(
        "container ray-worker keeps crashing (restarted 1 times, last exit code 1 (Error))", fatal=False)
    oom = pod("Running", containers=[waiting("CrashLoopBackOff", restarts=1, exitCode=137, reason="OOMKilled")])
    assert pod_problem(oom, []) == PodProblem(
        "container ray-worker was killed for using more than its memory limit of 160Gi (OOMKilled)", fatal=True)
    secret = pod(containers=[waiting("CreateContainerConfigError", 'secret "hf-token" not found')])
    assert pod_problem(secret, []) == PodProblem(
        'container ray-worker: CreateContainerConfigError: secret "hf-token" not found', fatal=True)


def test_pulling_is_said_but_not_fatal_and_a_fresh_or_running_pod_has_no_problem() -> None:
    scheduled = [{"type": "PodScheduled", "status": "True"}]
    creating = pod(conditions=scheduled, containers=[waiting("ContainerCreating")])
    assert pod_problem(creating, []) is None
    pulling = pod_problem(creating, [event("Scheduled", "Successfully assigned rtui/rtui-ray-gpu-worker-x7k2p to "
                                                        "ip-10-0-1-5.ec2.internal", type_="Normal"),
                                     event("Pulling", f'Pulling image "{IMAGE}"', type_="Normal")])
    assert pulling == PodProblem(f'Pulling image "{IMAGE}" (still pulling)', fatal=False)
    pulled = event("Pulled", f'Successfully pulled image "{IMAGE}" in 3m2.5s (3m2.5s including waiting). '
                             'Image size: 9876543210 bytes.', type_="Normal", last="2026-01-01T12:03:30Z")
    assert pod_problem(creating, [event("Pulling", f'Pulling image "{IMAGE}"', type_="Normal"), pulled]) is None
    running = pod("Running", conditions=[*scheduled, {"type": "Ready", "status": "True"}], containers=[
        {"name": "ray-worker", "image": IMAGE, "ready": True, "restartCount": 0,
         "state": {"running": {"startedAt": "2026-01-01T12:04:00Z"}}}])
    assert pod_problem(running, []) is None
    assert pod_running(running) and pod_ready(running)


def test_an_evicted_pod_is_fatal() -> None:
    evicted = pod("Failed", reason="Evicted", message="The node was low on resource: memory. Threshold quantity: "
                                                      "100Mi, available: 91264Ki.")
    problem = pod_problem(evicted, [])
    assert problem is not None and problem.fatal and problem.message.startswith("pod failed: Evicted: The node was low")


def test_running_and_ready_read_the_containers_not_only_the_phase() -> None:
    crashing = pod("Running", conditions=[{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
                   containers=[waiting("CrashLoopBackOff", restarts=2, exitCode=1, reason="Error")])
    assert not pod_running(crashing) and not pod_ready(crashing)
    assert not pod_running(pod("Pending")) and not pod_ready(pod("Pending"))
