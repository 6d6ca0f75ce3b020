"""The Pod Security Standards as kube-apiserver's PodSecurity admission checks them, for tests.

The controls and their allowed values are those of https://kubernetes.io/docs/concepts/security/
pod-security-standards/ ("Baseline" and "Restricted" tables, Kubernetes 1.33). The refusal reads as the
admission plugin writes it (k8s.io/pod-security-admission admission.go: ``violates PodSecurity
"<level>:<version>": <reason> (<detail>), ...``): each check has a short reason and a detail naming
the containers or volumes at fault.

``kuberay_pods`` turns a RayCluster into the pods KubeRay 1.7.0 makes of it, with what the operator adds
(ray-operator/controllers/ray/common/pod.go: the autoscaler sidecar in the head, whose securityContext
is ``autoscalerOptions.securityContext`` or none; the workers' ``wait-gcs-ready`` init container, which
copies the Ray container's securityContext; the head's service account with the autoscaler on, from
utils.GetHeadGroupServiceAccountName): the pods that admission sees are those, not the templates.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

Obj = dict[str, Any]

BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
SAFE_SYSCTLS = frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                          "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
                          "net.ipv4.ip_local_reserved_ports",
                          "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                          "net.ipv4.tcp_keepalive_probes"})
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                                "projected", "secret"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
# The Namespace labels PodSecurity admission reads (pod-security.kubernetes.io/<mode>[-version]).
LABEL_PREFIX = "pod-security.kubernetes.io/"


def containers(spec: Obj) -> list[Obj]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []),
            *(spec.get("ephemeralContainers") or [])]


def _sc(obj: Obj) -> Obj:
    return obj.get("securityContext") or {}


def _named(items: list[str]) -> str:
    return ", ".join(f'"{i}"' for i in items)


def baseline_violations(meta: Obj, spec: Obj) -> list[str]:
    """Every Baseline control the pod breaks, as ``reason (detail)``; empty when it passes."""
    out = []
    pod_sc, every = _sc(spec), containers(spec)
    host_process = [c["name"] for c in every if (_sc(c).get("windowsOptions") or {}).get("hostProcess")]
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess") or host_process:
        out.append(f"hostProcess (pod or containers {_named(host_process)} must not set hostProcess=true)")
    hosts = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if hosts:
        out.append(f"host namespaces ({', '.join(hosts)})")
    privileged = [c["name"] for c in every if _sc(c).get("privileged")]
    if privileged:
        out.append(f"privileged (containers {_named(privileged)} must not set securityContext.privileged=true)")
    added = sorted({cap for c in every for cap in (_sc(c).get("capabilities") or {}).get("add") or []
                    if cap not in BASELINE_CAPABILITIES})
    if added:
        out.append(f"non-default capabilities (capabilities {_named(added)} must not be added)")
    host_paths = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if host_paths:
        out.append(f"hostPath volumes (volumes {_named(host_paths)})")
    ports = sorted({p["hostPort"] for c in every for p in c.get("ports") or [] if p.get("hostPort")})
    if ports:
        out.append(f"hostPort (hostPorts {', '.join(map(str, ports))})")
    profiles = [(_sc(x).get("appArmorProfile") or {}).get("type") for x in (spec, *every)]
    profiles += [v.split("/", 1)[0] if v.startswith("localhost/") else v
                 for k, v in (meta.get("annotations") or {}).items() if k.startswith(APPARMOR_ANNOTATION)]
    bad_apparmor = sorted({str(p) for p in profiles
                           if p not in (None, "RuntimeDefault", "Localhost", "runtime/default", "localhost")})
    if bad_apparmor:
        out.append(f"forbidden AppArmor profiles ({_named(bad_apparmor)})")
    selinux = [s for s in (_sc(x).get("seLinuxOptions") for x in (spec, *every)) if s]
    if any(s.get("type", "") not in SELINUX_TYPES or s.get("user") or s.get("role") for s in selinux):
        out.append("seLinuxOptions (type must be a container type; user and role unset)")
    proc = [c["name"] for c in every if _sc(c).get("procMount") not in (None, "Default")]
    if proc:
        out.append(f"procMount (containers {_named(proc)} must not set securityContext.procMount)")
    unconfined = [c["name"] for c in every if (_sc(c).get("seccompProfile") or {}).get("type") == "Unconfined"]
    if (pod_sc.get("seccompProfile") or {}).get("type") == "Unconfined" or unconfined:
        out.append(f"seccompProfile (pod or containers {_named(unconfined)} must not set type to \"Unconfined\")")
    sysctls = [s["name"] for s in pod_sc.get("sysctls") or [] if s.get("name") not in SAFE_SYSCTLS]
    if sysctls:
        out.append(f"forbidden sysctls ({', '.join(sysctls)})")
    return out


def restricted_violations(meta: Obj, spec: Obj) -> list[str]:
    """The Restricted controls on top of Baseline (each as ``reason (detail)``)."""
    out = baseline_violations(meta, spec)
    pod_sc, every = _sc(spec), containers(spec)
    volumes = [v["name"] for v in spec.get("volumes") or [] if not RESTRICTED_VOLUMES & set(v)]
    if volumes:
        out.append(f"restricted volume types (volumes {_named(volumes)})")
    escalating = [c["name"] for c in every if _sc(c).get("allowPrivilegeEscalation") is not False]
    if escalating:
        out.append(f"allowPrivilegeEscalation != false (containers {_named(escalating)} must set "
                   "securityContext.allowPrivilegeEscalation=false)")
    capable = [c["name"] for c in every if "ALL" not in ((_sc(c).get("capabilities") or {}).get("drop") or [])
               or set((_sc(c).get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}]
    if capable:
        out.append(f"unrestricted capabilities (containers {_named(capable)} must set "
                   "securityContext.capabilities.drop=[\"ALL\"])")
    rooted = [c["name"] for c in every
              if _sc(c).get("runAsNonRoot") is False or (_sc(c).get("runAsNonRoot") is None
                                                          and pod_sc.get("runAsNonRoot") is not True)]
    if rooted:
        out.append(f"runAsNonRoot != true (containers {_named(rooted)} must set securityContext.runAsNonRoot=true)")
    if pod_sc.get("runAsUser") == 0 or any(_sc(c).get("runAsUser") == 0 for c in every):
        out.append("runAsUser=0 (pod and containers must not set runAsUser=0)")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    unset = [c["name"] for c in every
             if (_sc(c).get("seccompProfile") or {}).get("type", pod_seccomp) not in ("RuntimeDefault", "Localhost")]
    if unset:
        out.append(f"seccompProfile (containers {_named(unset)} must set securityContext.seccompProfile.type to "
                   "\"RuntimeDefault\" or \"Localhost\")")
    return out


def violations(level: str, meta: Obj, spec: Obj) -> list[str]:
    if level == "privileged":
        return []
    return restricted_violations(meta, spec) if level == "restricted" else baseline_violations(meta, spec)


def refusal(pod_name: str, level: str, version: str, found: list[str]) -> str:
    """The 403 message PodSecurity admission answers a pod that breaks the namespace's enforce level."""
    return f'pods "{pod_name}" is forbidden: violates PodSecurity "{level}:{version}": {", ".join(found)}'


def enforced(namespace: Obj | None) -> tuple[str, str]:
    """The namespace's enforce level and version (``privileged``, ``latest`` when unlabelled: the
    admission plugin's defaults without an AdmissionConfiguration)."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_PREFIX + "enforce", "privileged"), labels.get(LABEL_PREFIX + "enforce-version", "latest")


# ---- the pods KubeRay 1.7.0 makes of a RayCluster ------------------------------------------------------

def kuberay_pods(rc: Obj) -> Iterator[tuple[str, Obj, Obj]]:
    """(role, metadata, pod spec) of the head and each worker group, as the operator creates them."""
    spec = rc["spec"]
    head = copy.deepcopy(spec["headGroupSpec"]["template"])
    head_spec = head["spec"]
    if spec.get("enableInTreeAutoscaling"):
        head_spec["serviceAccountName"] = head_spec.get("serviceAccountName") or rc["metadata"]["name"]
        sidecar: Obj = {"name": "autoscaler", "image": head_spec["containers"][0]["image"]}
        context = (spec.get("autoscalerOptions") or {}).get("securityContext")
        if context is not None:
            sidecar["securityContext"] = copy.deepcopy(context)
        head_spec["containers"].append(sidecar)
    yield "head", head.get("metadata") or {}, head_spec
    for group in spec.get("workerGroupSpecs") or []:
        worker = copy.deepcopy(group["template"])
        ray = worker["spec"]["containers"][0]
        init: Obj = {"name": "wait-gcs-ready", "image": ray["image"]}
        if ray.get("securityContext") is not None:
            init["securityContext"] = copy.deepcopy(ray["securityContext"])
        worker["spec"]["initContainers"] = [*(worker["spec"].get("initContainers") or []), init]
        yield f"worker {group['groupName']}", worker.get("metadata") or {}, worker["spec"]


def pod_specs(obj: Obj) -> Iterator[tuple[str, Obj, Obj]]:
    """(what, metadata, pod spec) of every pod an object makes: a Pod, a workload's template, a RayCluster."""
    kind, name = obj.get("kind"), (obj.get("metadata") or {}).get("name")
    if kind == "Pod":
        yield f"Pod {name}", obj.get("metadata") or {}, obj["spec"]
    elif kind in ("DaemonSet", "Deployment", "StatefulSet", "Job", "ReplicaSet"):
        template = obj["spec"]["template"]
        yield f"{kind} {name}", template.get("metadata") or {}, template["spec"]
    elif kind == "RayCluster":
        for role, meta, spec in kuberay_pods(obj):
            yield f"RayCluster {name} {role}", meta, spec
