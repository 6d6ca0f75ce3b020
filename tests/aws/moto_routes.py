"""Routes of a VPC someone else made, as EC2 reports them where moto 5.2 is kinder (issue 34, item 5).

- **A route whose target is gone is ``blackhole``.** EC2 API reference, ``Route.State``: a blackhole
  route's target is not available, for instance a gateway no longer there or a NAT instance that was
  terminated. moto answers ``active`` for every route, so a default route to a deleted NAT gateway or a
  terminated NAT instance still looked like a way out.
- **CreateRoute to a transit gateway that does not exist** fails with ``InvalidTransitGatewayID.NotFound``
  (EC2 API reference, CreateRoute errors); moto stored a route with no target at all.

Checked and left as moto has them, since they match EC2: ``DescribeVpcAttribute`` answers
``enableDnsSupport`` true and ``enableDnsHostnames`` false for a VPC made by CreateVpc (VPC User Guide,
"DNS attributes for your VPC": only a default VPC has hostnames on); a route made with ``VpcEndpointId``
(a Gateway Load Balancer or Network Firewall endpoint) is described with the endpoint's id in
``GatewayId`` (the Terraform AWS provider's route flattening reads a ``vpce-`` GatewayId back as the
endpoint for that reason), and moto refuses one to an endpoint of another type; routes to a transit
gateway, an instance or a network interface keep that target's id field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from moto.ec2.exceptions import InvalidTransitGatewayID
from moto.ec2.models import EC2Backend
from moto.ec2.models.route_tables import Route

Patch = Callable[[Any, str, Any], None]


def _route_state(route: Route) -> str:
    nat = route.nat_gateway
    if nat is not None and nat.state in ("deleting", "deleted", "failed"):
        return "blackhole"
    instance = route.instance
    if instance is not None and instance.state in ("shutting-down", "terminated"):
        return "blackhole"
    gateway = route.transit_gateway
    if gateway is not None and gateway.id not in route.route_table.ec2_backend.transit_gateways:
        return "blackhole"
    return "active"


def _create_route(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_route(self: EC2Backend, *args: Any, transit_gateway_id: str | None = None, **kwargs: Any) -> Any:
        if transit_gateway_id is not None and transit_gateway_id not in self.transit_gateways:
            raise InvalidTransitGatewayID(transit_gateway_id)
        return original(self, *args, transit_gateway_id=transit_gateway_id, **kwargs)

    return create_route


def install(patch: Patch) -> None:
    patch(Route, "state", property(_route_state))
    patch(EC2Backend, "create_route", _create_route(EC2Backend.create_route))
