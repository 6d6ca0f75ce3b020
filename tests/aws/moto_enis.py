"""Network interfaces another AWS service made in the run's subnets (requester-managed), as EC2 keeps them.

A Lambda function with VPC settings, a load balancer or an interface VPC endpoint gets its network
interfaces from EC2 on the caller's behalf: they are in the caller's subnet, ``RequesterManaged`` true,
``RequesterId`` naming the service, ``InterfaceType`` and ``Description`` saying whose ("AWS Lambda VPC
ENI-<function>", "ELB net/<name>/..."), attached to something in the service's own account. The owner
of the VPC cannot detach or delete them; the service removes them when the resource that uses them goes
(EC2 User Guide, "Requester-managed network interfaces"; a Lambda's can take many minutes: Lambda
Developer Guide, "Giving Lambda functions access to resources in an Amazon VPC"). Until then DeleteSubnet
answers DependencyViolation (moto_provision_ec2) and DeleteNetworkInterface answers
``InvalidNetworkInterface.InUse`` ("The specified interface is currently in use": EC2 API reference,
"Error codes"). moto 5.2 would delete it on request: here it refuses, as EC2 does.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, cast

from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models import EC2Backend, ec2_backends

Patch = Callable[[Any, str, Any], None]
LAMBDA = ("lambda", "AWS Lambda VPC ENI-rtui-neighbour-{id}", "AROAEXAMPLELAMBDA:rtui-neighbour")


def service_eni(account: str, region: str, subnet_id: str, *, service: tuple[str, str, str] = LAMBDA) -> str:
    """A requester-managed interface in ``subnet_id``, attached on the service's side (the test plays the
    service); ``service``: its (InterfaceType, Description, RequesterId)."""
    backend: EC2Backend = ec2_backends[account][region]
    # No address given: moto picks a free one in the subnet, as EC2 does for the service.
    eni = backend.create_network_interface(backend.get_subnet(subnet_id), private_ip_address=cast(Any, None))
    kind, description, requester = service
    eni.interface_type, eni.requester_managed, eni.requester_id = kind, True, requester
    eni.description = description.format(id=uuid.uuid4().hex[:8])
    eni.status = "in-use"
    return str(eni.id)


def service_lets_go(account: str, region: str, eni_id: str) -> None:
    """The service is done with it (its function, load balancer or endpoint went): EC2 removes it."""
    ec2_backends[account][region].enis.pop(eni_id, None)


def _delete_network_interface(original: Callable[..., None]) -> Callable[..., None]:
    def delete_network_interface(self: EC2Backend, eni_id: str) -> None:
        eni = self.enis.get(eni_id)
        if eni is not None and eni.requester_managed:
            raise EC2ClientError("InvalidNetworkInterface.InUse", f"Interface: [{eni_id}] in use.")
        original(self, eni_id)

    return delete_network_interface


def install(patch: Patch) -> None:
    patch(EC2Backend, "delete_network_interface", _delete_network_interface(EC2Backend.delete_network_interface))
