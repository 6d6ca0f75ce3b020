"""Where moto 5.2's S3 is kinder than S3 on what the run's bucket relies on (issue 25), made as strict.

- **Bucket names.** moto checks only the length (3-63). S3 answers ``InvalidBucketName`` (HTTP 400)
  for any name outside its rules: lowercase letters, digits, '.' and '-' only; a letter or digit
  first and last; no two adjacent periods; not an IP address; not starting ``xn--``, ``sthree-`` or
  ``amzn-s3-demo-``; not ending ``-s3alias``, ``--ol-s3``, ``.mrap``, ``--x-s3`` or ``--table-s3``.
  References: S3 User Guide, "General purpose bucket naming rules" (bucketnamingrules.html); the S3
  API reference's error list (InvalidBucketName: "The specified bucket is not valid.").

- **DeleteBucket of a bucket that is not empty.** S3 answers 409 ``BucketNotEmpty`` ("The bucket you
  tried to delete is not empty") until every object is gone, "including all object versions and
  delete markers" (S3 API reference, DeleteBucket; the error list, BucketNotEmpty). moto refuses a
  bucket with keys, versions or delete markers too, but deletes one that holds only the parts of an
  incomplete multipart upload. Whether a general purpose bucket refuses that is not in the API
  reference (AbortMultipartUpload says it of directory buckets: "you can't delete the bucket until
  all the in-progress multipart uploads are aborted or completed"; S3-compatible stores and user
  reports say it of theirs), and the parts are stored and billed until aborted (S3 User Guide,
  "Aborting a multipart upload"). The double refuses it: possibly stricter than S3 here, never
  kinder, so a product that leaves unfinished uploads behind fails here rather than there.

Checked and already as S3 answers, so left alone (the tests in tests/aws/test_run_bucket.py rely on
them): ``DeleteBucket`` on a bucket with objects, versions or delete markers is ``BucketNotEmpty``
(above); ``GetBucketLifecycleConfiguration`` without a
configuration is 404 ``NoSuchLifecycleConfiguration``, ``GetBucketTagging`` without tags 404
``NoSuchTagSet``, ``GetPublicAccessBlock`` without one 404 ``NoSuchPublicAccessBlockConfiguration``;
``CreateBucket`` with ``LocationConstraint: us-east-1`` is ``InvalidLocationConstraint`` and one in
another region without it ``IllegalLocationConstraintException``.

Bucket policies' explicit Deny (moto evaluated it only for objects, and wrongly) is evaluated with the
request's transport in ``tests/aws/moto_s3_policy.py`` (issue 33), installed from here.

Known and not copied (moto is stricter, not kinder, and rtui sets both itself): since 2023 S3 gives
every new bucket SSE-S3 encryption and all four Block Public Access settings by default (S3 User
Guide, "Setting default server-side encryption behavior", and the April 2023 Block Public Access
default), where moto reports neither until they are put.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

from moto.s3.exceptions import BucketNotEmpty, InvalidBucketName
from moto.s3.models import S3Backend

from tests.aws import moto_s3_policy

Patch = Callable[[Any, str, Any], None]

_CHARACTERS = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def valid_bucket_name(name: str) -> bool:
    """Whether S3 takes ``name`` for a general purpose bucket (the rules above)."""
    if not _CHARACTERS.fullmatch(name) or ".." in name:
        return False
    try:
        ipaddress.IPv4Address(name)
        return False
    except ValueError:
        pass
    return not name.startswith(_RESERVED_PREFIXES) and not name.endswith(_RESERVED_SUFFIXES)


def _strict_create_bucket(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_bucket(self: S3Backend, bucket_name: str, region_name: str, *args: Any, **kwargs: Any) -> Any:
        if not valid_bucket_name(bucket_name):
            raise InvalidBucketName()
        return original(self, bucket_name, region_name, *args, **kwargs)

    return create_bucket


def _strict_delete_bucket(original: Callable[..., Any]) -> Callable[..., Any]:
    def delete_bucket(self: S3Backend, bucket_name: str) -> Any:
        bucket = self.get_bucket(bucket_name)
        if any(versions for _, versions in bucket.keys.lists()) or bucket.multiparts:
            raise BucketNotEmpty(bucket_name=bucket_name)
        return original(self, bucket_name)

    return delete_bucket


def install(patch: Patch) -> None:
    moto_s3_policy.install(patch)  # bucket policies' explicit Deny, with the request's transport
    patch(S3Backend, "create_bucket", _strict_create_bucket(S3Backend.create_bucket))
    patch(S3Backend, "delete_bucket", _strict_delete_bucket(S3Backend.delete_bucket))
