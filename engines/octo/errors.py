"""Errors of the Octo engine: each message is ONE line a runner can print as it is."""

from __future__ import annotations


class OctoError(RuntimeError):
    """Base of the Octo engine's errors; ``str(e)`` is a single line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class OctoCheckpointError(OctoError):
    """A checkpoint is missing, incomplete, or does not match the architecture (file or parameter named)."""


class OctoTokenizerError(OctoError):
    """The t5-base tokenizer files (``spiece.model``) are missing where a real checkpoint needs them."""
