"""On-demand prices: the AWS Pricing API when it answers, the built-in table otherwise.

Every price carries its source, so the report never passes an estimate off as a quote.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.config import Config

from targets.aws.cloud import catalog
from targets.aws.session import AwsSession

# The Pricing API lives in a few regions only; us-east-1 serves the whole aws partition.
PRICING_REGION = "us-east-1"
# A missing or forbidden Pricing API must cost the scan one quick failure, not six retries.
_PRICING_CONFIG = Config(retries={"mode": "standard", "max_attempts": 2}, connect_timeout=3, read_timeout=10)

SOURCE_API = "pricing-api"
SOURCE_BUILTIN = "builtin"
SOURCE_ESTIMATE = "builtin-estimate"


class PriceBook:
    """Instance prices per (region, type). Thread-safe; remembers when the API is unusable."""

    def __init__(self, aws: AwsSession) -> None:
        self._aws = aws
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[float | None, str | None]] = {}
        self._api_broken = False
        self._api_answered = False
        # Until the API has answered once, one caller at a time asks it: a denied Pricing API
        # then costs the scan one failed call, not one per region and type.
        self._first_answer = threading.Lock()
        # Everything a plan bills per (region, instance types): the matrix, the plan and the sweep
        # of one session price from the same answer, asked once.
        self._regions: dict[tuple[str, tuple[str, ...]], RegionPrices] = {}
        self._region_locks: dict[tuple[str, tuple[str, ...]], threading.Lock] = {}

    def region(self, region: str, instance_types: tuple[str, ...] | list[str]) -> RegionPrices:
        """Every price a plan in ``region`` bills (see ``region_prices``), asked once per session. Blocking."""
        key = (region, tuple(sorted(set(instance_types))))
        with self._lock:
            if key in self._regions:
                return self._regions[key]
            gate = self._region_locks.setdefault(key, threading.Lock())
        with gate:  # two callers asking for the same region wait for one answer
            with self._lock:
                if key in self._regions:
                    return self._regions[key]
            prices = region_prices(self, *key)
            with self._lock:
                self._regions[key] = prices
            return prices

    def known(self, region: str, instance_types: tuple[str, ...] | list[str]) -> RegionPrices | None:
        """The region's prices if this session already asked for them (no call)."""
        with self._lock:
            return self._regions.get((region, tuple(sorted(set(instance_types)))))

    @property
    def api_answered(self) -> bool:
        """The API answered once, or is known unusable: callers need not wait for a first answer."""
        return self._api_answered or self._api_broken

    def instance_price(self, region: str, instance_type: str) -> tuple[float | None, str | None]:
        """(USD per hour, source) — source is None when nothing is known. Blocking."""
        key = (region, instance_type)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        result: tuple[float | None, str | None] = (None, None)
        if self._aws.partition_of(region) == "aws":
            if self.api_answered:
                result = self._ask_api(region, instance_type)
            else:
                with self._first_answer:
                    result = self._ask_api(region, instance_type)
        if result[0] is None:
            result = builtin_instance_price(region, instance_type)
        with self._lock:
            self._cache[key] = result
        return result

    def _ask_api(self, region: str, instance_type: str) -> tuple[float | None, str | None]:
        if self._api_broken:
            return None, None
        try:
            price = self._from_api(region, instance_type)
        except Exception:
            # No permission, no endpoint, throttled out: the table is the honest fallback.
            self._api_broken = True
            return None, None
        self._api_answered = True
        return (price, SOURCE_API) if price is not None else (None, None)

    def usable(self, region: str) -> bool:
        """Whether the API may answer for ``region``: its partition's, and not found unusable."""
        return self._aws.partition_of(region) == "aws" and not self._api_broken

    def client(self) -> Any:
        return self._aws.client("pricing", PRICING_REGION, config=_PRICING_CONFIG)

    def _from_api(self, region: str, instance_type: str) -> float | None:
        client = self.client()
        filters = {
            "instanceType": instance_type,
            "regionCode": region,
            "operatingSystem": "Linux",
            "tenancy": "Shared",
            "preInstalledSw": "NA",
            "capacitystatus": "Used",
            "licenseModel": "No License required",
        }
        response = client.get_products(
            ServiceCode="AmazonEC2",
            Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
            FormatVersion="aws_v1",
            MaxResults=10,
        )
        return _on_demand_usd(response.get("PriceList", []))


def _on_demand_usd(price_list: list[Any]) -> float | None:
    for item in price_list:
        product = json.loads(item) if isinstance(item, str) else item
        for term in (product.get("terms", {}).get("OnDemand") or {}).values():
            for dimension in (term.get("priceDimensions") or {}).values():
                usd = float(dimension.get("pricePerUnit", {}).get("USD", 0) or 0)
                if usd > 0:
                    return usd
    return None


def builtin_instance_price(region: str, instance_type: str) -> tuple[float | None, str | None]:
    price = catalog.BUILTIN_INSTANCE_PRICES.get(instance_type)
    if price is None:
        return None, None
    return price, SOURCE_BUILTIN if region in catalog.BUILTIN_SAME_AS_US_EAST_1 else SOURCE_ESTIMATE


# --- Everything a plan bills, per region ----------------------------------------------------
# The fallback for the parts beyond instances (us-east-1 list prices, DESIGN.md §3; EBS and
# public IPv4 from the EBS and VPC pricing pages, checked 2026-11).
BUILTIN_EBS_GP3_GB_MONTH = 0.08
BUILTIN_PUBLIC_IPV4_PER_HOUR = 0.005
BUILTIN_NAT_PER_GB = 0.045
ESTIMATE_LABEL = f"estimate, {catalog.BUILTIN_PRICE_REGION} prices"
HOURS_PER_MONTH = 730  # how AWS turns a GB-month into hours on its bills and calculator


@dataclass(frozen=True)
class RegionPrices:
    """What one region charges for everything a plan makes, and whether the Pricing API said so.

    ``estimated`` names the parts the built-in table filled in (empty: every part is a quote)."""

    region: str
    instances: dict[str, float | None]
    eks_cluster_per_hour: float
    nat_per_hour: float
    nat_per_gb: float
    ebs_gp3_gb_month: float
    public_ipv4_per_hour: float
    estimated: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """"" for Pricing API quotes, else the label every shown total carries."""
        return ESTIMATE_LABEL if self.estimated else ""

    @property
    def source(self) -> str:
        """Where every figure priced from these prices comes from, as shown beside it."""
        return self.label or f"AWS Pricing API, {self.region} on-demand"

    def instance(self, instance_type: str) -> float | None:
        return self.instances.get(instance_type)

    def ebs_per_hour(self, gigabytes: int) -> float:
        return gigabytes * self.ebs_gp3_gb_month / HOURS_PER_MONTH


@dataclass(frozen=True)
class _Query:
    """One GetProducts question: the service, its filters, and the usage type of the price wanted
    (usage types carry a region prefix outside us-east-1, ``EUW2-NatGateway-Hours``)."""

    service: str
    filters: tuple[tuple[str, str], ...]
    usage: str | None = None


def _queries(region: str, instance_types: tuple[str, ...]) -> dict[str, _Query]:
    out = {f"instance:{t}": _Query("AmazonEC2", (
        ("instanceType", t), ("regionCode", region), ("operatingSystem", "Linux"), ("tenancy", "Shared"),
        ("preInstalledSw", "NA"), ("capacitystatus", "Used"), ("licenseModel", "No License required")))
        for t in instance_types}
    out.update({
        "eks": _Query("AmazonEKS", (("regionCode", region),), "AmazonEKS-Hours:perCluster"),
        "nat_hour": _Query("AmazonEC2", (("regionCode", region), ("productFamily", "NAT Gateway")),
                           "NatGateway-Hours"),
        "nat_gb": _Query("AmazonEC2", (("regionCode", region), ("productFamily", "NAT Gateway")),
                         "NatGateway-Bytes"),
        "ebs_gp3": _Query("AmazonEC2", (("regionCode", region), ("productFamily", "Storage"),
                                        ("volumeApiName", "gp3"))),
        "public_ipv4": _Query("AmazonVPC", (("regionCode", region),), "PublicIPv4:InUseAddress"),
    })
    return out


def _usage_matches(usage_type: str, wanted: str) -> bool:
    return usage_type == wanted or usage_type.endswith("-" + wanted)


def _ask(client: Any, query: _Query) -> float | None:
    """The on-demand USD price of the one product the query means; None when none matches."""
    paginator = client.get_paginator("get_products")
    pages = paginator.paginate(
        ServiceCode=query.service, FormatVersion="aws_v1",
        Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in query.filters])
    for page in pages:
        items = [json.loads(i) if isinstance(i, str) else i for i in page.get("PriceList", [])]
        if query.usage is not None:
            items = [i for i in items if _usage_matches(
                str(((i.get("product") or {}).get("attributes") or {}).get("usagetype", "")), query.usage)]
        price = _on_demand_usd(items)
        if price is not None:
            return price
    return None


_BUILTIN_PARTS: dict[str, float] = {"eks": catalog.EKS_CONTROL_PLANE_PER_HOUR, "nat_hour": catalog.NAT_GATEWAY_PER_HOUR,
                  "nat_gb": BUILTIN_NAT_PER_GB, "ebs_gp3": BUILTIN_EBS_GP3_GB_MONTH,
                  "public_ipv4": BUILTIN_PUBLIC_IPV4_PER_HOUR}


def region_prices(book: PriceBook, region: str, instance_types: tuple[str, ...]) -> RegionPrices:
    """Every price a plan in ``region`` needs, from the Pricing API (through the endpoint that serves
    this partition) or, part by part, the built-in table. Blocking. ``book`` is the session's: the
    instance prices it already has (the preflight asked for them) cost no second call, and an API
    found unusable is not asked again."""
    types = tuple(sorted(set(instance_types)))
    estimated: list[str] = []
    instances: dict[str, float | None] = {}
    for instance_type in types:
        price, source = book.instance_price(region, instance_type)
        instances[instance_type] = price
        if source != SOURCE_API:
            estimated.append(f"instance:{instance_type}")
    answers: dict[str, float | None] = {}
    queries = {k: q for k, q in _queries(region, ()).items()}
    if book.usable(region):
        client = book.client()

        def ask(name: str) -> float | None:
            try:
                return _ask(client, queries[name])
            except Exception:  # this part falls back to the table, labelled; the others stand
                return None

        with ThreadPoolExecutor(max_workers=len(queries)) as pool:
            answers = dict(zip(queries, pool.map(ask, queries), strict=True))

    def part(name: str, fallback: float) -> float:
        price = answers.get(name)
        if price is None:
            estimated.append(name)
            return fallback
        return price

    fixed = {name: part(name, value) for name, value in _BUILTIN_PARTS.items()}
    return RegionPrices(region=region, instances=instances, eks_cluster_per_hour=fixed["eks"],
                        nat_per_hour=fixed["nat_hour"], nat_per_gb=fixed["nat_gb"],
                        ebs_gp3_gb_month=fixed["ebs_gp3"], public_ipv4_per_hour=fixed["public_ipv4"],
                        estimated=tuple(estimated))


def builtin_region_prices(region: str, instance_types: tuple[str, ...]) -> RegionPrices:
    """The table alone (no call), labelled an estimate: for a plan made before any price was asked."""
    types = tuple(sorted(set(instance_types)))
    return RegionPrices(region=region, instances={t: catalog.BUILTIN_INSTANCE_PRICES.get(t) for t in types},
                        eks_cluster_per_hour=catalog.EKS_CONTROL_PLANE_PER_HOUR,
                        nat_per_hour=catalog.NAT_GATEWAY_PER_HOUR, nat_per_gb=BUILTIN_NAT_PER_GB,
                        ebs_gp3_gb_month=BUILTIN_EBS_GP3_GB_MONTH, public_ipv4_per_hour=BUILTIN_PUBLIC_IPV4_PER_HOUR,
                        estimated=("all",))


# --- One function prices a plan --------------------------------------------------------------
@dataclass(frozen=True)
class PlanShape:
    """What a plan bills by the hour: its nodes with their root volumes, the cluster, the NAT gateway."""

    gpu_node_type: str
    gpu_node_count: int
    gpu_disk_gb: int
    system_node_type: str
    system_node_count: int
    system_disk_gb: int
    nat_gateway: bool = True  # False when the plan adopts a VPC (its NAT is not ours to bill)


@dataclass(frozen=True)
class PartCost:
    per_hour: float | None  # None: an instance type nobody has a price for
    note: str = ""


@dataclass(frozen=True)
class PlanCost:
    """A plan's cost per hour, part by part, with the label every shown figure carries."""

    parts: dict[str, PartCost]
    source: str
    nat_per_gb: float | None

    @property
    def total(self) -> float | None:
        amounts = [p.per_hour for p in self.parts.values()]
        return None if any(a is None for a in amounts) else round(sum(a for a in amounts if a is not None), 4)

    def breakdown(self) -> dict[str, float]:
        return {name: p.per_hour for name, p in self.parts.items() if p.per_hour is not None}


# The platform of EKS's Linux nodes, as the Spot price history names it (EC2 API reference,
# DescribeSpotPriceHistory, ProductDescriptions); Windows and the paid Linux distributions cost more.
SPOT_PRODUCT = "Linux/UNIX"


def spot_prices(ec2: Any, instance_type: str) -> dict[str, float]:
    """The Spot price in effect now in each AZ of the client's region (USD per instance-hour), for Linux.

    Asked from now on (``StartTime``), EC2 answers with the last change before it, the price in effect,
    beside any later ones; without it, up to 90 days of history (EC2 API reference,
    DescribeSpotPriceHistory). No order is promised, so the newest entry per AZ is the price. An AZ
    without one is left out."""
    newest: dict[str, tuple[datetime, float]] = {}
    pages = ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=[instance_type], ProductDescriptions=[SPOT_PRODUCT], StartTime=datetime.now(UTC))
    for page in pages:
        for item in page.get("SpotPriceHistory", []):
            if item.get("InstanceType") != instance_type or item.get("ProductDescription") != SPOT_PRODUCT:
                continue
            zone, at, price = item["AvailabilityZone"], item["Timestamp"], float(item["SpotPrice"])
            if zone not in newest or at > newest[zone][0]:
                newest[zone] = (at, price)
    return {zone: price for zone, (_, price) in newest.items()}


def nodes_cost(prices: RegionPrices, instance_type: str, count: int, volume_gb: int) -> PartCost:
    """Instances and their gp3 root volumes per hour, and what that is made of."""
    price = prices.instance(instance_type)
    if price is None:
        return PartCost(None, f"no price known for {instance_type}")
    disks = prices.ebs_per_hour(volume_gb) * count
    note = (f"{count} × {instance_type} ${price:.4f}/h + {count} × {volume_gb} GB gp3 "
            f"(${prices.ebs_gp3_gb_month:.3f}/GB-month) ${disks:.4f}/h")
    return PartCost(round(price * count + disks, 4), note)


def spot_nodes_cost(prices: RegionPrices, instance_type: str, count: int, volume_gb: int, zone: str,
                    spot_price: float | None, also: tuple[str, ...] = ()) -> PartCost:
    """Spot instances in ``zone`` and their root volumes per hour, with the On-Demand price beside. Without
    a Spot price there, the On-Demand one, said so: Spot never bills more than it (its price is capped at
    On-Demand's when no maximum is set, as EKS's nodegroups leave it). ``also``: the other types the nodes
    may be (``--spot-types``); ``spot_price`` is then the dearest of them there."""
    on_demand = nodes_cost(prices, instance_type, count, volume_gb)
    if spot_price is None:
        return PartCost(on_demand.per_hour, f"no Spot price known for {instance_type} in {zone}: at most the "
                                            f"On-Demand price; {on_demand.note}")
    disks = prices.ebs_per_hour(volume_gb) * count
    od = prices.instance(instance_type)
    if also:
        named = f"{instance_type} or {', '.join(also)}"
        beside = f", the dearest of them ({instance_type} On-Demand ${od:.4f}/h)" if od is not None else \
            ", the dearest of them"
    else:
        named, beside = instance_type, f" (On-Demand ${od:.4f}/h)" if od is not None else ""
    note = (f"{count} × {named} Spot in {zone} ${spot_price:.4f}/h{beside} + {count} × {volume_gb} GB gp3 "
            f"${disks:.4f}/h")
    return PartCost(round(spot_price * count + disks, 4), note)


def nat_gateway_cost(prices: RegionPrices) -> PartCost:
    """The NAT gateway and its Elastic IP per hour; its data processing bills per GB beside."""
    return PartCost(round(prices.nat_per_hour + prices.public_ipv4_per_hour, 4),
                    f"gateway ${prices.nat_per_hour:.3f}/h + Elastic IP ${prices.public_ipv4_per_hour:.3f}/h, "
                    f"+ ${prices.nat_per_gb:.3f}/GB processed")


def price_plan(prices: RegionPrices, shape: PlanShape) -> PlanCost:
    """The one pricing of a plan: what the matrix shows per region and the plan bills per resource."""
    parts = {
        "gpu_nodes": nodes_cost(prices, shape.gpu_node_type, shape.gpu_node_count, shape.gpu_disk_gb),
        "system_nodes": (nodes_cost(prices, shape.system_node_type, shape.system_node_count, shape.system_disk_gb)
                         if shape.system_node_count else PartCost(0.0)),
        "eks_control_plane": PartCost(prices.eks_cluster_per_hour, f"${prices.eks_cluster_per_hour:.3f}/h"),
    }
    if shape.nat_gateway:
        parts["nat_gateway"] = nat_gateway_cost(prices)
    return PlanCost(parts=parts, source=prices.source, nat_per_gb=prices.nat_per_gb if shape.nat_gateway else None)
