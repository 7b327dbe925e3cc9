"""Released files of a model, resolved in one place: a folder given, the Hugging Face cache, or the Hub.

    release = Release("rail-berkeley/octo-small-1.5", what="octo-small weights", files="config.json, ...",
                      select=needed_files)
    files = fetch(release, revision=None, local_flag="--checkpoint DIR")   # -> Files(folder, repo, commit, sha256s)

The order is the ecosystem's (transformers, LeRobot, Octo's ``load_pretrained("hf://...")``):

1. a folder the user names (``--checkpoint DIR``): :func:`local` reads what the loader needs from it as it is;
2. the Hub, where it can be asked: the revision (default ``main``) is resolved to its commit with one request
   (``GET /api/models/{repo}/revision/{rev}``, which also lists every file with its git blob id and, for LFS
   files, its sha256), ``select`` picks the files the loader reads from that list, and each is fetched into
   the Hugging Face cache by ``huggingface_hub.hf_hub_download`` at that commit (its progress bar; a file
   already cached at that commit is not requested again, so the cache is shared with every other tool);
3. the cache alone when the Hub cannot be asked: ``HF_HUB_OFFLINE`` set (then no request is made at all), or
   the Hub unreachable or failing (said in one line on stderr): the snapshot ``refs/<revision>`` points at.

Nothing else is tried: when none of these has the files, :class:`WeightsUnavailable` says in one line which
repo, which files, which cache folder, why the Hub could not give them, and the flag that points at a copy.

The environment is huggingface_hub's own (``HF_ENDPOINT``, ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``,
``HF_HUB_CACHE``/``HF_HOME``/``XDG_CACHE_HOME``, ``HF_TOKEN`` read by the library), read when a file is resolved
and passed to the library explicitly: the library reads it once, when it is first imported.

Before a file is used its bytes are checked against the Hub's own record of them: the cache names every blob
by its hash (the sha256 of an LFS file, git's blob sha1 of any other), and the listing gives both. A file that
does not match (a damaged disk, a copy cut short, a proxy that altered it) is refused with
:class:`DamagedFile`, one line naming the file and what to delete. :class:`Files` is what ran: repo, commit and
every file's sha256, which the run's identity, its records, run.json and the export keys carry.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

HF_SCHEME = "hf://"  # a checkpoint named by its Hub repo, as Octo's own loader names them
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_REVISION = "main"


class HubError(ValueError):
    """Released files that cannot be had or used; ``str(e)`` is one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class WeightsUnavailable(HubError):
    """Neither a given folder, the cache nor the Hub has the files."""


class DamagedFile(HubError):
    """A file whose bytes do not match the Hub's record of it."""


class LayoutError(HubError):
    """A repo (or a folder) without the files a loader needs; raised by a :class:`Release`'s ``select``."""


@dataclass(frozen=True)
class Release:
    """What a loader needs from a Hub repo: ``select(paths)`` -> the paths it reads (or :class:`LayoutError`);
    ``what`` and ``files`` name them for the user ("octo-small weights", "config.json, ...")."""

    repo: str
    what: str
    files: str
    select: Callable[[Sequence[str]], list[str]]


@dataclass(frozen=True)
class Files:
    """Files a loader reads: the folder they are in, each one's sha256 and, from the Hub, the repo and commit."""

    folder: Path
    sha256: tuple[tuple[str, str], ...]  # (path in the folder, sha256), sorted
    repo: str | None = None
    revision: str | None = None  # the commit (40 hex digits) the files are of

    def path(self, name: str) -> Path:
        return self.folder / name

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.sha256]

    @property
    def where(self) -> str:
        """``hf://repo@commit`` or the folder."""
        return f"{HF_SCHEME}{self.repo}@{self.revision}" if self.repo else str(self.folder)

    @property
    def digest(self) -> str:
        return digest([self])

    def to_json(self) -> dict:
        out = {"repo": self.repo, "revision": self.revision} if self.repo else {"folder": str(self.folder)}
        return {**out, "files": dict(self.sha256)}


def digest(parts: Iterable[Files | None]) -> str:
    """One sha256 over the files of ``parts`` (their paths and sha256s, as ``sha256sum`` lists them): equal
    files give an equal digest wherever they came from."""
    h = hashlib.sha256()
    for part in parts:
        if part is not None:
            for name, sha in part.sha256:
                h.update(f"{sha}  {name}\n".encode())
    return h.hexdigest()


def parse_repo(checkpoint: str) -> str | None:
    """``org/name`` of an ``hf://org/name`` checkpoint, else None (a folder)."""
    if not checkpoint.startswith(HF_SCHEME):
        return None
    repo = checkpoint[len(HF_SCHEME):].strip("/")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise HubError(f"{checkpoint!r} is not a Hub repo: write hf://ORG/NAME (a revision goes in --revision)")
    return repo


# ------------------------------------------------------------------ huggingface_hub's environment, read now
def _true(name: str) -> bool:
    return os.environ.get(name, "").upper() in {"1", "ON", "YES", "TRUE"}  # huggingface_hub's ENV_VARS_TRUE_VALUES


def offline() -> bool:
    from huggingface_hub import constants

    return _true("HF_HUB_OFFLINE") or _true("TRANSFORMERS_OFFLINE") or constants.is_offline_mode()


def endpoint() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def cache_dir() -> Path:
    """The hub cache folder by huggingface_hub's rule: HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME/hub,
    XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub."""
    def expand(p: str) -> str:
        return os.path.expandvars(os.path.expanduser(p))

    home = expand(os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"))
    return Path(expand(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
                       or os.path.join(home, "hub"))).absolute()


def repo_folder(repo: str) -> Path:
    """The repo's folder in the cache (``models--org--name``)."""
    from huggingface_hub.file_download import repo_folder_name

    return cache_dir() / repo_folder_name(repo_id=repo, repo_type="model")


# ------------------------------------------------------------------ hashes
def _hashes(path: Path, git: bool) -> tuple[str, str | None]:
    """(sha256, git blob sha1 or None) of a file, read once."""
    size = path.stat().st_size
    sha = hashlib.sha256()
    blob = hashlib.sha1(f"blob {size}\0".encode()) if git else None
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
            if blob is not None:
                blob.update(chunk)
    return sha.hexdigest(), blob.hexdigest() if blob is not None else None


def _checked(repo: str, commit: str, folder: Path, name: str, record: tuple[str | None, str | None]) -> str:
    """The sha256 of the cached file ``name``, after its bytes were checked against every record of them: the
    blob it links to is named by its hash, and ``record`` is the listing's (lfs sha256, git blob id)."""
    link = folder / name
    if not link.is_file():
        raise WeightsUnavailable(f"{link} is missing (a download cut short, or a blob deleted): run again with the "
                                 f"Hub reachable to fetch it, or delete {repo_folder(repo)}")
    blob = link.resolve()
    want_sha, want_git = record
    named = blob.name if link.is_symlink() and blob.parent.name == "blobs" else ""  # a copy has no blob name
    if len(named) == 64 and want_sha is None:
        want_sha = named
    elif len(named) == 40 and want_git is None and want_sha is None:
        want_git = named
    sha, git = _hashes(blob, git=want_git is not None and want_sha is None)
    found, want = (sha, want_sha) if want_sha is not None else (git, want_git)
    if want is not None and found != want:
        raise DamagedFile(f"the cached file {name} of {repo}@{commit[:12]} is damaged: its bytes hash to "
                          f"{found[:12]}…, the Hub's record is {want[:12]}…; delete {blob} (or the whole "
                          f"{repo_folder(repo)}) and run again to download it")
    return sha


# ------------------------------------------------------------------ resolution
def local(folder: str | Path, select: Callable[[Sequence[str]], list[str]], what: str) -> Files:
    """The files ``select`` picks from a folder the user gave, with their sha256 (nothing to check them
    against: the folder is what the user says it is)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise WeightsUnavailable(f"{what}: folder {folder} does not exist")
    try:
        names = select(_listing(folder))
    except LayoutError as e:
        raise LayoutError(f"{folder}: {e}") from None
    return local_files(folder, names)


def local_files(folder: str | Path, names: Sequence[str]) -> Files:
    """The files ``names`` of a folder, with their sha256."""
    folder = Path(folder).expanduser()
    return Files(folder, tuple(sorted((n, _hashes(folder / n, git=False)[0]) for n in names)))


def _listing(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink())


def fetch(release: Release, revision: str | None = None, local_flag: str = "--checkpoint DIR", also: str = "",
          download: bool = True) -> Files:
    """The files of ``release`` at ``revision`` from the Hub into the cache, or from the cache alone when the Hub
    cannot be asked (``download=False``: never ask it). One-line errors (:class:`HubError` and kinds)."""
    revision = revision or DEFAULT_REVISION
    why_not = None
    if not download:
        why_not = "no download was asked for"
    elif offline():
        why_not = "HF_HUB_OFFLINE is set"
    else:
        listing = _list(release.repo, revision)
        if isinstance(listing, str):
            why_not = listing
        else:
            return _download(release, revision, *listing)
    return _from_cache(release, revision, why_not, local_flag, also)


def _list(repo: str, revision: str):
    """(commit, {path: (lfs sha256, git blob id)}) from the Hub, or why the Hub could not be asked (a str).
    A repo or revision the Hub says does not exist is an error, not a reason to look in the cache."""
    import httpx2
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError, \
        RevisionNotFoundError

    ep = endpoint()
    try:
        info = HfApi(endpoint=ep).model_info(repo, revision=revision, files_metadata=True,
                                             timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except RevisionNotFoundError:
        raise HubError(f"{repo} has no revision {revision!r} on {ep}: give a branch, tag or commit it has "
                       f"(--revision)") from None
    except RepositoryNotFoundError:
        raise HubError(f"{repo} is not a repo on {ep} (or it is private: log in with `hf auth login` or set "
                       f"HF_TOKEN)") from None
    except OfflineModeIsEnabled:
        return "HF_HUB_OFFLINE is set"
    except HfHubHTTPError as e:
        code = e.response.status_code if e.response is not None else "?"
        return f"the Hub at {ep} answered HTTP {code}"
    except (httpx2.TransportError, OSError) as e:
        return f"the Hub at {ep} cannot be reached ({type(e).__name__})"
    if not info.sha or info.siblings is None:
        return f"the Hub at {ep} answered without a commit or a file list"
    files = {s.rfilename: (s.lfs.sha256 if s.lfs is not None else None, s.blob_id) for s in info.siblings}
    return info.sha, files


def _download(release: Release, revision: str, commit: str, records: dict) -> Files:
    import httpx2
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    repo = release.repo
    try:
        names = release.select(sorted(records))
    except LayoutError as e:
        raise LayoutError(f"{repo}@{commit[:12]} on {endpoint()}: {e}") from None
    cache, ep = cache_dir(), endpoint()
    for name in names:
        try:
            hf_hub_download(repo, name, revision=commit, cache_dir=cache, endpoint=ep)
        except (HfHubHTTPError, httpx2.TransportError, OSError) as e:
            msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise WeightsUnavailable(f"downloading {name} of {repo}@{commit[:12]} from {ep} failed ({msg}); run "
                                     f"again to continue, the files fetched so far stay in {cache}") from None
    _write_ref(repo, revision, commit)
    folder = repo_folder(repo) / "snapshots" / commit
    return Files(folder, tuple(sorted((n, _checked(repo, commit, folder, n, records[n])) for n in names)),
                 repo=repo, revision=commit)


def _write_ref(repo: str, revision: str, commit: str) -> None:
    """``refs/<revision>`` -> commit, as huggingface_hub keeps it, so that an offline run finds the snapshot."""
    if revision == commit:
        return
    ref = repo_folder(repo) / "refs" / revision
    if ref.is_file() and ref.read_text().strip() == commit:
        return
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)


def _from_cache(release: Release, revision: str, why_not: str, local_flag: str, also: str) -> Files:
    repo, root = release.repo, repo_folder(release.repo)
    commit = revision if COMMIT_RE.match(revision) else None
    ref = root / "refs" / revision
    if commit is None and ref.is_file():
        commit = ref.read_text().strip()
    folder = root / "snapshots" / (commit or "")
    if commit is None or not folder.is_dir():
        at = "" if revision == DEFAULT_REVISION else f" at revision {revision}"
        raise WeightsUnavailable(
            f"no {release.what}: {repo}{at} ({release.files}) is not in the Hugging Face cache {cache_dir()} and "
            f"{why_not}; copy {root.name} from a machine that has it into {cache_dir()}, or pass {local_flag} (a "
            f"folder with those files){also}")
    if why_not not in ("HF_HUB_OFFLINE is set", "no download was asked for"):
        print(f"{why_not}: {release.what} from the cached snapshot {repo}@{commit[:12]}", file=sys.stderr)
    try:
        names = release.select(_listing(folder))
    except LayoutError as e:
        raise WeightsUnavailable(f"the cached snapshot {folder} is incomplete ({e}): run again with the Hub "
                                 f"reachable to complete it, or pass {local_flag}{also}") from None
    return Files(folder, tuple(sorted((n, _checked(repo, commit, folder, n, (None, None))) for n in names)),
                 repo=repo, revision=commit)
