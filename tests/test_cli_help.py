"""`rtui --help` and each command's help, through the real binary: choices, defaults, placeholders."""

from __future__ import annotations

import re
from typing import get_args

import pytest

import targets
from backend.config import Precision, Transport, field_info, field_owners, flag_name
from tests.conftest import run_rtui
from tui.cli import build_parser, config_metavar


def help_of(*command: str) -> str:
    proc = run_rtui(*command, "--help", timeout=60)
    assert proc.returncode == 0, proc.stderr
    return re.sub(r"\s+", " ", proc.stdout)  # argparse wraps to the terminal: compare words, not lines


@pytest.mark.parametrize("command", [(), ("up",)], ids=["rtui", "up"])
def test_help_lists_choices_defaults_and_placeholders(command: tuple[str, ...]) -> None:
    text = help_of(*command)
    for flag, choices in (("--target", tuple(targets.BUILTIN)), ("--precision", get_args(Precision)),
                          ("--require-transport", get_args(Transport))):
        assert f"{flag} {{{','.join(choices)}}}" in text
        assert f"one of {', '.join(choices)}" in text
    assert "--shard {full,hybrid}" in text and "(default: full)" in text
    assert "(default: local)" in text and "(default: auto)" in text and "(default: rtui-ray)" in text
    assert "--gpus-per-node N GPUs per GPU node (default: 4)" in text
    assert "--region REGION AWS region (default: us-east-1)" in text
    assert "--cluster-name NAME" in text and "--gpu-node-count N" in text and "--compile [{true,false}]" in text
    assert "--system-node-type INSTANCE_TYPE" in text and "--local-dashboard-port PORT" in text
    for bad in ("NODE", "COUNT", "CLUSTER_NAME", "GPU_NODE_TYPE", "DASHBOARD_PORT"):
        assert f" {bad}" not in text, bad


def test_subcommand_only_flags_show_choices_and_defaults() -> None:
    logs = help_of("logs")
    assert "--source {job,head}" in logs and "(default: job)" in logs
    bench = help_of("bench", "ab")
    assert "--variant {efa,tcp,gloo}" in bench and "--timeout SECONDS" in bench and "(default: 900)" in bench
    token = help_of("token")
    assert "--cluster-name NAME" in token and "--region REGION" in token


def test_every_config_flag_has_a_placeholder_not_its_field_name() -> None:
    """Derived from the field's type and name: no upper-cased field name slips through for a new field."""
    for field in field_owners():
        metavar = config_metavar(field)
        words = field.split("_")
        if len(words) > 1 and field not in ("vpc_id",):
            assert metavar != field.upper(), field
        if field_info(field).annotation is int:
            assert metavar in ("N", "PORT"), (field, metavar)
    options = {a.option_strings[0]: a for a in build_parser()._actions if a.option_strings}
    assert all(options[flag_name(f)].help for f in field_owners())
