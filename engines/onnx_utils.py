"""Checks and metadata for exported ONNX files."""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path

from engines.cache import sha256_file  # noqa: F401 - the one file digest, named here for the model files
from engines.optional import require


class BadModelFileError(ValueError):
    """A model file is missing, truncated, corrupt or not what was expected (one line)."""


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector off for a graph export, rewrite or quantization pass: they make many small
    objects and no cycles worth collecting, and in a build process that has exported with JAX each full
    collection walks ~300k live objects (measured: octo-small's rewrite 4.4 -> 2.6 s). Reference counting
    still frees everything; the collector is back on (if it was) afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def check_onnx_file(path: str | Path):
    """Load and check an ONNX file; one clear line when it is missing, truncated or corrupt."""
    onnx = require("onnx", "export")
    path = Path(path)
    if not path.is_file():
        raise BadModelFileError(f"ONNX file {path} does not exist; build it with: make engines")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001 - protobuf and checker errors have many types
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadModelFileError(f"ONNX file {path} is corrupt or truncated ({first}); rebuild it with: make engines") from None
    return model


def set_metadata(path: str | Path, **props: str) -> None:
    """Record provenance (exporter, opset, source) in the file's metadata_props."""
    onnx = require("onnx", "export")
    model = onnx.load(str(path))
    existing = {p.key: p for p in model.metadata_props}
    for k, v in props.items():
        if k in existing:
            existing[k].value = str(v)
        else:
            entry = model.metadata_props.add()
            entry.key, entry.value = k, str(v)
    onnx.save(model, str(path))


def metadata(path: str | Path) -> dict[str, str]:
    model = check_onnx_file(path)
    return {p.key: p.value for p in model.metadata_props}


QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def has_qdq(path_or_model) -> bool:
    """Whether a graph holds QuantizeLinear/DequantizeLinear nodes (an explicitly quantized graph)."""
    onnx = require("onnx", "export")
    m = path_or_model if not isinstance(path_or_model, (str, Path)) else onnx.load(str(path_or_model),
                                                                                   load_external_data=False)
    return any(n.op_type in QDQ_OPS for n in m.graph.node)
