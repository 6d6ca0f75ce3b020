"""The Hugging Face Hub's model API on loopback (``HF_ENDPOINT``), as huggingface_hub meets it.

``GET /api/models/{namespace}/{name}/revision/{revision}`` (``HfApi.model_info``, huggingface_hub
``hf_api.py``) answers the model's info with ``sha``: the commit the branch or tag points at now, or
the commit itself when a full sha is asked. Failures as the real Hub sends them (huggingface_hub
``utils/_http.py`` ``hf_raise_for_status``, which reads ``X-Error-Code``): an unknown revision is 404
``RevisionNotFound``; an unknown model, and a private one asked without a token that can read it, is
401 ``RepoNotFound`` (the Hub does not tell them apart); a gated model's info is public (only its
files are gated). ``move`` points a branch at a new commit, as a push does.

Datasets (``datasets``: {id: {commit: {path: bytes}}}, ``dataset_refs``: {id: {branch: commit}}), as
huggingface_hub 2.x's ``HfApi`` and ``HfFileSystem`` read them (``hf_api.py``, ``hf_file_system.py``):
``GET /api/datasets/{id}/revision/{rev}`` (``dataset_info``: ``sha``, ``siblings``, the card's
``license`` in ``cardData`` and as a ``license:`` tag); ``GET /api/datasets/{id}/tree/{rev}[/{path}]``
(``list_repo_tree``; ``recursive``; the path percent-encoded whole) and ``POST
/api/datasets/{id}/paths-info/{rev}`` (form field ``paths``), answering ``{type, path, size, oid}``
entries, 404 ``EntryNotFound`` for a path not in that commit; ``GET /datasets/{id}/resolve/{rev}/{path}``
honouring ``Range`` (206), what ``HfFileSystemFile._fetch_range`` sends. A file exists only at the
commits that hold it: reading at an older commit gives that commit's bytes, never the branch head's.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from backend.hub import DEFAULT_DATASET
from tests.serving import serve_in_thread

DEFAULT_MODEL = "Qwen/Qwen2.5-1.5B"


def chat_parquet(conversations: int = 8, tag: str = "") -> bytes:
    """A Parquet file of ``messages`` records (a list of role/content structs, as the Hub's chat sets hold)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"messages": [{"role": "user", "content": f"question {i}{tag}"},
                          {"role": "assistant", "content": f"answer {i}{tag}"}]} for i in range(conversations)]
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


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
        self.datasets: dict[str, dict[str, dict[str, bytes]]] = {}
        self.dataset_refs: dict[str, dict[str, str]] = {}
        self.dataset_licence: dict[str, str] = {}
        # rtui's default dataset on GPU targets, as its card describes it (backend.hub.DEFAULT_DATASET).
        self.add_dataset(DEFAULT_DATASET.repo, {f"{DEFAULT_DATASET.path}/train_sft-00000-of-00001.parquet":
                                                chat_parquet(), "README.md": b"---\nlicense: apache-2.0\n---\n"},
                         licence=DEFAULT_DATASET.licence)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                return

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                auth = self.headers.get("Authorization")
                hub.requests.append((self.path, auth))
                if self.path.startswith(("/api/datasets/", "/datasets/")):
                    self._dataset("GET")
                    return
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

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
                hub.requests.append((self.path, self.headers.get("Authorization")))
                self._dataset("HEAD")

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                hub.requests.append((self.path, self.headers.get("Authorization")))
                self._dataset("POST")

            def _dataset(self, method: str) -> None:
                raw = urllib.parse.urlsplit(self.path)
                api = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/(revision|tree|paths-info)/([^/]+)(/.*)?", raw.path)
                files = re.fullmatch(r"/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", raw.path)
                match = api or files
                name = urllib.parse.unquote(match.group(1)) if match else ""
                ref = urllib.parse.unquote(match.group(3) if api else match.group(2)) if match else ""
                if not match or name not in hub.datasets:
                    self._error(401, "RepoNotFound", "Repository not found")
                    return
                commits = hub.datasets[name]
                sha = ref if ref in commits else hub.dataset_refs.get(name, {}).get(ref)
                if sha is None:
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {ref}")
                    return
                tree = commits[sha]
                if files is not None:
                    self._file(method, sha, tree.get(urllib.parse.unquote(files.group(3))))
                    return
                assert api is not None
                if api.group(2) == "revision":
                    licence = hub.dataset_licence.get(name, "")
                    self._json({"id": name, "sha": sha, "private": False, "gated": False,
                                "cardData": {"license": licence} if licence else {},
                                "tags": [f"license:{licence}"] if licence else [],
                                "siblings": [{"rfilename": f} for f in sorted(tree)]})
                    return
                if api.group(2) == "paths-info":
                    length = int(self.headers.get("Content-Length") or 0)
                    form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                    self._json([e for p in form.get("paths", []) if (e := self._entry(tree, p.strip("/")))])
                    return
                under = urllib.parse.unquote(api.group(4) or "").strip("/")
                recursive = urllib.parse.parse_qs(raw.query).get("recursive", [""])[0].lower() == "true"
                if under and self._entry(tree, under) is None:
                    self._error(404, "EntryNotFound", f"{under} does not exist at {sha}")
                    return
                names = {p for f in tree for p in self._parents(f) | {f}
                         if p.startswith(under + "/" if under else "")}
                if not recursive:
                    depth = under.count("/") + 1 if under else 0
                    names = {n for n in names if n.count("/") == depth}
                self._json([e for n in sorted(names) if (e := self._entry(tree, n))])

            @staticmethod
            def _parents(path: str) -> set[str]:
                parts = path.split("/")
                return {"/".join(parts[:i]) for i in range(1, len(parts))}

            def _entry(self, tree: dict[str, bytes], path: str) -> dict[str, Any] | None:
                if path in tree:
                    return {"type": "file", "path": path, "size": len(tree[path]),
                            "oid": hashlib.sha1(tree[path]).hexdigest()}  # noqa: S324 - git's blob id shape
                if any(f.startswith(path + "/") for f in tree):
                    return {"type": "directory", "path": path, "size": 0, "oid": commit(path)}
                return None

            def _file(self, method: str, sha: str, data: bytes | None) -> None:
                if data is None:
                    self._error(404, "EntryNotFound", "Entry not found")
                    return
                wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                last = len(data) - 1
                start, end = (int(wanted.group(1)), int(wanted.group(2) or last)) if wanted else (0, last)
                body = data[start:end + 1]
                self.send_response(206 if wanted else 200)
                self.send_header("X-Repo-Commit", sha)
                self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')  # noqa: S324
                self.send_header("Content-Length", str(len(body)))
                if wanted:
                    self.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/{len(data)}")
                self.end_headers()
                if method == "GET":
                    self.wfile.write(body)

            def _json(self, value: Any) -> None:
                body = json.dumps(value).encode()
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

    def add_dataset(self, name: str, files: dict[str, bytes], *, branch: str = "main", licence: str = "") -> str:
        """A commit of ``files`` (the whole tree at it) on ``branch``; its sha."""
        sha = commit(f"{name}:{len(self.datasets.get(name, {}))}")
        self.datasets.setdefault(name, {})[sha] = dict(files)
        self.dataset_refs.setdefault(name, {})[branch] = sha
        if licence:
            self.dataset_licence[name] = licence
        return sha

    def move(self, model: str, ref: str, to: str) -> None:
        self.models[model][ref] = to

    def __enter__(self) -> FakeHub:
        serve_in_thread(self._server, name="fake-hub")
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
