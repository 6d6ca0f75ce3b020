"""The run's own S3 bucket on the aws target (issue 25): where checkpoints and the model go when the
user names no ``--storage-path``.

The bucket is private and tidy from the moment it exists: Block Public Access with all four
settings on, default encryption SSE-S3 (AES256), a bucket policy that denies every request made
without TLS (S3 takes plain HTTP unless a policy refuses it: "Security best practices for Amazon
S3", the ``aws:SecureTransport`` condition), versioning never enabled (a checkpoint rewritten
is not kept twice), a lifecycle rule that aborts multipart uploads left incomplete for a day (a
worker killed mid-upload leaves parts that bill like objects), and the run's tags. Its name is a
pure function of the account, region, cluster and run (S3 names are global to a partition), so
discovery finds it by name and trusts it only with this run's tag; a bucket of that name without
it is refused.

The job writes under ``s3://<bucket>/runs/<run id>/`` (``DATA_PREFIX``); the Ray pods reach it
through EKS Pod Identity with a policy scoped to that prefix (``data_policy``). ``down`` keeps a
bucket that holds data (its delete step says so, with the size and monthly cost, and the orphan
sweep reports it as kept on purpose), and deletes it when empty or when ``--delete-data`` was given
(``Context.delete_data``): then the objects go first, 1,000 keys a request.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

from backend.delivery import S3_STANDARD_PER_GIB_MONTH, human_bytes
from backend.errors import OperationError
from backend.layers.base import Context
from backend.ledger import ResourceStatus
from backend.resources import Action, Leftover, Observed, Resource
from backend.runner import Progress
from targets.aws.config import aws_config
from targets.aws.facts import aws_facts
from targets.aws.infra.api import RUN_TAG, AwsApi, partition, refuse_foreign, tags
from targets.aws.infra.common import LAYER, AwsHandler
from targets.aws.infra.specs import BucketSpec

BUCKET = "aws.s3-bucket.data"
KIND = "aws-s3-bucket"
DATA_PREFIX = "runs"
ABORT_INCOMPLETE_UPLOADS_DAYS = 1
LIFECYCLE_RULE = "rtui-abort-incomplete-multipart-uploads"
# Ray's pods take their AWS credentials from this service account (kube layer), and it from
# the pod identity association (iam.DATA_IDENTITY).
RAY_SERVICE_ACCOUNT = "rtui-ray"
RAY_WORKER_SERVICE_ACCOUNT = "rtui-ray-worker"  # the workers' own: no Kubernetes token, the same S3 rights
# What a pod of the run may do with its data: objects under the prefix, and listing only the prefix.
OBJECT_ACTIONS = ("s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:AbortMultipartUpload")
_GONE = ("NoSuchBucket",)
TLS_ONLY_SID = "DenyRequestsWithoutTls"
_BLOCK_ALL = {"BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
              "RestrictPublicBuckets": True}


def bucket_name(cluster: str, run_id: str, account: str, region: str) -> str:
    """``rtui-<cluster>-<run id>-<8 hex>``: 3-63 characters, lowercase letters, digits and '-', starting
    with a letter and ending with a hex digit, no dots (S3 User Guide, "General purpose bucket naming
    rules"). The hash of the account and region keeps it unique across accounts (bucket names are
    global to a partition) while the name still says whose run it is; a long cluster name is cut."""
    digest = hashlib.sha256(f"{account}/{region}/{cluster}/{run_id}".encode()).hexdigest()[:8]
    tail = f"-{run_id.lower()}-{digest}"
    return f"rtui-{cluster}"[: 63 - len(tail)].rstrip("-") + tail


def storage_uri(bucket: str) -> str:
    """The run's storage path in its own bucket (each run writes under ``<this>/<run id>/``)."""
    return f"s3://{bucket}/{DATA_PREFIX}"


def data_policy(bucket: str, prefix: str, partition_name: str) -> dict[str, Any]:
    """The Ray pods' inline policy: objects under ``prefix/`` of ``bucket`` and the listing of that
    prefix, nothing else (no ``s3:*``, no ``*`` resource).

    The listing's condition is ``StringLikeIfExists`` on ``s3:prefix``, not ``StringLike``: S3
    authorises HeadBucket (which pyarrow's ``create_dir``, and so Ray Train's storage setup, sends
    first) and the 404 of a missing key as ``s3:ListBucket`` *without* an ``s3:prefix`` key, and IAM
    finds a plain condition on an absent key false ("the values do not match"; only ``…IfExists``
    and ``Null`` differ: IAM User Guide, "Condition operators"). So a listing that names a prefix must
    stay in the run's; a request that names none (HeadBucket, a listing of the whole bucket) is
    allowed: on the run's own bucket that is this run's data only; on the user's ``--storage-path``
    bucket the pods can see the names (never the content) of its other keys.

    pyarrow's recursive ``create_dir`` (Arrow 26) also puts an empty "directory marker" object for
    every ancestor of the path, existing or not (``runs/``, then ``runs/<run id>/``, …): the pods may
    put exactly those keys above the prefix, nothing else there. And pyarrow's ``get_file_info`` of
    the prefix itself (``--resume-from latest`` looks there first) is a HeadObject of the key without
    its slash before it lists under it: the pods may read that one key too."""
    base = prefix.strip("/")
    objects = f"{base}/*" if base else "*"
    arn = f"arn:{partition_name}:s3:::{bucket}"
    listing: dict[str, Any] = {"Sid": "ListRunData", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": arn}
    statements: list[dict[str, Any]] = [
        {"Sid": "RunData", "Effect": "Allow", "Action": list(OBJECT_ACTIONS), "Resource": f"{arn}/{objects}"}, listing]
    if base:
        listing["Condition"] = {"StringLikeIfExists": {"s3:prefix": [f"{base}/*"]}}
        statements.append({"Sid": "RunPrefixItself", "Effect": "Allow", "Action": "s3:GetObject",
                           "Resource": f"{arn}/{base}"})
        parts = base.split("/")
        markers = [f"{arn}/{'/'.join(parts[:i])}/" for i in range(1, len(parts))]
        if markers:
            statements.append({"Sid": "DirectoryMarkers", "Effect": "Allow", "Action": "s3:PutObject",
                               "Resource": markers})
    return {"Version": "2012-10-17", "Statement": statements}


def tls_only_statement(bucket: str, partition_name: str) -> dict[str, Any]:
    """The bucket policy statement refusing every request that did not come over TLS, on the bucket and
    its objects, whoever asks: S3 sets ``aws:SecureTransport`` to false for a plain HTTP request (S3
    User Guide, "Security best practices for Amazon S3"; IAM User Guide, global condition keys). A
    Deny only: it grants nothing, so Block Public Access takes it, and `down` (over HTTPS) is not refused."""
    arn = f"arn:{partition_name}:s3:::{bucket}"
    return {"Sid": TLS_ONLY_SID, "Effect": "Deny", "Principal": "*", "Action": "s3:*",
            "Resource": [arn, f"{arn}/*"], "Condition": {"Bool": {"aws:SecureTransport": "false"}}}


def _statements(policy: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The statements of a GetBucketPolicy answer (none when the bucket has no policy)."""
    if not policy or not policy.get("Policy"):
        return []
    found = json.loads(str(policy["Policy"])).get("Statement") or []
    return [found] if isinstance(found, dict) else list(found)


async def name_for(api: AwsApi, ctx: Context) -> str:
    """The run's bucket name: from the record once settled, else from the account (STS)."""
    config = aws_config(ctx)
    if settled := aws_facts(ctx).data_bucket:
        return settled
    account = str((await api.identity())["Account"])
    return bucket_name(config.cluster_name, ctx.record.run_id, account, config.region)


async def _owner_tags(api: AwsApi, name: str) -> dict[str, str] | None:
    """The bucket's tags; None when no bucket has that name. A bucket this account may not read
    (another account's: HeadBucket answers 403, or 301 from its own region) is someone else's:
    ``{"": ""}``, which ``refuse_foreign`` refuses."""
    try:
        found = await api.call("s3", "head_bucket", Bucket=name, ok=("404", "NoSuchBucket"))
    except OperationError:
        return {"": ""}
    if found is None:
        return None
    answer = await api.call("s3", "get_bucket_tagging", Bucket=name, ok=("NoSuchTagSet", "NoSuchBucket"))
    return {t["Key"]: t["Value"] for t in (answer or {}).get("TagSet") or []}


async def _objects(api: AwsApi, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = await api.pages("s3", "list_objects_v2", "Contents", Bucket=name)
    return found


def describe_holding(objects: list[dict[str, Any]]) -> str:
    size = sum(int(o.get("Size") or 0) for o in objects)
    cost = size / 2**30 * S3_STANDARD_PER_GIB_MONTH
    money = f"${cost:,.2f}/month" if cost >= 0.01 or not cost else "under $0.01/month"
    return f"{len(objects):,} object{'s' * (len(objects) != 1)}, {human_bytes(size)}, {money}"


class BucketHandler(AwsHandler):
    kind = KIND
    spec_model = BucketSpec
    title = "Create the run's S3 bucket (private, encrypted)"
    delete_title = "Delete the run's S3 bucket (kept while it holds data)"
    updatable = True
    expected_s = 3.0

    @staticmethod
    def spec(name: str) -> BucketSpec:
        return BucketSpec(name=name, block_public_access=True, encryption="AES256", versioning="off",
                          abort_incomplete_uploads_days=ABORT_INCOMPLETE_UPLOADS_DAYS, tls_only=True)

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        # By name, also for a run whose record lost it (the name is the account's, the cluster's and the run's).
        name = await name_for(api, ctx)
        owner = await _owner_tags(api, name)
        if owner is None or owner.get(RUN_TAG) != ctx.record.run_id:
            return []  # none, or someone else's: create refuses it
        return [Observed(address=BUCKET, layer=LAYER, kind=self.kind, id=name, reason="exists",
                         state=await self._settings(api, name, aws_config(ctx).region))]

    async def _settings(self, api: AwsApi, name: str, region: str) -> dict[str, Any]:
        """What the bucket has of the spec's settings, in the spec's terms."""
        block = await api.call("s3", "get_public_access_block", Bucket=name,
                               ok=("NoSuchPublicAccessBlockConfiguration",))
        blocked = all((block or {}).get("PublicAccessBlockConfiguration", {}).get(k) for k in _BLOCK_ALL)
        encryption = await api.call("s3", "get_bucket_encryption", Bucket=name,
                                    ok=("ServerSideEncryptionConfigurationNotFoundError",))
        rules = ((encryption or {}).get("ServerSideEncryptionConfiguration") or {}).get("Rules") or []
        algorithm = next((r.get("ApplyServerSideEncryptionByDefault", {}).get("SSEAlgorithm") for r in rules), None)
        versioning = await api.call("s3", "get_bucket_versioning", Bucket=name)
        status = (versioning or {}).get("Status")
        lifecycle = await api.call("s3", "get_bucket_lifecycle_configuration", Bucket=name,
                                   ok=("NoSuchLifecycleConfiguration",))
        days = next((r.get("AbortIncompleteMultipartUpload", {}).get("DaysAfterInitiation")
                     for r in (lifecycle or {}).get("Rules") or []
                     if r.get("ID") == LIFECYCLE_RULE and r.get("Status") == "Enabled"), None)
        policy = await api.call("s3", "get_bucket_policy", Bucket=name, ok=("NoSuchBucketPolicy",))
        tls_only = tls_only_statement(name, partition(region).name) in _statements(policy)
        return {"name": name, "block_public_access": blocked, "encryption": algorithm,
                "versioning": "on" if status == "Enabled" else "off", "abort_incomplete_uploads_days": days,
                "tls_only": tls_only}

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        if have.healthy and have.state.get("name") != BucketSpec.of(want).name:
            return Action.REPLACE, "another name"
        return super().compare(want, have)

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = aws_config(ctx)
        api = self.api(ctx)
        name = BucketSpec.of(want).name
        region = config.region
        # us-east-1 takes no LocationConstraint (InvalidLocationConstraint); every other region needs its
        # own (IllegalLocationConstraintException): S3 API reference, CreateBucket.
        where: dict[str, Any] = {} if region == "us-east-1" else {
            "CreateBucketConfiguration": {"LocationConstraint": region}}
        # Looked for first: in us-east-1 S3 answers CreateBucket of a bucket this account already owns
        # with 200 OK (S3 API reference, CreateBucket: BucketAlreadyOwnedByYou is for the other regions),
        # so a 200 does not say the bucket is new, nor ours.
        owner = await _owner_tags(api, name)
        # Made, then a crash before its tags: HeadBucket answered (so it is this account's: another
        # account's bucket answers 403), it has no tags at all, and this run has called CreateBucket for
        # it before (counted in the record just before the call, below, after looking and finding none;
        # the ledger's entry starts afresh with each attempt, so it cannot say).
        ours_untagged = owner == {} and aws_facts(ctx).create_attempts.get(want.address, 0) > 0
        if owner is not None and owner.get(RUN_TAG) != ctx.record.run_id and not ours_untagged:
            refuse_foreign("S3 bucket", name, owner, ctx.record.run_id)
        if owner is None:
            attempts = aws_facts(ctx).create_attempts
            attempts[want.address] = attempts.get(want.address, 0) + 1
            ctx.save()  # before the call: a crash after it is healed above
            made = await api.call("s3", "create_bucket", Bucket=name,
                                  ok=("BucketAlreadyOwnedByYou", "BucketAlreadyExists"), **where)
            if made is None:  # made by someone else since we looked
                refuse_foreign("S3 bucket", name, {}, ctx.record.run_id)
        self.made(ctx, want, name)
        await api.call("s3", "put_bucket_tagging", Bucket=name, Tagging={"TagSet": [
            {"Key": k, "Value": v} for k, v in tags(ctx.record.run_id, config.cluster_name).items()]})
        async for p in self._configure(api, name, region, None):
            yield p

    async def update(self, ctx: Context, want: Resource, have: Observed) -> AsyncIterator[Progress]:
        async for p in self._configure(self.api(ctx), have.id, aws_config(ctx).region, have.state):
            yield p

    async def _configure(self, api: AwsApi, name: str, region: str,
                         have: dict[str, Any] | None) -> AsyncIterator[Progress]:
        """Each setting the bucket lacks (all of them on a new bucket), then one line saying what it has."""
        have = have or {}
        if have.get("block_public_access") is not True:
            await api.call("s3", "put_public_access_block", Bucket=name,
                           PublicAccessBlockConfiguration=dict(_BLOCK_ALL))
        if have.get("encryption") != "AES256":
            await api.call("s3", "put_bucket_encryption", Bucket=name, ServerSideEncryptionConfiguration={
                "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]})
        if have.get("versioning") == "on":  # a versioned bucket can only be suspended, never unversioned
            await api.call("s3", "put_bucket_versioning", Bucket=name,
                           VersioningConfiguration={"Status": "Suspended"})
        if have.get("abort_incomplete_uploads_days") != ABORT_INCOMPLETE_UPLOADS_DAYS:
            await api.call("s3", "put_bucket_lifecycle_configuration", Bucket=name, LifecycleConfiguration={
                "Rules": [{"ID": LIFECYCLE_RULE, "Status": "Enabled", "Filter": {"Prefix": ""},
                           "AbortIncompleteMultipartUpload": {
                               "DaysAfterInitiation": ABORT_INCOMPLETE_UPLOADS_DAYS}}]})
        if have.get("tls_only") is not True:
            # Ours added (or put back as it should be); any statement someone else put there stays.
            current = await api.call("s3", "get_bucket_policy", Bucket=name, ok=("NoSuchBucketPolicy",))
            others = [st for st in _statements(current) if st.get("Sid") != TLS_ONLY_SID]
            await api.call("s3", "put_bucket_policy", Bucket=name, Policy=json.dumps({
                "Version": "2012-10-17", "Statement": [tls_only_statement(name, partition(region).name), *others]}))
        yield Progress(f"{name}: public access blocked, HTTPS only, encrypted (SSE-S3), unversioned, incomplete "
                       f"uploads aborted after {ABORT_INCOMPLETE_UPLOADS_DAYS} day", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        name = have.id
        objects = await _objects(api, name)
        if objects and not ctx.delete_data:
            ctx.ledger.update(have.address, status=ResourceStatus.READY, outputs={"kept": describe_holding(objects)})
            yield Progress(f"kept: {name} holds data ({describe_holding(objects)}); "
                           f"`rtui down {ctx.record.run_id} --delete-data --yes` deletes it", 1.0)
            return
        if objects:
            yield Progress(f"deleting the run's data in {name} ({describe_holding(objects)})")
        # Every version and delete marker, not only the current objects: S3 refuses to delete a bucket
        # that holds any (BucketNotEmpty), and one someone turned versioning on for keeps old versions.
        versions = [*await api.pages("s3", "list_object_versions", "Versions", Bucket=name),
                    *await api.pages("s3", "list_object_versions", "DeleteMarkers", Bucket=name)]
        keys = [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in versions]
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            await api.call("s3", "delete_objects", Bucket=name, Delete={"Objects": keys[start:start + 1000],
                                                                        "Quiet": True})
        # Parts of uploads that never completed are not data: they would keep the bucket from going.
        uploads = await api.pages("s3", "list_multipart_uploads", "Uploads", Bucket=name)
        for upload in uploads:
            await api.call("s3", "abort_multipart_upload", Bucket=name, Key=upload["Key"],
                           UploadId=upload["UploadId"], ok=("NoSuchUpload",))
        await api.call("s3", "delete_bucket", Bucket=name, ok=_GONE)
        yield Progress(f"{name} deleted" + (f" with {describe_holding(objects)}" if objects else " (it was empty)"),
                       1.0)


async def kept_bucket(api: AwsApi, ctx: Context) -> list[Leftover]:
    """The orphan sweep's look at the run's bucket: one that holds data is kept on purpose (with its
    monthly cost), an empty one is a leftover."""
    name = await name_for(api, ctx)
    owner = await _owner_tags(api, name)
    if owner is None or owner.get(RUN_TAG) != ctx.record.run_id:
        return []
    objects = await _objects(api, name)
    if objects:
        return [Leftover("S3 bucket", name, f"kept on purpose: holds {describe_holding(objects)}", kept=True)]
    return [Leftover("S3 bucket", name, "empty")]
