from __future__ import annotations

import pytest

from training.logparse import normalize

NCCL = "NCCL INFO Using network Libfabric"


@pytest.mark.parametrize(
    ("line", "host", "pid", "rank", "device"),
    [
        (f"node-1:123:456 [3] {NCCL}", "node-1", 123, None, 3),
        (f"\x1b[36m(RayTrainWorker pid=77, ip=10.0.1.5)\x1b[0m node-1:123:456 [0] {NCCL}",
         "node-1", 123, None, 0),
        (f"(RayTrainWorker pid=77, ip=10.0.1.5) {NCCL}", "10.0.1.5", 77, None, None),
        (f"(TrainController pid=9) {NCCL}", None, 9, None, None),
        (f"(pid=9) {NCCL}", None, 9, None, None),
        (f"(raylet, ip=10.0.0.2) {NCCL}", "10.0.0.2", None, None, None),
        (f"[1,13]<stdout>:nccl-tests-worker-1:38:69 [5] {NCCL}", "nccl-tests-worker-1", 38, 13, 5),
        (f"[default3]:host-a:1:2 [3] {NCCL}", "host-a", 1, 3, 3),
        (f"[rank7]:host-a:1:2 [7] {NCCL}", "host-a", 1, 7, 7),
        (f"[2] node0:13571:13571 [0] {NCCL}", "node0", 13571, 2, 0),
        (f"5: node0:11:12 [1] {NCCL}", "node0", 11, 5, 1),
        (f"2025-05-16T16:39:55.210-07:00ip-10-36-29-253:79:2547 [0] {NCCL}", "ip-10-36-29-253", 79, None, 0),
        (f"2026-01-26T07:53:00.671123456Z h:1:2 [0] {NCCL}", "h", 1, None, 0),
        (f"| 2025-05-16T16:39:55.210-07:00 | h:1:2 [0] {NCCL}", "h", 1, None, 0),
        (f"[2024-01-26 07:53:00,671] h:1:2 [0] {NCCL}", "h", 1, None, 0),
        (f"[pod/worker-abc/ray-worker] {NCCL}", "worker-abc", None, None, None),
        (f"    3767c65d25c4:880:887 [0] {NCCL}", "3767c65d25c4", 880, None, 0),
        (f"[0] {NCCL}", None, None, None, None),
    ],
)
def test_prefixes_are_stripped_and_kept_as_fields(line: str, host: str | None, pid: int | None,
                                                  rank: int | None, device: int | None) -> None:
    out = normalize(line)
    assert out.text.endswith(NCCL)
    assert out.text == NCCL or out.text == "[0] " + NCCL
    assert (out.host, out.pid, out.rank, out.device) == (host, pid, rank, device)


def test_bare_device_bracket_is_not_a_rank() -> None:
    out = normalize("[0] NCCL INFO Using network Socket")
    assert out.rank is None and out.text == "[0] NCCL INFO Using network Socket"


def test_ray_dedup_marker_is_removed_and_counted() -> None:
    out = normalize("(RayTrainWorker pid=1, ip=10.0.0.1) h:1:2 [0] NCCL INFO Connected all rings "
                    "[repeated 7x across cluster]")
    assert out.repeated == 7 and out.text == "NCCL INFO Connected all rings"


def test_parenthesised_text_is_not_a_ray_prefix() -> None:
    assert normalize("(found 4 nics) hello").text == "(found 4 nics) hello"


def test_ansi_everywhere_and_crlf() -> None:
    out = normalize("\x1b[1m\x1b[32mh:1:2 [0] \x1b[0mNCCL INFO x\x1b[0m\r\n")
    assert out.text == "NCCL INFO x" and out.host == "h"


def test_stacked_prefixes() -> None:
    line = ("2026-01-26T07:53:00Z [pod/w-1/c] \x1b[36m(RayTrainWorker pid=5, ip=10.0.0.9)\x1b[0m "
            "[rank3]:w-1:5:6 [3] NCCL INFO hi")
    out = normalize(line)
    fields = (out.text, out.host, out.pid, out.rank, out.actor)
    assert fields == ("NCCL INFO hi", "w-1", 5, 3, "RayTrainWorker")


def test_garbage_does_not_crash() -> None:
    for line in ("", "\x00\x01\xff", "[", "(", "[1,", "1:", "\x1b[", "[pod/", "((((((", "[[[[[[[[[[["):
        assert isinstance(normalize(line).text, str)


def test_colour_codes_that_lost_their_escape_byte() -> None:
    # Logs pasted into issues keep "[36m" without the escape byte, or spell it "ESC[36m".
    for line in (" [36m(RayWorkerVllm pid=5310) [0m [pod-name]:5310:5433 [7] NCCL INFO x [32m [repeated 6x "
                 "across cluster] [0m",
                 "ESC[36m(RayWorkerVllm pid=5310)ESC[0m [pod-name]:5310:5433 [7] NCCL INFO x"):
        out = normalize(line)
        assert (out.text, out.host, out.pid, out.actor) == ("NCCL INFO x", "[pod-name]", 5310, "RayWorkerVllm")
