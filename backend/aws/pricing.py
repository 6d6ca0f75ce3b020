"""On-demand prices: the AWS Pricing API when it answers, the built-in table otherwise.

Every price carries its source, so the report never passes an estimate off as a quote.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from botocore.config import Config

from backend.aws import catalog
from backend.aws.session import AwsSession

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

    def _from_api(self, region: str, instance_type: str) -> float | None:
        client = self._aws.client("pricing", PRICING_REGION, config=_PRICING_CONFIG)
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


def plan_price(
    gpu: tuple[float | None, str | None],
    gpu_count: int,
    system: tuple[float | None, str | None],
    system_count: int,
) -> tuple[float | None, str | None, dict[str, float]]:
    """The whole plan per hour: GPU nodes, system nodes, EKS control plane, one NAT gateway."""
    if gpu[0] is None or (system_count and system[0] is None):
        return None, None, {}
    breakdown = {
        "gpu_nodes": round(gpu[0] * gpu_count, 4),
        "system_nodes": round((system[0] or 0.0) * system_count, 4),
        "eks_control_plane": catalog.EKS_CONTROL_PLANE_PER_HOUR,
        "nat_gateway": catalog.NAT_GATEWAY_PER_HOUR,
    }
    sources = {s for s in (gpu[1], system[1] if system_count else None) if s}
    # The weakest source labels the total: one estimated part makes the sum an estimate.
    source = next(s for s in (SOURCE_ESTIMATE, SOURCE_BUILTIN, SOURCE_API) if s in sources)
    return round(sum(breakdown.values()), 4), source, breakdown
