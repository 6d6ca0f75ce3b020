from __future__ import annotations

from pathlib import Path

import pytest

from backend.config import RunConfig, config_for, env_name, field_owners, flag_name
from backend.errors import UserError
from backend.resolve import resolve_config
from targets.aws.config import AwsConfig
from targets.kube.config import KubeConfig
from targets.local.config import LocalConfig
from tests.conftest import json_lines, run_rtui


def test_defaults_match_the_reference() -> None:
    assert resolve_config({}, environ={}).config.target == "local"
    cfg = AwsConfig.of(resolve_config({"target": "aws"}, environ={}).config)
    assert (cfg.gpu_node_type, cfg.gpu_node_count, cfg.gpus_per_node) == ("g6.12xlarge", 2, 4)
    assert (cfg.system_node_type, cfg.system_node_count) == ("m7i.xlarge", 1)
    assert cfg.image == "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
    assert resolve_config({}, environ={}).config.effective_model_id() is None  # locally: the tiny model
    assert resolve_config({"target": "aws"}, environ={}).config.effective_model_id() == "Qwen/Qwen2.5-1.5B"


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    (tmp_path / "rtui.toml").write_text('steps = 7\nregion = "eu-west-1"\nseq_len = 64\n')
    resolved = resolve_config({"target": "aws", "steps": "9"}, environ={"RTUI_REGION": "us-west-2"}, cwd=tmp_path)
    cfg, src = AwsConfig.of(resolved.config), resolved.sources
    assert (cfg.steps, src["steps"]) == (9, "flag")
    assert (cfg.region, src["region"]) == ("us-west-2", "env")
    assert (cfg.seq_len, src["seq_len"]) == (64, f"file:{tmp_path / 'rtui.toml'}")
    assert (cfg.namespace, src["namespace"]) == ("rtui", "default")


def test_xdg_config_file_used_when_cwd_has_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg_dir = tmp_path / "xdg"
    cfg_dir.mkdir()
    (cfg_dir / "rtui.toml").write_text("steps = 3\n")
    monkeypatch.setenv("RTUI_CONFIG_DIR", str(cfg_dir))
    work = tmp_path / "work"
    work.mkdir()
    assert resolve_config({}, environ={}, cwd=work).config.steps == 3
    # steps: a field a checkout's file sets without confirmation (tests/test_config_allowlist.py)
    (work / "rtui.toml").write_text("steps = 5\n")
    assert resolve_config({}, environ={}, cwd=work).config.steps == 5


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        ({"target": "gcp"}, "--target='gcp'"),
        ({"target": "kube", "gpu_node_count": "-1"}, "--gpu-node-count='-1'"),
        ({"steps": "many"}, "--steps='many'"),
        ({"cluster_name": "Bad_Name"}, "--cluster-name"),
        ({"target": "aws", "region": "mars-1"}, "--region"),
    ],
)
def test_bad_values_name_field_value_and_what_is_accepted(flags: dict[str, str], needle: str) -> None:
    with pytest.raises(UserError) as info:
        resolve_config(flags, environ={})
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_target_error_lists_accepted_values() -> None:
    with pytest.raises(UserError, match="expected one of local, aws, kube"):
        resolve_config({"target": "gcp"}, environ={})


def test_unknown_file_key_and_env_typo(tmp_path: Path) -> None:
    (tmp_path / "rtui.toml").write_text("stepz = 3\n")
    with pytest.raises(UserError, match="unknown config key 'stepz'"):
        resolve_config({}, environ={}, cwd=tmp_path)
    with pytest.raises(UserError, match="RTUI_STEPZ"):
        resolve_config({}, environ={"RTUI_STEPZ": "3"}, cwd=tmp_path / "nowhere")


def test_missing_and_invalid_config_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        resolve_config({}, config_file=str(tmp_path / "missing.toml"), environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = = 3")
    with pytest.raises(UserError, match="not valid TOML"):
        resolve_config({}, config_file=str(bad), environ={})


def test_every_field_has_a_flag_and_an_env_name() -> None:
    from tui.cli import build_parser

    help_text = build_parser().format_help()
    owners = field_owners()
    for field in owners:
        assert flag_name(field) in help_text
        assert env_name(field) == "RTUI_" + field.upper()
    every = {f for model in (LocalConfig, KubeConfig, AwsConfig) for f in model.model_fields}
    assert every == set(owners) and set(RunConfig.model_fields) <= set(LocalConfig.model_fields)


def test_auto_values_depend_on_target() -> None:
    local = resolve_config({}, environ={}).config
    aws = resolve_config({"target": "aws"}, environ={}).config
    assert (local.effective_workers(), local.effective_batch_size(), local.effective_precision()) == (2, 32, "fp32")
    assert (aws.effective_workers(), aws.effective_precision()) == (8, "bf16")
    # GPU clusters: the largest micro-batch the L4's memory fits (tests/training/test_gpu_defaults.py), at 1024
    assert aws.effective_batch_size() > 1 and (local.effective_seq_len(), aws.effective_seq_len()) == (128, 1024)


def test_config_show_json_reports_sources(tmp_path: Path) -> None:
    (tmp_path / "rtui.toml").write_text("steps = 11\n")
    proc = run_rtui("config", "show", "--json", "--target", "aws", "--seq-len", "32", env={"RTUI_REGION": "ap-south-1"})
    assert proc.returncode == 0, proc.stderr
    data = json_lines(proc.stdout)[0]
    assert data["config"]["steps"] == 11 and data["sources"]["steps"].startswith("file:")
    assert data["config"]["seq_len"] == 32 and data["sources"]["seq_len"] == "flag"
    assert data["config"]["region"] == "ap-south-1" and data["sources"]["region"] == "env"
    human = run_rtui("config", "show").stdout
    assert "steps" in human and "file:" in human


def _show_rows(*args: str) -> dict[str, list[str]]:
    proc = run_rtui("config", "show", *args)
    assert proc.returncode == 0, proc.stderr
    return {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()}


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("local", {"seq_len": "128", "num_workers": "2", "precision": '"fp32"', "require_transport": '"any"'}),
        ("aws", {"seq_len": "1024", "num_workers": "8", "precision": '"bf16"', "require_transport": '"efa"'}),
    ],
)
def test_config_show_prints_what_auto_resolves_to_on_the_target(target: str, expected: dict[str, str]) -> None:
    rows = _show_rows("--target", target)
    expected = {**expected, "batch_size": str(config_for(target).effective_batch_size())}
    for field, value in expected.items():
        assert rows[field] == [value, "auto", "on", target, "(default)"], (field, rows[field])


def test_config_show_leaves_values_that_were_set_alone() -> None:
    rows = _show_rows("--batch-size", "4", "--num-workers", "3", "--precision", "bf16")
    assert rows["batch_size"] == ["4", "flag"] and rows["num_workers"] == ["3", "flag"]
    assert rows["precision"] == ['"bf16"', "flag"]
    # Asked for auto by name: still resolved, and the source says who asked.
    assert _show_rows("--precision", "auto")["precision"] == ['"fp32"', "auto", "on", "local", "(flag)"]


def test_config_show_json_carries_raw_and_effective_values() -> None:
    proc = run_rtui("config", "show", "--json", "--target", "aws", "--gpu-node-count", "3", "--batch-size", "2")
    assert proc.returncode == 0, proc.stderr
    data = json_lines(proc.stdout)[0]
    assert data["config"]["num_workers"] == 0 and data["effective"]["num_workers"] == 12
    assert data["config"]["precision"] == "auto" and data["effective"]["precision"] == "bf16"
    assert data["config"]["batch_size"] == data["effective"]["batch_size"] == 2
    assert data["auto"] == ["learning_rate", "num_workers", "precision", "require_transport", "seq_len"]
    assert data["effective"].keys() == data["config"].keys()


def test_every_float_field_rejects_non_finite_values() -> None:
    floats = [f for f, info in RunConfig.model_fields.items() if info.annotation in (float, float | None)]
    assert floats
    for field in floats:
        for value in ("nan", "inf", float("nan"), float("-inf")):
            with pytest.raises(UserError, match="finite number"):
                resolve_config({field: value}, environ={})


def test_a_config_dir_that_is_a_file_is_just_absent(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("")
    proc = run_rtui("config", "show", "--json", env={"RTUI_CONFIG_DIR": str(tmp_path / "not-a-dir")})
    assert proc.returncode == 0, proc.stderr
    assert json_lines(proc.stdout)[0]["config_file"] is None


@pytest.mark.parametrize("target", ["local", "kube", "aws"])
def test_config_show_is_what_the_job_runs_with_and_only_the_targets_fields(target: str) -> None:
    """`rtui config show` prints the values the job is submitted with (issue 21, item 3)."""
    import shlex

    from backend.jobspec import build_job_spec

    rows = _show_rows("--target", target)
    config = resolve_config({"target": target}, environ={}).config
    args = shlex.split(build_job_spec(config).entrypoint)
    submitted = {flag: args[args.index(flag) + 1] for flag in ("--lr", "--batch-size", "--precision", "--num-workers")}
    assert float(rows["learning_rate"][0]) == float(submitted["--lr"]) > 0
    assert rows["learning_rate"][1:] == ["auto", "on", target, "(default)"]
    assert rows["batch_size"][0] == submitted["--batch-size"] and rows["num_workers"][0] == submitted["--num-workers"]
    assert rows["precision"][0] == f'"{submitted["--precision"]}"'
    aws_only, kube_only, local_only = {"region", "vpc_id", "system_node_type"}, {"kubeconfig", "context"}, \
        {"local_cpus", "local_hidden_size"}
    shown_fields = set(rows)
    assert shown_fields >= {"target", "steps", "seq_len"}
    assert (aws_only <= shown_fields) is (target == "aws") and not (aws_only & shown_fields and target != "aws")
    # The aws target's config builds on the kube target's (the kube layer is theirs both).
    assert (kube_only <= shown_fields) is (target != "local") and not (kube_only & shown_fields and target == "local")
    assert (local_only <= shown_fields) is (target == "local") and not (local_only & shown_fields and target != "local")
    assert ("namespace" in shown_fields) is (target != "local")


@pytest.mark.parametrize(("field", "flag_value", "needle"), [
    ("storage_size", "50Gi", "--storage-size is a volume in a kube cluster; the aws target keeps the run's data in S3"),
    ("service_account", "s3-writer", "--service-account is for the kube target"),
    ("context", "kind-dev", "--context picks a cluster of your kubeconfig for the kube target"),
])
def test_a_kube_setting_the_aws_target_does_not_take_is_the_kube_targets_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, flag_value: str, needle: str) -> None:
    """The aws config builds on the kube one and inherits these; the aws target does not take them. So
    they are the kube target's settings alone (its help group), a flag of them on aws is refused in the
    aws target's own words, and one rtui.toml serving both targets has its value left out on aws."""
    assert field_owners()[field] == ("kube",)
    with pytest.raises(UserError) as refused:
        resolve_config({"target": "aws", field: flag_value}, environ={})
    assert needle in refused.value.message
    own = tmp_path / "xdg"  # the user's own file: nothing in it waits for a confirmation
    own.mkdir()
    (own / "rtui.toml").write_text(f'{field} = "{flag_value}"\n')
    monkeypatch.setenv("RTUI_CONFIG_DIR", str(own))
    resolved = resolve_config({"target": "aws"}, environ={}, cwd=tmp_path)
    assert getattr(resolved.config, field) in ("", None)
    assert "not used by the aws target" in resolved.sources[field]
    kube = resolve_config({"target": "kube"}, environ={}, cwd=tmp_path)
    assert getattr(kube.config, field) == flag_value
