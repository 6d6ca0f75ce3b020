"""Real NCCL excerpts from public sources (tests/telemetry/public_logs) for the three families of
issue 27: all ranks on one node, init-only fragments, libfabric providers that are not EFA.

Each goes through ``rtui logs classify --json`` (its command function) and must give the label
its MANIFEST gives, with a node estimate that says what it rests on.
"""

from __future__ import annotations

import hashlib
import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from backend.telemetry.classify import classify_command
from tests.telemetry.tel_support import HELD_OUT_MISSES
from training.logparse import classify_lines, iter_file_lines
from training.transport_guard import check_transport, enforce_transport, job_nodes, read_verdict
from tui.transport_badge import TransportSnapshot

LOGS = Path(__file__).parent / "public_logs"
ENTRIES: list[dict[str, Any]] = json.loads((LOGS / "MANIFEST.json").read_text())


def classify_json(path: Path) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    code = classify_command([str(path)], as_json=True, stdout=out, stdin=io.StringIO(""), stderr=err)
    assert code == 0 and err.getvalue() == ""
    record: dict[str, Any] = json.loads(out.getvalue())
    return record


def entry(prefix: str) -> dict[str, Any]:
    return next(e for e in ENTRIES if e["file"].startswith(prefix))


def _case(item: dict[str, Any]) -> Any:
    miss = HELD_OUT_MISSES.get(item["file"])
    marks = [pytest.mark.xfail(strict=True, reason="held-out miss: " + miss)] if miss else []
    return pytest.param(item, marks=marks, id=item["file"].removesuffix(".log"))


@pytest.mark.parametrize("item", [_case(e) for e in ENTRIES])
def test_public_log_is_read_as_its_manifest_says(item: dict[str, Any]) -> None:
    path = LOGS / item["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == item["sha256"], "the excerpt changed"
    record = classify_json(path)
    got = "efa" if record["transport"] == "efa_gdr" else record["transport"]
    assert got == item["expected_transport"], (record["reason"], record["decided_by"])
    assert record["nodes"] == item["expected_nodes"], record["nodes_basis"]
    assert (record["nodes_basis"] is None) == (record["nodes"] is None)
    if got == "unknown":
        assert record["basis"] is None


def test_the_held_out_batch_is_marked_and_its_misses_are_its_own() -> None:
    # Logs added after issue 39's rules carry their batch; only they may be listed as misses.
    held_out = [e for e in ENTRIES if e.get("added_after_rules")]
    assert len(held_out) >= 12 and all(e["batch"] == "issue39-heldout" for e in held_out)
    assert set(HELD_OUT_MISSES) <= {e["file"] for e in held_out}
    families = {e["family"] for e in held_out}
    assert {"efa-without-provider-line", "single-node", "socket-multi-node", "ib", "libfabric-not-efa"} <= families


def test_public_logs_are_not_in_the_held_out_set() -> None:
    shared = Path(__file__).resolve().parents[2] / ".." / "shared" / "nccl_logs" / "MANIFEST.json"
    if not shared.is_file():
        pytest.skip("../shared/nccl_logs is not here")
    held_out = {e["source_url"] for e in json.loads(shared.read_text())}
    assert not held_out & {e["source_url"] for e in ENTRIES}


def test_single_node_told_by_the_ranks_on_one_host() -> None:
    # Each of the 4 ranks of the ring prints its tree from eudoxus (4 processes there too).
    record = classify_json(LOGS / entry("pytorch75658")["file"])
    assert record["transport"] == "intra_node" and record["nodes"] == 1
    assert "eudoxus" in record["nodes_basis"] and "4-rank communicator" in record["nodes_basis"]


def test_graph_with_net_endpoints_is_not_a_single_node() -> None:
    record = classify_json(LOGS / entry("nccl1189")["file"])
    assert record["transport"] == "unknown" and record["nodes"] is None


def test_init_only_fragment_is_read_as_the_network_chosen_not_the_bootstrap_interface() -> None:
    record = classify_json(LOGS / entry("nvpeermem56")["file"])
    assert record["transport"] == "ib" and record["network"] == "IB"
    assert not any("different networks" in w for w in record["warnings"]), record["warnings"]
    assert not any("TCP" in w for w in record["warnings"]), record["warnings"]
    assert any("NET/IB : Using [0]mlx5_0:1/IB" in line for line in record["decided_by"])


def test_libfabric_without_provider_line_names_the_missing_evidence() -> None:
    record = classify_json(LOGS / entry("cscs_alps")["file"])
    assert record["transport"] == "unknown" and record["network"] == "AWS Libfabric"
    assert "Selected provider" in record["reason"] and "EFA cannot be told" in record["reason"]


def test_cxi_provider_is_not_efa() -> None:
    # Slingshot's cxi is none of the badge's transports (issue 39 follows the shared labels): unknown,
    # with the provider named.
    record = classify_json(LOGS / entry("determined169")["file"])
    assert record["transport"] == "unknown" and record["provider"] == "cxi"
    assert "'cxi' (HPE Slingshot)" in record["reason"] and "not EFA" in record["reason"]


def test_plugin_setup_on_an_ec2_platform_is_efa_evidence() -> None:
    # aws-ofi-nccl's AWS build forces the efa provider (platform-aws.cpp); no line names it yet.
    record = classify_json(LOGS / entry("awsofi715")["file"])
    assert record["transport"] == "efa" and record["basis"] == "announced"
    assert "AWS platform setup" in record["reason"]
    assert any("Setting provider_filter to efa" in line or "Configuring AWS-specific options" in line
               for line in record["decided_by"])


def test_the_job_node_count_decides_single_node() -> None:
    lines = list(iter_file_lines(LOGS / entry("cscs_alps")["file"]))
    alone = read_verdict(lines=lines, nodes=1)
    assert alone.transport == "intra_node" and alone.nodes == 1
    assert alone.nodes_basis is not None and "job" in alone.nodes_basis
    assert classify_lines(lines).transport == "unknown"


@pytest.mark.parametrize("prefix", ["pytorch75658", "nccl1358_one"])
def test_strict_mode_never_stops_a_single_node_job(prefix: str, tmp_path: Path) -> None:
    rank_file = tmp_path / "nccl.host.1.log"
    rank_file.write_bytes((LOGS / entry(prefix)["file"]).read_bytes())
    for required in ("efa", "socket", "ib"):
        verdict = enforce_transport(required, tmp_path, wait_s=0)
        assert verdict.transport == "intra_node"
        assert check_transport(required, verdict) is None


def test_strict_mode_passes_a_job_the_driver_knows_is_one_node(tmp_path: Path) -> None:
    (tmp_path / "nccl.host.1.log").write_bytes((LOGS / entry("cscs_alps")["file"]).read_bytes())
    with pytest.raises(SystemExit):
        enforce_transport("efa", tmp_path, wait_s=0)
    assert enforce_transport("efa", tmp_path, wait_s=0, nodes=1).transport == "intra_node"


def test_badge_says_no_network_is_used() -> None:
    verdict = classify_lines(iter_file_lines(LOGS / entry("pytorch75658")["file"]))
    assert TransportSnapshot.from_verdict(verdict).words == "INTRA-NODE (no network used)"


def test_job_node_count_from_torch_distributed_variables() -> None:
    assert job_nodes({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}) == 2
    assert job_nodes({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}) == 1
    assert job_nodes({"WORLD_SIZE": "4"}) is None and job_nodes({"WORLD_SIZE": "x", "LOCAL_WORLD_SIZE": "1"}) is None


def test_training_loop_passes_its_own_node_count_to_the_guard(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from training import loop
    from training.config import TrainConfig

    (tmp_path / "nccl.nid006352.34610.log").write_bytes((LOGS / entry("cscs_alps")["file"]).read_bytes())
    cfg = TrainConfig(device="cuda", require_transport="efa")
    monkeypatch.setenv("WORLD_SIZE", "4")  # all four ranks on this node: the network is not used
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    out = io.StringIO()
    with redirect_stdout(out):
        loop.enforce_transport(cfg, tmp_path)
    assert "intra_node (basis announced) passes (a single node uses no network)" in out.getvalue()


# -- the rules behind the families, each on the smallest set of lines that shows it -------------
def at(host: str, pid: int, text: str) -> str:
    return f"{host}:{pid}:{pid} [0] NCCL INFO {text}"


def test_an_initialised_net_never_gives_way_to_one_nccl_tries_later() -> None:
    ib = at("h", 1, "NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>")
    socket = at("h", 1, "NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:10.0.1.1<0>")
    plugin = at("h", 1, "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation")
    for order in ([plugin, ib, socket], [plugin, socket, ib]):
        assert classify_lines(order).network == "IB"
    # ... unless NCCL says otherwise, or NCCL_NET names the other one.
    assert classify_lines([plugin, ib, socket, at("h", 1, "Using network Socket")]).network == "Socket"
    forced = at("h", 1, "NCCL_NET set by environment to Socket")
    assert classify_lines([forced, plugin, ib, socket]).network == "Socket"


def test_graph_without_net_endpoints_is_one_node_and_with_them_is_not() -> None:
    local = [at("h", 1, "Using network Socket"), at("h", 1, " 0 : GPU/0 GPU/1 GPU/2 GPU/3")]
    verdict = classify_lines(local)
    assert (verdict.transport, verdict.nodes) == ("intra_node", 1) and "NET endpoint" in (verdict.nodes_basis or "")
    spans = [*local, at("h", 2, " 0 : NET/0 GPU/0 GPU/1 NET/0")]
    assert classify_lines(spans).transport == "socket"


def test_processes_on_one_host_fewer_than_the_ranks_are_no_proof() -> None:
    ring = at("h", 1, "Channel 00/02 :    0   1   2   3   4   5   6   7")
    lines = [ring, at("h", 1, "Using network IB"), at("h", 2, "Trees [0] 2/-1/-1->1->0")]
    verdict = classify_lines(lines)
    assert verdict.transport == "ib" and verdict.nodes is None


def test_live_telemetry_takes_the_node_count_the_job_states() -> None:
    from backend.telemetry import Telemetry
    from training.protocol import METRIC_TAG, format_record

    telemetry = Telemetry()
    telemetry.feed_lines(iter_file_lines(LOGS / entry("cscs_alps")["file"]))
    assert telemetry.transport.transport == "unknown"
    record = {"step": 1, "loss": 5.0, "step_time_s": 1.0, "world_size": 4, "nodes": 1, "ts": 1.0}
    telemetry.feed(f"(RayTrainWorker pid=7) {format_record(METRIC_TAG, record)}")
    verdict = telemetry.transport
    assert verdict.transport == "intra_node" and verdict.nodes_basis == "the job itself runs on 1 node"
    assert Telemetry(job_nodes=2).transport.nodes == 2


def test_processes_count_only_against_a_stated_communicator_size() -> None:
    # Four ranks' Trees lines on one host, but nothing states how many ranks the communicator has:
    # the other node's ranks may simply not be in the fragment.
    trees = [at("h", 10 + r, f"Trees [0] {r + 1}/-1/-1->{r}->{r - 1}") for r in range(4)]
    verdict = classify_lines([at("h", 10, "Using network IB"), *trees])
    assert verdict.transport == "ib" and verdict.nodes is None
    stated = [*trees, at("h", 10, "Channel 00/02 :    0   1   2   3"), at("h", 10, "Using network IB")]
    assert classify_lines(stated).transport == "intra_node"


def test_one_process_holding_every_rank_is_one_node() -> None:
    # nccl-tests -g 4: one process, a thread per GPU, each printing its own tree.
    lines = [f"h:798:{810 + r} [{r}] NCCL INFO Trees [0] {r + 1}/-1/-1->{r}->{r - 1}" for r in range(4)]
    lines += ["h:798:810 [0] NCCL INFO Channel 00/02 :    0   1   2   3", "h:798:810 [0] NCCL INFO Using network IB"]
    verdict = classify_lines(lines)
    assert verdict.transport == "intra_node" and "prints its tree" in (verdict.nodes_basis or "")
    assert classify_lines(lines[1:]).transport == "ib"  # rank 0's tree is not in the lines
