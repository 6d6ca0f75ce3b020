"""The AWS double a bench script runs against (bench/aws_up.py, bench/spot_cost.py): moto's server with
rtui's extensions and provisioning model, over real HTTP on loopback, and the caller's public address
answered here, never by the internet; the process's environment points boto3 (and rtui) at it."""

from __future__ import annotations

import os

from tests.aws.checkip import CHECKIP
from tests.aws.moto_ext import SCRIPT, ScriptedMotoServer, install
from tests.aws.moto_provision import install_provisioning


def serve_aws_double() -> ScriptedMotoServer:
    """Start the double and point this process at it; the caller stops the server it returns."""
    install()
    install_provisioning()
    server = ScriptedMotoServer(SCRIPT)
    server.start()
    CHECKIP.start()  # the caller's public address (the EKS API's default allow-list)
    host, port = server.get_host_and_port()
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_SESSION_TOKEN": "bench",
                       "AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_CONFIG_FILE": "/nonexistent",
                       "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "RTUI_CHECKIP_URL": CHECKIP.url})
    return server
