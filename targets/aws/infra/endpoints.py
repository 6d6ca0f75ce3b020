"""The S3 gateway endpoint on the private route table: S3 traffic of the nodes skips the NAT gateway.

Checkpoints, the model and the dataset move between the private subnets and S3. Through the NAT
gateway every GB is billed ($0.045/GB in us-east-1); through a gateway endpoint for
``com.amazonaws.<region>.s3`` it is free, and the endpoint itself has no charge (VPC User Guide,
"Gateway endpoints for Amazon S3"). EC2 adds a route to S3's prefix list in each route table the
endpoint names, and removes it when the endpoint is deleted (EC2 API reference, DeleteVpcEndpoints);
the VPC cannot be deleted while the endpoint is in it, so teardown removes it first.

In a VPC rtui did not make (``--vpc-id``) it changes no route table of the user's: the plan says when
their private subnets have no S3 gateway endpoint (``missing_endpoint_note``), and what it costs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from backend.errors import OperationError
from backend.layers.base import Context
from backend.resources import Observed, Resource
from backend.runner import Progress
from targets.aws.config import aws_config
from targets.aws.infra.api import AwsApi, client_token, run_filter, tag_spec
from targets.aws.infra.common import LAYER, PRIVATE_RT, VPC, AwsHandler
from targets.aws.infra.network import find, run_tags, vpc_id
from targets.aws.infra.specs import S3EndpointSpec

S3_ENDPOINT = "aws.vpc-endpoint.s3"
GONE_STATES = ("deleting", "deleted", "failed", "rejected", "expired")


def s3_service_name(region: str) -> str:
    """S3's gateway service; the same form in every partition (``com.amazonaws.cn-north-1.s3`` too)."""
    return f"com.amazonaws.{region}.s3"


async def live_endpoints(api: AwsApi, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = await api.pages("ec2", "describe_vpc_endpoints", "VpcEndpoints", Filters=filters)
    return [e for e in found if str(e.get("State", "")).lower() not in GONE_STATES]


class S3EndpointHandler(AwsHandler):
    kind = "aws-vpc-endpoint"
    spec_model = S3EndpointSpec
    title = "Route S3 past the NAT gateway (gateway endpoint)"
    address = S3_ENDPOINT
    expected_s = 3.0

    @staticmethod
    def spec(region: str) -> S3EndpointSpec:
        return S3EndpointSpec(service=s3_service_name(region), type="Gateway", route_tables=["private"])

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        tables = {t["RouteTableId"]: t for t in await find(api, ctx, "describe_route_tables", "RouteTables")}
        out = []
        for endpoint in await live_endpoints(api, run_filter(ctx.record.run_id)):
            roles = sorted({_role(tables[t]) for t in endpoint.get("RouteTableIds") or [] if t in tables})
            out.append(Observed(address=S3_ENDPOINT, layer=LAYER, kind=self.kind, id=endpoint["VpcEndpointId"],
                                state={"service": endpoint.get("ServiceName"),
                                       "type": endpoint.get("VpcEndpointType"), "route_tables": roles},
                                depends_on=(VPC, PRIVATE_RT), reason=str(endpoint.get("State", "")).lower()))
        return out

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api, spec = self.api(ctx), S3EndpointSpec.of(want)
        found = await live_endpoints(api, run_filter(ctx.record.run_id))
        if found:
            eid = str(found[0]["VpcEndpointId"])
        else:
            tables = await find(api, ctx, "describe_route_tables", "RouteTables", **{"rtui:role": "private"})
            if not tables:
                raise OperationError("this run's private route table is gone: the S3 endpoint has no route to add",
                                     remedy="run `rtui up` again: the plan makes the route table first")
            request: dict[str, Any] = {
                "VpcId": await vpc_id(api, ctx), "ServiceName": spec.service,
                "VpcEndpointType": spec.type, "RouteTableIds": [tables[0]["RouteTableId"]],
                "TagSpecifications": tag_spec("vpc-endpoint", run_tags(ctx), f"{aws_config(ctx).cluster_name}-s3")}
            made = await api.call("ec2", "create_vpc_endpoint", **request,
                                  ClientToken=client_token(ctx.record.run_id, "s3-endpoint", request=request))
            eid = str(made["VpcEndpoint"]["VpcEndpointId"])
        self.made(ctx, want, eid)
        yield Progress(f"{eid}: S3 from the private subnets goes through it, not the NAT gateway", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        answer = await self.api(ctx).call("ec2", "delete_vpc_endpoints", VpcEndpointIds=[have.id])
        # DeleteVpcEndpoints answers 200 and lists what it could not delete.
        failed = [item for item in (answer or {}).get("Unsuccessful") or []
                  if (item.get("Error") or {}).get("Code") != "InvalidVpcEndpoint.NotFound"]
        if failed:
            error = failed[0].get("Error") or {}
            raise OperationError(f"AWS did not delete the S3 endpoint {have.id}: {error.get('Code', '')} "
                                 f"{error.get('Message', '')}".strip(),
                                 remedy="run `rtui down` again, or delete it with `aws ec2 delete-vpc-endpoints`")
        yield Progress(f"{have.id} deleted (its routes with it)", 1.0)


def _role(table: dict[str, Any]) -> str:
    return next((t["Value"] for t in table.get("Tags") or [] if t["Key"] == "rtui:role"), "private")


async def missing_endpoint_note(api: AwsApi, ctx: Context) -> str:
    """With --vpc-id: one line when a private subnet's route table has no S3 gateway endpoint; else ""."""
    config = aws_config(ctx)
    if not config.vpc_id or not config.private_subnet_id_list():
        return ""
    vpc = [{"Name": "vpc-id", "Values": [config.vpc_id]}]
    try:
        tables = await api.pages("ec2", "describe_route_tables", "RouteTables", Filters=vpc)
        endpoints = await live_endpoints(api, vpc)
    except OperationError:
        return ""  # the VPC check of the preflight says what is wrong with it
    service = s3_service_name(config.region)
    routed = {t for e in endpoints if e.get("ServiceName") == service and e.get("VpcEndpointType") == "Gateway"
              for t in e.get("RouteTableIds") or []}
    main = next((t["RouteTableId"] for t in tables if any(a.get("Main") for a in t.get("Associations") or [])), None)
    by_subnet = {a["SubnetId"]: t["RouteTableId"] for t in tables for a in t.get("Associations") or []
                 if a.get("SubnetId")}
    unrouted = [s for s in config.private_subnet_id_list() if by_subnet.get(s, main) not in routed]
    if not unrouted:
        return ""
    return (f"{config.vpc_id}: no S3 gateway endpoint on the route table of {', '.join(unrouted)}, so S3 traffic "
            f"(checkpoints, model, data) goes through your NAT at its per-GB charge; rtui does not change your "
            f"route tables: add a gateway endpoint for {service} (free) to them")
