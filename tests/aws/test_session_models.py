"""Every AwsSession of a process reads botocore's service models once: a plan, a check and a re-plan
each make a session, and parsing the EC2 model anew cost each of them more CPU than their AWS calls
(py-spy: a third of a preflight's samples in botocore's JSON loader; on a loaded machine that CPU
ran inside the listing deadline). The models are botocore's own files, the same for every session;
what a session owns (profile, credentials, clients) stays its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.loaders import JSONFileLoader

from backend.errors import UserError
from targets.aws.session import AwsSession


@pytest.fixture(autouse=True)
def _credentials(moto_endpoint: str) -> None:
    """The test account's keys and endpoint (creating a client resolves credentials: never IMDS)."""


@pytest.fixture
def model_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = JSONFileLoader.load_file

    def counted(self: JSONFileLoader, file_path: str) -> Any:
        reads.append(file_path)
        return real(self, file_path)

    monkeypatch.setattr(JSONFileLoader, "load_file", counted)
    return reads


def ec2_model_reads(reads: list[str]) -> int:
    return sum(1 for path in reads if "/ec2/" in path and path.endswith("service-2"))


def test_a_second_session_does_not_parse_the_ec2_model_again(model_reads: list[str]) -> None:
    first, second = AwsSession(), AwsSession()
    first.client("ec2", "us-east-1")
    second.client("ec2", "eu-west-1")
    assert ec2_model_reads(model_reads) <= 1
    assert first.client("ec2", "us-east-1") is not second.client("ec2", "us-east-1")
    first.close()
    second.close()


def test_sessions_share_no_search_path_growth(model_reads: list[str]) -> None:
    sessions = [AwsSession() for _ in range(5)]
    loaders = {id(s._session._session.get_component("data_loader")) for s in sessions}
    assert len(loaders) == 1
    paths = sessions[0]._session._session.get_component("data_loader").search_paths
    assert len(paths) == len(set(paths)), paths  # boto3 adds its data dir to the loader it is given


def test_a_data_path_of_the_users_gets_a_loader_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_reads: list[str]) -> None:
    plain = AwsSession()
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    custom = AwsSession()
    loader = custom._session._session.get_component("data_loader")
    assert str(tmp_path) in loader.search_paths
    assert loader is not plain._session._session.get_component("data_loader")


def test_a_missing_profile_is_still_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("[profile other]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    with pytest.raises(UserError, match="AWS profile 'nope' not found"):
        AwsSession("nope")
