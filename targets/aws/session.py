"""The aws target's boto3 session and clients (``AwsSession``, made with ``backend.boto``), and AWS errors
turned into one clear line."""

from __future__ import annotations

import os
import threading
from typing import Any

from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ProfileNotFound,
    ReadTimeoutError,
    SSOError,
    TokenRetrievalError,
    UnauthorizedSSOTokenError,
)

from backend.boto import boto3_session
from backend.config import clip
from backend.errors import OperationError, RtuiError, UserError
from targets.aws.calls import Workers

# Standard mode retries throttling and transient errors with jittered backoff; six retries
# (botocore's max_attempts counts retries: seven attempts in all) ride out the bursts a
# whole-account scan provokes. Timeouts are retried too, so one call to an endpoint that never
# answers can take 7 × the read timeout: the callers bound their waits (PreflightRequest's
# listing, region and overall limits); these bound what a thread left behind goes on costing.
RETRY_ATTEMPTS = 6
CONNECT_TIMEOUT_S = 5
# A Describe/Get call answers in well under a second; ten leaves room for a slow proxy.
READ_TIMEOUT_S = 10

_CREDENTIAL_CODES = frozenset(
    {
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "AuthFailure",
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
    }
)
_PERMISSION_CODES = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"})
THROTTLING_CODES = frozenset(
    {"Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException"}
)


class AwsSession:
    """One boto3 session and one client per (service, region), created once and shared,
    and the worker threads its blocking calls run on (``workers``).

    boto3 sessions are not thread-safe, clients are: creation happens under a lock, the
    calls themselves from any thread.
    """

    def __init__(self, profile: str | None = None, *, max_pool_connections: int = 16,
                 retries: dict[str, Any] | None = None, user_agent_extra: str = "rtui-preflight") -> None:
        self.profile = profile
        try:
            self._session = boto3_session(profile)
        except ProfileNotFound as exc:
            raise UserError(
                f"AWS profile {profile!r} not found", remedy="check ~/.aws/config or drop --profile"
            ) from exc
        self._config = Config(
            retries=retries or {"mode": "standard", "max_attempts": RETRY_ATTEMPTS},
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            max_pool_connections=max_pool_connections,
            user_agent_extra=user_agent_extra,
        )
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self.workers = Workers()

    def client(self, service: str, region: str, *, config: Config | None = None) -> Any:
        key = (service, region)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                merged = self._config.merge(config) if config is not None else self._config
                client = self._session.client(service, region_name=region, config=merged)
                self._clients[key] = client
            return client

    def close(self) -> None:
        """Let this session's idle worker threads end; the session stays usable."""
        self.workers.close()

    def endpoint(self, service: str, region: str) -> str:
        """The URL this session's ``service`` calls in ``region`` go to (``AWS_ENDPOINT_URL`` when
        set): what an error about an endpoint that does not answer has to name."""
        try:
            return str(self.client(service, region).meta.endpoint_url)
        except Exception:  # the message that wants it must still be written
            return f"the {service} endpoint of {region}"

    def partition_of(self, region: str) -> str | None:
        try:
            return str(self._session._session.get_partition_for_region(region))
        except Exception:  # an unknown region name: the caller decides what that means
            return None


def error_code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", "ClientError"))
    return type(exc).__name__


def is_credential_error(exc: BaseException) -> bool:
    if isinstance(exc, NoCredentialsError | TokenRetrievalError | UnauthorizedSSOTokenError | SSOError):
        return True
    return isinstance(exc, ClientError) and error_code(exc) in _CREDENTIAL_CODES


def login_hint(profile: str | None) -> str:
    if profile:
        return f"run `aws sso login --profile {profile}` (or refresh that profile's keys), then retry"
    return "run `aws sso login` or `aws configure`, or set AWS_PROFILE to a profile with valid credentials"


def no_credentials_error(profile: str | None) -> UserError:
    """botocore found no credentials anywhere in its chain: nothing was sent, so nothing was rejected.

    The places named are botocore's default chain, in its order (botocore/credentials.py,
    ``create_credential_resolver``): the environment (skipped when a profile is given), the
    profile's entries in the shared credentials and config files (keys, SSO, login,
    credential_process, assume-role), then container credentials and instance metadata.
    """
    creds = os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials"
    config = os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config"
    name = profile or os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or "default"
    places = [] if profile else ["AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment"]
    places.append(f"profile {name!r} in {creds} and {config} (keys, SSO, credential_process, role)")
    imds = os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true"
    places.append("container credentials and instance metadata" + (" (disabled by AWS_EC2_METADATA_DISABLED)"
                                                                  if imds else ""))
    return UserError(
        f"no AWS credentials found (looked at {', '.join(places)})",
        remedy="run `aws configure` (access keys) or `aws configure sso` (then `aws sso login`) and pass "
               "--profile NAME or set AWS_PROFILE; or export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")


def describe_aws_error(exc: BaseException, *, action: str, profile: str | None = None) -> RtuiError:
    """Turn a boto3 failure into the one line (code + what to do) the CLI prints."""
    code = error_code(exc)
    if isinstance(exc, RtuiError):
        return exc
    if isinstance(exc, ProfileNotFound):
        return UserError(f"AWS profile {profile!r} not found", remedy="check ~/.aws/config or drop --profile")
    if isinstance(exc, NoRegionError):
        return UserError("no AWS region configured", remedy="pass --region or set AWS_REGION")
    if isinstance(exc, NoCredentialsError):
        return no_credentials_error(profile)
    if is_credential_error(exc):
        return OperationError(
            f"AWS rejected the credentials while {action} ({code})", remedy=login_hint(profile)
        )
    if code in _PERMISSION_CODES:
        return OperationError(
            f"AWS denied {action} ({code})",
            remedy="the identity needs ec2:Describe*, servicequotas:Get* and pricing:GetProducts",
        )
    if code in THROTTLING_CODES:
        return OperationError(
            f"AWS throttled {action} after retries ({code})", remedy="wait a minute and retry"
        )
    if isinstance(exc, EndpointConnectionError | ConnectTimeoutError | ReadTimeoutError):
        url = exc.kwargs.get("endpoint_url")
        where = f" at {url}" if url else ""
        return OperationError(
            f"could not reach AWS{where} while {action} ({code})",
            remedy="check the network, the proxy or AWS_ENDPOINT_URL",
        )
    if isinstance(exc, ValueError) and str(exc).startswith("Invalid"):
        # botocore's own check of the endpoint URL ("Invalid endpoint: ...", "Invalid IPv6 URL"),
        # raised when a client is made: the user's setting, not an AWS failure.
        return UserError(
            f"the AWS endpoint URL is not usable ({clip(str(exc))})",
            remedy="fix or unset AWS_ENDPOINT_URL (or endpoint_url in ~/.aws/config)",
        )
    if isinstance(exc, ClientError | BotoCoreError):
        message = (
            str(exc.response.get("Error", {}).get("Message", "")) if isinstance(exc, ClientError) else ""
        )
        detail = f": {clip(message, 200)}" if message else ""
        return OperationError(f"AWS error while {action} ({code}){detail}")
    return OperationError(f"unexpected error while {action} ({code}: {clip(str(exc), 200)})")
