"""A resource's spec is typed by its kind (issue 38): the layer builds it as its handler's ``spec_model``,
the plan holds its JSON form, the handler reads it back checked, and a plan refuses a wanted spec its
handler could not read before anything is applied."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from backend.layers.ray_job import JobSpecSummary
from backend.planner import diff
from backend.resolve import resolve_config
from backend.resources import Resource
from backend.targets import get as target
from targets.aws.infra.specs import AddonSpec, LaunchTemplateSpec, NodegroupSpec
from targets.local.layer import HEAD, HeadSpec, LocalRay


def test_the_json_form_holds_the_fields_given_in_the_order_the_plan_shows() -> None:
    # An optional field left out stays out, so a plan compares with what an earlier run recorded.
    assert AddonSpec(name="coredns").as_spec() == {"name": "coredns"}
    assert AddonSpec(name="vpc-cni", configuration={"enableNetworkPolicy": "true"}).as_spec() == {
        "name": "vpc-cni", "configuration": {"enableNetworkPolicy": "true"}}
    system = LaunchTemplateSpec(volume_gb=80, imdsv2=True, imds_hop_limit=1)
    assert list(system.as_spec()) == ["volume_gb", "imdsv2", "imds_hop_limit"]
    gpu = LaunchTemplateSpec(efa=True, efa_interfaces=1, volume_gb=200, imdsv2=True, imds_hop_limit=1, reservation=None)
    assert list(gpu.as_spec()) == ["efa", "efa_interfaces", "volume_gb", "imdsv2", "imds_hop_limit", "reservation"]
    group = NodegroupSpec.model_validate({"instance_type": "g6.12xlarge", "size": 2, "min_size": 0, "max_size": 2,
                                          "azs": ["us-east-1a"], "ami_type": "AL2023_x86_64_NVIDIA", "labels": {},
                                          "launch_template": True})
    assert group.bounds() == (0, 2) and group.types() == ["g6.12xlarge"]


@pytest.mark.parametrize("name", ["local", "kube", "aws"])
def test_every_handler_of_a_built_in_target_declares_its_spec(name: str) -> None:
    config = resolve_config({"target": name}, environ={}).config
    handlers = [h for layer in target(name).stack(config).layers for h in layer.handlers.values()]
    assert handlers and [h.kind for h in handlers if h.spec_model is None] == []


def test_a_plan_refuses_a_spec_its_handler_cannot_read() -> None:
    config = resolve_config({"target": "local"}, environ={}).config
    stack = target("local").stack(config)
    wanted = Resource(address=HEAD, layer=LocalRay.name, kind="ray-head", spec={"cpus": "many"})
    with pytest.raises(ValidationError):
        diff(stack, [wanted], {})
    good = HeadSpec(cpus=2, object_store_mib=256, loopback=True, idle_stop_s=0)
    assert diff(stack, [wanted.model_copy(update={"spec": good.as_spec()})], {}).changes


def test_the_job_submitted_is_pinned_to_the_commits_the_plan_shows() -> None:
    shown = JobSpecSummary(entrypoint="python -m training.train", workers=2, spec_hash="h",
                           model_revision="0123abc (main)", data="fedcba9 · apache-2.0")
    assert shown.pinned(shown.model_revision) == "0123abc" and shown.pinned(shown.data) == "fedcba9"
    assert shown.pinned(None) is None
