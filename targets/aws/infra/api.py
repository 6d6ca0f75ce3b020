"""The AWS layer's calls: one region, our tags, retries a user can see, and waits with an ETA.

botocore's own retries are off here: a throttled or failed call is retried by ``AwsApi.call``
(``backend.retry``), which tells the running step, so a progress pane shows each retry
instead of a step that seems stuck. Errors become one line with what to do next.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import jmespath
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from botocore.loaders import create_loader

from backend.errors import OperationError, RtuiError, UserError
from backend.retry import REAL_CLOCK, Backoff, Clock, Retrying
from backend.waiting import polling
from targets.aws.calls import CallPool
from targets.aws.session import (
    THROTTLING_CODES,
    AwsSession,
    describe_aws_error,
    error_code,
    is_credential_error,
    login_hint,
    no_credentials_error,
)

RUN_TAG = "rtui:run"
CLUSTER_TAG = "rtui:cluster"
ROLE_TAG = "rtui:role"  # what a resource is for, where its kind alone does not say (public/private subnet)
IAM_PATH = "/rtui/"

# Retries of one call: throttling and 5xx come in bursts, so back off up to ~20 s (full jitter, as
# botocore's standard mode) and try ten times.
CALL_ATTEMPTS = 10
CALL_BACKOFF = Backoff(first_s=0.5, cap_s=20.0, jitter="full")
_TRANSIENT_CODES = frozenset({
    *THROTTLING_CODES, "InternalError", "InternalFailure", "InternalServerError", "ServiceUnavailable",
    "ServiceUnavailableException", "ServerException", "RequestTimeout", "RequestTimeoutException",
    "Unavailable", "SlowDown", "PriorRequestNotComplete", "EC2ThrottledException", "ServiceFailure",
})
_CONNECTION_ERRORS = (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)

# A role IAM has just made is not yet visible everywhere: EKS refuses it for a while with these
# InvalidParameterException messages (the ones terraform-provider-aws retries CreateCluster on,
# internal/service/eks/cluster.go, within its two-minute propagation timeout).
IAM_SETTLE_S = 120.0
IAM_SETTLE_BACKOFF = Backoff(first_s=0.4, factor=1.6, cap_s=10.0)
IAM_PROPAGATION_MESSAGES = ("does not exist", "Error in role params",
                            "could not be assumed because the trusted entity is not correct",
                            "doesn't have the Amazon EKS Managed Policies associated with it",
                            "IAM role's policy must include",
                            "Trust policy of the role provided is invalid")


def iam_propagating(exc: ClientError) -> bool:
    message = str(exc.response.get("Error", {}).get("Message", ""))
    return error_code(exc) == "InvalidParameterException" and any(m in message for m in IAM_PROPAGATION_MESSAGES)


def transient(exc: BaseException) -> bool:
    return retry_cause(exc) is not None


def retry_cause(exc: BaseException) -> str | None:
    """Why a failed call is worth trying again (its error code or exception name), or None."""
    if isinstance(exc, _CONNECTION_ERRORS):
        return type(exc).__name__
    if isinstance(exc, ClientError):
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if error_code(exc) in _TRANSIENT_CODES or status >= 500:
            return error_code(exc) or f"HTTP {status}"
    return None


def missing_permission(exc: BaseException) -> tuple[str, str] | None:
    """(action, resource) from an AccessDenied message, as AWS writes it, when it names them."""
    if not isinstance(exc, ClientError) or error_code(exc) not in (
            "AccessDenied", "AccessDeniedException", "UnauthorizedOperation"):
        return None
    message = str(exc.response.get("Error", {}).get("Message", ""))
    action = re.search(r"perform:? ([a-z0-9-]+:[A-Za-z0-9]+)", message)
    resource = re.search(r"on resource:? (\S+)", message)
    return (action.group(1) if action else "?", resource.group(1).rstrip(".,") if resource else "*")


class AwsApi:
    """One region's clients, on the shared worker threads, with the run's tags."""

    def __init__(self, region: str, profile: str | None = None, *, concurrency: int = 32,
                 clock: Clock = REAL_CLOCK) -> None:
        self.region = region
        self.profile = profile
        self.clock = clock  # what its retries and waits read and sleep on
        self.session = AwsSession(profile, max_pool_connections=concurrency,
                                  retries={"mode": "standard", "total_max_attempts": 1},
                                  user_agent_extra="rtui-provision")
        self._pool: CallPool | None = None
        self._concurrency = concurrency
        self._identity: dict[str, Any] | None = None
        # Calls sent, by "service:Operation" and, for the polls of a wait, "wait:service:Operation".
        self.counts: collections.Counter[str] = collections.Counter()

    def client(self, service: str) -> Any:
        return self.session.client(service, self.region)

    @property
    def pool(self) -> CallPool:
        if self._pool is None:  # made on first use, inside the event loop that will await it
            self._pool = CallPool(self.session.workers, self._concurrency)
        return self._pool

    async def call(self, service: str, operation: str, *, ok: tuple[str, ...] = (), new_role: bool = False,
                   **kwargs: Any) -> Any:
        """``client.<operation>(**kwargs)``; an error whose code is in ``ok`` returns None.

        Throttling, 5xx and dropped connections are retried with jittered backoff, each retry
        reported to the running step. ``new_role``: the call names an IAM role rtui may have just
        made, and EKS's refusals while IAM settles it are retried too, for up to ``IAM_SETTLE_S``.
        Anything else is one line with a remedy.
        """
        fn = getattr(self.client(service), operation)
        what = f"{service}:{_camel(operation)}"
        tries = Retrying(CALL_BACKOFF, attempts=CALL_ATTEMPTS, clock=self.clock)
        settling = Retrying(IAM_SETTLE_BACKOFF, deadline_s=IAM_SETTLE_S, clock=self.clock)  # uses no try
        while True:
            self.counts[what] += 1
            if polling.get():
                self.counts[f"wait:{what}"] += 1
            try:
                return await self.pool.run(fn, **kwargs)
            except ClientError as exc:
                if error_code(exc) in ok:
                    return None
                if new_role and iam_propagating(exc) and await settling.again(
                        "IAM propagation", f"{what}: IAM has not settled the new role yet "
                                           f"({exc.response.get('Error', {}).get('Message', '')[:120]})"):
                    continue
                cause = retry_cause(exc)
                if cause is None or not await tries.again(cause, f"{what} answered {cause}"):
                    raise self.error(exc, what) from None
            except _CONNECTION_ERRORS as exc:
                if not await tries.again(type(exc).__name__, f"{what} answered {type(exc).__name__}"):
                    raise self.error(exc, what) from None
            except BotoCoreError as exc:  # a reply botocore cannot read, a bad parameter: not worth a retry
                raise self.error(exc, what) from None

    def error(self, exc: BaseException, what: str) -> RtuiError:
        if isinstance(exc, RtuiError):
            return exc
        denied = missing_permission(exc)
        if denied is not None:
            action, resource = denied
            action = what if action == "?" else action
            return OperationError(f"AWS denied {action} on {resource}",
                                  remedy=f"give the identity rtui runs as the IAM permission {action}")
        if isinstance(exc, NoCredentialsError):
            return no_credentials_error(self.profile)
        if is_credential_error(exc):
            return OperationError(f"AWS rejected the credentials at {what} ({error_code(exc)})",
                                  remedy=login_hint(self.profile))
        return describe_aws_error(exc, action=f"calling {what}", profile=self.profile)

    async def identity(self) -> dict[str, Any]:
        if self._identity is None:
            self._identity = dict(await self.call("sts", "get_caller_identity"))
        return self._identity

    async def pages(self, service: str, operation: str, key: str, **kwargs: Any) -> list[Any]:
        """Every item of a paginated Describe/List call (one page at a time, each retried)."""
        items: list[Any] = []
        paging = _paging(service, operation)
        params: dict[str, Any] = dict(kwargs)
        while True:
            page = await self.call(service, operation, **params)
            items.extend(page.get(key) or [])
            more = paging.next_params(page)
            if not more:
                return items
            params = {**kwargs, **more}

    def close(self) -> None:
        self.session.close()


def _camel(operation: str) -> str:
    return "".join(part.capitalize() for part in operation.split("_"))


@dataclass(frozen=True)
class _Paging:
    """How one operation pages, from botocore's own paginator model (``paginators-1.json``): each service
    has its tokens (EC2 ``NextToken``, EKS ``nextToken``, IAM ``Marker``, S3 ``ContinuationToken`` or
    ``KeyMarker`` with ``VersionIdMarker``/``UploadIdMarker``), some with a ``more_results`` flag."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]  # JMESPath expressions over the answer
    more_results: str | None

    def next_params(self, page: dict[str, Any]) -> dict[str, Any]:
        """The parameters that ask for the next page; empty when this one was the last."""
        if self.more_results and not jmespath.search(self.more_results, page):
            return {}
        values = [jmespath.search(expr, page) for expr in self.outputs]
        return {name: value for name, value in zip(self.inputs, values, strict=True) if value}


def _as_tuple(value: Any) -> tuple[str, ...]:
    return tuple(value) if isinstance(value, list) else (str(value),)


@functools.cache
def _paging(service: str, operation: str) -> _Paging:
    try:
        config = create_loader().load_service_model(service, "paginators-1")["pagination"][_camel(operation)]
    except KeyError:  # botocore models no paginator for it (EC2 DescribePlacementGroups): the service's token
        token = {"eks": "nextToken", "iam": "Marker"}.get(service, "NextToken")
        return _Paging((token,), (token,), None)
    return _Paging(_as_tuple(config["input_token"]), _as_tuple(config["output_token"]), config.get("more_results"))


def tags(run_id: str, cluster: str, **extra: str) -> dict[str, str]:
    return {RUN_TAG: run_id, CLUSTER_TAG: cluster, **extra}


def ec2_tags(tag_map: dict[str, str], name: str | None = None) -> list[dict[str, str]]:
    out = [{"Key": k, "Value": v} for k, v in tag_map.items()]
    if name:
        out.append({"Key": "Name", "Value": name})
    return out


def tag_spec(resource_type: str, tag_map: dict[str, str], name: str | None = None) -> list[dict[str, Any]]:
    return [{"ResourceType": resource_type, "Tags": ec2_tags(tag_map, name)}]


def run_filter(run_id: str, **extra: str) -> list[dict[str, Any]]:
    """EC2 filters for this run's resources (and what else the tags must say)."""
    wanted = {RUN_TAG: run_id, **extra}
    return [{"Name": f"tag:{k}", "Values": [v]} for k, v in wanted.items()]


def tag_map(tag_list: list[dict[str, str]] | None) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in tag_list or []}


def refuse_foreign(kind: str, name: str, owner_tags: dict[str, str], run_id: str) -> None:
    """A resource of our name that this run did not make: refused, never adopted silently."""
    if owner_tags.get(RUN_TAG) == run_id:
        return
    owner = "another rtui run" if RUN_TAG in owner_tags else "someone else"
    raise UserError(f"{kind} {name} already exists and belongs to {owner}",
                    remedy="choose another --cluster-name (rtui never takes over what it did not make)")


# Idempotency tokens: EKS takes 33..126 characters; EC2 up to 64 (128 for CreateLaunchTemplate).
EKS_TOKEN = (33, 126)
EC2_TOKEN = (1, 64)


def client_token(*parts: str, limits: tuple[int, int] = EC2_TOKEN, request: dict[str, Any] | None = None) -> str:
    """A token naming what it creates (``parts``: the run, the resource, its generation), fitted to
    the API's length limits: too long keeps its head and a digest of the whole, too short is padded
    with that digest, so two different requests never share a token.

    The same for a retry of the same request (a reply lost after AWS acted must not make a second
    resource; botocore's own token is new at every call). With ``request``, a digest of its parameters
    joins the parts, since EC2 refuses a token reused with other parameters (IdempotentParameterMismatch)."""
    if request is not None:
        parts = (*parts, hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()[:12])
    low, high = limits
    text = "-".join(p for p in parts if p)
    digest = hashlib.sha256(text.encode()).hexdigest()
    if len(text) > high:
        text = f"{text[:high - 17]}-{digest[:16]}"
    if len(text) < low:
        text = f"{text}-{digest}"[:max(low, len(text) + 17)]
    return text


@dataclass(frozen=True)
class Partition:
    """The AWS partition of a region (aws, aws-cn, aws-us-gov, ...) and its DNS suffix, from botocore's data."""

    name: str
    dns_suffix: str

    def arn(self, service: str, region: str, account: str, resource: str) -> str:
        return f"arn:{self.name}:{service}:{region}:{account}:{resource}"

    def service_principal(self, service: str) -> str:
        """``<service>.<suffix>``: the partition's DNS suffix for the services IAM knows by it there (EC2
        in aws-cn and the ISO partitions), the standard partition's for the rest, EKS included (eksctl
        pkg/apis/eksctl.io/v1alpha5/partitions.go; IAM refuses the EKS principal with aws-cn's suffix)."""
        suffix = self.dns_suffix if service in _PARTITION_SUFFIXED_PRINCIPALS else partition(STANDARD_REGION).dns_suffix
        return f"{service}.{suffix}"


_PARTITION_SUFFIXED_PRINCIPALS = frozenset({"ec2"})
STANDARD_REGION = "us-east-1"  # a region of the standard partition, whose suffix most principals keep


@functools.cache
def partition(region: str) -> Partition:
    data = create_loader().load_data("partitions")
    for p in data["partitions"]:
        if region in p.get("regions", {}) or re.match(p["regionRegex"], region):
            return Partition(p["id"], p["outputs"]["dnsSuffix"])
    return Partition("aws", "amazonaws.com")
