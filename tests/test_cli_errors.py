"""Bad input gets one clear line and the right exit code; nothing is lost."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from backend.store import RunStatus, RunStore
from targets.local.config import LocalConfig
from tests.conftest import REPO, run_rtui


def assert_one_line(proc: subprocess.CompletedProcess[str], code: int, needle: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert err.count("\n") == 0, f"expected one line, got:\n{err}"
    assert err.startswith("rtui: ") and needle in err, err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["plan", "--target", "gcp"], "expected one of local, aws, kube"),
        (["plan", "--target", "kube", "--gpu-node-count", "-2"], "--gpu-node-count='-2'"),
        (["plan", "--gpu-node-count", "2"], "--gpu-node-count is a setting of the aws and kube targets"),
        (["plan", "--local-worker-nodes", "-1"], "--local-worker-nodes"),
        (["plan", "--config", "/nonexistent/rtui.toml"], "does not exist"),
        (["plan", "--storage-path", "ftp://host/dir"], "ftp:// is none of them"),
        (["plan", "--storage-path", "s3:/bucket/runs"], "a URI has two slashes after its scheme: s3://"),
        (["plan", "--storage-path", "s3://"], "no bucket named (expected s3://BUCKET/PREFIX)"),
        (["plan", "--storage-path", "s3://My_Bucket/runs"], "'My_Bucket' is not an S3 bucket name"),
        (["plan", "--export-every", "-1"], "--export-every='-1'"),
        (["up"], "needs --yes"),
        # By the default cluster name, `down` would stop another test's orphaned cluster.
        pytest.param(["down", "--yes"], "no runs yet", marks=pytest.mark.host_clusters),
        (["status", "r-nope"], "no run r-nope"),
        (["--resume"], "no runs to resume"),
        (["frobnicate"], "invalid choice"),
        (["plan", "--target", "kube", "--kubeconfig", "/nonexistent/kubeconfig"], "no kubeconfig found"),
        (["logs", "classify"], "no files to classify"),
        (["up", "--yes", "--until", "nowhere"], "--until 'nowhere' is neither an address nor a layer"),
        # Only the aws target makes GPU nodes to buy on Spot: elsewhere the flag is refused, not ignored.
        (["plan", "--target", "local", "--spot"], "--spot is a setting of the aws target; the local target has"),
        (["plan", "--target", "kube", "--spot"], "--spot is a setting of the aws target; the kube target has"),
        (["plan", "--target", "local", "--spot-fallback", "on-demand"], "--spot-fallback is a setting of the aws"),
        (["plan", "--target", "aws", "--spot-fallback", "on-demand"], "--spot-fallback on-demand: only with --spot"),
        (["plan", "--target", "aws", "--spot", "--spot-fallback", "spot"], "--spot-fallback"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    assert_one_line(run_rtui(*args), 2, needle)


def test_unknown_config_key_in_file(tmp_path: Path) -> None:
    (tmp_path / "rtui.toml").write_text("gpu_nodes = 2\n")
    assert_one_line(run_rtui("plan"), 2, "unknown config key 'gpu_nodes'")


def test_unwritable_state_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    proc = run_rtui("up", "--yes", env={"RTUI_STATE_DIR": str(blocker / "state")})
    assert_one_line(proc, 2, "not writable")


def test_port_already_taken() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run_rtui("up", "--yes", "--local-dashboard-port", str(port))
    assert_one_line(proc, 2, f"dashboard port {port} on 127.0.0.1 is already taken")


def test_second_up_while_one_runs_changes_nothing(isolated_env: Path) -> None:
    store = RunStore()
    rec = store.create(LocalConfig())
    rec.status = RunStatus.APPLYING
    store.save(rec)
    before = store.path_for(rec.run_id).read_bytes()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys,time; from backend.store import RunStore\nwith RunStore().lock(sys.argv[1]):\n"
         " print('held', flush=True); time.sleep(60)", rec.run_id],  # models time: lives until stopped
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        proc = run_rtui("up", "--yes")
        assert_one_line(proc, 1, f"run {rec.run_id} is in use by another rtui (pid {holder.pid})")
        assert store.path_for(rec.run_id).read_bytes() == before
    finally:
        holder.kill()
        holder.wait()


def test_corrupt_run_record(isolated_env: Path) -> None:
    store = RunStore()
    rec = store.create(LocalConfig())
    store.path_for(rec.run_id).write_text("{ torn")
    proc = run_rtui("status", rec.run_id)
    assert_one_line(proc, 1, f"run record {rec.run_id} is corrupt")
    assert store.path_for(rec.run_id).read_text() == "{ torn", "left where it is"
    listing = run_rtui("runs")
    assert listing.returncode == 0 and "no runs yet" in listing.stdout and "is corrupt" in listing.stderr
    assert run_rtui("runs", "--set-aside-corrupt").returncode == 0
    kept = list(store.corrupt_dir.iterdir())
    assert len(kept) == 1 and kept[0].read_text() == "{ torn"


def test_help_and_plan_work_without_any_state(isolated_env: Path) -> None:
    assert run_rtui("--help").returncode == 0
    proc = run_rtui("plan", "--json")
    assert proc.returncode == 0, proc.stderr
    assert not isolated_env.exists(), "plan must not write anything"


def test_resume_skips_runs_that_are_down(isolated_env: Path) -> None:
    store = RunStore()
    rec = store.create(LocalConfig())
    rec.status = RunStatus.DOWN
    store.save(rec)
    assert_one_line(run_rtui("--resume"), 2, f"no runs to resume (the latest, {rec.run_id}, is down)")
    assert_one_line(run_rtui("--resume", rec.run_id), 2, f"run {rec.run_id} is already down")


# --- the config file: anything that is not a readable UTF-8 regular file ---------------------

NOT_UTF8 = b'steps = 5\ncluster_name = "caf\xe9"\n'  # Latin-1, as an old editor saves it


def test_non_utf8_config_file_given_with_config(tmp_path: Path) -> None:
    (tmp_path / "latin1.toml").write_bytes(NOT_UTF8)
    assert_one_line(run_rtui("config", "show", "--config", "latin1.toml"), 2, "not UTF-8 text (byte 0xe9")


def test_non_utf8_config_file_found_in_the_current_dir(tmp_path: Path) -> None:
    (tmp_path / "rtui.toml").write_bytes(NOT_UTF8)
    assert_one_line(run_rtui("plan"), 2, "rtui.toml: not UTF-8 text")


def test_config_naming_a_directory_says_so(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    assert_one_line(run_rtui("plan", "--config", "conf.d"), 2, "config file 'conf.d' is a directory")


def test_config_naming_a_fifo_says_so_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.toml")  # nobody ever writes to it: opening it to read would block
    proc = run_rtui("plan", "--config", "pipe.toml", timeout=60)  # blocked, it would time out here
    assert_one_line(proc, 2, "config file 'pipe.toml' is a FIFO")


def test_a_directory_named_rtui_toml_is_not_silently_skipped(tmp_path: Path) -> None:
    (tmp_path / "rtui.toml").mkdir()
    assert_one_line(run_rtui("plan"), 2, "rtui.toml is a directory")


def test_an_empty_config_flag_is_not_the_current_directory() -> None:
    assert_one_line(run_rtui("plan", "--config", ""), 2, "--config is empty")


def test_a_config_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    (tmp_path / "rtui.toml").write_bytes(b"\xef\xbb\xbfsteps = 5\n")  # "UTF-8" as Notepad saves it
    proc = run_rtui("config", "show", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["config"]["steps"] == 5


# --- values: what is echoed, and numbers that are not numbers --------------------------------

LONG = "a" * 5000


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["plan", "--cluster-name", LONG], {}, "invalid --cluster-name='aaaa"),
        (["plan", "--target", LONG], {}, "expected one of local, aws, kube"),
        (["plan", "--data", LONG], {}, "no such file or directory"),
        (["plan", "--config", LONG], {}, "cannot be read: File name too long"),
        (["plan"], {"RTUI_IMAGE": "x", "RTUI_" + "X" * 5000: "1"}, "unknown environment variable"),
        ([LONG], {}, "invalid choice"),
        (["plan", "--shard", LONG], {}, "expected one of full, hybrid"),
    ],
)
def test_a_5000_character_value_is_not_echoed_in_full(args: list[str], env: dict[str, str], needle: str) -> None:
    proc = run_rtui(*args, env=env)
    assert_one_line(proc, 2, needle)
    assert len(proc.stderr) < 400, len(proc.stderr)
    assert "(5000 characters)" in proc.stderr or "…" in proc.stderr


def _float_fields() -> list[tuple[str, str]]:
    """(field, a target that reads it) for every float field of every target's config."""
    from backend.config import field_info, field_owners

    return [(name, owners[-1]) for name, owners in field_owners().items()
            if field_info(name).annotation in (float, float | None)]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999"])
@pytest.mark.parametrize(("field", "target"), _float_fields())
def test_non_finite_numbers_are_rejected_plainly(field: str, target: str, value: str) -> None:
    flag = "--" + field.replace("_", "-")
    # FLAG=VALUE: argparse reads a separate "-inf" as an option, not as the flag's value.
    proc = run_rtui("plan", "--target", target, f"{flag}={value}")
    assert_one_line(proc, 2, f"invalid {flag}='{value}' (from flag): Input should be a finite number")


def test_non_finite_number_in_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "rtui.toml").write_text("learning_rate = nan\n")  # TOML has nan and inf literals
    assert_one_line(run_rtui("plan"), 2, "invalid learning_rate=nan (from file:")


def test_bench_timeout_must_be_a_finite_number() -> None:
    # The taken port stops a bench that got past the parser before it starts anything.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = str(s.getsockname()[1])
        proc = run_rtui("bench", "fabric", "--yes", "--timeout", "nan", "--local-dashboard-port", port)
    assert_one_line(proc, 2, "argument --timeout: expected a finite number of seconds, got 'nan'")


def test_there_is_a_float_field_to_check() -> None:
    fields = dict(_float_fields())
    assert "learning_rate" in fields and fields.get("aws_timeout_s") == "aws"  # a common one, and a target's


# --- wizard options given to a command ----------------------------------------------------

@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--resume", "r-x", "plan"], "--resume is for the wizard, not `rtui plan`"),
        (["--resume", "r-x", "status"], "--resume is for the wizard, not `rtui status`"),
        (["--resume", "plan"], "--resume took 'plan' for a run id"),
        (["--read-only", "up", "--yes"], "--read-only is for the wizard, not `rtui up`"),
    ],
)
def test_wizard_options_with_a_command_are_refused(args: list[str], needle: str, isolated_env: Path) -> None:
    assert_one_line(run_rtui(*args), 2, needle)
    assert not isolated_env.exists(), "a refused command must not write anything"


@pytest.mark.parametrize("args", [[], ["--target", "aws"]])
def test_the_wizard_without_a_terminal_says_so_instead_of_waiting(args: list[str]) -> None:
    # run_rtui: stdin is /dev/null and stdout a pipe, as in a script or `rtui > out.txt`.
    proc = run_rtui(*args, timeout=60)  # waiting for a terminal, it would time out here
    assert_one_line(proc, 2, "the wizard needs a terminal")
