"""The AWS Price List Query API (``pricing:GetProducts``) as AWS serves it; moto has none.

What it does like AWS, and where that is written down:

- Endpoints: the Query API answers only from its own regions, us-east-1, eu-central-1 and
  ap-south-1 for the aws partition and cn-northwest-1 for aws-cn (AWS Billing User Guide, "Using
  the AWS Price List Query API", endpoints). A request signed for any other region finds no
  endpoint there; we answer it with an error, so a client that asks its run's region fails.
- Filters: ``TERM_MATCH`` only, and a product is returned when *every* filter equals one of its
  attributes (or ``ServiceCode``); nothing is matched loosely (Price List Query API reference,
  ``GetProducts`` and ``Filter``). So a client that names too little gets several products.
- Answer shape: ``{"FormatVersion": "aws_v1", "PriceList": [str, ...], "NextToken"?}`` where each
  item is a JSON *string* of ``{"product": {"productFamily", "attributes", "sku"}, "serviceCode",
  "terms": {"OnDemand": {...}, "Reserved": {...}}, "version", "publicationDate"}``; a term holds
  ``priceDimensions`` with ``unit``, ``pricePerUnit.USD`` (a decimal string), ``description``
  and ranges (``GetProducts`` response syntax; "Reading the price list files" in the Billing
  User Guide for the term and dimension fields). ``MaxResults`` is at most 100; more products
  page through ``NextToken``.
- Usage types: outside us-east-1 they carry the region's billing prefix (``EUW2-NatGateway-Hours``,
  ``USE2-BoxUsage:g6.12xlarge``); us-east-1's have none. One region sells several products per
  family: EKS standard and extended-support hours, NAT gateway hours and bytes, public IPv4
  in-use and idle addresses, gp3 storage beside gp3 IOPS and throughput, and EC2 instances on
  Windows or as unused reservations beside the Linux on-demand one. The distractors come first,
  as nothing in the API promises an order.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from typing import Any

PRICING_REGIONS = {"us-east-1": "aws", "eu-central-1": "aws", "ap-south-1": "aws", "cn-northwest-1": "aws-cn"}
MAX_RESULTS = 100

# The billing prefix of usage types per region (us-east-1 has none).
USAGE_PREFIX = {"us-east-1": "", "us-east-2": "USE2-", "us-west-1": "USW1-", "us-west-2": "USW2-",
                "eu-west-1": "EU-", "eu-west-2": "EUW2-", "eu-central-1": "EUC1-", "ap-south-1": "APS3-",
                "ap-northeast-1": "APN1-", "ca-central-1": "CAN1-"}
LOCATION = {"us-east-1": "US East (N. Virginia)", "us-east-2": "US East (Ohio)", "us-west-2": "US West (Oregon)",
            "eu-west-1": "EU (Ireland)", "eu-west-2": "EU (London)", "eu-central-1": "EU (Frankfurt)",
            "ap-south-1": "Asia Pacific (Mumbai)"}

# What each region charges beyond instances, when a test scripts it: region -> part -> USD.
# Parts: eks (per cluster-hour), nat_hour, nat_gb, ebs_gp3 (per GB-month), ipv4 (per in-use hour).
PARTS = ("eks", "nat_hour", "nat_gb", "ebs_gp3", "ipv4")


def _sku(*parts: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, "/".join(parts)).hex[:16].upper()


def _item(service: str, family: str, attributes: dict[str, str], usd: float, unit: str, description: str,
          *, reserved: float | None = None) -> dict[str, Any]:
    sku = _sku(service, *sorted(f"{k}={v}" for k, v in attributes.items()))
    on_demand = f"{sku}.JRTCKXETXF"
    terms: dict[str, Any] = {"OnDemand": {on_demand: {
        "offerTermCode": "JRTCKXETXF", "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z", "termAttributes": {},
        "priceDimensions": {f"{on_demand}.6YS6EN2CT7": {
            "rateCode": f"{on_demand}.6YS6EN2CT7", "appliesTo": [], "beginRange": "0", "endRange": "Inf",
            "unit": unit, "description": description, "pricePerUnit": {"USD": f"{usd:.10f}"}}}}}}
    if reserved is not None:
        term = f"{sku}.4NA7Y494T4"
        terms["Reserved"] = {term: {
            "offerTermCode": "4NA7Y494T4", "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z",
            "termAttributes": {"LeaseContractLength": "1yr", "OfferingClass": "standard",
                               "PurchaseOption": "No Upfront"},
            "priceDimensions": {f"{term}.6YS6EN2CT7": {
                "rateCode": f"{term}.6YS6EN2CT7", "appliesTo": [], "beginRange": "0", "endRange": "Inf",
                "unit": "Hrs", "description": "Linux/UNIX (Amazon VPC), 1yr no upfront",
                "pricePerUnit": {"USD": f"{reserved:.10f}"}}}}}
    return {"product": {"productFamily": family, "attributes": {"servicecode": service, **attributes}, "sku": sku},
            "serviceCode": service, "terms": terms, "version": "20261101000000",
            "publicationDate": "2026-11-01T00:00:00Z"}


def _instance_products(region: str, instance_type: str, usd: float) -> list[dict[str, Any]]:
    prefix = USAGE_PREFIX.get(region, region.upper().replace("-", "")[:4] + "-")
    base = {"regionCode": region, "location": LOCATION.get(region, region), "instanceType": instance_type,
            "tenancy": "Shared", "preInstalledSw": "NA", "licenseModel": "No License required",
            "locationType": "AWS Region", "instanceFamily": "GPU instance" if instance_type[0] in "gp"
            else "General purpose"}
    linux = {**base, "operatingSystem": "Linux", "operation": "RunInstances", "capacitystatus": "Used",
             "usagetype": f"{prefix}BoxUsage:{instance_type}"}
    return [
        _item("AmazonEC2", "Compute Instance", {**base, "operatingSystem": "Windows", "operation": "RunInstances:0002",
                                                "capacitystatus": "Used",
                                                "usagetype": f"{prefix}BoxUsage:{instance_type}"},
              usd * 1.4, "Hrs", f"On Demand Windows {instance_type} Instance Hour"),
        _item("AmazonEC2", "Compute Instance", {**linux, "capacitystatus": "UnusedCapacityReservation",
                                                "usagetype": f"{prefix}UnusedBox:{instance_type}"},
              usd * 0.97, "Hrs", f"Linux/UNIX Unused Reservation {instance_type} Instance Hour"),
        _item("AmazonEC2", "Compute Instance", linux, usd, "Hrs", f"On Demand Linux {instance_type} Instance Hour",
              reserved=round(usd * 0.62, 4)),
    ]


def _region_products(region: str, parts: dict[str, float]) -> list[dict[str, Any]]:
    prefix = USAGE_PREFIX.get(region, region.upper().replace("-", "")[:4] + "-")
    where = {"regionCode": region, "location": LOCATION.get(region, region), "locationType": "AWS Region"}
    out: list[dict[str, Any]] = []
    if "eks" in parts:
        out += [_item("AmazonEKS", "Compute", {**where, "usagetype": f"{prefix}AmazonEKS-Hours:extendedSupport",
                                               "operation": "ExtendedSupport"},
                      parts["eks"] * 6, "Hours", "Amazon EKS cluster extended support per hour"),
                _item("AmazonEKS", "Compute", {**where, "usagetype": f"{prefix}AmazonEKS-Hours:perCluster",
                                               "operation": "CreateOperation"},
                      parts["eks"], "Hours", "Amazon EKS cluster usage per hour")]
    if "nat_hour" in parts or "nat_gb" in parts:
        out += [_item("AmazonEC2", "NAT Gateway", {**where, "usagetype": f"{prefix}NatGateway-Bytes",
                                                   "operation": "NatGateway", "group": "NGW:NatGateway"},
                      parts.get("nat_gb", 0.045), "GB", "per GB data processed by NAT Gateways"),
                _item("AmazonEC2", "NAT Gateway", {**where, "usagetype": f"{prefix}NatGateway-Hours",
                                                   "operation": "NatGateway", "group": "NGW:NatGateway"},
                      parts.get("nat_hour", 0.045), "Hrs", "per NAT Gateway Hour")]
    if "ebs_gp3" in parts:
        out += [_item("AmazonEC2", "Storage", {**where, "volumeApiName": "gp2", "volumeType": "General Purpose",
                                               "usagetype": f"{prefix}EBS:VolumeUsage.gp2"},
                      parts["ebs_gp3"] * 1.25, "GB-Mo", "per GB-month of General Purpose (gp2) provisioned storage"),
                _item("AmazonEC2", "System Operation", {**where, "volumeApiName": "gp3", "group": "EBS IOPS",
                                                        "usagetype": f"{prefix}EBS:VolumeP-IOPS.gp3"},
                      0.005, "IOPS-Mo", "per IOPS-month provisioned over 3000 (gp3)"),
                _item("AmazonEC2", "Provisioned Throughput", {**where, "volumeApiName": "gp3",
                                                              "usagetype": f"{prefix}EBS:VolumeP-Throughput.gp3"},
                      0.04, "GiBps-mo", "per GiBps-month provisioned over 125 MiBps (gp3)"),
                _item("AmazonEC2", "Storage", {**where, "volumeApiName": "gp3", "volumeType": "General Purpose",
                                               "usagetype": f"{prefix}EBS:VolumeUsage.gp3"},
                      parts["ebs_gp3"], "GB-Mo", "per GB-month of General Purpose (gp3) provisioned storage")]
    if "ipv4" in parts:
        out += [_item("AmazonVPC", "VpcPublicIPv4Address", {**where, "usagetype": f"{prefix}PublicIPv4:IdleAddress",
                                                            "group": "VPCPublicIPv4Address"},
                      parts["ipv4"], "Hrs", "per idle public IPv4 address per hour"),
                _item("AmazonVPC", "VpcPublicIPv4Address", {**where, "usagetype": f"{prefix}PublicIPv4:InUseAddress",
                                                            "group": "VPCPublicIPv4Address"},
                      parts["ipv4"], "Hrs", "per in-use public IPv4 address per hour")]
    return out


def _matches(product: dict[str, Any], service: str, filters: list[dict[str, str]]) -> bool:
    if product["serviceCode"] != service:
        return False
    fields = {**product["product"]["attributes"], "ServiceCode": product["serviceCode"],
              "productFamily": product["product"]["productFamily"]}
    return all(fields.get(f.get("Field", "")) == f.get("Value") for f in filters)


ErrorFn = Callable[[Any, str, str, str, int], Iterable[bytes]]


def get_products(start_response: Any, body: bytes, signing_region: str, *, denied: bool,
                 instance_prices: dict[tuple[str, str], float], region_prices: dict[str, dict[str, float]],
                 error: ErrorFn) -> Iterable[bytes]:
    if signing_region not in PRICING_REGIONS:
        return error(start_response, "pricing", "UnknownEndpoint",
                     f"the Price List Query API has no endpoint in {signing_region}: it is served from "
                     f"{', '.join(sorted(PRICING_REGIONS))}", 404)
    if denied:
        return error(start_response, "pricing", "AccessDeniedException", "not authorized: pricing", 400)
    params = json.loads(body or b"{}")
    service = params.get("ServiceCode")
    if not service:
        return error(start_response, "pricing", "InvalidParameterException", "ServiceCode is required", 400)
    filters = params.get("Filters") or []
    if any(f.get("Type") != "TERM_MATCH" for f in filters):
        return error(start_response, "pricing", "InvalidParameterException", "Filter Type must be TERM_MATCH", 400)
    max_results = int(params.get("MaxResults") or MAX_RESULTS)
    if not 1 <= max_results <= MAX_RESULTS:
        return error(start_response, "pricing", "InvalidParameterException",
                     f"MaxResults must be between 1 and {MAX_RESULTS}", 400)
    catalog: list[dict[str, Any]] = []
    for (region, instance_type), usd in sorted(instance_prices.items()):
        catalog += _instance_products(region, instance_type, usd)
    for region, parts in sorted(region_prices.items()):
        catalog += _region_products(region, parts)
    found = [p for p in catalog if _matches(p, service, filters)]
    start = int(params.get("NextToken") or 0)
    page = found[start:start + max_results]
    out: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p) for p in page]}
    if start + max_results < len(found):
        out["NextToken"] = str(start + max_results)
    raw = json.dumps(out).encode()
    start_response("200 OK", [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(raw)))])
    return [raw]
