"""Issue 23 item 8 (local): nothing a local cluster listens on answers without the token.

A probe on loopback only: every listening socket of the cluster's processes gets an HTTP GET of
``/`` and ``/metrics`` without the token (a real local Ray cluster). A server that answers 200 gives
away something; 401/403, a refused connection or a non-HTTP server (gRPC) do not.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend.layers.local_cluster import find_clusters
from tests.conftest import json_lines
from tests.test_local_security import is_loopback, listening

pytestmark = pytest.mark.ray

# Data a server could give away: Prometheus metrics, the Jobs API, the cluster's state.
PROBES = ("/", "/metrics", "/api/jobs/", "/api/version", "/api/cluster_status", "/nodes?view=summary",
          "/api/v0/tasks")
# Public by Ray's design: the dashboard's index page (static; the page then asks for the token).
# Ray 2.58 dashboard/http_server_head.py lists it among public_exact_paths with /favicon.ico, the
# health checks and /static/; every API behind it needs the token.
PUBLIC = {("dashboard", "/")}


def answers_without_token(port: int, path: str) -> int | None:
    """The HTTP status a token-less GET gets, or None when the server speaks no HTTP/1.1."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def test_no_local_port_answers_without_the_token(tmp_path: Path) -> None:
    rtui = str(Path(sys.executable).parent / "rtui")
    env = {**os.environ, "RTUI_STATE_DIR": str(tmp_path / "state")}
    try:
        up = subprocess.run([rtui, "up", "--yes", "--json", "--steps", "1", "--cluster-name", "probe"], env=env,
                            capture_output=True, text=True, timeout=500)
        assert up.returncode == 0, up.stderr[-2000:]
        cluster = find_clusters(run_id=json_lines(up.stdout)[0]["data"]["run_id"])[0]
        names = {port: name for name, port in cluster.facts["ports"].items()}
        sockets = listening(cluster.path)
        assert sockets and all(is_loopback(ip) for ip, _, _ in sockets), sockets
        open_ = []
        for _, port, proc in sockets:
            for path in PROBES:
                status = answers_without_token(port, path)
                if status is not None and status < 400 and (names.get(port), path) not in PUBLIC:
                    open_.append((names.get(port, "?"), port, proc, path, status))
        print("answered without the token:", open_)
        assert not open_, f"answered without the token: {open_}"
    finally:
        subprocess.run([rtui, "down", "--yes", "--cluster-name", "probe"], env=env, capture_output=True, timeout=180)
