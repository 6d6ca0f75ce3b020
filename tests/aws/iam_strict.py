"""IAM policy evaluation as AWS does it, for the S3 requests the Ray pods make with their role's credentials.

moto 5.2 evaluates an identity policy only when its auth switch is on for the whole process, and then
passes a condition whose key is absent from the request (``moto/iam/policy_conditions.py``:
``verify_condition`` loops over the values it found, none, and answers True). IAM does the opposite:

- "If the key that you specify in a policy condition is not present in the request context, the
  values do not match and the condition is false. If the policy condition requires that the key is
  *not* matched, such as StringNotLike or ArnNotLike, and the right key is not present, the condition
  is true." Only the ``…IfExists`` operators (true when the key is absent) and ``Null`` (which tests
  presence) differ. (IAM User Guide, "IAM JSON policy elements: Condition operators", and "Condition
  with multiple context keys or values".)
- An explicit Deny in any policy wins; else an Allow in the identity policy or the bucket policy
  (same account) allows; else the request is implicitly denied. (IAM User Guide, "Policy evaluation
  logic".)

And S3 maps its REST calls to IAM actions with their own context (S3 User Guide, "Required
permissions for Amazon S3 API operations"; S3 API Reference, HeadBucket and HeadObject):

- HeadBucket is authorised as ``s3:ListBucket`` on the bucket, with **no** ``s3:prefix`` key: only a
  ListObjects(V2) request that names a ``prefix`` parameter (even empty) carries ``s3:prefix``.
- GetObject and HeadObject of a key that does not exist answer 404 only to a caller allowed
  ``s3:ListBucket`` on the bucket; to anyone else 403 AccessDenied.
- DeleteObjects (``POST ?delete``) needs ``s3:DeleteObject`` on each key; CreateMultipartUpload,
  UploadPart and CompleteMultipartUpload need ``s3:PutObject``; AbortMultipartUpload its own action;
  a copy needs ``s3:GetObject`` on the source too.

The double serves plain HTTP, where the real clients speak TLS: ``aws:SecureTransport`` is "true".
Only requests signed with credentials from STS AssumeRole (a pod's) are judged here; the product's own
calls (the test account's admin keys) go through as before.
"""

from __future__ import annotations

import fnmatch
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import parse_qsl, unquote

ACCOUNT = "123456789012"


class Decision(Enum):
    ALLOW = "allow"
    DENY = "explicit deny"
    IMPLICIT_DENY = "implicit deny"


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _like(pattern: str, value: str) -> bool:
    """IAM's wildcards: ``*`` any run of characters, ``?`` one character (no character classes)."""
    return re.fullmatch(".*".join(".".join(re.escape(p) for p in part.split("?")) for part in pattern.split("*")),
                        value, flags=re.DOTALL) is not None


_STRING_TESTS: dict[str, Callable[[str, str], bool]] = {
    "StringEquals": lambda want, got: want == got,
    "StringEqualsIgnoreCase": lambda want, got: want.lower() == got.lower(),
    "StringLike": _like,
    "ArnEquals": lambda want, got: want == got,
    "ArnLike": _like,
    "Bool": lambda want, got: want.lower() == got.lower(),
}
_NEGATED = {"StringNotEquals": "StringEquals", "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
            "StringNotLike": "StringLike", "ArnNotEquals": "ArnEquals", "ArnNotLike": "ArnLike"}


def condition_holds(operator: str, key: str, wanted: Any, context: Mapping[str, list[str]]) -> bool:
    """One operator on one key, as IAM evaluates it (the rules in this module's docstring)."""
    wants = [str(w) if not isinstance(w, bool) else str(w).lower() for w in _as_list(wanted)]
    values = context.get(key.lower())
    if operator == "Null":  # "true": the key must be absent; "false": present
        return (values is None) == (wants[0].lower() == "true")
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    qualifier, _, base = base.rpartition(":")
    if values is None:
        if if_exists:
            return True
        return base in _NEGATED  # a negated operator on an absent key is true; every other is false
    negated = base in _NEGATED
    test = _STRING_TESTS.get(_NEGATED.get(base, base))
    if test is None:
        raise NotImplementedError(f"condition operator {operator} is not modelled by this double")
    if qualifier == "ForAllValues":
        matched = all(any(test(w, v) for w in wants) for v in values)
    else:  # single-valued keys and ForAnyValue: any value matching any wanted value
        matched = any(test(w, v) for w in wants for v in values)
    return not matched if negated else matched


def _conditions_hold(conditions: Mapping[str, Mapping[str, Any]], context: Mapping[str, list[str]]) -> bool:
    return all(condition_holds(op, key, wanted, context)
               for op, keys in conditions.items() for key, wanted in keys.items())


def _matches_any(patterns: Any, value: str, *, case_sensitive: bool) -> bool:
    if case_sensitive:
        return any(_like(p, value) for p in _as_list(patterns))
    return any(fnmatch.fnmatchcase(value.lower(), p.lower()) for p in _as_list(patterns))


def _applies(statement: Mapping[str, Any], action: str, resource: str, principal: str | None,
             context: Mapping[str, list[str]]) -> bool:
    if "Action" in statement and not _matches_any(statement["Action"], action, case_sensitive=False):
        return False
    if "NotAction" in statement and _matches_any(statement["NotAction"], action, case_sensitive=False):
        return False
    if "Resource" in statement and not _matches_any(statement["Resource"], resource, case_sensitive=True):
        return False
    if "NotResource" in statement and _matches_any(statement["NotResource"], resource, case_sensitive=True):
        return False
    if principal is not None and "Principal" in statement:  # a resource policy
        who = statement["Principal"]
        names = _as_list(who.get("AWS", [])) if isinstance(who, dict) else _as_list(who)
        if "*" not in names and principal not in names:
            return False
    return _conditions_hold(statement.get("Condition") or {}, context)


def evaluate(identity: Iterable[Mapping[str, Any]], action: str, resource: str, context: Mapping[str, list[str]],
             *, resource_policy: Mapping[str, Any] | None = None, principal: str = "") -> Decision:
    """The decision for one request: identity policies and (same account) the bucket's policy."""
    judged: list[tuple[Mapping[str, Any], str | None]] = [
        (s, None) for doc in identity for s in _as_list(doc.get("Statement", []))]
    if resource_policy:
        judged += [(s, principal) for s in _as_list(resource_policy.get("Statement", []))]
    allowed = False
    for statement, who in judged:
        if not _applies(statement, action, resource, who, context):
            continue
        if statement.get("Effect") == "Deny":
            return Decision.DENY
        allowed = True
    return Decision.ALLOW if allowed else Decision.IMPLICIT_DENY


@dataclass(frozen=True)
class S3Request:
    """What S3 authorises for one REST call: (action, resource ARN, context) pairs, all needed."""

    bucket: str
    key: str
    checks: list[tuple[str, str, dict[str, list[str]]]] = field(default_factory=list)
    reads_key: bool = False  # GetObject/HeadObject: a missing key answers 404 or 403 (see the docstring)


def s3_request(method: str, path: str, query: str, headers: Mapping[str, str], body: bytes,
               partition: str = "aws") -> S3Request | None:
    """The authorisation a path-style S3 call needs; None for ListBuckets and calls on no bucket."""
    bucket, _, key = unquote(path.lstrip("/")).partition("/")
    if not bucket:
        return None
    params = dict(parse_qsl(query, keep_blank_values=True))
    bucket_arn = f"arn:{partition}:s3:::{bucket}"
    object_arn = f"{bucket_arn}/{key}"
    base: dict[str, list[str]] = {"aws:securetransport": ["true"]}
    request = S3Request(bucket, key)

    def need(action: str, arn: str, **extra: str) -> None:
        request.checks.append((action, arn, {**base, **{k.lower(): [v] for k, v in extra.items()}}))

    if not key:
        if method == "HEAD":
            need("s3:ListBucket", bucket_arn)  # HeadBucket: ListBucket with no s3:prefix key
        elif method == "GET" and "versions" in params:
            need("s3:ListBucketVersions", bucket_arn, **_listing_keys(params))
        elif method == "GET" and "uploads" in params:
            need("s3:ListBucketMultipartUploads", bucket_arn)
        elif method == "GET" and set(params) & {"location", "policy", "tagging", "versioning", "lifecycle",
                                                "encryption", "publicAccessBlock", "ownershipControls"}:
            sub = next(iter(set(params) & {"location", "policy", "tagging", "versioning", "lifecycle",
                                           "encryption", "publicAccessBlock", "ownershipControls"}))
            need(f"s3:GetBucket{sub[0].upper()}{sub[1:]}", bucket_arn)
        elif method == "GET":
            need("s3:ListBucket", bucket_arn, **_listing_keys(params))
        elif method == "POST" and "delete" in params:
            for name in _delete_keys(body):
                need("s3:DeleteObject", f"{bucket_arn}/{name}")
        elif method == "PUT":
            need("s3:CreateBucket" if not params else "s3:PutBucketConfiguration", bucket_arn)
        elif method == "DELETE":
            need("s3:DeleteBucket" if not params else "s3:DeleteBucketConfiguration", bucket_arn)
        else:
            need(f"s3:{method}Bucket", bucket_arn)
        return request
    if method in ("GET", "HEAD"):
        if "uploadId" in params:
            need("s3:ListMultipartUploadParts", object_arn)
        else:
            need("s3:GetObject", object_arn)
            return S3Request(bucket, key, request.checks, reads_key=True)
    elif method == "PUT":
        need("s3:PutObject", object_arn)
        source = headers.get("x-amz-copy-source")
        if source:
            need("s3:GetObject", f"arn:{partition}:s3:::{unquote(source.lstrip('/')).split('?', 1)[0]}")
    elif method == "POST":
        need("s3:PutObject", object_arn)  # CreateMultipartUpload, CompleteMultipartUpload
    elif method == "DELETE":
        need("s3:AbortMultipartUpload" if "uploadId" in params else "s3:DeleteObject", object_arn)
    return request


def _listing_keys(params: Mapping[str, str]) -> dict[str, str]:
    """The ``s3:prefix``/``s3:delimiter``/``s3:max-keys`` keys, present only when the request names them."""
    names = {"prefix": "s3:prefix", "delimiter": "s3:delimiter", "max-keys": "s3:max-keys"}
    return {names[p]: v for p, v in params.items() if p in names}


def _delete_keys(body: bytes) -> list[str]:
    root = ET.fromstring(body)
    return [el.text or "" for el in root.iter() if el.tag.rsplit("}", 1)[-1] == "Key"]


def access_denied(start_response: Any, message: str = "Access Denied") -> list[bytes]:
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
            f"<Message>{message}</Message></Error>").encode()
    start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
    return [body]


def role_policies(role_name: str) -> list[dict[str, Any]]:
    """The role's inline and attached policy documents, as moto's IAM holds them."""
    from moto.iam.models import iam_backends

    backend = iam_backends[ACCOUNT]["aws"]
    documents: list[dict[str, Any]] = []
    for name in backend.list_role_policies(role_name):
        _, text = backend.get_role_policy(role_name, name)
        documents.append(json.loads(unquote(text)) if isinstance(text, str) else dict(text))
    attached, _ = backend.list_attached_role_policies(role_name)
    for policy in attached:
        version = next(v for v in policy.versions if v.is_default)
        documents.append(json.loads(unquote(version.document)))
    return documents


def assumed_role(access_key_id: str) -> tuple[str, str] | None:
    """(role name, assumed-role ARN) of credentials minted by moto's STS AssumeRole, else None."""
    from moto.sts.models import sts_backends

    for assumed in sts_backends[ACCOUNT]["aws"].assumed_roles:
        if assumed.access_key_id == access_key_id:
            role = assumed.role_arn.split("/")[-1]
            return role, f"arn:aws:sts::{ACCOUNT}:assumed-role/{role}/{assumed.session_name}"
    return None


def bucket_state(bucket: str) -> tuple[dict[str, Any] | None, Callable[[str], bool]]:
    """The bucket's policy (None when it has none) and whether a key exists in it."""
    from moto.s3.models import s3_backends

    backend = s3_backends[ACCOUNT]["aws"]
    found = backend.buckets.get(bucket)
    if found is None:
        return None, lambda _key: False
    policy = json.loads(found.policy) if found.policy else None
    return policy, lambda key: key in found.keys


def authorise(environ: dict[str, Any], body: bytes) -> tuple[bool, str]:
    """Whether an S3 call signed by an assumed role's credentials may go on to moto, and why not."""
    found = re.search(r"Credential=([A-Z0-9]+)/", environ.get("HTTP_AUTHORIZATION", ""))
    role = assumed_role(found.group(1)) if found else None
    if role is None:
        return True, ""
    role_name, principal = role
    headers = {k[5:].replace("_", "-").lower(): str(v) for k, v in environ.items() if k.startswith("HTTP_")}
    request = s3_request(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", ""),
                         headers, body)
    if request is None:
        return True, ""
    identity = role_policies(role_name)
    policy, exists = bucket_state(request.bucket)
    for action, resource, context in request.checks:
        decision = evaluate(identity, action, resource, context, resource_policy=policy, principal=principal)
        if decision is not Decision.ALLOW:
            return False, f"{principal} is not authorized to perform {action} on {resource} ({decision.value})"
    if request.reads_key and not exists(request.key):
        listing = evaluate(identity, "s3:ListBucket", f"arn:aws:s3:::{request.bucket}",
                           {"aws:securetransport": ["true"]}, resource_policy=policy, principal=principal)
        if listing is not Decision.ALLOW:
            return False, f"{request.key} does not exist and {principal} may not list the bucket (S3 answers 403)"
    return True, ""
