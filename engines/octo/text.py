"""Instruction tokenisation (t5-base's sentencepiece model) and the instruction-embedding cache.

Octo's text processor is the Hugging Face t5-base tokenizer with
``max_length=16, padding="max_length", truncation=True``: the sentencepiece ids,
cut to 15, then ``</s>`` (id 1), then padding id 0; the attention mask marks the
ids and the ``</s>``. :class:`T5Tokenizer` does the same with ``sentencepiece``
on t5-base's ``spiece.model``, found by :func:`resolve_spiece`:

1. the file given, or ``$OCTO_T5_TOKENIZER`` (the file, or a folder holding it);
2. next to a checkpoint folder: ``<checkpoint>/spiece.model`` or ``<checkpoint>/t5-base/spiece.model``;
3. ``google-t5/t5-base`` on the Hugging Face Hub (:mod:`engines.hub`: the cache, or a download of that one file).

A real checkpoint without it is an error (one line naming the repo, the file, the cache
folder and where else to put it). ONLY with random weights, where success is meaningless
anyway, nothing is downloaded and a missing file falls back to :class:`HashTokenizer`:
each lower-cased word hashed (sha256) to an id, then ``</s>`` and padding,
deterministic and clearly not T5's tokenisation.

:class:`InstructionCache` keeps the encoder output per (checkpoint, instruction),
in memory and optionally as ``.npy`` files in a folder, so the control loop (and
a device that only runs the backbone) never runs T5.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from engines import hub
from engines.cache import reuse, write_sealed
from engines.octo.errors import OctoTokenizerError

ENV_VAR = "OCTO_T5_TOKENIZER"
T5_REPO = "google-t5/t5-base"
SPIECE = "spiece.model"
PAD_ID, EOS_ID = 0, 1


def _spiece_only(paths: Sequence[str]) -> list[str]:
    if SPIECE not in paths:
        raise hub.LayoutError(f"no {SPIECE}")
    return [SPIECE]


def resolve_spiece(checkpoint: "hub.Files | None" = None, spiece: str | Path | None = None,
                   download: bool = True) -> "hub.Files":
    """t5-base's ``spiece.model`` (:class:`engines.hub.Files`): ``spiece`` or ``$OCTO_T5_TOKENIZER``, beside a
    checkpoint folder, else from the Hub (``download=False``: the cache only). One-line errors."""
    given = spiece or os.environ.get(ENV_VAR)
    if given:
        p = Path(given).expanduser()
        folder, name = (p, SPIECE) if p.is_dir() else (p.parent, p.name)
        if not (folder / name).is_file():
            source = "given" if spiece else f"${ENV_VAR}"
            raise OctoTokenizerError(f"{p} ({source}): no t5-base {SPIECE} there")
        return hub.local_files(folder, [name])
    if checkpoint is not None and checkpoint.repo is None:
        for sub in ("", "t5-base"):
            if (checkpoint.folder / sub / SPIECE).is_file():
                return hub.local_files(checkpoint.folder / sub, [SPIECE])
    put = f"{checkpoint.folder / 't5-base' / SPIECE}, or " if checkpoint is not None and checkpoint.repo is None else ""
    release = hub.Release(T5_REPO, what="t5-base tokenizer (needed to encode instructions)", files=SPIECE,
                          select=_spiece_only)
    return hub.fetch(release, local_flag=f"{put}${ENV_VAR}=FILE", download=download)


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


def make_tokenizer(spiece: "hub.Files | None", max_length: int, vocab_size: int):
    """T5's tokenisation on ``spiece``'s model; None (random weights only): :class:`HashTokenizer`."""
    if spiece is not None:
        return T5Tokenizer(spiece.path(spiece.names[0]), max_length)
    return HashTokenizer(vocab_size, max_length)


def random_weights_spiece(spiece: str | Path | None = None) -> "hub.Files | None":
    """The tokenizer random weights use: a local ``spiece.model`` where there is one, nothing downloaded."""
    try:
        return resolve_spiece(None, spiece, download=False)
    except hub.WeightsUnavailable:
        return None


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
