"""What moto 5.2 lacks for the preflight, added in-process, plus scripted latency and faults.

- service-quotas: moto knows only the ``vpc`` service. We answer ``ec2`` quotas (applied and
  AWS default) from ``SCRIPT`` and record ``RequestServiceQuotaIncrease`` calls.
- ec2: ``DescribeCapacityReservations`` is not implemented; we serve ``SCRIPT.reservations``.
- ec2: ``GetSpotPlacementScores`` is not implemented; we serve ``SCRIPT.spot_scores`` by zone ID, and
  the Spot Instance Advisor's public S3 object from ``SCRIPT.spot_advisor`` (tests/aws/moto_spot.py, with
  their references).
- pricing: moto has no Pricing API at all (the request crashes its dispatcher); the WSGI
  middleware answers ``GetProducts`` as AWS does (tests/aws/moto_pricing.py, with its references)
  from ``SCRIPT.prices`` and ``SCRIPT.region_prices``, or denies it.
- Faults: per-call latency, throttling of a share of calls, regions that hang, and scripted
  error codes, all in a WSGI middleware in front of moto's dispatcher, so the client under
  test sees them over real HTTP exactly as it would from AWS.
"""

from __future__ import annotations

import io
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any
from unittest.mock import patch
from urllib.parse import parse_qsl, unquote_plus

import boto3.session
from moto import backends as moto_backends
from moto.core.responses import ActionResult
from moto.ec2.models import instance_types as moto_instance_types
from moto.ec2.responses import EC2Response
from moto.eks import models as moto_eks_models
from moto.eks.exceptions import InvalidParameterException
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from moto.servicequotas.exceptions import NoSuchResource
from moto.servicequotas.models import ServiceQuotasBackend
from moto.servicequotas.responses import ServiceQuotasResponse
from werkzeug.serving import make_server

from tests.aws import iam_strict, moto_pricing, moto_spot

QUOTA_NAMES = {
    "L-DB2E81BA": "Running On-Demand G and VT instances",
    "L-417A185B": "Running On-Demand P instances",
    "L-1216C47A": "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances",
    "L-3819A6DF": "All G and VT Spot Instance Requests",
    "L-34B43A08": "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests",
}


@dataclass
class Timings:
    """Real-second durations of AWS's asynchronous transitions (0: at once). See moto_provision."""

    cluster_create: float = 0.0
    cluster_delete: float = 0.0
    nodegroup_create: float = 0.0
    nodegroup_delete: float = 0.0
    # A nodegroup whose Auto Scaling group finds no capacity: its failed launch activity is written at
    # once, EKS turns it CREATE_FAILED only this much after ``nodegroup_create`` (moto_activities).
    capacity_verdict: float = 0.0
    addon_create: float = 0.0
    addon_delete: float = 0.0
    nat_create: float = 0.0
    nat_delete: float = 0.0
    nat_deleted_visible: float = 3600.0  # a deleted NAT gateway is still described this long
    # After CreateRole, EKS refuses the role this long (IAM is eventually consistent): moto_provision.
    iam_propagation: float = 0.3


NodegroupHook = Callable[[str, str, dict[str, Any]], None]


@dataclass
class Script:
    """The scripted world. Tests mutate it; ``reset()`` runs before each test."""

    quotas: dict[tuple[str, str], float] = field(default_factory=dict)  # (region, code) -> applied
    default_quotas: dict[str, float] = field(default_factory=dict)  # code -> AWS default
    reservations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # region -> API dicts
    prices: dict[tuple[str, str], float] = field(default_factory=dict)  # (region, type) -> USD/h
    # (region, type) -> AZ -> the Spot price in effect now, USD/h (tests/aws/moto_spot.py)
    spot_prices: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    # Spot price changes after the one in effect now was set: (when, region, type, AZ, USD per hour).
    spot_changes: list[tuple[datetime, str, str, str, float]] = field(default_factory=list)
    # (region, AZ name) -> Spot placement score 1-10, answered by zone ID (tests/aws/moto_spot.py
    # get_spot_placement_scores); an AZ not here scores moto_spot.default_score.
    spot_scores: dict[tuple[str, str], int] = field(default_factory=dict)
    # How many distinct score request configurations EC2 takes (None: no cap), and those it has taken.
    spot_score_config_limit: int | None = None
    spot_score_configs: set[tuple[Any, ...]] = field(default_factory=set)
    # The Spot Instance Advisor's public object (moto_spot.serve_advisor); None: S3 answers 403 AccessDenied.
    spot_advisor: dict[str, Any] | None = field(default_factory=moto_spot.advisor_document)
    # region -> {eks, nat_hour, nat_gb, ebs_gp3, ipv4} -> USD (tests/aws/moto_pricing.py)
    region_prices: dict[str, dict[str, float]] = field(default_factory=dict)
    pricing_denied: bool = True
    latency_s: float = 0.0
    # (service, action) -> seconds more that one action's answer takes (models time, as ``latency_s``).
    action_latency_s: dict[tuple[str, str], float] = field(default_factory=dict)
    throttle_rate: float = 0.0
    # Never throttle an attempt beyond this one, so scripted throttling cannot outlast retries.
    throttle_max_attempt: int = 3
    hang_regions: set[str] = field(default_factory=set)
    # (service, action) -> error code answered instead of the real call; action "*" matches all.
    errors: dict[tuple[str, str], str] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (service, region, action)
    # (service, signing region, action, the path, query and body as text): what AWS was told.
    requests: list[tuple[str, str, str, str]] = field(default_factory=list)
    throttled: int = 0
    quota_requests: list[dict[str, Any]] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(5))
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)
    # The EKS clusters and nodegroups (by name) that stay CREATING past their timings until the test lets
    # them go: a state a test must meet whatever the machine's speed (AWS's take minutes; a loaded box
    # may outrun the seconds scripted here).
    held: set[str] = field(default_factory=set)
    # Calls ((service, action)) whose answer waits until the test lets them go (``release_action``): a
    # step a test must kill a client in, whatever the machine's speed. Released, the call goes on as AWS
    # goes on with a request whose client has gone: it makes what was asked.
    held_actions: set[tuple[str, str]] = field(default_factory=set)
    hold_changed: threading.Condition = field(default_factory=threading.Condition)
    extra_offerings: list[dict[str, Any]] = field(default_factory=list)
    # Provisioning (tests/aws/moto_provision.py).
    timings: Timings = field(default_factory=Timings)
    cluster_endpoint: str | None = None  # DescribeCluster's endpoint for every cluster
    cluster_ca: str | None = None  # and its certificateAuthority.data (base64 PEM)
    cluster_endpoints: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (endpoint, ca)
    ice_zones: dict[str, set[str]] = field(default_factory=dict)  # instance type -> AZs without capacity
    spot_ice_zones: dict[str, set[str]] = field(default_factory=dict)  # the same, for Spot capacity
    error5xx_rate: float = 0.0  # share of calls answered 500/503 (attempts <= throttle_max_attempt)
    faulted: int = 0  # how many were
    on_nodegroup_active: NodegroupHook | None = None  # (cluster, nodegroup, info) once, when ACTIVE
    on_nodegroup_deleted: NodegroupHook | None = None  # (cluster, nodegroup, info) once, when gone
    # EC2 client tokens: (region, action, token) -> (the other parameters, status, headers, body).
    client_tokens: dict[tuple[str, str, str], tuple[dict[str, str], str, list[Any], bytes]] = field(
        default_factory=dict)
    ec2_requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (action, parameters)
    # EC2 action -> how many of its replies are lost after the request was carried out (answered 500).
    lost_replies: dict[str, int] = field(default_factory=dict)
    # add-on name -> the health issues it ends with, DEGRADED instead of ACTIVE (moto_provision_api)
    degraded_addons: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    leave_cluster_sg: bool = False  # EKS leaves its eks-cluster-sg-* group behind when the cluster goes

    def reset(self) -> None:
        self.release.set()  # let any hung request from the previous test finish
        remove_offerings(self)
        fresh = Script()
        for name in self.__dataclass_fields__:
            if name not in ("lock", "hold_changed"):
                setattr(self, name, getattr(fresh, name))
        with self.hold_changed:  # and any held call
            self.hold_changed.notify_all()

    def release_action(self, service: str, action: str) -> None:
        with self.hold_changed:
            self.held_actions.discard((service, action))
            self.hold_changed.notify_all()

    def wait_while_held(self, service: str, action: str) -> None:
        with self.hold_changed:
            self.hold_changed.wait_for(lambda: (service, action) not in self.held_actions, timeout=120)


SCRIPT = Script()

# AWS answers each request whole: a read made while another caller writes sees the state before or
# after, never an internal error. moto's backends are plain dicts walked without a lock
# (``IAMBackend.get_role`` iterates ``self.roles.values()``) and its threaded server gives each
# request a thread, so a role created mid-walk failed a reader with "dictionary changed size during
# iteration" (a CI run's ``up``). One request at a time reaches moto's backends; the latency, hangs and
# faults the script models are applied before, outside this lock, so calls still overlap in time.
MOTO_STATE = threading.RLock()


# --- moto extensions ------------------------------------------------------------------------


def _quota_dict(region: str, code: str, value: float) -> dict[str, Any]:
    return {
        "ServiceCode": "ec2",
        "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
        "QuotaArn": f"arn:aws:servicequotas:{region}:123456789012:ec2/{code}",
        "QuotaCode": code,
        "QuotaName": QUOTA_NAMES.get(code, code),
        "Value": value,
        "Unit": "None",
        "Adjustable": True,
        "GlobalQuota": False,
    }


_original_get_service_quota = ServiceQuotasBackend.get_service_quota


def _get_service_quota(self: ServiceQuotasBackend, service_code: str, quota_code: str) -> dict[str, Any]:
    if service_code != "ec2":
        return _original_get_service_quota(self, service_code, quota_code)
    value = SCRIPT.quotas.get((self.region_name, quota_code))
    if value is None:
        raise NoSuchResource()
    return _quota_dict(self.region_name, quota_code, value)


def _get_aws_default_service_quota(self: ServiceQuotasResponse) -> str:
    params = json.loads(self.body)
    code = str(params.get("QuotaCode"))
    value = SCRIPT.default_quotas.get(code)
    if params.get("ServiceCode") != "ec2" or value is None:
        raise NoSuchResource()
    return json.dumps({"Quota": _quota_dict(self.region, code, value)})


def _request_service_quota_increase(self: ServiceQuotasResponse) -> str:
    params = json.loads(self.body)
    change = {
        "Id": uuid.uuid4().hex,
        "ServiceCode": params["ServiceCode"],
        "QuotaCode": params["QuotaCode"],
        "DesiredValue": params["DesiredValue"],
        "Status": "PENDING",
        "Created": time.time(),
    }
    SCRIPT.quota_requests.append({**change, "Region": self.region})
    return json.dumps({"RequestedQuota": change})


def _describe_capacity_reservations(self: EC2Response) -> ActionResult:
    """Named ids answer whatever their state (an expired or cancelled reservation is still described
    for a while: EC2 User Guide, "Capacity Reservation states"); an id the account never had is
    ``InvalidCapacityReservationId.NotFound`` (EC2 API reference, error codes)."""
    filters = self._filters_from_querystring()
    ids = self._get_param("CapacityReservationIds", [])
    known = {cr["CapacityReservationId"] for cr in SCRIPT.reservations.get(self.region, [])}
    unknown = [i for i in ids if i not in known]
    if unknown:
        from moto.ec2.exceptions import EC2ClientError

        raise EC2ClientError("InvalidCapacityReservationId.NotFound",
                        f"The capacity reservation ID '{unknown[0]}' does not exist")
    found = []
    for cr in SCRIPT.reservations.get(self.region, []):
        if ids and cr["CapacityReservationId"] not in ids:
            continue
        if "instance-type" in filters and cr["InstanceType"] not in filters["instance-type"]:
            continue
        if "state" in filters and cr["State"] not in filters["state"]:
            continue
        found.append(cr)
    return ActionResult({"CapacityReservations": found})


def install() -> Callable[[], None]:
    """Patch moto's classes; returns the function that undoes it."""
    patches = ExitStack()
    patches.enter_context(patch.object(ServiceQuotasBackend, "get_service_quota", _get_service_quota))
    patches.enter_context(patch.object(ServiceQuotasResponse, "get_aws_default_service_quota",
                                       _get_aws_default_service_quota, create=True))
    patches.enter_context(patch.object(ServiceQuotasResponse, "request_service_quota_increase",
                                       _request_service_quota_increase, create=True))
    patches.enter_context(patch.object(EC2Response, "describe_capacity_reservations", _describe_capacity_reservations,
                                       create=True))
    patches.enter_context(patch.object(EC2Response, "describe_spot_price_history",
                                       lambda self: moto_spot.describe_spot_price_history(self, SCRIPT)))
    patches.enter_context(patch.object(EC2Response, "get_spot_placement_scores",
                                       lambda self: moto_spot.get_spot_placement_scores(self, SCRIPT), create=True))
    # moto's dispatcher lists its package directory (listdir, then isdir on ~180 entries) for every request
    # it routes (werkzeug_app.get_backend_for_host): listed once here, the same names. Not a behaviour of
    # AWS's, only this double's CPU (py-spy: ~8% of tests/aws/test_provision.py's moto samples).
    modules = tuple(moto_backends.list_of_moto_modules())
    patches.enter_context(patch.object(moto_backends, "list_of_moto_modules", lambda: modules))
    patches.enter_context(patch.object(moto_eks_models, "validate_role_arn", _validate_role_arn))
    return patches.close


_ROLE_ARN = re.compile("arn:(?P<partition>.+):iam::(?P<account_id>[0-9]{12}):role/.+")


@cache
def _partitions() -> frozenset[str]:
    return frozenset(boto3.session.Session().get_available_partitions())


def _validate_role_arn(arn: str) -> None:
    """moto.eks.utils.validate_role_arn's check (the same pattern, the same partitions, the same error)
    with botocore's partition list read once: moto's makes a new boto3 Session, which parses botocore's
    endpoint data anew, on every CreateCluster and CreateNodegroup (py-spy: 15% of
    tests/aws/test_provision.py's CPU). Only the double's CPU changes, not what EKS accepts."""
    match = _ROLE_ARN.match(arn or "")
    if not (arn and match and match.group("partition") in _partitions()):
        raise InvalidParameterException(message="Invalid Role Arn: '" + arn + "'")


def offer(script: Script, region: str, zone: str, instance_type: str) -> None:
    """Make moto offer a type in an AZ where its bundled data does not (undone by ``reset``)."""
    entry = {"InstanceType": instance_type, "Location": zone, "LocationType": "availability-zone"}
    by_region = moto_instance_types.INSTANCE_TYPE_OFFERINGS["availability-zone"]
    # moto's bundled data lacks some regions (cn-northwest-1): the region's list is made, and dropped again.
    added_region = region not in by_region
    by_region.setdefault(region, []).append(entry)
    script.extra_offerings.append({"region": region, "entry": entry, "added_region": added_region})


def remove_offerings(script: Script) -> None:
    for item in script.extra_offerings:
        by_region = moto_instance_types.INSTANCE_TYPE_OFFERINGS["availability-zone"]
        offerings = by_region.get(item["region"], [])
        if item["entry"] in offerings:
            offerings.remove(item["entry"])
        if item.get("added_region") and not offerings:
            by_region.pop(item["region"], None)
    script.extra_offerings.clear()


def reservation(
    zone: str,
    *,
    count: int,
    instance_type: str = "g6.12xlarge",
    platform: str = "Linux/UNIX",
    kind: str = "default",
    state: str = "active",
    available: int | None = None,
    match: str | None = None,
    placement_group: str | None = None,
    end_date: str | None = None,
) -> dict[str, Any]:
    """A DescribeCapacityReservations entry; Capacity Blocks are always targeted, ODCRs open unless ``match``;
    ``placement_group``: made in that cluster placement group (``PlacementGroupArn``)."""
    region = zone[:-1]
    extra = ({"PlacementGroupArn": f"arn:aws:ec2:{region}:123456789012:placement-group/{placement_group}"}
             if placement_group else {})
    limited = kind == "capacity-block" or end_date is not None
    return {**extra,
        "CapacityReservationId": f"cr-{uuid.uuid4().hex[:17]}",
        "OwnerId": "123456789012",
        "InstanceType": instance_type,
        "InstancePlatform": platform,
        "AvailabilityZone": zone,
        "Tenancy": "default",
        "TotalInstanceCount": count,
        "AvailableInstanceCount": count if available is None else available,
        "State": state,
        "EndDateType": "limited" if limited else "unlimited",
        "EndDate": end_date or ("2031-01-01T00:00:00Z" if kind == "capacity-block" else None),
        "InstanceMatchCriteria": "targeted" if kind == "capacity-block" else (match or "open"),
        "ReservationType": kind,
    }


# --- the HTTP layer: latency, faults, Pricing API --------------------------------------------


def _service_region(environ: dict[str, Any]) -> tuple[str, str]:
    auth = environ.get("HTTP_AUTHORIZATION", "")
    try:
        scope = auth.split("Credential=", 1)[1].split(",", 1)[0]
        _, _, region, service, _ = scope.split("/")
        return service, region
    except (IndexError, ValueError):
        return "", ""


def _action(environ: dict[str, Any], body: bytes) -> str:
    target = environ.get("HTTP_X_AMZ_TARGET")
    if target:
        return str(target).rsplit(".", 1)[-1]
    for pair in body.decode("utf-8", "replace").split("&"):
        if pair.startswith("Action="):
            return pair[len("Action=") :]
    return ""


def _attempt(environ: dict[str, Any]) -> int:
    header = str(environ.get("HTTP_AMZ_SDK_REQUEST", "attempt=1"))
    try:
        return int(header.split("attempt=", 1)[1].split(";", 1)[0])
    except (IndexError, ValueError):
        return 1


# Services that speak the query protocol (XML errors); json and rest-json get JSON bodies.
QUERY_SERVICES = {"iam", "sts", "autoscaling", "elasticloadbalancing", "cloudformation", "rds", "sns"}


def _error(start_response: Any, service: str, code: str, message: str, status: int) -> Iterable[bytes]:
    headers = [("x-amzn-RequestId", str(uuid.uuid4()))]
    if service == "ec2":
        body = (
            '<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error>'
            f"<Code>{code}</Code><Message>{message}</Message></Error></Errors>"
            f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
        ).encode()
        content_type = "text/xml"
    elif service == "s3":
        # S3 speaks rest-xml: an <Error> element at the top (S3 API Reference, "Error responses": "REST
        # error responses"), never JSON, which botocore's S3 parser reads as a bare "400 Bad Request".
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f"<Error><Code>{code}</Code><Message>{message}</Message><RequestId>{uuid.uuid4()}</RequestId></Error>"
        ).encode()
        content_type = "application/xml"
    elif service in QUERY_SERVICES:
        kind = "Receiver" if status >= 500 else "Sender"
        body = (
            f"<ErrorResponse><Error><Type>{kind}</Type><Code>{code}</Code><Message>{message}</Message>"
            f"</Error><RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>"
        ).encode()
        content_type = "text/xml"
    else:  # json and rest-json: botocore reads the header first, then __type
        body = json.dumps({"__type": code, "message": message}).encode()
        content_type = "application/x-amz-json-1.1"
        headers.append(("x-amzn-ErrorType", code))
    headers += [("Content-Type", content_type), ("Content-Length", str(len(body)))]
    start_response(f"{status} Error", headers)
    return [body]


def _pricing(start_response: Any, body: bytes, region: str) -> Iterable[bytes]:
    return moto_pricing.get_products(start_response, body, region, denied=SCRIPT.pricing_denied,
                                     instance_prices=SCRIPT.prices, region_prices=SCRIPT.region_prices,
                                     error=_error)


class FaultInjector:
    """WSGI middleware in front of moto: records calls, adds latency and the scripted faults."""

    def __init__(self, app: Any, script: Script) -> None:
        self.app: Callable[..., Iterable[bytes]] = app
        self.script = script

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        service, region = _service_region(environ)
        if not service and moto_spot.is_advisor_request(environ):  # anonymous, as its readers ask
            with self.script.lock:
                self.script.calls.append(("s3", "us-east-1", "GetObject"))
            if self.script.latency_s:
                time.sleep(self.script.latency_s)  # models time: the network and AWS's answer latency
            return moto_spot.serve_advisor(environ, start_response, self.script, _error)
        if not service:
            return self._moto(environ, start_response)  # moto's own API (reset) and the like
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length:
            body = environ["wsgi.input"].read(length)
        elif environ.get("wsgi.input_terminated"):  # chunked (pyarrow's uploads): read to the end
            body = environ["wsgi.input"].read()
        else:
            body = b""
        environ["wsgi.input"] = io.BytesIO(body)
        action = _action(environ, body)
        script = self.script
        unavailable = False
        with script.lock:
            script.calls.append((service, region, action))
            said = f"{environ.get('PATH_INFO', '')}?{environ.get('QUERY_STRING', '')} " + unquote_plus(
                body.decode("utf-8", "replace"))
            script.requests.append((service, region, action, said))
            throttle = (
                script.throttle_rate > 0
                and _attempt(environ) <= script.throttle_max_attempt
                and script.rng.random() < script.throttle_rate
            )
            if throttle:
                script.throttled += 1
            fault = (
                not throttle
                and script.error5xx_rate > 0
                and _attempt(environ) <= script.throttle_max_attempt
                and script.rng.random() < script.error5xx_rate
            )
            if fault:
                script.faulted += 1
                unavailable = script.rng.random() < 0.5
        if script.latency_s:
            time.sleep(script.latency_s)  # models time: the network and AWS's answer latency
        if (service, action) in script.action_latency_s:
            time.sleep(script.action_latency_s[(service, action)])  # models time: that action's own answer
        if region in script.hang_regions:
            script.release.wait(timeout=60)
        if (service, action) in script.held_actions:
            script.wait_while_held(service, action)
        code = script.errors.get((service, action)) or script.errors.get((service, "*"))
        if code:
            return _error(start_response, service, code, f"scripted failure {code}", 400)
        if throttle:
            # S3 throttles with 503 SlowDown, "Please reduce your request rate." (S3 API Reference,
            # "Error responses", list of error codes).
            code = {"ec2": "RequestLimitExceeded", "s3": "SlowDown"}.get(service, "ThrottlingException")
            return _error(start_response, service, code, "Rate exceeded", 503 if service in ("ec2", "s3") else 400)
        if fault:
            if unavailable:
                return _error(start_response, service, "ServiceUnavailable", "Service unavailable", 503)
            return _error(start_response, service, "InternalError", "Internal error", 500)
        if service == "s3":
            with MOTO_STATE:  # it reads moto's IAM, STS and S3 backends
                allowed, why = iam_strict.authorise(environ, body)  # a pod's credentials: judged as IAM does
            if not allowed:
                return iam_strict.access_denied(start_response, why)
        if service == "pricing":
            return _pricing(start_response, body, region)
        if service == "ec2":
            return self._idempotent(environ, start_response, region, action, body)
        return self._moto(environ, start_response)

    def _moto(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        """moto's answer, made and read whole under ``MOTO_STATE``."""
        with MOTO_STATE:
            answer = self.app(environ, start_response)
            try:
                return list(answer)
            finally:
                if hasattr(answer, "close"):
                    answer.close()

    def _idempotent(self, environ: dict[str, Any], start_response: Any, region: str, action: str,
                    body: bytes) -> Iterable[bytes]:
        """EC2's client tokens (EC2 API Reference, "Ensuring idempotency in Amazon EC2 API requests"):
        a request repeated with the same ClientToken and the same parameters gets the first answer
        again and makes nothing; the same token with other parameters is refused with
        IdempotentParameterMismatch."""
        params = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        token = params.pop("ClientToken", None)
        params.pop("Version", None)
        script = self.script
        with script.lock:
            script.ec2_requests.append((action, {**params, **({"ClientToken": token} if token else {})}))
            seen = script.client_tokens.get((region, action, token)) if token else None
        if seen is not None:
            first, status, headers, answer = seen
            if first != params:
                return _error(start_response, "ec2", "IdempotentParameterMismatch",
                              f"Client token {token} was used with different parameters", 400)
            start_response(status, headers)
            return [answer]
        with script.lock:
            lose = script.lost_replies.get(action, 0) > 0
            if lose:
                script.lost_replies[action] -= 1
        if not token and not lose:
            return self._moto(environ, start_response)
        captured: dict[str, Any] = {}

        def capture(status: str, headers: list[Any], exc_info: Any = None) -> Any:
            captured.update(status=status, headers=headers)
            return lambda data: None

        answer = b"".join(self._moto(environ, capture))
        if token and str(captured.get("status", "")).startswith("2"):
            with script.lock:
                script.client_tokens[(region, action, token)] = (params, captured["status"], captured["headers"],
                                                                 answer)
        if lose:  # carried out, but the reply never reaches the caller
            return _error(start_response, "ec2", "InternalError", "An internal error has occurred", 500)
        start_response(captured["status"], captured["headers"])
        return [answer]


class ScriptedMotoServer(ThreadedMotoServer):
    """moto's threaded server with ``FaultInjector`` in front of its dispatcher."""

    def __init__(self, script: Script) -> None:
        super().__init__(ip_address="127.0.0.1", port=0, verbose=False)
        self.script = script

    def _server_entry(self) -> None:
        app = FaultInjector(DomainDispatcherApplication(create_backend_app), self.script)
        self._server = make_server(
            self._ip_address, self._port, app, True, request_handler=MotoRequestHandler
        )
        self._server_ready_event.set()
        self._server.serve_forever()
