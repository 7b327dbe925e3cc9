"""Answerers behind one interface: ``answer(item, data_dir) -> str`` (free text, parsed later).

* ``oracle``: solves every item from the simulator states stored with its images (never
  reads the stored answer), so a 100% score checks the generators and the scorer.
* ``random``: a uniformly random well-formed answer (chance level).
* ``http``: a multimodal model behind an OpenAI-compatible ``/v1/chat/completions``
  endpoint; images are sent inline as base64 PNG data URLs, one labelled text part before each.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from env import geometry
from eval.reasoning import planning as P
from eval.reasoning import questions as Q
from eval.reasoning import scene as S

ANSWERERS = ("oracle", "random", "http")


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
        im = _scene(item)
        st = im["state"]
        shape = _block(st, meta["subject"])["shape"]
        return item["labels"][Q.holes_left_to_right(st, im["camera"]).index(Q.cell_index(st, shape))]
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
        if S.canonical(before["board"]) != S.canonical(after["board"]):
            changed = "board"
        else:
            changed = next(b["id"] for b, a in zip(before["blocks"], after["blocks"]) if b != a)
        return next(lab for lab, i in meta["option_ids"].items() if i == changed)
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
SYSTEM_PROMPT = ("You answer questions about rendered images of a robot workspace: a table, a board with shaped "
                 "holes and coloured blocks (circle, square, triangle) with a knob on top. Think briefly, then end "
                 "with a line 'Answer: ...' in the requested format.")


class HttpAnswerer:
    """POST {endpoint}/chat/completions with the OpenAI message format (text + image_url parts)."""

    name = "http"

    def __init__(self, endpoint: str, model: str = "default", api_key: str | None = None, timeout_s: float = 120.0,
                 max_tokens: int = 512, temperature: float = 0.0):
        if not endpoint or not endpoint.startswith(("http://", "https://")):
            raise AnswererError(f"--endpoint must be an http(s) URL ending in /v1, got {endpoint!r}")
        self.url = endpoint.rstrip("/") + "/chat/completions"
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s
        self.max_tokens, self.temperature = max_tokens, temperature

    def messages(self, item, data_dir) -> list[dict]:
        parts = [{"type": "text", "text": item["prompt"]}]
        for im in item["images"]:
            data = (Path(data_dir) / im["path"]).read_bytes()
            parts.append({"type": "text", "text": f"{im['label']}:"})
            parts.append({"type": "image_url",
                          "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}})
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": parts}]

    def answer(self, item, data_dir=None) -> str:
        body = json.dumps({"model": self.model, "messages": self.messages(item, data_dir),
                           "max_tokens": self.max_tokens, "temperature": self.temperature}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            out = json.loads(resp.read().decode())
        content = out["choices"][0]["message"]["content"]
        if isinstance(content, list):  # some servers return content parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content or ""


def make_answerer(name: str, **kw):
    if name == "oracle":
        return Oracle()
    if name == "random":
        return RandomAnswerer(seed=kw.get("seed", 0))
    if name == "http":
        return HttpAnswerer(kw.get("endpoint") or "", model=kw.get("model") or "default", api_key=kw.get("api_key"),
                            timeout_s=kw.get("timeout_s", 120.0))
    raise AnswererError(f"unknown answerer {name!r}; valid: {', '.join(ANSWERERS)}")
