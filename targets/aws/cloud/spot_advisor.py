"""How often Spot takes a node back: the Spot Instance Advisor's buckets, as a rate per instance-hour.

AWS publishes no interruption rate per AZ. Its Spot Instance Advisor (https://aws.amazon.com/ec2/spot/
instance-advisor/) gives, per region, platform and instance type, a bucket of the "frequency of
interruption": the share of that type's Spot instances EC2 reclaimed over the trailing month (<5%, 5-10%,
10-15%, 15-20%, >20%). The page reads it from one public S3 object, ``s3://spot-bid-advisor/
spot-advisor-data.json``: ``ranges`` (each bucket's ``index`` and ``label``), ``spot_advisor`` region ->
"Linux"/"Windows" -> type -> ``{"s": savings %, "r": bucket index}``, ``instance_types``. That shape is not
documented by AWS; it is how public readers decode it (e.g. nint8835/interruption-spotter,
pkg/spotdata/types.go). Each range also carries a ``max`` that is not the label's upper edge (11 for
"5-10%"): the edge is read from the label.

A bucket's upper edge f (a monthly share) becomes a constant rate per instance-hour λ = −ln(1 − f) / 730:
the rate at which a share f of instances running a whole month (730 hours) would be taken. ">20%" has no
upper edge: it is read as 20%, and said to be "at least" that. A rate is an upper bound of the bucket
otherwise, so a plan it prices errs towards caution.

The object is read unsigned (anonymous, as the advisor page reads it): a signed request from another
account would also need the caller's own IAM policies to allow ``s3:GetObject`` on that bucket (IAM User
Guide, "Cross-account policy evaluation logic"), which a narrow role lacks. It still goes to
``AWS_ENDPOINT_URL`` when set, as every other AWS call of rtui does.

Public for the other users of the same rate (``--checkpoint-every auto``): ``read_advisor``,
``interruption_rate``, ``SpotAdvisor`` (one read per preflight or session), and the time lost to an
interruption (``LOST_MINUTES_PER_INTERRUPTION``, ``time_stretch``) that ``bench/spot_cost.py`` shares.
"""

from __future__ import annotations

import json
import math
import re
import threading
from typing import TYPE_CHECKING, Any

from targets.aws.cloud.report import InterruptionRate

if TYPE_CHECKING:
    from targets.aws.session import AwsSession

__all__ = [
    "ADVISOR_BUCKET",
    "ADVISOR_KEY",
    "CHECKPOINT_MINUTES",
    "HOURS_PER_MONTH",
    "LOST_MINUTES_PER_INTERRUPTION",
    "REPLACE_MINUTES",
    "InterruptionRate",
    "SpotAdvisor",
    "interruption_rate",
    "rate_per_hour",
    "read_advisor",
    "time_stretch",
]

ADVISOR_BUCKET = "spot-bid-advisor"
ADVISOR_KEY = "spot-advisor-data.json"
ADVISOR_REGION = "us-east-1"
ADVISOR_PLATFORM = "Linux"  # EKS's nodes; Windows buckets differ
HOURS_PER_MONTH = 730.0  # AWS bills a month as 730 hours

# What an interruption costs a job (bench/spot_cost.py's defaults): the wait for a replacement node (an
# instance, its node joining, the image, Ray Train's restart) and, on average, half the steps since the last
# complete checkpoint.
REPLACE_MINUTES = 8.0
CHECKPOINT_MINUTES = 10.0
LOST_MINUTES_PER_INTERRUPTION = REPLACE_MINUTES + CHECKPOINT_MINUTES / 2

_EDGES = re.compile(r"^\s*(?P<op>[<>])?\s*(?P<low>\d+(?:\.\d+)?)\s*%?\s*(?:-\s*(?P<high>\d+(?:\.\d+)?)\s*%?)?\s*$")


def rate_per_hour(share_per_month: float) -> float:
    """λ per instance-hour such that a share ``share_per_month`` of instances is taken within 730 hours."""
    if share_per_month >= 1:
        return math.inf
    return -math.log1p(-share_per_month) / HOURS_PER_MONTH


def time_stretch(rate: float, nodes: int, lost_hours: float = LOST_MINUTES_PER_INTERRUPTION / 60) -> float:
    """Wall hours per hour of training when each of ``nodes`` is taken at ``rate`` per node-hour and each
    loss costs ``lost_hours`` (the lost time is exposed too: a geometric series, 1 / (1 − λ·n·L)); inf
    when the job never finishes."""
    per_hour = rate * nodes * lost_hours
    return math.inf if per_hour >= 1 else 1 / (1 - per_hour)


def _bucket(label: str) -> tuple[float, bool] | None:
    """(upper edge as a share, whether it is only a lower bound) of a label such as "5-10%" or ">20%"."""
    match = _EDGES.match(label)
    if match is None:
        return None
    low, high, op = float(match["low"]), match["high"], match["op"]
    if op == ">":
        return low / 100, True
    return (float(high) if high is not None else low) / 100, False


def interruption_rate(document: dict[str, Any], region: str, instance_type: str) -> InterruptionRate | None:
    """The advisor's bucket for (region, type) on Linux as a rate, or None when it does not list the type
    there. Raises ``ValueError`` when the document is not shaped as expected."""
    entry = (((document.get("spot_advisor") or {}).get(region) or {}).get(ADVISOR_PLATFORM) or {}).get(instance_type)
    if entry is None:
        return None
    index = entry.get("r")
    ranges = {r.get("index"): r for r in document.get("ranges") or []}
    if index not in ranges:
        raise ValueError(f"the advisor's {region}/{instance_type} names range {index!r}, which it does not list")
    label = str(ranges[index].get("label", ""))
    edge = _bucket(label)
    if edge is None:
        raise ValueError(f"the advisor's range label {label!r} is not a percentage range")
    share, at_least = edge
    return InterruptionRate(instance_type=instance_type, label=label, share_per_month=share,
                            per_hour=rate_per_hour(share), at_least=at_least)


def read_advisor(aws: AwsSession) -> dict[str, Any]:
    """The advisor's object, read anonymously from S3 (blocking). Raises botocore's errors or ValueError."""
    # lazy: botocore (~400 ms) only when the advisor is read; the verdict and the matrix import this module
    import botocore
    from botocore.config import Config

    from backend.boto import boto3_session

    config = Config(signature_version=botocore.UNSIGNED, retries={"mode": "standard", "max_attempts": 2},
                    connect_timeout=3, read_timeout=10)
    # A client of its own: the session's S3 client for us-east-1 signs its requests.
    client = boto3_session(aws.profile).client("s3", region_name=ADVISOR_REGION, config=config)
    body = client.get_object(Bucket=ADVISOR_BUCKET, Key=ADVISOR_KEY)["Body"].read()
    document = json.loads(body)
    if not isinstance(document, dict) or not isinstance(document.get("spot_advisor"), dict):
        raise ValueError("the Spot Instance Advisor's data has no spot_advisor object")
    return document


class SpotAdvisor:
    """The advisor's object read at most once (thread-safe), and the rates it gives; a failed read is
    remembered too, so a check of many regions asks once."""

    def __init__(self, aws: AwsSession) -> None:
        self._aws = aws
        self._lock = threading.Lock()
        self._document: dict[str, Any] | None = None
        self._error: str | None = None

    def document(self) -> tuple[dict[str, Any] | None, str | None]:
        """(the object, None) or (None, why it could not be read). Blocking."""
        with self._lock:
            if self._document is None and self._error is None:
                try:
                    self._document = read_advisor(self._aws)
                except Exception as exc:  # any failure: a warning, never a failed check
                    self._error = _why(exc)
            return self._document, self._error

    def rates(self, region: str, instance_types: list[str]) -> tuple[InterruptionRate | None, list[str]]:
        """The highest-risk rate among ``instance_types`` in ``region`` (None when none is known), and what
        could not be known, one line each. Blocking."""
        document, error = self.document()
        if document is None:
            return None, [f"no Spot interruption rate: could not read the Spot Instance Advisor's data ({error})"]
        known: list[InterruptionRate] = []
        missing: list[str] = []
        for name in instance_types:
            try:
                rate = interruption_rate(document, region, name)
            except ValueError as exc:
                return None, [f"no Spot interruption rate: {exc}"]
            if rate is None:
                missing.append(name)
            else:
                known.append(rate)
        notes = ([f"the Spot Instance Advisor lists no interruption rate for {', '.join(missing)} in {region}"]
                 if missing else [])
        return (max(known, key=lambda r: r.per_hour) if known else None), notes


def _why(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("Error"):
        error = response["Error"]
        return f"{error.get('Code', type(exc).__name__)}: {error.get('Message', '')}"[:200]
    return f"{type(exc).__name__}: {exc}"[:200]
