"""The three wire protocols, byte for byte as their reference code speaks them.

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
a token may also travel in the URL's query (``ws://HOST:PORT/?token=KEY``). An error is an ERROR message
``{"error": "observation_failed: Type: message"}``.

**openvla-http** (openvla-oft's own server, ``vla-scripts/deploy.py`` of moojink/openvla-oft@213c5ff): HTTP
``POST /act`` (port 8777 by default) of one JSON observation map, arrays encoded as ``json_numpy`` 2.1.1 encodes
them (``{"__numpy__": base64 of the C-order bytes, "dtype": numpy's descr, "shape": [...]}``: deploy.py calls
``json_numpy.patch()``, so FastAPI decodes them); the reply is the JSON list of the chunk's actions (arrays
encoded alike), or the JSON string ``"error"`` when ``get_vla_action`` raised (the traceback stays in the
server's log). A FastAPI server lists its routes at ``GET /openapi.json``: the handshake checks ``/act`` is one.

The codecs are implemented here with ``msgpack``, ``json`` and ``base64`` alone (the client needs none of the
reference packages); the tests check them against the real packages.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import numpy as np

PROTOCOLS = ("openpi", "vla-eval", "openvla-http")
SERVED_PROTOCOLS = ("openpi", "vla-eval")  # what eval.serve speaks (openvla-http is openvla-oft's own server)
URL_SCHEMES = {"openpi": ("ws", "wss"), "vla-eval": ("ws", "wss"), "openvla-http": ("http", "https")}
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


def check_url(url: str | None, protocol: str) -> str:
    """The server URL of ``protocol`` (ws:// or wss://; http:// or https:// for openvla-http), or one line."""
    schemes = URL_SCHEMES[check_protocol(protocol)]
    example = f"{schemes[0]}://HOST:PORT"
    if not url:
        raise ValueError(f"--model remote needs --server {example}")
    if url.split("://", 1)[0] not in schemes or "://" not in url:
        raise ValueError(f"--server must be a {' or '.join(s + '://' for s in schemes)} URL for --protocol "
                         f"{protocol}, got {url!r}")
    return url


def one_line(text: str, limit: int = 400) -> str:
    """Text of a peer (an error, a reply) as one line of at most ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def exception_line(text: str) -> str:
    """The exception (type and message) of a server's error text, in one line: of a Python traceback (what
    openpi's websocket_policy_server sends) the lines after its last frame, else the text itself."""
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    if lines and lines[0].startswith("Traceback (most recent call last)"):
        frames = [i for i, ln in enumerate(lines) if ln.startswith(" ")]
        lines = lines[frames[-1] + 1:] if frames and frames[-1] + 1 < len(lines) else lines[-1:]
    return one_line(" ".join(lines)) or "(no text)"


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


# ------------------------------------------------------------------ openvla-http: JSON with json_numpy arrays
def _json_numpy_default(obj):
    if isinstance(obj, (np.ndarray, np.generic)):
        from numpy.lib.format import dtype_to_descr

        if obj.dtype.kind not in "biuf":
            raise ProtocolError(f"cannot send an array of dtype {obj.dtype}")
        return {"__numpy__": base64.b64encode(np.ascontiguousarray(obj).tobytes()).decode(),
                "dtype": dtype_to_descr(obj.dtype), "shape": list(np.shape(obj))}
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _json_numpy_hook(obj: dict):
    if "__numpy__" not in obj:
        return obj
    from numpy.lib.format import descr_to_dtype

    try:
        dtype = descr_to_dtype(obj["dtype"])
        if dtype.kind not in "biuf":
            raise ProtocolError(f"disallowed array dtype {dtype}")
        flat = np.frombuffer(base64.b64decode(obj["__numpy__"]), dtype)
        return flat.reshape(obj["shape"]) if obj["shape"] else flat[0]
    except ProtocolError:
        raise
    except Exception as e:  # noqa: BLE001 - a malformed array from the peer: one line
        raise ProtocolError(f"a malformed json_numpy array ({_line(e)})") from None


def json_numpy_dumps(obj: Any) -> bytes:
    return json.dumps(obj, default=_json_numpy_default, allow_nan=False).encode()


def json_numpy_loads(data: bytes) -> Any:
    try:
        return json.loads(data, object_hook=_json_numpy_hook)
    except ProtocolError:
        raise
    except ValueError as e:
        raise ProtocolError(f"not a JSON reply ({len(data)} bytes): {_line(e)}") from None
