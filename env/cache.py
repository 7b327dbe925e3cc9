"""The project's one cache folder: ``$SAB_CACHE_DIR``, else ``~/.cache/shape_assembly_bench``. It holds what
is built on first use and can be rebuilt at any time: collision meshes (``meshes/``), ONNX exports
(``onnx/``), TensorRT engines (``engines/``) and instruction embeddings (the engines' folders:
:mod:`engines.cache`).

Every entry is written the one way :func:`write_sealed` writes it: whole (a temporary file renamed into place),
then sealed (its sha256 beside it, ``<file>.sha256``). :func:`reuse` trusts an entry only when its seal matches;
a damaged one (a truncated copy, a disk error) or one without a seal (an older release wrote it) is removed and
built again, and one line on stderr names the file and says why: nothing damaged is loaded, nothing is rebuilt
silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Callable

SEAL_SUFFIX = ".sha256"


def cache_root() -> Path:
    return Path(os.environ.get("SAB_CACHE_DIR") or Path.home() / ".cache" / "shape_assembly_bench")


_remembered: dict | None = None  # (device, inode, size, mtime_ns) -> sha256, inside hashes_remembered() only


@contextlib.contextmanager
def hashes_remembered():
    """Inside, a file unchanged since it was hashed (same inode, size and modification time) is not read again: a
    build writes a graph, seals it, rewrites it and lists it in a manifest, hashing each file once. Outside (a
    run checking what it loads) every call reads the whole file."""
    global _remembered
    outer, _remembered = _remembered, ({} if _remembered is None else _remembered)
    try:
        yield
    finally:
        _remembered = outer


def sha256_file(path: str | Path) -> str:
    key = None
    if _remembered is not None:
        st = os.stat(path)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in _remembered:
            return _remembered[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    # a file modified within the last second may be modified again with the same coarse timestamp and size
    # ("racily clean", as git calls it): hashed again next time
    if key is not None and time.time_ns() - key[3] > 1_000_000_000:
        _remembered[key] = h.hexdigest()
    return h.hexdigest()


def seal_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + SEAL_SUFFIX)


def _write_seal(path: Path, digest: str) -> None:
    target = seal_path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(digest + "\n")
    os.replace(tmp, target)


_UNSEALED = "no seal beside it"
_said_unsealed: set[str] = set()  # kinds of entry whose older, unsealed files this process has said it rebuilds


def damaged(path: str | Path) -> str | None:
    """Why the entry at ``path`` cannot be trusted (no seal beside it; its sha256 does not match its seal;
    it cannot be read), or None when it is whole."""
    path = Path(path)
    try:
        expected = seal_path(path).read_text().strip()
    except FileNotFoundError:
        return _UNSEALED
    except OSError as e:
        return f"its seal cannot be read ({e.strerror or e})"
    try:
        found = sha256_file(path)
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    return None if found == expected else f"its sha256 {found[:12]} does not match its seal {expected[:12]}"


def reuse(path: str | Path, what: str) -> bool:
    """True when the entry is there and whole. Otherwise it is removed (with its seal) and the caller builds it
    again: a damaged entry is said in one line naming the file; entries an older release wrote without a seal
    are said once per kind and process."""
    path = Path(path)
    if not path.exists():
        return False
    reason = damaged(path)
    if reason is None:
        return True
    if reason != _UNSEALED:
        print(f"cached {what} {path} is damaged ({reason}): building it again", file=sys.stderr)
    elif what not in _said_unsealed:
        _said_unsealed.add(what)
        print(f"cached {what} files written by an older release have no seal (e.g. {path}): building them again",
              file=sys.stderr)
    path.unlink(missing_ok=True)
    seal_path(path).unlink(missing_ok=True)
    return False


def write_sealed(path: str | Path, write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` writes the entry to a temporary file beside ``path``; its seal is written, then the entry
    is renamed into place. A reader never sees half an entry nor an entry without its seal (workers that build
    the same entry at once each write a whole one); a kill between the two steps leaves a seal without an
    entry, which is built again."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(tmp)
        _write_seal(path, sha256_file(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
