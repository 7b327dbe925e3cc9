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


# ------------------------------------------------------------------ a peer's arrays
# What a peer's bytes may become: numbers of the kinds the protocols carry (bool, int, uint, float). Anything
# else is refused before numpy sees the bytes: an object dtype ("|O") makes numpy read the peer's bytes as
# pointers (the process crashes on first use), and str, void, structured, datetime and complex arrays are no
# protocol's. No pickles: msgpack carries none, and nothing here unpickles.
ALLOWED_KINDS = "biuf"
MAX_DIMS = 8  # an observation's arrays have at most 4 (a batch of images); more is no client of these protocols


def peer_dtype(dtype: Any) -> np.dtype:
    """The dtype a peer declared (numpy's string, e.g. '<f4'), if it is a plain number type; else ProtocolError."""
    if isinstance(dtype, bytes):
        dtype = dtype.decode("ascii", "replace")
    if isinstance(dtype, np.dtype):
        parsed = dtype
    elif isinstance(dtype, str) and len(dtype) <= 16:
        try:
            parsed = np.dtype(dtype)
        except Exception:  # noqa: BLE001 - not a dtype numpy knows: one line
            raise ProtocolError(f"array dtype {dtype!r} is not a numpy dtype") from None
    else:
        raise ProtocolError(f"array dtype must be a short string such as '<f4', got {one_line(repr(dtype), 60)}")
    # kind "V" also covers structured ("f4,f4") and sub-array ("(2,)f4") dtypes
    if parsed.kind not in ALLOWED_KINDS or parsed.fields is not None or parsed.subdtype is not None:
        raise ProtocolError(f"array dtype {parsed.str!r} is not a number type the protocol carries (bool, int, "
                            "uint, float)")
    return parsed


def peer_array(data: Any, dtype: Any, shape: Any, copy: bool) -> np.ndarray:
    """The array a peer sent as raw bytes, dtype and shape, checked: a number dtype (:func:`peer_dtype`), a
    shape of at most MAX_DIMS non-negative ints, and exactly shape * itemsize bytes (a huge shape declared with
    few bytes is refused, not allocated). Read-only over the message's bytes unless ``copy``."""
    kind = peer_dtype(dtype)
    if not isinstance(data, (bytes, bytearray)):
        raise ProtocolError(f"array data must be bytes, got {type(data).__name__}")
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_DIMS or \
            not all(type(d) is int and d >= 0 for d in shape):  # type(d) is int: a bool is no dimension
        raise ProtocolError(f"array shape must be a list of at most {MAX_DIMS} non-negative ints, got "
                            f"{one_line(repr(shape), 80)}")
    count = 1
    for d in shape:  # Python ints: no overflow
        count *= d
    if count * kind.itemsize != len(data):
        raise ProtocolError(f"array of shape {tuple(shape)} and dtype {kind.str} needs {count * kind.itemsize} "
                            f"bytes, the message holds {len(data)}")
    # bytes are immutable: a view over them is read-only; a bytearray is copied once, as ``copy`` asks anyway
    array = np.frombuffer(data if isinstance(data, bytes) or copy else bytes(data), dtype=kind).reshape(shape)
    return array.copy() if copy else array


def peer_scalar(value: Any, dtype: Any) -> np.generic:
    """A numpy scalar a peer sent (openpi's ``__npgeneric__``): a number of a number dtype, else ProtocolError."""
    kind = peer_dtype(dtype)
    if type(value) not in (bool, int, float):
        raise ProtocolError(f"a numpy scalar's data must be a number, got {type(value).__name__}")
    try:
        return kind.type(value)
    except (OverflowError, ValueError, TypeError) as e:
        raise ProtocolError(f"a numpy scalar {value!r} does not fit {kind.str}: {_line(e)}") from None


def _msgpack_error(e: Exception) -> str:
    import msgpack

    if isinstance(e, msgpack.StackError):
        return "nested too deeply"
    return _line(e)


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
        missing = [k.decode() for k in (b"data", b"dtype", b"shape") if k not in obj]
        if missing:
            raise ProtocolError(f"an __ndarray__ without {', '.join(missing)}")
        return peer_array(obj[b"data"], obj[b"dtype"], obj[b"shape"], copy=False)
    if b"__npgeneric__" in obj:
        return peer_scalar(obj.get(b"data"), obj.get(b"dtype"))
    return obj


def _no_ext(code: int, data: bytes):
    raise ProtocolError(f"a msgpack extension type ({code}): no part of the protocol")


def openpi_pack(obj: Any) -> bytes:
    import msgpack

    return msgpack.packb(obj, default=_openpi_default)


def openpi_unpack(data: bytes) -> Any:
    """One openpi message, its arrays checked (:func:`peer_array`), or a one-line ProtocolError."""
    import msgpack

    if isinstance(data, str):
        raise ProtocolError(f"a text frame where an openpi msgpack message was expected: {one_line(data, 80)!r}")
    try:
        return msgpack.unpackb(data, object_hook=_openpi_hook, ext_hook=_no_ext)
    except ProtocolError as e:
        raise ProtocolError(f"a malformed openpi message ({len(data)} bytes): {e}") from None
    except Exception as e:  # noqa: BLE001 - garbage from the peer: one line
        raise ProtocolError(f"not an openpi msgpack message ({len(data)} bytes): {_msgpack_error(e)}") from None


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
        missing = [k for k in ("data", "dtype", "shape") if k not in obj]
        if missing:
            raise ProtocolError(f"an __ndarray__ without {', '.join(missing)}")
        return peer_array(obj["data"], obj["dtype"], obj["shape"], copy=True)
    if "__image__" in obj:  # images of vla-eval's codec (raw, PNG, JPEG)
        return _decode_image(obj)
    return obj


MAX_IMAGE_SIDE = 4096  # an encoded image's width and height: checked from its header before its pixels are read


def _decode_image(obj: dict) -> np.ndarray:
    """An image of vla-eval's codec (vla_eval/protocol/image_codec.py decode_image: raw bytes, or
    ``np.array(Image.open(data))``), decoded alike but checked: its raw form as :func:`peer_array` (the codec's own
    ``np.frombuffer`` takes any dtype: an object one would crash), a PNG/JPEG's size from its header first (a
    small PNG may inflate to gigabytes)."""
    fmt = obj.get("format")
    if fmt == "raw":
        return peer_array(obj.get("data"), obj.get("dtype"), obj.get("shape"), copy=True)
    if fmt not in ("png", "jpeg") or not isinstance(obj.get("data"), bytes):
        raise ProtocolError(f"an encoded image of format {one_line(repr(fmt), 30)}: raw, png or jpeg with bytes "
                            "expected")
    try:
        import io

        from PIL import Image
    except ImportError:
        raise ProtocolError("an encoded image arrived; decoding it needs Pillow (pip install -e '.[remote]')") from None
    try:
        img = Image.open(io.BytesIO(obj["data"]), formats=[fmt.upper()])  # the header only, by the declared decoder
        if not (1 <= img.width <= MAX_IMAGE_SIDE and 1 <= img.height <= MAX_IMAGE_SIDE):
            raise ProtocolError(f"an encoded image of {img.width}x{img.height} pixels (at most {MAX_IMAGE_SIDE} a "
                                "side)")
        array = np.array(img)
    except ProtocolError:
        raise
    except Exception as e:  # noqa: BLE001 - a truncated or corrupt image: one line
        raise ProtocolError(f"an encoded {fmt} image that does not decode: {_line(e)}") from None
    if array.dtype.kind not in ALLOWED_KINDS:
        raise ProtocolError(f"an encoded image decodes to {array.dtype}, not numbers")
    return array


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
        raw = msgpack.unpackb(data, object_hook=_vla_hook, ext_hook=_no_ext, raw=False)
    except ProtocolError as e:
        raise ProtocolError(f"a malformed vla-eval message ({len(data)} bytes): {e}") from None
    except Exception as e:  # noqa: BLE001
        raise ProtocolError(f"not a vla-eval msgpack message ({len(data)} bytes): {_msgpack_error(e)}") from None
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
        if not isinstance(obj["dtype"], str) or not isinstance(obj["__numpy__"], str):
            raise ProtocolError("a json_numpy array's dtype and data must be strings")
        array = peer_array(base64.b64decode(obj["__numpy__"], validate=True), descr_to_dtype(obj["dtype"]),
                           obj.get("shape"), copy=False)
        return array if array.shape else array[()]
    except ProtocolError as e:
        raise ProtocolError(f"a malformed json_numpy array: {e}") from None
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
    except RecursionError:  # json's decoder recurses per level: a peer's "[[[[..." would be a traceback
        raise ProtocolError(f"a JSON reply ({len(data)} bytes) nested too deeply") from None
