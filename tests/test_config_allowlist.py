"""Issue 33 item 1: a checkout's ./rtui.toml decides nothing that matters until the user confirms it.

A repository anyone can push to may carry a ``rtui.toml``. Before issue 33 only seven fields waited
for ``rtui config trust``; ``resume_from`` alone made every Ray worker unpickle the file's checkpoint
(``torch.load(weights_only=False)`` and DCP's ``.metadata`` are pickles: see the warning in
https://pytorch.org/docs/stable/generated/torch.load.html and torch.distributed.checkpoint's
FileSystemReader, which reads the metadata with ``pickle.load``). So the rule is turned around: the
file may set only the allowlisted knobs (each config model's ``free_fields``) without a confirmation; every
other field (``held_fields``, with why) is held. ``--config FILE`` follows the same rule unless the file lies
in the user's own config dir (the XDG dir rtui reads on its own).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backend.config import config_model, field_owners
from backend.errors import UserError
from backend.resolve import resolve_config
from targets.kube.config import KubeConfig

# For every field the file must not decide on its own: a value an attacker might choose, with the
# companions it needs to be valid (a kube-only field needs target = "kube", itself held).
HOSTILE: dict[str, dict[str, Any]] = {
    "target": {"target": "kube"},
    "cluster_name": {"cluster_name": "someone-elses"},
    "region": {"region": "eu-west-1"},
    "profile": {"profile": "production-admin"},
    "kubernetes_version": {"target": "aws", "kubernetes_version": "1.28"},
    "vpc_id": {"target": "aws", "vpc_id": "vpc-0abc12345def67890",
               "private_subnet_ids": "subnet-0abc1234,subnet-0def5678"},
    "private_subnet_ids": {"target": "aws", "vpc_id": "vpc-0abc12345def67890",
                           "private_subnet_ids": "subnet-0abc1234,subnet-0def5678"},
    "api_cidrs": {"target": "aws", "api_cidrs": "0.0.0.0/0"},
    "access_scope": {"target": "aws", "access_scope": "namespace"},
    "system_node_type": {"target": "aws", "system_node_type": "m7i.48xlarge"},
    "system_node_count": {"target": "aws", "system_node_count": 10},
    "gpu_node_type": {"target": "aws", "gpu_node_type": "p5.48xlarge"},
    "spot": {"target": "aws", "spot": True},
    "spot_fallback": {"target": "aws", "spot": True, "spot_fallback": "on-demand"},
    "spot_types": {"target": "aws", "spot": True, "spot_types": "g6.24xlarge"},
    "gpu_node_count": {"target": "aws", "gpu_node_count": 64},
    "namespace": {"target": "kube", "namespace": "kube-system"},
    "image": {"target": "kube", "image": "evil.example.com/ray:latest"},
    "kuberay_version": {"target": "kube", "kuberay_version": "1.0.0"},
    "ray_version": {"target": "kube", "ray_version": "2.9.0"},
    "nvidia_device_plugin_version": {"target": "aws", "nvidia_device_plugin_version": "0.9.0"},
    "efa_device_plugin_version": {"target": "aws", "efa_device_plugin_version": "0.3.0"},
    "allow_unpinned": {"target": "kube", "allow_unpinned": True},
    "addon_registry": {"target": "aws", "addon_registry": "evil.example.com/mirror"},
    "operator_scope": {"target": "kube", "operator_scope": "cluster"},
    "kuberay_crds": {"target": "kube", "kuberay_crds": "https://evil.example.com/crds/"},
    "kubeconfig": {"target": "kube", "kubeconfig": "./evil-kubeconfig"},
    "context": {"target": "kube", "context": "production"},
    "hf_token": {"target": "kube", "hf_token": "~/.aws/credentials"},
    "storage_size": {"target": "kube", "storage_size": "500Gi"},
    "service_account": {"target": "kube", "service_account": "s3-writer"},
    "model_id": {"target": "kube", "model_id": "attacker/poisoned-model"},
    "model_revision": {"target": "kube", "model_revision": "0123456789abcdef0123456789abcdef01234567"},
    "data": {"target": "kube", "data": "stolen.jsonl"},
    "tokenizer": {"target": "kube", "tokenizer": "attacker/tokenizer"},
    "storage_path": {"storage_path": "s3://attacker-bucket/loot"},
    "resume_from": {"resume_from": "/tmp/attacker/checkpoint"},
    "job_env": {"job_env": "MY_SETTING"},
    "local_worker_nodes": {"local_worker_nodes": 8},
    "local_dashboard_port": {"local_dashboard_port": 8265},
}


def _toml(values: dict[str, Any]) -> str:
    # JSON's strings, integers and booleans are TOML's too (for these plain ASCII values).
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items())


def _trust_here() -> None:
    """`rtui config trust` in the working directory, as the user would run it (in-process: 40 cases)."""
    from tui.cli import main

    assert main(["config", "trust"]) == 0


def test_every_config_field_is_classified_once() -> None:
    """A new config field fails here until its model puts it on the allowlist or holds it with a reason."""
    from backend.config import UNCLASSIFIED, held_fields

    unclassified = {f for f, reason in held_fields().items() if reason == UNCLASSIFIED}
    assert not unclassified, f"classify in its config model's free_fields or held_fields: {sorted(unclassified)}"
    for model in {config_model(name) for name in ("local", "kube", "aws")}:
        for klass in model.__mro__:
            free, held = vars(klass).get("free_fields", frozenset()), vars(klass).get("held_fields", {})
            declared = set(vars(klass).get("__annotations__", {}))
            assert not free & set(held), klass
            assert not (free | set(held)) - declared, f"{klass.__name__} classifies a field it does not declare"
    assert all(reason.strip() and "\n" not in reason for reason in held_fields().values())
    # Each held field has its attack below: the table grows with the classification.
    assert set(HOSTILE) == set(held_fields())


@pytest.mark.parametrize("field", sorted(HOSTILE))
def test_a_hostile_cwd_file_changes_nothing_until_confirmed(tmp_path: Path, field: str) -> None:
    values = HOSTILE[field]
    # The run is on a target that reads the field (the user's flag; the file's own target is the attack)
    owners = field_owners()[field]
    run_on = {} if field == "target" or "local" in owners else {"target": owners[-1]}
    (tmp_path / "stolen.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "rtui.toml").write_text(_toml(values) + "steps = 7\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    default = getattr(resolve_config(run_on, environ={}, cwd=elsewhere).config, field)

    with pytest.raises(UserError) as refused:  # what `plan`, `up`, `manifest`… resolve with
        resolve_config(run_on, environ={}, cwd=tmp_path)
    assert field in str(refused.value) and "rtui config trust" in str(refused.value)
    assert "\n" not in str(refused.value)
    withheld = resolve_config(run_on, environ={}, cwd=tmp_path, untrusted="withhold")  # the wizard's session
    assert getattr(withheld.config, field) == default
    assert field in withheld.unconfirmed
    assert withheld.config.steps == 7  # an allowlisted knob is taken as it is
    shown = resolve_config(run_on, environ={}, cwd=tmp_path, untrusted="show")  # `rtui config show`
    assert "not confirmed" in shown.sources[field]

    _trust_here()
    taken = resolve_config(run_on, environ={}, cwd=tmp_path)
    as_flags = resolve_config({**run_on, **values}, environ={}, cwd=tmp_path).config
    assert getattr(taken.config, field) == getattr(as_flags, field) != default
    assert "confirmed" in taken.sources[field] and not taken.unconfirmed


def test_an_explicit_config_file_outside_the_config_dir_is_held_too(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    ci = checkout / "ci.toml"
    ci.write_text('resume_from = "/tmp/attacker/checkpoint"\nsteps = 5\n')
    with pytest.raises(UserError, match=r"resume_from.*rtui config show --config .*rtui config trust --config"):
        resolve_config({}, config_file=str(ci), environ={}, cwd=tmp_path)
    withheld = resolve_config({}, config_file=str(ci), environ={}, cwd=tmp_path, untrusted="withhold")
    assert (withheld.config.resume_from, withheld.config.steps) == (None, 5)
    from tui.cli import main

    assert main(["config", "trust", "--config", str(ci)]) == 0
    assert resolve_config({}, config_file=str(ci), environ={}, cwd=tmp_path).config.resume_from == \
        "/tmp/attacker/checkpoint"


def test_a_file_in_the_users_own_config_dir_is_the_users_word(tmp_path: Path) -> None:
    """The XDG config dir (RTUI_CONFIG_DIR here, set by conftest) is the user's: read on its own or named."""
    own = tmp_path / "config"
    (own / "profiles").mkdir(parents=True)
    (own / "rtui.toml").write_text('target = "kube"\ncontext = "mine"\n')
    (own / "profiles" / "big.toml").write_text('resume_from = "/data/ckpt"\n')
    work = tmp_path / "work"
    work.mkdir()
    assert KubeConfig.of(resolve_config({}, environ={}, cwd=work).config).context == "mine"
    named = resolve_config({}, config_file=str(own / "profiles" / "big.toml"), environ={}, cwd=work)
    assert named.config.resume_from == "/data/ckpt" and not named.unconfirmed
    # Only inside it: a sibling whose name merely starts the same is not the config dir.
    lookalike = tmp_path / "config-evil.toml"
    lookalike.write_text('target = "kube"\n')
    with pytest.raises(UserError, match="target"):
        resolve_config({}, config_file=str(lookalike), environ={}, cwd=work)


def test_flags_and_environment_stay_the_users_own_words(tmp_path: Path) -> None:
    """RTUI_* and flags set held fields without any confirmation, and win over the file's values."""
    (tmp_path / "rtui.toml").write_text('resume_from = "/tmp/attacker/checkpoint"\ncontext = "attacker"\n')
    environ = {"RTUI_RESUME_FROM": "/data/mine", "RTUI_CONTEXT": "mine", "RTUI_TARGET": "kube",
               "RTUI_STORAGE_PATH": "s3://bucket/runs"}
    resolved = resolve_config({}, environ=environ, cwd=tmp_path)
    assert (resolved.config.resume_from, KubeConfig.of(resolved.config).context) == ("/data/mine", "mine")
    assert not resolved.unconfirmed
    flags = resolve_config({"target": "kube", "resume_from": "/data/flag", "context": "flag",
                            "storage_path": "s3://bucket/runs"}, environ={}, cwd=tmp_path).config
    assert (flags.resume_from, KubeConfig.of(flags).context) == ("/data/flag", "flag")
