"""moto's S3 over real HTTP for a test of the training program's own S3 use: ``AWS_ENDPOINT_URL`` and test
credentials in the environment (what boto3 and pyarrow's S3 filesystem both read), one bucket made."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


@contextmanager
def moto_s3(monkeypatch: pytest.MonkeyPatch, bucket: str) -> Iterator[Any]:  # boto3's clients are untyped
    """A boto3 S3 client of a fresh moto server that holds ``bucket``; the server stops on the way out."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for key, value in {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    try:
        yield client
    finally:
        server.stop()
