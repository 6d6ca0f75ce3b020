"""EC2's Spot price history (``DescribeSpotPriceHistory``) as AWS serves it; moto answers one made-up
line per offering ("0.00001", a fixed 2006 timestamp, one product) whatever was asked.

What it does like AWS, and where that is written down (EC2 API reference, DescribeSpotPriceHistory and
its ``SpotPrice`` type; EC2 User Guide, "Spot Instance pricing history"):

- History, not a price: each AZ, instance type and product (platform) has a line per price change over
  the last 90 days. Without ``StartTime`` all of them come back; with it, those from then on (up to
  ``EndTime``, else now) and, per AZ, type and product, the last change before it: the price in effect
  at ``StartTime``. Nothing promises an order (an older reference says oldest first): older lines come
  first here, so a client that takes the first line per AZ reads a stale price.
- Products: Linux/UNIX beside SUSE Linux, Red Hat Enterprise Linux and Windows, which cost more; the
  ``ProductDescriptions`` parameter and the ``product-description`` filter narrow to some. Types and AZs
  narrow by ``InstanceTypes``, ``AvailabilityZone`` and the ``instance-type``/``availability-zone``
  filters. Only types offered in an AZ (moto's offerings, and ``offer``'s) have a price there.
- Paging: ``MaxResults`` (at most 1000) per page, the rest behind ``NextToken``.
- ``SpotPrice`` is a decimal string of USD per instance-hour, ``Timestamp`` a time.

The price model: a test scripts the price in effect now, (region, type) -> AZ -> USD, in
``Script.spot_prices``; an offered type nobody scripted costs a share of its On-Demand price (the
scripted one, else rtui's built-in table), a different share per AZ, as Spot prices differ by AZ.
A test moves a price while a run goes on with ``Script.spot_changes`` (a line from then on).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from moto.core.responses import ActionResult
from moto.ec2.models import instance_types as moto_instance_types
from moto.ec2.responses import EC2Response

from targets.aws.cloud.catalog import BUILTIN_INSTANCE_PRICES

PRODUCTS = {"Linux/UNIX": 1.0, "SUSE Linux": 1.25, "Red Hat Enterprise Linux": 1.4, "Windows": 1.9}
MAX_RESULTS = 1000
HISTORY_DAYS = 90
# The changes before the one in effect now: (how long ago, the price then against now's).
EARLIER = ((timedelta(days=40), 0.7), (timedelta(days=12), 1.6), (timedelta(days=3), 1.15))
NOW_SINCE = timedelta(hours=5)  # the price in effect now changed this long ago


def default_share(zone: str) -> float:
    """The share of On-Demand an unscripted AZ's Spot price is: 0.30 in its region's "a" AZ, more in others."""
    return 0.30 + 0.04 * (ord(zone[-1]) - ord("a"))


def current_prices(script: Any, region: str, now: datetime) -> dict[tuple[str, str], float]:
    """(AZ, type) -> the Linux/UNIX Spot price in effect now."""
    offered = moto_instance_types.INSTANCE_TYPE_OFFERINGS["availability-zone"].get(region, [])
    out: dict[tuple[str, str], float] = {}
    for offering in offered:
        zone, instance_type = offering["Location"], offering["InstanceType"]
        scripted = script.spot_prices.get((region, instance_type))
        if scripted is not None:
            if zone in scripted:
                out[(zone, instance_type)] = scripted[zone]
            continue
        on_demand = script.prices.get((region, instance_type), BUILTIN_INSTANCE_PRICES.get(instance_type))
        if on_demand is not None:
            out[(zone, instance_type)] = round(on_demand * default_share(zone), 6)
    return out


def history(script: Any, region: str, now: datetime) -> list[dict[str, Any]]:
    """Every line of the last 90 days, older ones first."""
    lines = []
    for (zone, instance_type), price in sorted(current_prices(script, region, now).items()):
        for product, factor in PRODUCTS.items():
            changes = [(now - ago, price * share) for ago, share in EARLIER] + [(now - NOW_SINCE, price)]
            changes += [(at, usd) for at, where, kind, az, usd in script.spot_changes
                        if (where, kind, az) == (region, instance_type, zone) and at <= now]
            for at, usd in changes:
                lines.append({"AvailabilityZone": zone, "InstanceType": instance_type, "ProductDescription": product,
                              "SpotPrice": f"{usd * factor:.6f}", "Timestamp": at})
    return sorted(lines, key=lambda line: line["Timestamp"])


def _time(value: datetime | str | None) -> datetime | None:
    """A request's time (moto parses it by the service model; a string when it does not), in UTC."""
    if not value:
        return None
    at = value if isinstance(value, datetime) else datetime.fromisoformat(value.replace("Z", "+00:00"))
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def describe_spot_price_history(self: EC2Response, script: Any) -> ActionResult:
    now = datetime.now(UTC)
    start, end = _time(self._get_param("StartTime")), _time(self._get_param("EndTime")) or now
    types = set(self._get_param("InstanceTypes", []))
    products = set(self._get_param("ProductDescriptions", []))
    zone = self._get_param("AvailabilityZone")
    filters = self._filters_from_querystring()
    max_results = min(int(self._get_param("MaxResults") or MAX_RESULTS), MAX_RESULTS)
    offset = int(self._get_param("NextToken") or 0)

    def wanted(line: dict[str, Any]) -> bool:
        return ((not types or line["InstanceType"] in types)
                and (not products or line["ProductDescription"] in products)
                and (not zone or line["AvailabilityZone"] == zone)
                and all(line[key] in filters[name] for name, key in (
                    ("instance-type", "InstanceType"), ("product-description", "ProductDescription"),
                    ("availability-zone", "AvailabilityZone")) if name in filters))

    lines = [line for line in history(script, self.region, now)
             if wanted(line) and now - line["Timestamp"] <= timedelta(days=HISTORY_DAYS)
             and line["Timestamp"] <= end]
    if start is not None:
        in_effect: dict[tuple[str, str, str], dict[str, Any]] = {}
        for line in lines:
            if line["Timestamp"] < start:
                in_effect[(line["AvailabilityZone"], line["InstanceType"], line["ProductDescription"])] = line
        lines = [*in_effect.values(), *(line for line in lines if line["Timestamp"] >= start)]
        lines.sort(key=lambda line: line["Timestamp"])
    page = lines[offset:offset + max_results]
    result: dict[str, Any] = {"SpotPriceHistory": page}
    if offset + max_results < len(lines):
        result["NextToken"] = str(offset + max_results)
    return ActionResult(result)


def interrupt(cluster: Any, region: str, eks_cluster: str, nodegroup: str) -> tuple[str, str, str, str]:
    """EC2 reclaims one Spot instance of a nodegroup: its group records the loss and launches a replacement
    (``moto_activities.interrupted``), the lost node leaves the cluster's Kubernetes API and the
    replacement's node joins it (``eks_nodes.replace_node``). Returns (old instance, new instance, old
    node, new node)."""
    import uuid

    from moto.eks.models import eks_backends

    from tests.aws import eks_nodes, iam_strict, moto_activities

    ng = eks_backends[iam_strict.ACCOUNT][region].clusters[eks_cluster].nodegroups[nodegroup]
    info: dict[str, Any] = vars(ng)["rtui_info"]
    assert ng.capacity_type == "SPOT", ng.capacity_type  # only Spot capacity is reclaimed
    old, new = info["instance_ids"][0], f"i-{uuid.uuid4().hex[:17]}"
    moto_activities.interrupted(iam_strict.ACCOUNT, region, info["asg"], old, new)
    info["instance_ids"] = [new, *info["instance_ids"][1:]]
    gone, joined = eks_nodes.replace_node(cluster, nodegroup, info, new)
    return old, new, gone, joined
