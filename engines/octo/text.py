"""Instruction tokenisation (t5-base's sentencepiece model, read from the user's local files) and the
instruction-embedding cache.

Octo's text processor is the Hugging Face t5-base tokenizer with
``max_length=16, padding="max_length", truncation=True``: the sentencepiece ids,
cut to 15, then ``</s>`` (id 1), then padding id 0; the attention mask marks the
ids and the ``</s>``. :class:`T5Tokenizer` does the same with ``sentencepiece``
on t5-base's ``spiece.model``, found by :func:`find_spiece`:

1. ``$OCTO_T5_TOKENIZER`` (the file, or a folder holding it);
2. next to the checkpoint: ``<checkpoint>/spiece.model`` or ``<checkpoint>/t5-base/spiece.model``;
3. the Hugging Face cache: ``models--google-t5--t5-base`` or ``models--t5-base`` snapshots.

Nothing is ever downloaded. A real checkpoint without these files is an error
(:class:`OctoTokenizerError`, one line saying where to put ``spiece.model``).
ONLY with random weights, where success is meaningless anyway, a missing file
falls back to :class:`HashTokenizer`: each lower-cased word hashed (sha256) to an
id, then ``</s>`` and padding, deterministic and clearly not T5's tokenisation.

:class:`InstructionCache` keeps the encoder output per (checkpoint, instruction),
in memory and optionally as ``.npy`` files in a folder, so the control loop (and
a device that only runs the backbone) never runs T5.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Callable

import numpy as np

from engines.cache import reuse, write_sealed
from engines.octo.errors import OctoTokenizerError

ENV_VAR = "OCTO_T5_TOKENIZER"
T5_REPOS = ("google-t5/t5-base", "t5-base")
PAD_ID, EOS_ID = 0, 1


def hf_hub_dirs() -> list[Path]:
    """Hugging Face hub cache folders, in the order huggingface_hub would use them."""
    out = []
    if os.environ.get("HF_HUB_CACHE"):
        out.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):
        out.append(Path(os.environ["HUGGINGFACE_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        out.append(Path(os.environ["HF_HOME"]) / "hub")
    xdg = os.environ.get("XDG_CACHE_HOME")
    out.append((Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub")
    seen, uniq = set(), []
    for p in out:
        if p not in seen:
            seen.add(p)
            uniq.append(p)
    return uniq


def hf_snapshots(repo_id: str) -> list[Path]:
    """Local snapshot folders of a repo in the HF cache, ``refs/main`` first, then newest first."""
    found = []
    for hub in hf_hub_dirs():
        root = hub / ("models--" + repo_id.replace("/", "--"))
        snaps = root / "snapshots"
        if not snaps.is_dir():
            continue
        dirs = sorted((d for d in snaps.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
        ref = root / "refs" / "main"
        if ref.is_file():
            main = snaps / ref.read_text().strip()
            dirs = [main] + [d for d in dirs if d != main] if main.is_dir() else dirs
        found += dirs
    return found


def find_spiece(checkpoint_dir: str | Path | None = None) -> Path | None:
    env = os.environ.get(ENV_VAR)
    cands: list[Path] = []
    if env:
        p = Path(env).expanduser()
        cands.append(p / "spiece.model" if p.is_dir() else p)
    if checkpoint_dir is not None:
        c = Path(checkpoint_dir)
        cands += [c / "spiece.model", c / "t5-base" / "spiece.model"]
    for repo in T5_REPOS:
        cands += [s / "spiece.model" for s in hf_snapshots(repo)]
    return next((p for p in cands if p.is_file()), None)


def where_to_put(checkpoint_dir: str | Path | None) -> str:
    place = f"{Path(checkpoint_dir) / 't5-base' / 'spiece.model'}" if checkpoint_dir else "a folder"
    return (f"put t5-base's spiece.model at {place} or point ${ENV_VAR} to it (get it on a machine with internet "
            f"with `huggingface-cli download google-t5/t5-base spiece.model`)")


class T5Tokenizer:
    """t5-base tokenisation with sentencepiece: ids[:L-1] + </s>, padded with 0 to L."""

    kind = "t5-sentencepiece"

    def __init__(self, spiece_path: str | Path, max_length: int = 16):
        from engines.optional import require

        spm = require("sentencepiece", "jax")

        self.path = Path(spiece_path)
        self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        self.max_length = max_length
        eos = self.sp.eos_id()
        self.eos = eos if eos >= 0 else EOS_ID
        pad = self.sp.pad_id()
        self.pad = pad if pad >= 0 else PAD_ID

    def __call__(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        ids = list(self.sp.encode(text))[: self.max_length - 1] + [self.eos]
        n = len(ids)
        ids = ids + [self.pad] * (self.max_length - n)
        mask = [1] * n + [0] * (self.max_length - n)
        return np.asarray(ids, np.int32), np.asarray(mask, np.int32)


class HashTokenizer:
    """Random-weights-only stand-in: lower-cased words hashed to ids in [3, vocab), then </s>, padding."""

    kind = "hash-fallback (random weights only)"

    def __init__(self, vocab_size: int, max_length: int = 16):
        self.vocab = max(4, min(vocab_size, 32100))
        self.max_length = max_length

    def __call__(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        words = re.findall(r"\w+|[^\w\s]", text.lower())
        ids = [3 + int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "little") % (self.vocab - 3)
               for w in words][: self.max_length - 1] + [EOS_ID]
        n = len(ids)
        return (np.asarray(ids + [PAD_ID] * (self.max_length - n), np.int32),
                np.asarray([1] * n + [0] * (self.max_length - n), np.int32))


def make_tokenizer(checkpoint_dir: str | Path | None, max_length: int, vocab_size: int, random_weights: bool,
                   spiece: str | Path | None = None):
    path = Path(spiece) if spiece else find_spiece(checkpoint_dir)
    if path is not None and path.is_file():
        return T5Tokenizer(path, max_length)
    if random_weights:
        return HashTokenizer(vocab_size, max_length)
    raise OctoTokenizerError(f"t5-base tokenizer not found (needed to encode instructions for this checkpoint): "
                             f"{where_to_put(checkpoint_dir)}")


class InstructionCache:
    """Encoder outputs per (checkpoint id, instruction): memory, and ``folder/<ckpt>/<sha>.npy`` when given."""

    _memory: dict[tuple[str, str], np.ndarray] = {}  # shared by all instances of a process

    def __init__(self, checkpoint_id: str, encode: Callable[[str], np.ndarray], folder: str | Path | None = None):
        self.checkpoint_id = checkpoint_id
        self.encode = encode
        self.folder = Path(folder) if folder else None
        self.misses = 0

    def _file(self, text: str) -> Path | None:
        if self.folder is None:
            return None
        ck = hashlib.sha256(self.checkpoint_id.encode()).hexdigest()[:16]
        return self.folder / ck / (hashlib.sha256(text.encode()).hexdigest()[:32] + ".npy")

    def __call__(self, text: str) -> np.ndarray:
        key = (self.checkpoint_id, text)
        if key in self._memory:
            return self._memory[key]
        f = self._file(text)
        if f is not None and reuse(f, "instruction embedding"):  # sealed: a damaged file is encoded again
            emb = np.load(f)
        else:
            self.misses += 1
            emb = np.asarray(self.encode(text), np.float32)
            if f is not None:
                write_sealed(f, lambda tmp: np.save(tmp, emb))
        emb.setflags(write=False)
        self._memory[key] = emb
        return emb
