"""Every S3 listing of the aws layer reads all its pages (issue 34, item 4).

S3 pages its listings by 1,000 keys with its own tokens, not ``NextToken``: ListObjectsV2 answers
``IsTruncated`` and ``NextContinuationToken`` (asked back as ``ContinuationToken``),
ListObjectVersions and ListMultipartUploads ``NextKeyMarker`` with ``NextVersionIdMarker`` /
``NextUploadIdMarker`` (S3 API Reference, each operation's response elements; botocore's
``data/s3/2006-03-01/paginators-1.json``). Reading only the first page understated what `down`
keeps and left `--delete-data` with a bucket that is not empty."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest

from targets.aws.infra.api import AwsApi
from tests.aws.conftest import World
from tests.aws.provision_world import REGION

KEYS = 1_001


@pytest.fixture
def api(world: World) -> Iterator[AwsApi]:
    made = AwsApi(REGION)
    yield made
    made.close()


@pytest.fixture
def full_bucket(world: World) -> str:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="rtui-pages-test")
    s3.put_bucket_versioning(Bucket="rtui-pages-test", VersioningConfiguration={"Status": "Enabled"})
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: s3.put_object(Bucket="rtui-pages-test", Key=f"runs/r/{i:05d}", Body=b"x"),
                      range(KEYS)))
    for i in range(3):
        s3.create_multipart_upload(Bucket="rtui-pages-test", Key=f"runs/r/part-{i:05d}")
    return "rtui-pages-test"


@pytest.mark.slow
async def test_every_page_of_a_listing_is_read(api: AwsApi, full_bucket: str) -> None:
    objects = await api.pages("s3", "list_objects_v2", "Contents", Bucket=full_bucket)
    assert len(objects) == KEYS
    versions = await api.pages("s3", "list_object_versions", "Versions", Bucket=full_bucket)
    assert len(versions) == KEYS
    uploads = await api.pages("s3", "list_multipart_uploads", "Uploads", Bucket=full_bucket, MaxUploads=2)
    assert len(uploads) == 3
