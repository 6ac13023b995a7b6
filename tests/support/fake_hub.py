"""A loopback stand-in for the Hugging Face hub: the routes huggingface_hub's snapshot_download
calls (the revision info and tree APIs, the resolve route), the headers it reads from them, and
the error answers (X-Error-Code) it turns into typed errors. Nothing leaves 127.0.0.1."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]]  # commit -> {path in the repository: bytes}
    refs: dict[str, str]  # branch or tag -> commit
    gated: bool = False  # the info and tree answer; every file is refused (401 GatedRepo)


@dataclass
class FakeHub:
    repos: dict[str, Repo]
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of every request

    def start(self) -> "FakeHub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub.answer(self, body=False)

            def do_GET(self):
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def fetched(self) -> set[str]:
        """The repository files whose bytes were asked for (GET on the resolve route)."""
        return {m.group("file") for method, path in self.requests if method == "GET"
                for m in [_RESOLVE.match(path)] if m}

    def answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = urlsplit(handler.path).path
        self.requests.append((handler.command, path))
        api, resolve = _API.match(path), _RESOLVE.match(path)
        found = api or resolve
        if found is None:
            return _send(handler, 404, {}, b"", body)
        repo = self.repos.get(found.group("repo"))
        if repo is None:  # the hub's answer for a missing (or private) repository
            return _send(handler, 401, {"X-Error-Code": "RepoNotFound"}, b'{"error": "Repository not found"}', body)
        revision = unquote(found.group("rev"))
        commit = revision if revision in repo.commits else repo.refs.get(revision)
        if commit is None:
            return _send(handler, 404, {"X-Error-Code": "RevisionNotFound"}, b'{"error": "Invalid rev id"}', body)
        files = repo.commits[commit]
        if api and api.group("kind") == "revision":
            info = {"id": found.group("repo"), "sha": commit, "private": False, "gated": repo.gated and "manual",
                    "siblings": [{"rfilename": name} for name in sorted(files)]}
            return _send(handler, 200, {"Content-Type": "application/json"}, json.dumps(info).encode(), body)
        if api:
            tree = [{"type": "file", "path": name, "size": len(data), "oid": _oid(data)}
                    for name, data in sorted(files.items())]
            return _send(handler, 200, {"Content-Type": "application/json"}, json.dumps(tree).encode(), body)
        if repo.gated:
            return _send(handler, 401, {"X-Error-Code": "GatedRepo"}, b'{"error": "Access to this repo is restricted"}',
                         body)
        name = unquote(resolve.group("file"))
        if name not in files:
            return _send(handler, 404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit}, b"", body)
        data = files[name]
        _send(handler, 200, {"X-Repo-Commit": commit, "ETag": f'"{_oid(data)}"',
                             "Content-Type": "application/octet-stream"}, data, body)


_REPO = r"(?P<repo>[\w.-]+(?:/[\w.-]+)?)"
_API = re.compile(rf"^/api/models/{_REPO}/(?P<kind>revision|tree)/(?P<rev>[^/]+)$")
_RESOLVE = re.compile(rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


def _oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id


def _send(handler, status: int, headers: dict, data: bytes, body: bool) -> None:
    handler.send_response(status)
    for key, value in {**headers, "Content-Length": str(len(data))}.items():
        handler.send_header(key, value)
    handler.end_headers()
    if body:
        handler.wfile.write(data)


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its path there, as a repository holds them."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def commit_id(files: dict[str, bytes]) -> str:
    """A stable 40-hex commit id for a set of files."""
    digest = hashlib.sha1()
    for name, data in sorted(files.items()):
        digest.update(name.encode() + b"\0" + hashlib.sha1(data).digest())
    return digest.hexdigest()


def fill_cache(cache: Path, repo_id: str, files: dict[str, bytes], ref: str = "main") -> str:
    """``files`` laid out in a hub cache as huggingface_hub leaves a download
    (models--org--name/refs/REF, snapshots/COMMIT/...); returns the commit."""
    commit = commit_id(files)
    storage = cache / f"models--{repo_id.replace('/', '--')}"
    for name, data in files.items():
        target = storage / "snapshots" / commit / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / ref).write_text(commit)
    return commit
