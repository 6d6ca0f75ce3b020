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

Also here, each with what it copies of AWS and where that is written in its docstring: EC2's Spot placement
scores (``get_spot_placement_scores``; moto has none) and the Spot Instance Advisor's public object
(``serve_advisor``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
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


# --- Spot placement scores (GetSpotPlacementScores) ---------------------------------------------
MIN_SCORED_TYPES = 3
FEW_TYPES_SCORE = 1
SCORE_PAGE = 2
TOP_SCORES = 10
MAX_TARGET_CAPACITY = 2_000_000_000
UNIT_TYPES = ("units", "vcpu", "memory-mib")


def default_score(zone: str) -> int:
    """An unscripted AZ's score: 9 in its region's "a" AZ, 2 less in each next one, at least 1."""
    return max(1, 9 - 2 * (ord(zone[-1]) - ord("a")))


def _refuse(code: str, message: str) -> None:
    from moto.ec2.exceptions import EC2ClientError

    raise EC2ClientError(code, message)


def _zones(region: str) -> list[tuple[str, str]]:
    from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend

    return [(z.name, z.zone_id) for z in RegionsAndZonesBackend.zones.get(region, [])
            if z.zone_type == "availability-zone"]


def get_spot_placement_scores(self: EC2Response, script: Any) -> ActionResult:
    """moto 5.2 has no GetSpotPlacementScores. What the double does like EC2, and where that is written down:

    - Scores go from 1 (a Spot request of this size is unlikely to succeed) to 10 (highly likely, not
      guaranteed), for the capacity, types and moment asked; a recommendation for the account, never a promise
      of capacity or of how often it is taken back (EC2 User Guide, "Spot placement score" and "How Spot
      placement score works"; EC2 API reference, the ``SpotPlacementScore`` type).
    - With ``SingleAvailabilityZone`` each item names its AZ by ``AvailabilityZoneId`` (with ``Region``), never
      by name: the ``SpotPlacementScore`` type has no zone-name field. Only the top 10 come back. Which AZs
      are listed at all where none of the types is offered is not written down: they are left out here, so a
      client must read a missing AZ as "no score".
    - Fewer than three different instance types get a low score whatever the capacity (the ``InstanceTypes``
      parameter's documentation; the User Guide's "Limitations"); a user found one type scored the same in
      every AZ (kislyuk/aegea issue 73). Here: every AZ ``FEW_TYPES_SCORE``.
    - Parameters (EC2 API reference, GetSpotPlacementScores; botocore's model for the bounds):
      ``TargetCapacity`` 1 to 2,000,000,000 and required; ``TargetCapacityUnitType`` one of units, vcpu,
      memory-mib; at most 1000 ``InstanceTypes`` and 10 ``RegionNames``; ``InstanceTypes`` and
      ``InstanceRequirementsWithMetadata`` exclude each other (one is needed); ``MaxResults`` 10 to 1000.
      Refused with EC2's general codes (EC2 API reference, "Error codes"): InvalidParameterCombination,
      MissingParameter, InvalidParameterValue. A type EC2 does not score is InvalidParameterValue naming it
      (redhat-developer/mapt issue 902).
    - Paging: ``MaxResults`` and ``NextToken``; an AWS API may answer fewer items than asked while more remain
      (the SDKs' ``MaxResults`` documentation: check ``NextToken`` after every call), so pages here hold
      ``SCORE_PAGE`` items whatever was asked.
    - Limits: new request configurations in 24 hours may be capped (User Guide, "Limitations"); beyond the
      cap a new one is refused ``MaxConfigLimitExceeded`` (aws-solutions-library-samples/
      global-capacity-orchestrator-on-aws PR 247), the ones already asked still answer. Scripted by
      ``Script.spot_score_config_limit`` (None: no cap). The target-capacity limit AWS sets from recent Spot
      usage is not copied (its error is not documented).
    - Permission: ``ec2:GetSpotPlacementScores``; a caller without it gets UnauthorizedOperation, as any
      EC2 action (script it with ``Script.errors``).

    The scores: ``Script.spot_scores`` (region, AZ name) -> score, scripted by name for the test's ease and
    answered by zone ID; an AZ nobody scripted scores ``default_score``, a different score per AZ.
    """
    types = list(self._get_param("InstanceTypes", []) or [])
    requirements = self._get_param("InstanceRequirementsWithMetadata")
    capacity = self._get_param("TargetCapacity")
    unit = self._get_param("TargetCapacityUnitType") or "units"
    single = self._get_bool_param("SingleAvailabilityZone", False)
    regions = list(self._get_param("RegionNames", []) or [])
    max_results = self._get_param("MaxResults")
    token = self._get_param("NextToken")
    if types and requirements:
        _refuse("InvalidParameterCombination", "InstanceTypes and InstanceRequirementsWithMetadata cannot both be set")
    if not types and not requirements:
        _refuse("MissingParameter", "either InstanceTypes or InstanceRequirementsWithMetadata is required")
    if requirements:
        _refuse("InvalidParameterValue", "InstanceRequirementsWithMetadata is not served by this double")
    if capacity is None:
        _refuse("MissingParameter", "the request must contain the parameter TargetCapacity")
    if not 1 <= int(capacity) <= MAX_TARGET_CAPACITY:
        _refuse("InvalidParameterValue", f"TargetCapacity {capacity} is out of range 1-{MAX_TARGET_CAPACITY}")
    if unit not in UNIT_TYPES:
        _refuse("InvalidParameterValue", f"TargetCapacityUnitType {unit!r} is not one of {', '.join(UNIT_TYPES)}")
    if len(types) > 1000 or len(regions) > 10:
        _refuse("InvalidParameterValue", "at most 1000 instance types and 10 regions")
    if max_results is not None and not 10 <= int(max_results) <= 1000:
        _refuse("InvalidParameterValue", f"MaxResults {max_results} is out of range 10-1000")
    unknown = [t for t in types if t not in moto_instance_types.INSTANCE_TYPES]
    if unknown:
        _refuse("InvalidParameterValue", f"instance types not valid for Spot placement scores: {unknown}")
    offerings = moto_instance_types.INSTANCE_TYPE_OFFERINGS["availability-zone"]
    bad = [r for r in regions if r not in offerings]
    if bad:
        _refuse("InvalidParameterValue", f"unknown regions: {bad}")
    config = (tuple(sorted(set(types))), int(capacity), unit, bool(single), tuple(sorted(set(regions))))
    with script.lock:
        if config not in script.spot_score_configs:
            limit = script.spot_score_config_limit
            if limit is not None and len(script.spot_score_configs) >= limit:
                _refuse("MaxConfigLimitExceeded", "too many new Spot placement score configurations in 24 hours")
            script.spot_score_configs.add(config)

    few = len(set(types)) < MIN_SCORED_TYPES
    items: list[dict[str, Any]] = []
    for region in regions or sorted(offerings):
        offered = {o["Location"] for o in offerings.get(region, []) if o["InstanceType"] in types}
        scored = [(zid, FEW_TYPES_SCORE if few else int(script.spot_scores.get((region, name), default_score(name))))
                  for name, zid in _zones(region) if name in offered]
        if not scored:
            continue
        if single:
            items += [{"Region": region, "AvailabilityZoneId": zid, "Score": score} for zid, score in scored]
        else:
            items.append({"Region": region, "Score": max(score for _, score in scored)})
    items = sorted(items, key=lambda item: -item["Score"])[:TOP_SCORES]
    try:
        offset = int(token or 0)
    except ValueError:
        _refuse("InvalidParameterValue", f"NextToken {token!r} is not valid")
    page = items[offset:offset + SCORE_PAGE]
    result: dict[str, Any] = {"SpotPlacementScores": page}
    if offset + SCORE_PAGE < len(items):
        result["NextToken"] = str(offset + SCORE_PAGE)
    return ActionResult(result)


# --- The Spot Instance Advisor's data --------------------------------------------------------------
ADVISOR_BUCKET = "spot-bid-advisor"
ADVISOR_KEY = "spot-advisor-data.json"
RANGES = [{"index": 0, "label": "<5%", "dots": 0, "max": 5}, {"index": 1, "label": "5-10%", "dots": 1, "max": 11},
          {"index": 2, "label": "10-15%", "dots": 2, "max": 16}, {"index": 3, "label": "15-20%", "dots": 3, "max": 22},
          {"index": 4, "label": ">20%", "dots": 4, "max": 100}]
# The range index of each type the document lists (Linux); Windows is given another, so a reader of the
# wrong platform is seen. A type not here is not in the document, as a type AWS does not advise on.
ADVISED = {"g6.xlarge": 0, "g6.2xlarge": 0, "g6.4xlarge": 0, "g6.8xlarge": 1, "g6.12xlarge": 1, "g6.16xlarge": 0,
           "g6.24xlarge": 2, "g6.48xlarge": 3, "gr6.4xlarge": 0, "gr6.8xlarge": 0, "g5.12xlarge": 2, "g6e.12xlarge": 3,
           "m7i.large": 0, "m7i.xlarge": 0, "m7i.2xlarge": 0}
WINDOWS_RANGE = 4


def advisor_document() -> dict[str, Any]:
    """The advisor's object as AWS publishes it, for every region moto offers types in."""
    regions = sorted(moto_instance_types.INSTANCE_TYPE_OFFERINGS["availability-zone"])
    linux = {name: {"s": 70 - 5 * r, "r": r} for name, r in ADVISED.items()}
    windows = {name: {"s": 40, "r": WINDOWS_RANGE} for name in ADVISED}
    info = {name: {"emr": False, "cores": moto_instance_types.INSTANCE_TYPES.get(name, {}).get("VCpuInfo", {})
                   .get("DefaultVCpus", 0), "ram_gb": 0.0} for name in ADVISED}
    return {"global_rate": "<10%", "instance_types": info, "ranges": [dict(r) for r in RANGES],
            "spot_advisor": {region: {"Linux": {k: dict(v) for k, v in linux.items()},
                                      "Windows": {k: dict(v) for k, v in windows.items()}} for region in regions}}


def advise(script: Any, region: str, instance_type: str, range_index: int | None) -> None:
    """Script one (region, type)'s Linux bucket (None: the document does not list it there)."""
    linux = script.spot_advisor["spot_advisor"].setdefault(region, {}).setdefault("Linux", {})
    if range_index is None:
        linux.pop(instance_type, None)
    else:
        linux[instance_type] = {"s": 60, "r": range_index}


def is_advisor_request(environ: dict[str, Any]) -> bool:
    """An anonymous GET or HEAD of the advisor's object, path style or virtual-hosted style."""
    if environ.get("HTTP_AUTHORIZATION") or environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
        return False
    path, host = environ.get("PATH_INFO", ""), str(environ.get("HTTP_HOST", ""))
    return (path == f"/{ADVISOR_BUCKET}/{ADVISOR_KEY}"
            or (host.startswith(f"{ADVISOR_BUCKET}.") and path == f"/{ADVISOR_KEY}"))


def serve_advisor(environ: dict[str, Any], start_response: Any, script: Any, error: Any) -> Iterable[bytes]:
    """The Spot Instance Advisor's object, or S3's 403 when ``script.spot_advisor`` is None.

    AWS's Spot Instance Advisor page reads one public JSON object, s3://spot-bid-advisor/spot-advisor-data.json
    (https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json), shaped as public readers of it decode
    it (nint8835/interruption-spotter pkg/spotdata/types.go; several others): ``ranges`` (index, label, dots,
    max), ``spot_advisor`` region -> "Linux"/"Windows" -> type -> {"s": savings %, "r": a range index},
    ``instance_types`` type -> {emr, cores, ram_gb}, ``global_rate``. Each range is the share of a type's Spot
    instances EC2 took back over the trailing month in that region, as a bucket: <5%, 5-10%, 10-15%, 15-20%,
    >20%. The ``max`` fields are AWS's own (5, 11, 16, 22, 100), not the labels' upper edges: the double serves
    them as published, so a reader that took ``max`` for the edge reads 11% where the label says 10%.

    Served only to anonymous requests (no Authorization), as the page's own readers send them: a signed one
    from another account is also judged by the caller's own IAM policies (IAM User Guide, "Cross-account
    policy evaluation logic"), which a narrow role fails; here it reaches moto, which has no such bucket
    (NoSuchBucket), stricter than S3, never kinder. ``Script.spot_advisor`` None: S3's answer to an object
    the caller may not read, 403 AccessDenied (S3 API Reference, "Error responses").
    """
    document = script.spot_advisor
    if document is None:
        return list(error(start_response, "s3", "AccessDenied", "Access Denied", 403))
    body = json.dumps(document).encode()
    etag = hashlib.md5(body, usedforsecurity=False).hexdigest()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body))), ("ETag", f'"{etag}"'),
               ("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT"), ("x-amz-request-id", etag[:16].upper())]
    start_response("200 OK", headers)
    return [b""] if environ.get("REQUEST_METHOD") == "HEAD" else [body]
