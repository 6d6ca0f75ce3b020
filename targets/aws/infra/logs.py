"""The CloudWatch Logs group of the EKS control plane's logs, made by rtui so that it goes with the run.

With control-plane logging on (``cluster.CONTROL_PLANE_LOGS``), EKS writes into ``/aws/eks/<cluster>/
cluster``, making the group when it is not there, and keeps it when the cluster is deleted: the stored
logs bill until someone deletes it (EKS User Guide, "Send control plane logs to CloudWatch Logs").
rtui makes the group before the cluster, with the run's tags, so discovery finds it by tag and `down`
deletes it after the cluster. A group of that name rtui did not make (an earlier cluster of the same
name left it) is adopted: EKS writes into it, and rtui never deletes it. One EKS made untagged for this
run's own cluster (a run from before rtui made the group) is this run's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from backend.layers.base import Context
from backend.ledger import ResourceStatus
from backend.resources import Observed, Resource
from backend.runner import Progress
from targets.aws.config import aws_config
from targets.aws.infra.api import RUN_TAG, AwsApi, refuse_foreign, tags
from targets.aws.infra.common import EKS_CLUSTER, LAYER, AwsHandler
from targets.aws.infra.specs import LogGroupSpec

LOG_GROUP = "aws.log-group.cluster"
_NOT_FOUND = ("ResourceNotFoundException",)


def log_group_name(cluster: str) -> str:
    return f"/aws/eks/{cluster}/cluster"


async def find_group(api: AwsApi, name: str) -> tuple[str, dict[str, str], dict[str, Any]] | None:
    """The ARN, tags and description of the group of exactly this name (DescribeLogGroups matches a
    prefix); None if absent."""
    found = await api.pages("logs", "describe_log_groups", "logGroups", logGroupNamePrefix=name)
    group = next((g for g in found if g.get("logGroupName") == name), None)
    if group is None:
        return None
    # ListTagsForResource takes the group's ARN without the ":*" DescribeLogGroups' "arn" ends with.
    arn = group.get("logGroupArn") or str(group.get("arn", "")).removesuffix(":*")
    listed = await api.call("logs", "list_tags_for_resource", resourceArn=arn, ok=_NOT_FOUND)
    return arn, dict((listed or {}).get("tags") or {}), group


def owned_by_run(ctx: Context, group_tags: dict[str, str]) -> bool:
    """Whether the group is this run's: tagged with it, or untagged and EKS made it for the cluster this
    run made (never a group the ledger adopted)."""
    if RUN_TAG in group_tags:
        return group_tags[RUN_TAG] == ctx.record.run_id
    kept = ctx.ledger.get(LOG_GROUP)
    cluster = ctx.ledger.get(EKS_CLUSTER)
    return (kept is None or kept.status is not ResourceStatus.ADOPTED) and cluster is not None \
        and cluster.status is not ResourceStatus.ADOPTED


class LogGroupHandler(AwsHandler):
    kind = "aws-log-group"
    spec_model = LogGroupSpec
    title = "Create the control plane's log group"
    address = LOG_GROUP
    expected_s = 2.0

    async def observe(self, api: AwsApi, ctx: Context) -> list[Observed]:
        name = log_group_name(aws_config(ctx).cluster_name)
        found = await find_group(api, name)
        if found is None:
            return []
        _, group_tags, _ = found
        if RUN_TAG in group_tags and group_tags[RUN_TAG] != ctx.record.run_id:
            return []  # another run's: create refuses it
        ours = owned_by_run(ctx, group_tags)
        return [Observed(address=LOG_GROUP, layer=LAYER, kind=self.kind, id=name, state={"name": name},
                         adopted=not ours,
                         reason="exists" if ours else "exists, not made by this run: EKS writes into it, "
                                                      "rtui never deletes it")]

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        config = aws_config(ctx)
        api = self.api(ctx)
        name = LogGroupSpec.of(want).name
        made = await api.call("logs", "create_log_group", logGroupName=name,
                              tags=tags(ctx.record.run_id, config.cluster_name),
                              ok=("ResourceAlreadyExistsException",))
        found = await find_group(api, name) if made is None else None
        if found is not None:  # made meanwhile: by EKS for our cluster (it started first), or by someone else
            arn, group_tags, _ = found
            if RUN_TAG not in group_tags and owned_by_run(ctx, group_tags):
                await api.call("logs", "tag_resource", resourceArn=arn,
                               tags=tags(ctx.record.run_id, config.cluster_name))
            else:
                refuse_foreign("CloudWatch log group", name, group_tags, ctx.record.run_id)
        self.made(ctx, want, name)
        yield Progress(f"{name}: the control plane's logs go here, and go with the run", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        await self.api(ctx).call("logs", "delete_log_group", logGroupName=have.id, ok=_NOT_FOUND)
        yield Progress(f"{have.id} deleted", 1.0)
