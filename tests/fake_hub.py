"""The Hugging Face Hub's model API on loopback (``HF_ENDPOINT``), as huggingface_hub meets it.

``GET /api/models/{namespace}/{name}/revision/{revision}`` (``HfApi.model_info``, huggingface_hub
``hf_api.py``) answers the model's info with ``sha``: the commit the branch or tag points at now, or
the commit itself when a full sha is asked. Failures as the real Hub sends them (huggingface_hub
``utils/_http.py`` ``hf_raise_for_status``, which reads ``X-Error-Code``): an unknown revision is 404
``RevisionNotFound``; an unknown model, and a private one asked without a token that can read it, is
401 ``RepoNotFound`` (the Hub does not tell them apart); a gated model's info is public (only its
files are gated). ``move`` points a branch at a new commit, as a push does.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_MODEL = "Qwen/Qwen2.5-1.5B"


def commit(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()  # noqa: S324 - a git commit id's shape, not security


class FakeHub:
    def __init__(self, models: dict[str, dict[str, str]] | None = None, *,
                 private: dict[str, str] | None = None) -> None:
        """``models``: {model id: {branch or tag: commit}}; ``private``: {model id: the token that reads it}."""
        self.models = models if models is not None else {DEFAULT_MODEL: {"main": commit("main-1"),
                                                                          "v1": commit("v1")}}
        self.private = private or {}
        self.requests: list[tuple[str, str | None]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                return

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                auth = self.headers.get("Authorization")
                hub.requests.append((self.path, auth))
                path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
                model, sep, revision = path.removeprefix("/api/models/").partition("/revision/")
                refs = hub.models.get(model)
                readable = model not in hub.private or auth == f"Bearer {hub.private[model]}"
                if not path.startswith("/api/models/") or not sep or refs is None or not readable:
                    self._error(401, "RepoNotFound", "Repository not found")
                    return
                sha = revision if revision in refs.values() else refs.get(revision)
                if sha is None:
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                    return
                body = json.dumps({"_id": hashlib.md5(model.encode()).hexdigest()[:24],  # noqa: S324
                                   "id": model, "modelId": model, "sha": sha, "private": model in hub.private,
                                   "gated": False, "siblings": [{"rfilename": "config.json"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _error(self, status: int, code: str, message: str) -> None:
                body = json.dumps({"error": message}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def move(self, model: str, ref: str, to: str) -> None:
        self.models[model][ref] = to

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
