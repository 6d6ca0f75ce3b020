"""What outlives an EKS cluster and its VPC unless rtui removes it, as AWS behaves (moto 5.2 does neither).

- **The control-plane log group.** With control-plane logging on, EKS sends the logs to the CloudWatch
  Logs group ``/aws/eks/<cluster>/cluster``, making it when it is not there and writing into one that
  is (EKS User Guide, "Send control plane logs to CloudWatch Logs": log streams "to a group for each
  Amazon EKS cluster"; the Terraform AWS provider's ``aws_eks_cluster`` docs make the group first to
  own its retention). Deleting the cluster does not delete the group: its stored logs keep billing
  (CloudWatch pricing, $0.03/GB-month stored in us-east-1). moto's EKS makes no group at all.
- **VPC endpoints.** CreateVpcEndpoint refuses a service the region does not offer
  (``InvalidServiceName``: S3's gateway service is ``com.amazonaws.<region>.s3``, VPC User Guide,
  "Gateway endpoints for Amazon S3"); moto takes any name and makes an endpoint without routes.
  A gateway endpoint adds a route to the S3 prefix list in each of its route tables and DeleteVpcEndpoints
  removes them (EC2 API reference, DeleteVpcEndpoints): moto does both. DeleteVpc refuses a VPC that
  still has resources associated with it (EC2 API reference, DeleteVpc: "You must detach or delete all
  gateways and resources that are associated with the VPC"), an endpoint among them: moto deletes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from moto.ec2.exceptions import DependencyViolationError, InvalidServiceName
from moto.ec2.models import EC2Backend
from moto.eks.responses import EKSResponse
from moto.logs.models import logs_backends

from tests.aws import moto_routes

Patch = Callable[[Any, str, Any], None]


def log_group_name(cluster: str) -> str:
    return f"/aws/eks/{cluster}/cluster"


def _logs_on(cluster: Any) -> bool:
    return any(group.get("enabled") and group.get("types")
               for group in (getattr(cluster, "logging", None) or {}).get("clusterLogging") or [])


def _ensure_group(response: EKSResponse, name: str) -> None:
    cluster = response.eks_backend.clusters.get(name)
    if cluster is not None and _logs_on(cluster):
        # EKS writes into the group when it exists (made beforehand, with its owner's tags and retention).
        logs_backends[response.current_account][response.region].ensure_log_group(log_group_name(name))


def _create_cluster(original: Callable[[EKSResponse], Any]) -> Callable[[EKSResponse], Any]:
    def create_cluster(self: EKSResponse) -> Any:
        result = original(self)
        _ensure_group(self, self._get_param("name"))
        return result

    return create_cluster


def _update_cluster_config(original: Callable[[EKSResponse], Any]) -> Callable[[EKSResponse], Any]:
    def update_cluster_config(self: EKSResponse) -> Any:
        result = original(self)
        _ensure_group(self, self._get_param("name"))
        return result

    return update_cluster_config


def _create_vpc_endpoint(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_vpc_endpoint(self: EC2Backend, vpc_id: str, service_name: str, *args: Any, **kwargs: Any) -> Any:
        offered = {s["ServiceName"] for s in self._collect_default_endpoint_services(self.account_id,
                                                                                     self.region_name)}
        if service_name not in offered:
            raise InvalidServiceName(service_name)
        return original(self, vpc_id, service_name, *args, **kwargs)

    return create_vpc_endpoint


def _delete_vpc(original: Callable[..., Any]) -> Callable[..., Any]:
    def delete_vpc(self: EC2Backend, vpc_id: str) -> Any:
        if any(e.vpc_id == vpc_id and e.state != "deleted" for e in self.vpc_end_points.values()):
            raise DependencyViolationError(f"The vpc '{vpc_id}' has dependencies and cannot be deleted.")
        return original(self, vpc_id)

    return delete_vpc


def install(patch: Patch) -> None:
    """On top of every other EKS and EC2 wrapper (the cluster's logging setting is known after them)."""
    patch(EKSResponse, "create_cluster", _create_cluster(EKSResponse.create_cluster))
    patch(EKSResponse, "update_cluster_config", _update_cluster_config(EKSResponse.update_cluster_config))
    patch(EC2Backend, "create_vpc_endpoint", _create_vpc_endpoint(EC2Backend.create_vpc_endpoint))
    patch(EC2Backend, "delete_vpc", _delete_vpc(EC2Backend.delete_vpc))
    moto_routes.install(patch)  # the same issue's item 5: a given VPC's routes as EC2 reports them
