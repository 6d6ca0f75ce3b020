"""`rtui check --target aws`: the region/AZ feasibility matrix, and the quota increase it may file."""

from __future__ import annotations

import sys
from typing import TextIO

from backend.errors import UserError
from targets.aws.config import AwsConfig


def feasibility(config: AwsConfig, *, regions: list[str] | None, all_regions: bool, request_quota: bool,
                yes: bool, as_json: bool, out: TextIO) -> int:
    # lazy: boto3 (~400 ms) only when the aws feasibility is asked for (`rtui check --target aws`)
    from targets.aws.cloud import check_command
    from targets.aws.infra.preflight_request import request_for

    request = request_for(config, regions=regions, all_regions=all_regions)
    if not request_quota:
        return check_command(request, as_json=as_json, stdout=out, stderr=sys.stderr)
    if not yes:
        raise UserError("--request-quota-increase files a request with AWS and needs --yes",
                        remedy="run `rtui check --target aws` first to see what is short")
    # lazy: boto3, as above, and only with --request-quota-increase
    from targets.aws.cloud.check_command import increase_quota_command

    return increase_quota_command(request, as_json=as_json, stdout=out, stderr=sys.stderr)
