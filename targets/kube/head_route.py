"""The Ray head's Jobs API on a kube cluster, by the path that works: the port-forward
(``portforward``), else the API server's service proxy, else a client that says at once why neither
reaches the head (see ``portforward``'s docstring for the two paths).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from backend.errors import OperationError, TransientError
from backend.jobsapi import TokenRefused
from backend.rayjobs import RayJobs
from targets.kube.config import KubeConfig
from targets.kube.portforward import PortForwardForbidden

if TYPE_CHECKING:
    from targets.kube.api import KubeApi

# The service proxy's own dial timeout is 30 s on kube-apiserver: a fallback that gets no answer in
# this long is taken as dropped.
PROXY_CHECK_TIMEOUT_S = 35.0


class _PathDropped(RayJobs):
    """The head's Jobs API where rtui knows its way there is dropped: a submission fails at once with
    why and what to check, instead of waiting out its deadline as if the job agent were starting."""

    def __init__(self, address: str, problem: OperationError, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        self.problem = problem

    async def submit(self, *, entrypoint: str, submission_id: str, runtime_env: dict[str, Any],
                     metadata: dict[str, str]) -> str:
        raise self.problem


def path_remedy(config: KubeConfig, policy: str) -> str:
    return (f"ask for `create pods/portforward` in namespace {config.namespace} (the admin and edit roles have it; "
            "no NetworkPolicy filters that path), or have the NetworkPolicy "
            f"{config.namespace}/{policy} admit where your API server's traffic reaches pods from (a CNI "
            "tunnel address, the Konnectivity agents of GKE/AKS)")


async def head_jobs(api: KubeApi, config: KubeConfig, pod: str, port: int, service: str, port_name: str,
                    ray_auth: Mapping[str, str], policy: str) -> RayJobs:
    """The Jobs API of the head pod ``pod``: through a port-forward, else (no right to one) through the
    service proxy when that answers, else a client that refuses submissions with what to check."""
    forward = api.port_forward(config.namespace, pod, port)
    try:
        await forward.check("/api/version", ray_auth)
    except PortForwardForbidden as denied:
        return await _through_service_proxy(api, config, service, port_name, ray_auth, policy, denied)
    except OperationError:
        # The stream opened but nothing answered on the port yet (the dashboard still starting), or the
        # API server did not answer: the caller waits on it as on any head that is starting.
        pass
    return RayJobs(forward.url, headers=ray_auth, stream_idle_s=api.stream_idle_s)


async def _through_service_proxy(api: KubeApi, config: KubeConfig, service: str, port_name: str,
                                 ray_auth: Mapping[str, str], policy: str, denied: OperationError) -> RayJobs:
    jobs = api.ray_jobs(config.namespace, service, port_name, ray_auth=ray_auth)
    try:
        await jobs.version(timeout_s=PROXY_CHECK_TIMEOUT_S)
    except TokenRefused:
        return jobs  # reached: Ray (or the API server) judged the credentials, the step says so
    except TransientError as exc:
        # The proxy's dial dropped (503 "error trying to reach service ... i/o timeout"), or no answer.
        if "error trying to reach service" in exc.message or "timed out" in exc.message:
            return _PathDropped(jobs.address, OperationError(
                f"the API server's service proxy cannot reach the Ray head ({exc.message}), and {denied.message}",
                remedy=path_remedy(config, policy)), **_proxy_route(api, ray_auth))
    return jobs


def _proxy_route(api: KubeApi, ray_auth: Mapping[str, str]) -> dict[str, Any]:
    extra = dict(ray_auth)

    def headers() -> dict[str, str]:
        return {**api.headers(), **extra}

    return {"header_provider": headers, "ssl": api.ssl_context(), "proxy": api.proxy,
            "server_hostname": api.tls_server_name, "stream_idle_s": api.stream_idle_s}
