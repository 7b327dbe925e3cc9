"""A local Hugging Face Hub for tests of an upload: the HTTP calls huggingface_hub 2.4.0 makes for
``create_repo``, ``upload_folder``, ``delete_tag`` and ``create_tag`` (what eval/lerobot/hub.py ``push`` calls),
answered as the Hub answers them. The paths are huggingface_hub's (site-packages/huggingface_hub/...):

- ``GET /api/agent-harnesses`` (utils/_detect_agent.py ``_fetch_registry``, from utils/_headers.py
  ``build_hf_headers`` -> ``detect_agent``, at most once a day per HF_HOME): the public registry of AI agent
  harnesses, asked without a token; answered with none known.
- ``POST /api/repos/create`` (hf_api.py ``HfApi.create_repo``): JSON ``{name, organization, type, visibility}``
  (``visibility`` from ``private`` by ``_resolve_repo_visibility``: "private" or "public"). A new repo answers 200
  ``{url, name, id}`` and starts, as on the Hub, with a system commit holding ``.gitattributes`` (hf_api.py
  ``list_repo_commits``: "Initial commit is always a system commit containing the `.gitattributes` file"); an existing
  one 409 with its ``url`` (``create_repo`` with ``exist_ok`` reads ``url`` from that answer).
- ``GET /api/{type}s/{repo}[/revision/{rev}]`` (hf_api.py ``repo_info`` / ``dataset_info``): what ``create_repo``
  with ``exist_ok`` asks after a 401/402/403, and ``create_commit`` after an empty commit: ``{id, sha, private,
  siblings}``; 404 ``RepoNotFound`` / ``RevisionNotFound``.
- ``POST /api/validate-yaml`` (hf_api.py ``HfApi._validate_yaml``, from ``_prepare_upload_folder_additions`` and
  ``create_commit`` when README.md is uploaded): ``{content, repoType}``; 200 ``{errors: [], warnings: []}``, a
  warning for a card without metadata, 400 ``{errors: [{message}]}`` for front matter that is not YAML.
- ``POST /api/{type}s/{repo}/preupload/{rev}`` (_commit_api.py ``_fetch_upload_modes``, from hf_api.py
  ``preupload_lfs_files`` and _upload_pipeline.py ``_UploadPipeline._coordinator_loop``): ``{files: [{path, sample,
  size}]}``; answers ``{files: [{path, uploadMode, shouldIgnore, oid}], commitOid}``. The server chooses the upload
  mode and the library obeys it (``addition._upload_mode = upload_modes[...]``): with ``lfs=False`` every file is
  "regular" (its bytes come base64 in the commit: no LFS or xet transfer at all); with ``lfs=True`` the Hub's rule
  (a path the repo's ``.gitattributes`` stores with LFS, as the Hub's default one does ``*.parquet`` and ``*.mp4``;
  10 MB or more; a sample with a NUL byte) says "lfs". ``oid`` is the file's at ``rev`` if it has one (git blob sha1,
  or sha256 for an LFS file): ``_local_oid`` compares it to drop unchanged files.
- ``POST /{prefix}{repo}.git/info/lfs/objects/batch`` (lfs.py ``post_lfs_batch_info``, from _commit_api.py
  ``_upload_files``, the path without hf_xet, i.e. ``HF_HUB_DISABLE_XET=1``): the git-lfs batch API, transfer
  "basic": per object an ``upload`` action to the storage (another origin, like the Hub's S3: the bytes never go to
  the Hub itself) and a ``verify`` action on the Hub; an object already stored has no actions. With hf_xet installed
  the library uploads an "lfs" file through xet instead (_commit_api.py ``_upload_xet_files``, _upload_pipeline.py):
  not implemented (its token URL ``/api/{type}s/{repo}/xet-write-token/{rev}`` is an unknown endpoint here), so a
  test with ``lfs=True`` runs its client with ``HF_HUB_DISABLE_XET=1``.
- ``PUT {storage}/lfs/{oid}`` (lfs.py ``lfs_upload`` -> ``_upload_single_part``): the bytes, no Hub token (the URL
  is the credential); refused (400) unless their sha256 and size are the object's.
- ``POST /{prefix}{repo}.git/info/lfs/objects/verify`` (lfs.py ``lfs_upload``, step 3): ``{oid, size}``; 200, or
  404 for an object the storage does not hold.
- ``POST /api/{type}s/{repo}/commit/{rev}`` (_commit_api.py ``_send_commit`` / ``_prepare_commit_payload``, from
  hf_api.py ``create_commit`` and _upload_pipeline.py ``_UploadPipeline._do_commit``): ndjson, a ``header``
  ``{summary, description, parentCommit?}`` then ``file`` (base64 ``content``), ``lfsFile`` (``oid``: it must be in
  the storage), ``deletedFile`` / ``deletedFolder`` lines; answers ``{success, commitOid, commitUrl, hookOutput,
  pullRequestUrl}``. ``?create_pr=1`` is not implemented (an unknown endpoint).
- ``DELETE /api/{type}s/{repo}/tag/{tag}`` (hf_api.py ``HfApi.delete_tag``): 200, or 404 with ``X-Error-Code:
  RevisionNotFound`` (``hf_raise_for_status`` -> ``RevisionNotFoundError``) when there is no such tag.
- ``POST /api/{type}s/{repo}/tag/{rev}`` (hf_api.py ``HfApi.create_tag``): ``{tag, message?}``; 200, 409 for a tag
  that exists, 404 ``RevisionNotFound`` for a revision that does not.

Errors are as utils/_http.py ``hf_raise_for_status`` and ``_format`` read them: the status, ``X-Error-Code``,
``X-Error-Message``, ``X-Request-Id`` and a JSON ``{"error": message}``. A token the stub does not know, on any Hub
request, is answered as the Hub answers it: 401, ``X-Error-Message: Invalid credentials in Authorization header``;
a write without a token: 401. Anything else (another method or path): 404 with the Hub's headers, logged in
``unknown`` so that a test can say none was asked for.

Every request is logged in ``requests`` (origin "hub" or "storage", method, path, its Authorization header or None),
every repo keeps its commits (each: parent, message, the files it added, the whole tree path -> bytes), branches,
tags and private flag.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

from tests.hub_stub import LoopbackServers

REPO_TYPES = {"model": "", "dataset": "datasets/", "space": "spaces/"}  # constants.REPO_TYPES_URL_PREFIXES
LFS_THRESHOLD = 10 * 1024 * 1024  # the Hub stores a file of 10 MB or more with LFS whatever its name
# The head of the .gitattributes the Hub commits in a new dataset repo (the LFS patterns a dataset meets)
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.gz", "*.h5", "*.joblib", "*.lz4", "*.msgpack", "*.npy",
    "*.npz", "*.onnx", "*.parquet", "*.pb", "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors",
    "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip", "*.zst", "*.mds", "*.mp3", "*.ogg", "*.wav",
    "*.jpg", "*.jpeg", "*.png", "*.webp", "*.mp4", "*.webm"))
INVALID_TOKEN = "Invalid credentials in Authorization header"
# The registry of AI agent harnesses (utils/_detect_agent.py ``_fetch_registry``), public: none known here
AGENT_HARNESSES = {"standardEnvVars": ["AI_AGENT", "AGENT"], "harnesses": {}}


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Commit:
    oid: str
    parent: str | None
    message: str
    added: dict[str, bytes]  # the files this commit wrote
    tree: dict[str, bytes]  # every file of the repo at this commit
    lfs: frozenset[str] = frozenset()  # the tree's paths stored with LFS


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> str | None:
        if revision in self.branches:
            return self.branches[revision]
        if revision in self.tags:
            return self.tags[revision]
        return revision if revision in self.commits else None

    @property
    def head(self) -> Commit:
        return self.commits[self.branches["main"]]


@dataclass(frozen=True)
class Request:
    origin: str  # "hub" or "storage"
    method: str
    path: str  # with its query
    authorization: str | None  # the Authorization header as sent


class HttpError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, body: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.body = status, message, code, body


class UploadHub(LoopbackServers):
    """The Hub (``url``) and its LFS storage (``storage_url``, another origin), each a thread of this process.

    ``tokens``: the tokens the Hub knows (any other is refused 401, as a bad token is); ``lfs``: answer the preupload
    with the Hub's LFS rule instead of "regular" for every file."""

    def __init__(self, tokens: tuple[str, ...] = (), lfs: bool = False):
        self.tokens = set(tokens)
        self.lfs = lfs
        self.repos: dict[tuple[str, str], Repo] = {}
        self.requests: list[Request] = []
        self.unknown: list[tuple[str, str]] = []
        self.storage: dict[str, bytes] = {}  # sha256 -> bytes, uploaded by the LFS PUTs
        self.validated_cards: list[str] = []
        self.errors: list[str] = []  # requests the stub could not read (malformed JSON, a missing field)
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), self._handler(origin)) for origin in ("hub", "storage")]
        self.url, self.storage_url = (f"http://127.0.0.1:{s.server_address[1]}" for s in self._servers)

    def repo(self, repo_id: str, repo_type: str = "dataset") -> Repo:
        return self.repos[(repo_type, repo_id)]

    # ------------------------------------------------------------ HTTP
    def _handler(self, origin: str):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as httpx uses it; every answer has a Content-Length

            def log_message(self, *args):  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _any(self):
                body = self._body()
                hub._answer(self, origin, body)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _any

        return Handler

    def _send(self, h, status: int, payload, headers: dict[str, str] | None = None,
              content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("X-Request-Id", f"Root=1-stub-{next(self._ids):08d}")
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    def _answer(self, h, origin: str, body: bytes) -> None:
        auth = h.headers.get("Authorization")
        with self._lock:
            self.requests.append(Request(origin, h.command, h.path, auth))
        split = urlsplit(h.path)
        path, query = unquote(split.path), parse_qs(split.query)
        try:
            try:
                if origin == "storage":
                    status, payload = self._storage(h.command, path, body)
                else:
                    self._check_token(h.command, path, auth)
                    status, payload = self._hub(h.command, path, query, body)
            except (ValueError, KeyError, TypeError) as e:  # a request the stub cannot read: the test fails on it
                with self._lock:
                    self.errors.append(f"{h.command} {path}: {e!r}")
                raise HttpError(400, f"Malformed request: {e}") from None
        except HttpError as e:
            headers = {"X-Error-Message": e.message}
            if e.code:
                headers["X-Error-Code"] = e.code
            return self._send(h, e.status, e.body or {"error": e.message}, headers)
        self._send(h, status, payload,
                   content_type="application/vnd.git-lfs+json" if path.endswith("/lfs/objects/batch")
                   else "application/json")

    def _check_token(self, method: str, path: str, auth: str | None) -> None:
        if auth is not None:
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or token not in self.tokens:
                raise HttpError(401, INVALID_TOKEN)
        elif method != "GET" and path != "/api/validate-yaml":
            raise HttpError(401, "You must be authenticated to access this resource")

    def _unknown(self, method: str, path: str) -> HttpError:
        with self._lock:
            self.unknown.append((method, path))
        return HttpError(404, "Sorry, we can't find the page you are looking for.")

    # ------------------------------------------------------------ the Hub's endpoints
    def _hub(self, method: str, path: str, query: dict, body: bytes) -> tuple[int, object]:
        if method == "POST" and path == "/api/repos/create":
            return self._create_repo(json.loads(body))
        if method == "POST" and path == "/api/validate-yaml":
            return self._validate_yaml(json.loads(body))
        if method == "GET" and path == "/api/agent-harnesses":
            return 200, AGENT_HARNESSES
        if "/info/lfs/objects/" in path and ".git/" in path:
            return self._lfs(method, path, json.loads(body or b"{}"))
        parts = path.strip("/").split("/")
        if len(parts) >= 4 and parts[0] == "api" and parts[1].endswith("s") and parts[1][:-1] in REPO_TYPES:
            repo_type, repo_id, rest = parts[1][:-1], "/".join(parts[2:4]), parts[4:]
            if method == "GET" and (not rest or (rest[0] == "revision" and len(rest) >= 2)):
                return self._repo_info(repo_type, repo_id, "/".join(rest[1:]) or "main")
            if len(rest) >= 2 and not query.get("create_pr"):
                action, arg = rest[0], "/".join(rest[1:])
                if method == "POST" and action == "preupload":
                    return self._preupload(self._get(repo_type, repo_id), arg, json.loads(body))
                if method == "POST" and action == "commit":
                    return self._commit(self._get(repo_type, repo_id), arg, body)
                if method == "POST" and action == "tag":
                    return self._create_tag(self._get(repo_type, repo_id), arg, json.loads(body))
                if method == "DELETE" and action == "tag":
                    return self._delete_tag(self._get(repo_type, repo_id), arg)
        raise self._unknown(method, path)

    def _get(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            raise HttpError(404, "Repository not found", "RepoNotFound")
        return repo

    def _url(self, repo: Repo) -> str:
        return f"{self.url}/{REPO_TYPES[repo.repo_type]}{repo.repo_id}"

    def _new_commit(self, repo: Repo, message: str, added: dict[str, bytes], tree: dict[str, bytes],
                    lfs: frozenset[str]) -> Commit:
        parent = repo.branches.get("main")
        digest = hashlib.sha1(json.dumps([parent, message, sorted((p, git_blob_sha1(d)) for p, d in tree.items()),
                                          next(self._ids)]).encode()).hexdigest()
        commit = Commit(digest, parent, message, dict(added), dict(tree), lfs)
        repo.commits[digest] = commit
        repo.branches["main"] = digest
        return commit

    def _create_repo(self, payload: dict) -> tuple[int, object]:
        name, organization = payload.get("name"), payload.get("organization")
        repo_type = payload.get("type") or "model"
        if not name or repo_type not in REPO_TYPES or payload.get("visibility") not in (None, "public", "private"):
            raise HttpError(400, "Invalid repo name, type or visibility")
        repo_id = f"{organization}/{name}" if organization else f"user/{name}"
        with self._lock:
            if (repo_type, repo_id) in self.repos:
                repo = self.repos[(repo_type, repo_id)]
                raise HttpError(409, f"You already created this {repo_type} repo",
                                body={"error": f"You already created this {repo_type} repo", "url": self._url(repo)})
            repo = Repo(repo_type, repo_id, private=payload.get("visibility") == "private")
            attributes = GITATTRIBUTES.encode()
            self._new_commit(repo, "initial commit", {".gitattributes": attributes}, {".gitattributes": attributes},
                             frozenset())
            self.repos[(repo_type, repo_id)] = repo
        return 200, {"url": self._url(repo), "name": repo_id, "id": f"stub-{repo_type}-{len(self.repos)}"}

    def _repo_info(self, repo_type: str, repo_id: str, revision: str) -> tuple[int, object]:
        with self._lock:
            repo = self._get(repo_type, repo_id)
            oid = repo.resolve(revision)
            if oid is None:
                raise HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            commit = repo.commits[oid]
            siblings = [{"rfilename": p} for p in sorted(commit.tree)]
        return 200, {"_id": f"stub-{repo_id}", "id": repo_id, "sha": oid, "private": repo.private,
                     "siblings": siblings, "tags": []}

    def _validate_yaml(self, payload: dict) -> tuple[int, object]:
        import yaml

        content = payload.get("content", "")
        with self._lock:
            self.validated_cards.append(content)
        if not content.startswith("---\n") or "\n---" not in content[3:]:
            return 200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata in repo card"}]}
        try:
            meta = yaml.safe_load(content[4:content.index("\n---", 3)])
        except yaml.YAMLError as e:
            raise HttpError(400, "Invalid metadata", body={"errors": [{"message": f"Invalid YAML: {e}"}]}) from None
        if meta is not None and not isinstance(meta, dict):
            raise HttpError(400, "Invalid metadata", body={"errors": [{"message": "metadata must be a mapping"}]})
        return 200, {"errors": [], "warnings": []}

    def _is_lfs(self, repo: Repo, commit: Commit, path: str, size: int, sample: bytes) -> bool:
        if not self.lfs:
            return False
        patterns = [line.split()[0] for line in commit.tree.get(".gitattributes", b"").decode().splitlines()
                    if "filter=lfs" in line]
        name = path.rsplit("/", 1)[-1]
        matches = any(fnmatch.fnmatch(path if "/" in p else name, p) for p in patterns)
        return matches or size >= LFS_THRESHOLD or b"\0" in sample

    def _preupload(self, repo: Repo, revision: str, payload: dict) -> tuple[int, object]:
        with self._lock:
            oid = repo.resolve(revision)
            if oid is None:
                raise HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            commit = repo.commits[oid]
            files = []
            for f in payload.get("files", []):
                path, size, sample = f["path"], int(f["size"]), base64.b64decode(f.get("sample", ""))
                lfs = self._is_lfs(repo, commit, path, size, sample)
                remote = commit.tree.get(path)
                remote_oid = None
                if remote is not None:  # the oid _local_oid computes: sha256 for an LFS file, git blob sha1 else
                    remote_oid = (hashlib.sha256(remote).hexdigest() if path in commit.lfs else git_blob_sha1(remote))
                files.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                              "oid": remote_oid})
        return 200, {"files": files, "commitOid": oid}

    def _lfs(self, method: str, path: str, payload: dict) -> tuple[int, object]:
        repo_path, _, action = path.lstrip("/").partition(".git/info/lfs/objects/")
        prefix = next((p for p in ("datasets/", "spaces/") if repo_path.startswith(p)), "")
        repo_type = {"datasets/": "dataset", "spaces/": "space", "": "model"}[prefix]
        repo = self._get(repo_type, repo_path[len(prefix):])
        if method == "POST" and action == "batch":
            if payload.get("operation") != "upload" or "basic" not in payload.get("transfers", ["basic"]):
                raise self._unknown(method, path)
            objects = []
            for o in payload.get("objects", []):
                obj = {"oid": o["oid"], "size": int(o["size"])}
                if o["oid"] not in self.storage:
                    obj["authenticated"] = True
                    obj["actions"] = {
                        "upload": {"href": f"{self.storage_url}/lfs/{o['oid']}?size={o['size']}", "expires_in": 86400},
                        "verify": {"href": f"{self.url}/{repo_path}.git/info/lfs/objects/verify"}}
                objects.append(obj)
            return 200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}
        if method == "POST" and action == "verify":
            data = self.storage.get(payload.get("oid", ""))
            if data is None or len(data) != int(payload.get("size", -1)):
                raise HttpError(404, "Object not found in storage")
            return 200, {"success": True}
        raise self._unknown(method, path)

    def _storage(self, method: str, path: str, body: bytes) -> tuple[int, object]:
        if method == "PUT" and path.startswith("/lfs/"):
            oid = path[len("/lfs/"):]
            if hashlib.sha256(body).hexdigest() != oid:
                raise HttpError(400, "BadDigest: the content's sha256 is not the object's")
            with self._lock:
                self.storage[oid] = body
            return 200, b""
        with self._lock:
            self.unknown.append((method, "storage:" + path))
        raise HttpError(404, "NoSuchKey")

    def _commit(self, repo: Repo, revision: str, body: bytes) -> tuple[int, object]:
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HttpError(400, "The first line of the commit must be its header")
        header = lines[0]["value"]
        with self._lock:
            if revision != "main" and revision not in repo.branches:
                raise HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            head = repo.head
            if header.get("parentCommit") not in (None, head.oid):
                raise HttpError(412, "A commit has happened since. Please refresh and try again.")
            tree, lfs, added = dict(head.tree), set(head.lfs), {}
            for line in lines[1:]:
                key, value = line["key"], line["value"]
                path = value["path"]
                if key == "file":
                    if value.get("encoding") != "base64":
                        raise HttpError(400, f"{path}: unsupported encoding")
                    data = base64.b64decode(value["content"])
                    if self._is_lfs(repo, head, path, len(data), data[:512]):
                        raise HttpError(400, f"Your push was rejected because {path} should be stored with LFS")
                    lfs.discard(path)
                elif key == "lfsFile":
                    data = self.storage.get(value.get("oid", ""))
                    if data is None:
                        raise HttpError(422, f"{path}: the LFS object {value.get('oid')} was not uploaded")
                    lfs.add(path)
                elif key == "deletedFile":
                    if tree.pop(path, None) is None:
                        raise HttpError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                    lfs.discard(path)
                    continue
                elif key == "deletedFolder":
                    for p in [p for p in tree if p.startswith(path.rstrip("/") + "/")]:
                        tree.pop(p)
                        lfs.discard(p)
                    continue
                else:
                    raise HttpError(400, f"Unknown commit operation {key!r}")
                tree[path] = added[path] = data
            commit = self._new_commit(repo, header.get("summary", ""), added, tree, frozenset(lfs))
        return 200, {"success": True, "commitOid": commit.oid,
                     "commitUrl": f"{self._url(repo)}/commit/{commit.oid}", "hookOutput": "",
                     "pullRequestUrl": None}

    def _create_tag(self, repo: Repo, revision: str, payload: dict) -> tuple[int, object]:
        tag = payload.get("tag")
        with self._lock:
            oid = repo.resolve(revision)
            if oid is None:
                raise HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            if not tag:
                raise HttpError(400, "A tag name is required")
            if tag in repo.tags:
                raise HttpError(409, f"Tag reference refs/tags/{tag} already exists")
            repo.tags[tag] = oid
        return 200, {}

    def _delete_tag(self, repo: Repo, tag: str) -> tuple[int, object]:
        with self._lock:
            if tag not in repo.tags:
                raise HttpError(404, f"Invalid rev id: {quote(tag)}", "RevisionNotFound")
            del repo.tags[tag]
        return 200, {}
