"""Byte streams: partial lines, garbage, and a 2 GB stream without a newline in bounded memory."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator

import pytest

from backend.telemetry import Telemetry
from backend.telemetry.classify import classify_stream
from tests.telemetry.nccl_synth import run_log
from training.logparse.lines import LineSplitter, iter_stream_lines, iter_stream_marked, marked_lines

SOCKET_LINE = b"a:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
SOCKET_LINE_B = b"b:2:3 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via NET/Socket/0\n"


def test_splitter_counts_only_complete_lines() -> None:
    splitter = LineSplitter()
    assert splitter.push(b"one\ntw") == ["one"] and splitter.consumed == 4
    assert splitter.push(b"o\nthree") == ["two"] and splitter.consumed == 8
    assert splitter.pending_bytes == 5
    assert splitter.flush() == ["three"] and splitter.consumed == 13


def test_splitter_decodes_invalid_utf8_and_multibyte_across_chunks() -> None:
    data = "한국어 ✓\n".encode() + b"\xff\xfe bad\n"
    splitter = LineSplitter()
    out = [line for i in range(len(data)) for line in splitter.push(data[i : i + 1])]
    assert out == ["한국어 ✓", "\ufffd\ufffd bad"]


def test_overlong_line_is_dropped_with_memory_bounded() -> None:
    splitter = LineSplitter(max_line_bytes=1000)
    assert splitter.push(b"x" * 600) == [] and splitter.push(b"x" * 600) == []
    assert splitter.pending_bytes == 0 and splitter.dropped_lines == 1
    assert splitter.push(b"xxx\nok\n") == ["ok"] and splitter.consumed == 1200 + 7


def test_marked_lines_keeps_order_and_only_marked() -> None:
    block = b"a NCCL 1\nnoise\nRTUI_ 2\nboth NCCL RTUI_\n\nNCCL NCCL twice\nlast"
    assert marked_lines(block, (b"NCCL", b"RTUI_")) == ["a NCCL 1", "RTUI_ 2", "both NCCL RTUI_",
                                                         "NCCL NCCL twice"]


@pytest.mark.parametrize("seed", range(20))
def test_marked_lines_are_the_lines_a_plain_filter_keeps(seed: int) -> None:
    rng = random.Random(seed)
    pieces = [b"NCCL", b"RTUI_", b"NC", b"CL", b"\n", b"\n", b"\n", b"x" * 40, b"\xff\xfe", "✓".encode()]
    block = b"".join(rng.choices(pieces, k=rng.randrange(0, 400)))
    markers = rng.choice(((b"NCCL",), (b"NCCL", b"RTUI_"), (b"RTUI_", b"NCCL", b"CL")))
    plain = [line.decode("utf-8", "replace") for line in block.split(b"\n") if any(m in line for m in markers)]
    assert marked_lines(block, markers) == plain


def _blob(total: int, chunk: int) -> Iterator[bytes]:
    piece = (bytes(range(256)).replace(b"\n", b"?") * (chunk // 256 + 1))[:chunk]
    sent = 0
    while sent < total:
        yield piece
        sent += len(piece)


def test_two_gigabytes_without_newline_stays_bounded() -> None:
    telemetry = Telemetry()
    tracemalloc.start()
    for chunk in _blob(2 * 1024**3, 4 * 1024**2):
        telemetry.feed_bytes(chunk)
    telemetry.feed_bytes(b"\n" + SOCKET_LINE + SOCKET_LINE_B)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 16 * 1024**2, f"peak {peak} bytes"
    assert telemetry._live.dropped_lines == 1
    assert telemetry.transport.transport == "socket"


def test_binary_garbage_stream() -> None:
    garbage = os.urandom(1 << 20) + b"\nNCCL\x00 via NET/\xff\n" + SOCKET_LINE + SOCKET_LINE_B
    assert classify_stream(io.BytesIO(garbage)).transport == "socket"
    assert list(iter_stream_lines(io.BytesIO(b""))) == []
    assert list(iter_stream_marked(io.BytesIO(b"x NCCL y"), (b"NCCL",))) == ["x NCCL y"]


def test_classify_reads_a_pipe_in_bounded_memory() -> None:
    """256 MiB of newline-free output through a real pipe, then evidence: rss stays small."""
    code = (
        "import sys\n"
        "from backend.telemetry.classify import classify_command\n"
        "rc = classify_command(['-'], as_json=True, stdout=sys.stdout, stdin=sys.stdin)\n"
        # VmHWM is this process's own peak; ru_maxrss would inherit the (large) pytest parent's across exec.
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
        "print(hwm)\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            cwd=os.getcwd())
    assert proc.stdin is not None
    for chunk in _blob(256 * 1024**2, 1024**2):
        proc.stdin.write(chunk)
    proc.stdin.write(b"\n" + SOCKET_LINE + SOCKET_LINE_B)
    proc.stdin.close()
    assert proc.stdout is not None
    out = proc.stdout.read().decode().splitlines()
    assert proc.wait(timeout=120) == 0
    assert '"transport": "socket"' in out[0]
    assert int(out[1]) < 200 * 1024  # KiB: the interpreter plus a few MiB, never the 256 MiB


@pytest.mark.parametrize("seed", range(25))
def test_splitter_in_random_cuts_keeps_every_line_within_the_limit(seed: int) -> None:
    rng = random.Random(seed)
    lines = [b"y%d" % i + b"y" * rng.choice((0, 1, 5, 80, 300, 2500, 9000)) for i in range(rng.randrange(1, 300))]
    data = b"\n".join(lines) + rng.choice((b"\n", b"", b"\ntail"))
    splitter = LineSplitter(max_line_bytes=1000)
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        chunk = data[pos : pos + rng.choice((1, 7, 64, 999, 4096))]
        pos += len(chunk)
        out += [line.encode() for line in splitter.push(chunk)]
        # Every byte pushed is either handed out, thrown away (both counted) or held: none lost.
        assert splitter.consumed + splitter.pending_bytes == pos
    out += [line.encode() for line in splitter.flush()]
    assert splitter.consumed == len(data) and splitter.pending_bytes == 0
    everything = data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n")
    # A line over the limit still comes through whole when its newline arrives before what is
    # held of it passes the limit, so only past the limit plus one chunk is it always dropped.
    assert [line for line in everything if len(line) <= 1000] == [line for line in out if len(line) <= 1000]
    assert all(line in everything for line in out)
    assert not any(len(line) > 1000 + 4096 for line in out)
    assert len(everything) - len(out) == splitter.dropped_lines


def test_live_bytes_in_any_chunking_give_what_the_lines_give() -> None:
    data = "".join(line + "\n" for line in run_log(3000, metric_every=7)).encode()
    whole = Telemetry()
    whole.feed_lines(data.decode().splitlines())
    for size in (1, 113, 4096, 1 << 18):
        live = Telemetry()
        for at in range(0, len(data), size):
            live.feed_bytes(data[at : at + size])
        assert live.lines == whole.lines == 3000
        assert live.series.records == whole.series.records and live.transport == whole.transport


def test_live_badge_moves_from_announced_to_channels_and_to_a_fallback() -> None:
    telemetry = Telemetry()
    ray = "(RayTrainWorker pid=11, ip=10.0.1.11) "
    telemetry.feed_bytes((ray + "w0:11:12 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 1 "
                          "nics)\n" + ray + "w0:11:12 [0] NCCL INFO Using network Libfabric\n" + ray
                          + "w0:11:12 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 "
                            "MNNVL 0\n" + ray + "w0:11:12 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [rec").encode())
    state = telemetry.snapshot(tail=0).transport.model_dump()
    assert (state["transport"], state["basis"]) == ("efa", "announced")
    telemetry.feed_bytes(b"eive] via NET/Libfabric/0/GDRDMA\n")
    state = telemetry.snapshot(tail=0).transport.model_dump()
    assert (state["transport"], state["basis"]) == ("efa_gdr", "channels") and state["decided_by"]
    # A worker that joins later fails to bring up the OFI plugin and falls back to TCP.
    ray_b = "(RayTrainWorker pid=21, ip=10.0.1.12) "
    telemetry.feed_bytes((ray_b + "w1:21:22 [0] nccl_net_ofi_create_plugin:1067 NCCL WARN NET/OFI aws-ofi-nccl "
                          "initialization failed\n" + ray_b + "w1:21:22 [0] NCCL INFO Using network Socket\n").encode())
    state = telemetry.snapshot(tail=0).transport.model_dump()
    assert state["transport"] == "efa_gdr" and state["hosts"] == {"w0": "efa_gdr", "w1": "socket"}
    assert any("failed to initialise" in w for w in state["warnings"])
    assert any("w1 announced 'Socket' (socket), unlike the channels seen" in w for w in state["warnings"])
    telemetry.feed_bytes((ray_b + "w1:21:22 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [receive] via "
                          "NET/Socket/0\n").encode())
    state = telemetry.snapshot(tail=0).transport.model_dump()
    assert (state["transport"], state["basis"]) == ("socket", "channels")
    assert any("mixed transports" in w for w in state["warnings"])
