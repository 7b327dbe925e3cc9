"""The two wire protocols, byte for byte as their reference packages speak them.

**openpi** (``openpi-client`` 0.1.2: ``websocket_client_policy.py``, ``msgpack_numpy.py``): a WebSocket; the
server sends its metadata (one msgpack map) as soon as a client connects; then each client message is one
observation map and each reply one map holding ``actions``. Arrays travel as msgpack maps
``{b"__ndarray__": True, b"data": bytes, b"dtype": str, b"shape": list}`` (numpy scalars as ``__npgeneric__``).
An error is a text frame (openpi's server sends the traceback as a string). The API key travels as the header
``Authorization: Api-Key KEY``. openpi's servers report their compute time in ``server_timing.infer_ms``.

**vla-eval** (``vla-eval`` 0.8.0: ``protocol/messages.py``, ``protocol/numpy_codec.py``,
``model_servers/serve.py``): a WebSocket of msgpack maps ``{type, payload, seq, timestamp}`` with ``type`` one
of hello, observation, action, episode_start, episode_end, error; arrays as ``{"__ndarray__": True, "data",
"dtype", "shape"}`` (string keys), images optionally as PNG/JPEG (decoded here with vla-eval's own codec when it
is installed). The client opens with HELLO and the server answers HELLO; an ACTION echoes its observation's
``seq``; ``GET /health`` answers 200 before the WebSocket handshake. vla-eval's client sends no headers, so
a token may also travel in the URL's query (``ws://HOST:PORT/?token=KEY``).

Both codecs are implemented here with ``msgpack`` alone (the client needs neither reference package); the tests
check them against the real packages.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

PROTOCOLS = ("openpi", "vla-eval")
VLA_EVAL_PROTOCOL_VERSION = 1
VLA_TYPES = ("hello", "observation", "action", "episode_start", "episode_end", "error")


class ProtocolError(ValueError):
    """A message that does not follow the protocol (one line)."""


def _line(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e).strip() else type(e).__name__


def check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    return protocol


# ------------------------------------------------------------------ openpi: msgpack-numpy
def _openpi_default(obj):
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in ("V", "O", "c"):
        raise ProtocolError(f"cannot send an array of dtype {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str,
                b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def _openpi_hook(obj):
    if b"__ndarray__" in obj:
        return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=obj[b"shape"])
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


def openpi_pack(obj: Any) -> bytes:
    import msgpack

    return msgpack.packb(obj, default=_openpi_default)


def openpi_unpack(data: bytes) -> Any:
    import msgpack

    try:
        return msgpack.unpackb(data, object_hook=_openpi_hook)
    except Exception as e:  # noqa: BLE001 - garbage from the peer: one line
        raise ProtocolError(f"not an openpi msgpack message ({len(data)} bytes): {_line(e)}") from None


# ------------------------------------------------------------------ vla-eval: typed messages
def _vla_default(obj):
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise ProtocolError(f"cannot send an array of dtype {obj.dtype}")
        return {"__ndarray__": True, "data": np.ascontiguousarray(obj).tobytes(), "dtype": obj.dtype.str,
                "shape": list(obj.shape)}
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def _vla_hook(obj):
    if not isinstance(obj, dict):
        return obj
    if "__ndarray__" in obj:
        dtype = np.dtype(obj["dtype"])
        if dtype.kind not in "biuf":
            raise ProtocolError(f"disallowed array dtype {dtype}")
        return np.frombuffer(obj["data"], dtype=dtype).reshape(obj["shape"]).copy()
    if "__image__" in obj:  # PNG/JPEG images of vla-eval's codec
        try:
            from vla_eval.protocol.image_codec import decode_image
        except ImportError:
            raise ProtocolError("an encoded image arrived; decoding it needs vla-eval (pip install -e '.[remote]')"
                                ) from None
        return decode_image(obj)
    return obj


def vla_pack(msg_type: str, payload: dict, seq: int = 0) -> bytes:
    import msgpack

    return msgpack.packb({"type": msg_type, "payload": payload, "seq": seq, "timestamp": time.time()},
                         default=_vla_default, use_bin_type=True)


def vla_unpack(data: bytes) -> dict:
    """``{type, payload, seq, timestamp}`` of one message, or one-line ProtocolError."""
    import msgpack

    if isinstance(data, str):
        raise ProtocolError(f"a text frame where a vla-eval message was expected: {data[:80]!r}")
    try:
        raw = msgpack.unpackb(data, object_hook=_vla_hook, raw=False)
    except ProtocolError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ProtocolError(f"not a vla-eval msgpack message ({len(data)} bytes): {_line(e)}") from None
    if not isinstance(raw, dict):
        raise ProtocolError(f"a vla-eval message must be a map, got {type(raw).__name__}")
    missing = [k for k in ("type", "payload", "seq", "timestamp") if k not in raw]
    if missing:
        raise ProtocolError(f"vla-eval message without {', '.join(missing)}")
    if raw["type"] not in VLA_TYPES:
        raise ProtocolError(f"unknown vla-eval message type {raw['type']!r}")
    return raw


def hello_payload(**extra: Any) -> dict:
    return {"harness_version": "shape-assembly-bench", "protocol_version": VLA_EVAL_PROTOCOL_VERSION, **extra}
