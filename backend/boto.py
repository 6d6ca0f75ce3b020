"""Every boto3 session rtui makes (the aws target's, and any target's s3:// storage's), on one loader of
botocore's service models per process.

Credentials come from the usual chain (explicit profile, ``AWS_PROFILE``, environment, SSO, instance
roles); ``AWS_ENDPOINT_URL`` and its per-service variants are honoured by botocore itself, so nothing
here knows or cares which endpoint it talks to.
"""

from __future__ import annotations

import threading

import boto3
import botocore.session
from botocore.loaders import Loader, create_loader

# botocore's service models, parsed once per process: each boto3 session otherwise parses the EC2
# model anew (~0.1 s of CPU, more than a preflight's own calls). Keyed by AWS_DATA_PATH (or a
# profile's data_path), the one setting that changes what the loader finds.
_LOADERS: dict[str | None, Loader] = {}
_LOADERS_LOCK = threading.Lock()


def boto3_session(profile: str | None = None, region: str | None = None) -> boto3.session.Session:
    """``boto3.Session(profile_name=profile, region_name=region)``, its own profile, credentials and
    clients, on the process's shared loader: what every boto3 session of rtui is made with."""
    core = botocore.session.Session(profile=profile)
    data_path = core.get_config_variable("data_path")  # reads the profile: ProfileNotFound here
    with _LOADERS_LOCK:
        loader = _LOADERS.get(data_path)
        shared = loader is not None
        if loader is None:
            loader = _LOADERS[data_path] = create_loader(data_path)
        core.register_component("data_loader", loader)
        paths = list(loader.search_paths)
        session = boto3.session.Session(botocore_session=core, region_name=region)
        if shared:  # boto3 appends its data dir to the loader it is given: once is enough
            loader.search_paths[:] = paths
    return session
