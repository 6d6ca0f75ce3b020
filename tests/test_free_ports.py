"""The ports a local cluster's servers are told to bind, picked before they start (backend.procs.free_ports).

A port the kernel hands out itself (an outgoing connection's local port, a bind to port 0) comes from its
ephemeral range (Linux: net.ipv4.ip_local_port_range, ip(7)). A connected socket holds its local port
against every later bind of that port, SO_REUSEADDR or not (Linux inet_csk_bind_conflict; checked by
``test_an_outgoing_connection_holds_its_port_against_a_listener`` below). Ray binds some of the ports rtui
picks seconds after the pick (the dashboard agent's, under load tens of seconds): picked from the ephemeral
range, any connection the machine makes in between may take one, and that Ray process fails to start.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from backend.procs import ephemeral_range, free_ports


def test_an_outgoing_connection_holds_its_port_against_a_listener() -> None:
    """The kernel behaviour the pick avoids: a listener cannot bind a port a connection uses locally."""
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as client:
        taken = client.getsockname()[1]
        assert ephemeral_range()[0] <= taken <= ephemeral_range()[1]
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with pytest.raises(OSError):
                listener.bind(("127.0.0.1", taken))


def test_picked_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    for _ in range(20):
        ports = free_ports(11)
        assert len(set(ports)) == 11
        assert not [p for p in ports if low <= p <= high], (ports, (low, high))
        assert all(1024 <= p < 65536 for p in ports)
    # Free: each binds now.
    socks = []
    try:
        for port in free_ports(11):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", port))
    finally:
        for s in socks:
            s.close()


def test_a_port_in_use_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the pick narrowed to a few ports of which one is held, it is left out every time."""
    import backend.procs as procs

    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        monkeypatch.setattr(procs, "_listen_candidates", lambda: range(port, port + 8))
        for _ in range(10):
            assert port not in procs.free_ports(3)


@pytest.mark.parametrize(("log", "says"), [
    ("dashboard_agent.err", "OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 41234): "
                            "address already in use"),
    ("gcs_server.out", "[E] grpc_server.cc: Failed to bind port 127.0.0.1:6379"),
    ("raylet.out", "Raylet is terminated. Termination is unexpected."),
])
def test_a_bind_error_in_any_head_process_log_makes_the_start_worth_retrying(
        tmp_path: Path, log: str, says: str) -> None:
    """`ray start` says only that a process exited; the process's own log says why (Ray writes one per
    process under session_latest/logs). A port taken in between is worth a start with other ports."""
    from targets.local import cluster as lc
    from targets.local.layer import _a_ray_log_says_bind_failed

    cluster = lc.ClusterDir(tmp_path, "r20261206-bind0001", "bind", 0.0, {})
    logs = cluster.ray_dir / "session_latest" / "logs"
    assert not _a_ray_log_says_bind_failed(cluster)  # no logs yet
    logs.mkdir(parents=True)
    (logs / log).write_text("starting\n" + says + "\n")
    assert _a_ray_log_says_bind_failed(cluster) is ("bind" in says.lower())
