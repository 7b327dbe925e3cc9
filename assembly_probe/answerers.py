"""Answerers behind one interface: ``answer(item, data_dir) -> str`` (free text, parsed later).

* ``oracle``: solves every item from the simulator states stored with its images (never
  reads the stored answer), so a 100% score checks the generators and the scorer.
* ``random``: a uniformly random well-formed answer (chance level).
* ``http``: a multimodal model behind an OpenAI-compatible ``/v1/chat/completions``
  endpoint; images are sent inline as base64 PNG data URLs, laid out in a prompt style
  (:mod:`assembly_probe.prompts`: the official LEGO-Puzzles format by default, the legacy one on request);
  bounded retries, the server's error text, an image limit per request, and per-query
  ``last_info`` (server model, finish_reason, token counts, attempts) for the records.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import json
import math
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

from env import geometry
from assembly_probe import planning as P
from assembly_probe import prompts
from assembly_probe import questions as Q
from assembly_probe import scene as S

ANSWERERS = ("oracle", "random", "http", "sheet")  # sheet: assembly_probe.human (a person's answers, from a file)


class AnswererError(RuntimeError):
    """A configuration error (bad endpoint, ...): reported as one line by the CLI."""


# ----------------------------------------------------------------- oracle
def _scene(item, role=None, i=0):
    ims = [im for im in item["images"] if role is None or im["role"] == role]
    return ims[i]


def _block(state, bid):
    return next(b for b in state["blocks"] if b["id"] == bid)


def _solve(item):
    kind = item["type"]
    meta = item["meta"]
    if kind == "height":
        st = _scene(item)["state"]
        za, zb = (_block(st, meta["subjects"][lab])["z"] for lab in ("A", "B"))
        if abs(za - zb) <= P.POSE_TOL:
            return next(lab for lab, txt in item["options"].items() if txt == Q.SAME_HEIGHT)
        return "A" if za > zb else "B"
    if kind == "adjacency":
        st = _scene(item)["state"]
        a, b = (_block(st, i) for i in meta["subjects"])
        return "yes" if S.blocks_distance(a, b) <= Q.TOUCH_M else "no"
    if kind == "rotation":
        st = _scene(item)["state"]
        blk = _block(st, meta["subject"])
        need = Q.rotation_needed_deg(blk["shape"], blk["yaw"], st["board"]["yaw"])
        period = math.degrees(geometry.symmetry_period(blk["shape"]))
        circ = lambda v: min((v - need) % period, (need - v) % period)  # noqa: E731
        return min(meta["values_deg"], key=lambda lab: circ(meta["values_deg"][lab]))
    if kind == "multiview":
        ref = S.canonical(_scene(item, "reference")["state"])
        return next(im["label"] for im in item["images"] if im["role"] == "candidate" and S.canonical(im["state"]) == ref)
    if kind == "rotation_status":
        st = _scene(item)["state"]
        blk = _block(st, meta["subject"])
        return "no" if S.yaw_fits(blk["shape"], blk["yaw"], st["board"]["yaw"]) else "yes"
    if kind == "position":
        cur, res = _scene(item, "current"), _scene(item, "result")
        moved = next(a for b, a in zip(cur["state"]["blocks"], res["state"]["blocks"]) if a != b)
        st = res["state"]
        if any(o["id"] != moved["id"] and abs(o["x"] - moved["x"]) < 1e-6 and abs(o["y"] - moved["y"]) < 1e-6
               and o["z"] < moved["z"] for o in st["blocks"]):
            return item["labels"][3]
        cell = next(i for i in range(len(st["board"]["cells"]))
                    if np.hypot(*(S.cell_world(st["board"], i) - [moved["x"], moved["y"]])) < 1e-5)
        return item["labels"][Q.holes_left_to_right(st, res["camera"]).index(cell)]
    if kind == "next_step":
        cur = _scene(item, "current")["state"]
        x = meta["subject"]
        for im in item["images"]:
            if im["role"] != "candidate":
                continue
            st = im["state"]
            changed = [b["id"] for b, c in zip(cur["blocks"], st["blocks"]) if b != c]
            blk = _block(st, x)
            xy = S.cell_world(st["board"], Q.cell_index(st, blk["shape"]))
            inserted = (abs(blk["x"] - xy[0]) < 1e-5 and abs(blk["y"] - xy[1]) < 1e-5 and abs(blk["z"] - S.Z_TABLE) < 1e-5
                        and S.yaw_fits(blk["shape"], blk["yaw"], st["board"]["yaw"]))
            if changed == [x] and inserted:
                return im["label"]
        return None
    if kind == "dependency":
        before, after = _scene(item, "before")["state"], _scene(item, "after")["state"]
        had = {b["id"] for b in before["blocks"]}
        added = Q.part_key([b for b in after["blocks"] if b["id"] not in had])
        return next(im["label"] for im in item["images"]
                    if im["role"] == "candidate" and Q.part_key(im["state"]["blocks"]) == added)
    if kind == "backwards":
        dom, target = meta["domain"], set(meta["target"])
        for im in item["images"]:
            if im["role"] == "candidate":
                ok, ins = P.read_state(dom, im["state"])
                if ok and ins < target and ins:
                    return im["label"]
        return None
    if kind == "ordering":
        dom = meta["domain"]
        return sorted(item["labels"], key=lambda lab: len(P.read_state(dom, _by_label(item, lab))[1]))
    if kind == "outlier":
        states = [_by_label(item, lab) for lab in item["labels"]]
        hits = Q.outlier_candidates(meta["domain"], states)
        return item["labels"][hits[0]] if len(hits) == 1 else None
    if kind == "plan":
        dom, target = meta["domain"], set(meta["target"])
        valid = [im for im in item["images"] if im["role"] == "candidate" and P.valid_toward(dom, im["state"], target)]
        return [im["label"] for im in sorted(valid, key=lambda im: len(P.read_state(dom, im["state"])[1]))]
    raise ValueError(f"oracle: unknown type {kind!r}")


def _by_label(item, lab):
    return next(im["state"] for im in item["images"] if im["label"] == lab)


def format_answer(item, ans) -> str:
    if isinstance(ans, list):
        return "Answer: " + ", ".join(ans)
    return f"Answer: {ans}"


class Oracle:
    name = "oracle"

    def answer(self, item, data_dir=None) -> str:
        return format_answer(item, _solve(item))


class RandomAnswerer:
    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def answer(self, item, data_dir=None) -> str:
        # per-item stream: the answer to an item does not depend on which items ran before
        digest = hashlib.sha256(item["id"].encode()).digest()
        rng = np.random.default_rng([self.seed, int.from_bytes(digest[:8], "little")])
        fmt = item["answer_format"]
        if fmt == "yesno":
            return format_answer(item, str(rng.choice(["yes", "no"])))
        if fmt == "choice":
            return format_answer(item, str(rng.choice(item["labels"])))
        if fmt == "order":
            return format_answer(item, [str(x) for x in rng.permutation(item["labels"])])
        if fmt == "plan":
            return format_answer(item, [str(x) for x in rng.choice(item["labels"], item["k"], replace=False)])
        raise ValueError(fmt)


# ----------------------------------------------------------------- OpenAI-compatible HTTP
EXTRACT_SYSTEM_PROMPT = "You read another model's reply and copy out the final answer it gives. You never solve the question."
OVER_LIMIT = ("refuse", "tile")


class QueryError(RuntimeError):
    """One query failed for good (after any retries). ``info``: status, attempts, server text, ..."""

    def __init__(self, message: str, info: dict | None = None):
        super().__init__(message)
        self.info = info or {}


class Refused(QueryError):
    """The item was not sent: it has more images than ``--max-images`` (``--over-limit refuse``)."""


def _server_text(body: bytes, limit: int = 400) -> str:
    """The server's error message on one line: JSON ``error.message`` / ``message`` / ``detail``, else the body."""
    text = body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            err = obj.get("error", obj)
            if isinstance(err, dict):
                text = str(err.get("message") or err.get("detail") or obj.get("detail") or text)
            else:
                text = str(err)
    except ValueError:
        pass
    text = " ".join(text.split())
    return text[:limit] + ("..." if len(text) > limit else "")


def _public_url(url: str) -> str:
    """The endpoint without any user:password part, for records and reports."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def tile_images(images: list[bytes], labels: list[str], groups: int, tile: int = 256) -> list[tuple[bytes, list[str]]]:
    """Pack ``images`` (PNG bytes) into at most ``groups`` labelled grid images, consecutive images together,
    for a server that takes fewer images per request than an item has."""
    from PIL import Image, ImageDraw

    n = len(images)
    per = math.ceil(n / groups)
    out = []
    for g0 in range(0, n, per):
        chunk = list(zip(images[g0:g0 + per], labels[g0:g0 + per]))
        cols = math.ceil(math.sqrt(len(chunk)))
        rows = math.ceil(len(chunk) / cols)
        head, pad = 16, 6
        canvas = Image.new("RGB", (cols * (tile + pad) + pad, rows * (tile + head + pad) + pad), (255, 255, 255))
        draw = ImageDraw.Draw(canvas)
        for i, (data, lab) in enumerate(chunk):
            x = pad + (i % cols) * (tile + pad)
            y = pad + (i // cols) * (tile + head + pad)
            draw.text((x, y + 2), lab, fill=(0, 0, 0))
            img = Image.open(io.BytesIO(data)).convert("RGB")
            if img.size != (tile, tile):
                img = img.resize((tile, tile), Image.BILINEAR)
            canvas.paste(img, (x, y + head))
        buf = io.BytesIO()
        canvas.save(buf, format="PNG")
        out.append((buf.getvalue(), [lab for _, lab in chunk]))
    return out


class HttpAnswerer:
    """POST {endpoint}/chat/completions with the OpenAI message format (text + image_url parts).

    Failures: HTTP 429 and 5xx, timeouts and dropped connections are retried up to ``retries`` times with
    exponential backoff (``backoff_s`` doubling, at most ``backoff_max_s`` a wait, a server's Retry-After
    honoured within that cap) while the waits stay within ``retry_budget_s`` per query; other errors (a 400,
    a refused connection) fail at once. A failure raises :class:`QueryError` whose message carries the
    server's own error text. ``max_images``: an item with more images is refused (:class:`Refused`, nothing
    sent) or, with ``over_limit='tile'``, its images are packed into that many labelled grids.
    After each query ``last_info`` holds the model the server names, ``finish_reason``, token counts and
    the number of attempts.
    """

    name = "http"

    def __init__(self, endpoint: str, model: str = "default", api_key: str | None = None, timeout_s: float = 120.0,
                 max_tokens: int = 512, temperature: float = 0.0, retries: int = 4, backoff_s: float = 1.0,
                 backoff_max_s: float = 30.0, retry_budget_s: float = 300.0, max_images: int | None = None,
                 over_limit: str = "refuse", prompt_style: str = prompts.DEFAULT_STYLE, sleep=time.sleep):
        if not endpoint or not endpoint.startswith(("http://", "https://")):
            raise AnswererError(f"--endpoint must be an http(s) URL ending in /v1, got {endpoint!r}")
        if max_images is not None and max_images < 1:
            raise AnswererError(f"--max-images must be at least 1, got {max_images}")
        if over_limit not in OVER_LIMIT:
            raise AnswererError(f"--over-limit must be one of {', '.join(OVER_LIMIT)}, got {over_limit!r}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise AnswererError(f"--max-tokens must be a whole number of at least 1, got {max_tokens!r}")
        if retries < 0 or backoff_s < 0 or retry_budget_s < 0 or timeout_s <= 0:
            raise AnswererError("--retries, --backoff and --retry-budget must be >= 0 and --timeout > 0")
        if prompt_style not in prompts.STYLES:
            raise AnswererError(f"--prompt-style must be one of {', '.join(prompts.STYLES)}, got {prompt_style!r}")
        self.prompt_style = prompt_style
        self.url = endpoint.rstrip("/") + "/chat/completions"
        self.endpoint = _public_url(endpoint.rstrip("/"))
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s
        self.max_tokens, self.temperature = max_tokens, temperature
        self.retries, self.backoff_s, self.backoff_max_s, self.retry_budget_s = retries, backoff_s, backoff_max_s, retry_budget_s
        self.max_images, self.over_limit, self.sleep = max_images, over_limit, sleep
        self.last_info: dict = {}

    def describe(self) -> dict:
        return {"name": self.name, "model": self.model, "endpoint": self.endpoint, "prompt_style": self.prompt_style,
                "max_images": self.max_images,
                "over_limit": self.over_limit, "retries": self.retries, "retry_budget_s": self.retry_budget_s,
                "timeout_s": self.timeout_s, "max_tokens": self.max_tokens, "temperature": self.temperature}

    def messages(self, item, data_dir) -> list[dict]:
        """The request's messages in the answerer's prompt style (:mod:`assembly_probe.prompts`)."""
        datas = [(Path(data_dir) / im["path"]).read_bytes() for im in item["images"]]
        layout = prompts.parts(item, self.prompt_style)
        if self.max_images is not None and len(datas) > self.max_images:
            if self.over_limit == "refuse":
                raise Refused(f"refused: {len(datas)} images, more than --max-images {self.max_images}",
                              {"refused": True, "attempts": 0})
            # tiles cannot stand where each image is named: the text first, then the labelled grids
            text = prompts.text_of(item, self.prompt_style)
            parts = [{"type": "text", "text": text}]
            for data, labs in tile_images(datas, prompts.image_names(item, self.prompt_style), self.max_images):
                parts.append({"type": "text", "text": f"{', '.join(labs)} (one grid, each labelled above its picture):"})
                parts.append(_image_part(data))
        else:
            parts = [{"type": "text", "text": p} if kind == "text" else _image_part(datas[p]) for kind, p in layout]
        system = prompts.system_prompt(self.prompt_style)
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": parts}]

    def _post(self, payload: dict) -> tuple[dict, dict]:
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        info = {"attempts": 0, "retry_wait_s": 0.0, "status": None}
        while True:
            info["attempts"] += 1
            retry_after = None
            req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    info["status"] = resp.status
                    raw = resp.read()
                try:
                    return json.loads(raw.decode()), info
                except ValueError:
                    raise QueryError(f"the server's reply is not JSON: {_server_text(raw, 120)!r}", info) from None
            except urllib.error.HTTPError as e:
                info["status"] = e.code
                try:
                    text = _server_text(e.read())
                except Exception:  # noqa: BLE001 - the body of an error reply is best effort
                    text = ""
                err = f"HTTP {e.code} {e.reason}: {text}" if text else f"HTTP {e.code} {e.reason}"
                retryable = e.code == 429 or e.code >= 500
                try:
                    retry_after = float(e.headers.get("Retry-After")) if e.headers.get("Retry-After") else None
                except ValueError:
                    retry_after = None
            except (TimeoutError, socket.timeout):
                err, retryable = f"timed out after {self.timeout_s:g} s", True
            except (http.client.HTTPException, ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as e:
                err, retryable = f"connection dropped ({type(e).__name__}: {e})", True
            except urllib.error.URLError as e:
                reason = e.reason
                if isinstance(reason, (TimeoutError, socket.timeout)):
                    err, retryable = f"timed out after {self.timeout_s:g} s", True
                elif isinstance(reason, (http.client.HTTPException, ConnectionResetError, ConnectionAbortedError,
                                         BrokenPipeError)):
                    err, retryable = f"connection dropped ({type(reason).__name__}: {reason})", True
                else:  # refused, unknown host: nothing to wait for
                    err, retryable = f"cannot reach {self.endpoint}: {reason}", False
            info["error"] = err
            wait = min(self.backoff_max_s, self.backoff_s * 2 ** (info["attempts"] - 1))
            if retry_after is not None:
                wait = min(self.backoff_max_s, max(wait, retry_after))
            if not retryable:
                raise QueryError(err, info)
            if info["attempts"] > self.retries or info["retry_wait_s"] + wait > self.retry_budget_s:
                raise QueryError(f"{err} (gave up after {info['attempts']} attempts, "
                                 f"{info['retry_wait_s']:.1f} s of waits)", info)
            self.sleep(wait)
            info["retry_wait_s"] += wait

    def chat(self, messages, model=None, max_tokens=None, extra: dict | None = None) -> dict:
        """One chat completion (with the retries): the reply's ``choices[0].message``; ``last_info`` set.
        ``extra``: more request fields (e.g. ``modalities`` for image output)."""
        payload = {"model": model or self.model, "messages": messages, "max_tokens": max_tokens or self.max_tokens,
                   "temperature": self.temperature, **(extra or {})}
        self.last_info = {}
        out, info = self._post(payload)
        try:
            choice = out["choices"][0]
            message = choice["message"]
            message.get("content")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise QueryError(f"the server's reply has no choices[0].message: {json.dumps(out)[:200]}", info) from None
        usage = out.get("usage") if isinstance(out.get("usage"), dict) else {}
        info.update(server_model=out.get("model"), finish_reason=choice.get("finish_reason"),
                    prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"))
        info.pop("error", None)
        self.last_info = info
        return message

    def _complete(self, messages, model=None, max_tokens=None) -> str:
        content = self.chat(messages, model, max_tokens).get("content")
        if isinstance(content, list):  # some servers return content parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content or ""

    def answer(self, item, data_dir=None) -> str:
        return self._complete(self.messages(item, data_dir))

    def extract(self, item, reply: str, model: str) -> str:
        """Model-assisted extraction: a text-only request to ``model`` on the same endpoint."""
        from assembly_probe.parsing import extraction_prompt

        msgs = [{"role": "system", "content": EXTRACT_SYSTEM_PROMPT},
                {"role": "user", "content": extraction_prompt(item, reply)}]
        return self._complete(msgs, model=model, max_tokens=64)


def _image_part(png: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}


def reply_images(message: dict) -> list[bytes]:
    """The images of a chat reply, in order: ``message.images`` (OpenRouter's image output: image_url parts)
    and image_url parts of a list ``content``; each a base64 data URL (a remote URL is not fetched)."""
    content = message.get("content")
    found = []
    for part in list(message.get("images") or []) + (content if isinstance(content, list) else []):
        if not isinstance(part, dict) or part.get("type") != "image_url":
            continue
        url = (part.get("image_url") or {}).get("url", "")
        head, sep, data = url.partition(",")
        if not (sep and head.startswith("data:image/") and head.endswith(";base64")):
            raise QueryError(f"the reply's image is not a base64 data URL (remote images are not fetched): {url[:60]!r}")
        try:
            found.append(base64.b64decode(data, validate=True))
        except ValueError:
            raise QueryError("the reply's image data URL is not valid base64") from None
    return found


def make_answerer(name: str, **kw):
    if name == "oracle":
        return Oracle()
    if name == "random":
        return RandomAnswerer(seed=kw.get("seed", 0))
    if name == "http":
        extra = {k: kw[k] for k in ("retries", "backoff_s", "retry_budget_s", "max_images", "over_limit",
                                    "prompt_style", "max_tokens") if kw.get(k) is not None}
        return HttpAnswerer(kw.get("endpoint") or "", model=kw.get("model") or "default", api_key=kw.get("api_key"),
                            timeout_s=kw.get("timeout_s", 120.0), **extra)
    if name == "sheet":
        raise AnswererError("the sheet answerer reads a filled answer sheet against its set: "
                            "assembly_probe.human.SheetAnswerer (run --answerer sheet --sheet FILE)")
    raise AnswererError(f"unknown answerer {name!r}; valid: {', '.join(ANSWERERS)}")
