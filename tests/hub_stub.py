"""A local Hugging Face Hub for tests: the HTTP calls huggingface_hub makes for a download, answered as the Hub
answers them (huggingface_hub/file_download.py, hf_api.py: ``model_info``, ``hf_hub_download``).

- ``GET /api/models/{repo}/revision/{rev}[?blobs=True]``: the commit (``sha``) and every file
  (``siblings``: ``rfilename``, ``size``, ``blobId`` and, for an LFS file, ``lfs: {sha256, size, pointerSize}``);
- ``HEAD|GET /{repo}/resolve/{rev}/{path}``: a regular file answers 200 with ``X-Repo-Commit``, ``ETag`` (its git
  blob sha1) and ``Content-Length``; an LFS file answers 302 to a CDN on another origin (``Location``) with
  ``X-Linked-Etag`` (its sha256), ``X-Linked-Size`` and ``X-Repo-Commit``, and the CDN serves the bytes;
- a repo, revision or file that does not exist: 404 with ``X-Error-Code`` RepoNotFound, RevisionNotFound or
  EntryNotFound (what ``hf_raise_for_status`` reads).

Every request is logged (``requests``), so a test can say that a run made none. No xet headers are sent: the
library downloads over plain HTTP.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


LFS_SUFFIXES = (".msgpack", "checkpoint", ".model")  # stored with LFS, as the released repos' .gitattributes do


@dataclass
class StubRepo:
    commits: dict[str, dict[str, bytes]]  # commit -> {path: bytes}
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit ("main" among them)

    def resolve(self, revision: str) -> str | None:
        return revision if revision in self.commits else self.refs.get(revision)

    @staticmethod
    def is_lfs(name: str) -> bool:
        return name.endswith(LFS_SUFFIXES)


def repo_from_folders(folders: dict[str, Path], refs: dict[str, str]) -> StubRepo:
    """A repo whose commits hold every file of their folders."""
    return StubRepo({c: {p.relative_to(f).as_posix(): p.read_bytes() for p in sorted(f.rglob("*")) if p.is_file()}
                     for c, f in folders.items()}, dict(refs))


class LoopbackServers:
    """HTTP servers of this process on loopback (``_servers``), each served by a thread from ``with`` on."""

    _servers: list[ThreadingHTTPServer]

    def __enter__(self):
        for s in self._servers:
            threading.Thread(target=s.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        for s in self._servers:
            s.shutdown()
            s.server_close()


class StubHub(LoopbackServers):
    """The Hub (``url``) and its CDN (another origin), each a thread of this process."""

    def __init__(self, repos: dict[str, StubRepo]):
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        self.blobs = {hashlib.sha256(data).hexdigest(): data for repo in repos.values()
                      for files in repo.commits.values() for name, data in files.items() if repo.is_lfs(name)}
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), self._handler(cdn)) for cdn in (False, True)]
        self.url, self.cdn_url = (f"http://127.0.0.1:{s.server_address[1]}" for s in self._servers)

    # ------------------------------------------------------------ answers
    def _handler(self, cdn: bool):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._answer(self, cdn, body=False)

            def do_GET(self):
                hub._answer(self, cdn, body=True)

        return Handler

    def _send(self, h, status: int, headers: dict[str, str], data: bytes = b"", body: bool = True) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body and data:
            h.wfile.write(data)

    def _error(self, h, code: str, body: bool, commit: str | None = None) -> None:
        headers = {"X-Error-Code": code, "Content-Type": "application/json"}
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(h, 404, headers, json.dumps({"error": code}).encode(), body)

    def _answer(self, h, cdn: bool, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append((h.command, ("cdn" if cdn else "") + h.path))
        if cdn:
            sha = path.rsplit("/", 1)[-1]
            if path.startswith("/cdn/") and sha in self.blobs:
                return self._send(h, 200, {"ETag": f'"{sha}"'}, self.blobs[sha], body)
            return self._send(h, 404, {}, b"", body)
        if path.startswith("/api/models/"):
            head, sep, rev = path[len("/api/models/"):].partition("/revision/")
            repo = self.repos.get(head)
            if repo is None:
                return self._error(h, "RepoNotFound", body)
            commit = repo.resolve(rev or "main")
            if commit is None:
                return self._error(h, "RevisionNotFound", body)
            siblings = []
            for name, data in sorted(repo.commits[commit].items()):
                s = {"rfilename": name, "size": len(data), "blobId": git_blob_sha1(data)}
                if repo.is_lfs(name):
                    s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                siblings.append(s)
            info = {"_id": "stub", "id": head, "modelId": head, "sha": commit, "private": False, "siblings": siblings}
            return self._send(h, 200, {"Content-Type": "application/json"}, json.dumps(info).encode(), body)
        parts = path.strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return self._send(h, 404, {}, b"", body)
        repo_id, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._error(h, "RepoNotFound", body)
        commit = repo.resolve(rev)
        if commit is None:
            return self._error(h, "RevisionNotFound", body)
        files = repo.commits[commit]
        if name not in files:
            return self._error(h, "EntryNotFound", body, commit)
        data = files[name]
        if repo.is_lfs(name):
            sha = hashlib.sha256(data).hexdigest()
            headers = {"Location": f"{self.cdn_url}/cdn/{sha}", "X-Repo-Commit": commit, "X-Linked-Etag": f'"{sha}"',
                       "X-Linked-Size": str(len(data)), "ETag": f'"{git_blob_sha1(b"pointer " + sha.encode())}"'}
            return self._send(h, 302, headers, b"", body)
        return self._send(h, 200, {"X-Repo-Commit": commit, "ETag": f'"{git_blob_sha1(data)}"'}, data, body)
