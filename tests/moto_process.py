"""moto's server in a process of its own, over real HTTP on a free loopback port.

Its own process because moto's backends (and its authentication switch) are process-wide: a server
inside the test process would share them with every other moto test there.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def moto_server_process(start_timeout_s: float = 60.0) -> Iterator[str]:
    """Yields the server's endpoint once it answers; stops the server on the way out."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=2).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)
