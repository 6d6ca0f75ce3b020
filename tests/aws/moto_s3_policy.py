"""S3 bucket policies' explicit Deny, evaluated as S3 evaluates it, with the request's transport (issue 33).

What S3 does (IAM User Guide, "Policy evaluation logic": an explicit Deny in any applicable policy,
resource-based ones included, ends the evaluation with Deny; S3 User Guide, "How Amazon S3
authorizes a request": the bucket policy applies to bucket and object operations alike): a Deny
statement whose Principal, Action, Resource and every Condition match the request refuses it with
403 ``AccessDenied``. ``aws:SecureTransport`` is "true" when the request came over TLS and "false"
otherwise (IAM User Guide, "AWS global condition context keys"), so the S3 User Guide's "Security
best practices for Amazon S3" policy (Deny ``s3:*`` on the bucket and its objects when
``aws:SecureTransport`` is ``false``) refuses every plain-HTTP request and leaves HTTPS ones alone.
A condition on a key absent from the request is false, except for ``…IfExists`` operators (IAM User
Guide, "Condition operators").

Where moto 5.2.5 is wrong: it evaluates a bucket policy only in its object handler
(``FakeBucket.get_permission``, moto issue #7837), without the request, and answers DENIED for any
matching statement whose conditions do not hold, whatever its Effect (``IAMPolicyStatement``: built
for role trust policies). So the policy above made moto refuse every object request, TLS or not
(stricter than S3, and wrong), while bucket operations (ListBucket, DeleteBucket) ignored the policy
(kinder). Here both go through one evaluator.

What the double can and cannot tell:
- **The transport.** Every moto listener is plain HTTP on loopback. The world's endpoint
  (``AWS_ENDPOINT_URL``) stands for S3's HTTPS endpoint: botocore speaks HTTPS to S3 unless told not
  to, and rtui never is. A request is plain HTTP to the double only when it arrives on a listener
  from ``plain_http_listener`` (a second port on the same moto backends, marked by WSGI middleware
  with a key no client can send). It cannot check TLS versions (``s3:TlsVersion``).
- **The principal.** moto does not authenticate, so the double cannot tell who asks: a Deny with any
  Principal is applied to everyone (never kinder than S3; stricter for a Deny naming one principal,
  which rtui does not write).
- **Conditions** beyond ``Bool``/``Null`` (and their ``IfExists`` forms) are not evaluated: a policy
  using one answers 500 here, so the double is extended before such a policy is relied on.
"""

from __future__ import annotations

import fnmatch
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from moto.iam.access_control import PermissionResult
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from moto.s3.exceptions import BucketAccessDeniedError
from moto.s3.models import FakeBucket
from moto.s3.responses import S3Response
from werkzeug.serving import make_server

from tests.serving import serve_in_thread

Patch = Callable[[Any, str, Any], None]

# A WSGI environ key, not a header (headers arrive as HTTP_*): a client cannot claim a transport.
TRANSPORT_KEY = "rtui.s3.transport"
PLAIN = "plain-http"
# S3 authorises these moto operation names as other IAM actions (S3 API reference, HeadBucket and
# HeadObject, "Permissions").
_IAM_ACTION = {"HeadBucket": "ListBucket", "HeadObject": "GetObject"}

_request = threading.local()  # the transport of the request this server thread is answering


class UnevaluatedCondition(NotImplementedError):
    """A policy condition the double does not evaluate (see the module docstring)."""


def secure_transport() -> bool:
    return bool(getattr(_request, "secure", True))


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _matches(patterns: Any, value: str, *, fold: bool) -> bool:
    """IAM's wildcard match (``*`` any run, ``?`` one character); action names ignore case."""
    return any(fnmatch.fnmatchcase(value.lower() if fold else value, str(p).lower() if fold else str(p))
               for p in _listed(patterns))


def _condition_holds(operator: str, key_values: dict[str, Any], context: dict[str, str]) -> bool:
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    for key, wanted in key_values.items():
        present = key.lower() in context
        if base == "Null":  # "true": the key is absent
            if any(str(w).lower() == "true" for w in _listed(wanted)) == present:
                return False
            continue
        if base != "Bool":
            raise UnevaluatedCondition(f"the S3 double does not evaluate {operator} conditions")
        if not present:
            if if_exists:
                continue
            return False
        if context[key.lower()].lower() not in {str(w).lower() for w in _listed(wanted)}:
            return False
    return True


def denied(policy: str | bytes, action: str, resource: str, context: dict[str, str]) -> bool:
    """Whether an explicit Deny of ``policy`` applies to ``action`` on ``resource`` in ``context``."""
    document = json.loads(policy)
    context = {k.lower(): v for k, v in context.items()}
    for statement in _listed(document.get("Statement") or []):
        if statement.get("Effect") != "Deny":
            continue
        if "Action" in statement and not _matches(statement["Action"], action, fold=True):
            continue
        if "NotAction" in statement and _matches(statement["NotAction"], action, fold=True):
            continue
        if "Resource" in statement and not _matches(statement["Resource"], resource, fold=False):
            continue
        if "NotResource" in statement and _matches(statement["NotResource"], resource, fold=False):
            continue
        conditions = statement.get("Condition") or {}
        if all(_condition_holds(op, values, context) for op, values in conditions.items()):
            return True
    return False


def request_context() -> dict[str, str]:
    return {"aws:SecureTransport": "true" if secure_transport() else "false"}


def _setup_class(original: Callable[..., None]) -> Callable[..., None]:
    def setup_class(self: S3Response, request: Any, *args: Any, **kwargs: Any) -> None:
        environ = getattr(request, "environ", None) or {}
        _request.secure = environ.get(TRANSPORT_KEY) != PLAIN
        original(self, request, *args, **kwargs)

    return setup_class


def _authorize(original: Callable[..., None]) -> Callable[..., None]:
    def authorize(self: S3Response, bucket_name: str | None = None, key_name: str | None = None) -> None:
        if bucket_name:
            try:
                bucket = self.backend.get_bucket(bucket_name)
            except Exception:  # no such bucket: moto's own handler answers NoSuchBucket
                bucket = None
            if bucket is not None and bucket.policy:
                name = str(self.data.get("Action") or "")
                action = f"s3:{_IAM_ACTION.get(name, name)}"
                resource = f"arn:{bucket.partition}:s3:::{bucket_name}" + (f"/{key_name}" if key_name else "")
                if denied(bucket.policy, action, resource, request_context()):
                    raise BucketAccessDeniedError(bucket=bucket_name)
        original(self, bucket_name=bucket_name, key_name=key_name)

    return authorize


def _get_permission(self: FakeBucket, action: str, resource: str) -> PermissionResult:
    """moto's own check in its object handler, left out: it answers a bare 403 without S3's error body,
    before the operation is known. Every object operation is judged in ``_authorize`` instead (moto
    calls it for each one, with its action), and nothing is granted here: moto does not authenticate,
    so the bucket owner's IAM allows stand."""
    return PermissionResult.NEUTRAL


class _PlainHttp:
    """Marks every request of its listener as plain HTTP (``aws:SecureTransport`` false)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        environ[TRANSPORT_KEY] = PLAIN
        result: Iterable[bytes] = self.app(environ, start_response)
        return result


@contextmanager
def plain_http_listener() -> Iterator[str]:
    """A second listener on the same moto backends whose requests count as plain HTTP: its endpoint."""
    server = make_server("127.0.0.1", 0, _PlainHttp(DomainDispatcherApplication(create_backend_app)), threaded=True,
                         request_handler=MotoRequestHandler)
    thread = serve_in_thread(server, name="moto-plain-http")
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def install(patch: Patch) -> None:
    patch(S3Response, "setup_class", _setup_class(S3Response.setup_class))
    patch(S3Response, "_authenticate_and_authorize_s3_action",
          _authorize(S3Response._authenticate_and_authorize_s3_action))
    patch(FakeBucket, "get_permission", _get_permission)
