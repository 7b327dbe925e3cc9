"""Plan-k-Step-Generation driver for an image-generating model behind an OpenAI-compatible chat endpoint.

``multi-turn`` (the paper's protocol, the default): turn 1 sends the initial and the target picture and asks
for the state after move 1; every later turn keeps the conversation, the model's own previous picture as its
reply, and asks for the next state, so each state is drawn from the model's own previous one.
``single-shot``: one request asks for all k pictures; the reply must hold k images.

Requests go through :class:`answerers.HttpAnswerer` (the same retries, timeouts and server error text) with
``modalities: ["image", "text"]``; a reply's images are read by :func:`answerers.reply_images` (OpenRouter's
``message.images`` or image parts of the content, base64 data URLs). The pictures are written as
``DIR/<case id>/step<i>.png`` with ``DIR/run.json`` (protocol, model, endpoint, per-case turns and errors),
which ``generate-score`` reads to label its report.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from assembly_probe import genset as GS
from assembly_probe.answerers import HttpAnswerer, QueryError, _image_part, reply_images
from assembly_probe.genset import GenError

PROTOCOLS = ("multi-turn", "single-shot")
MODALITIES = {"modalities": ["image", "text"]}
MAX_TOKENS = 4096


def _intro(k: int) -> str:
    return GS.gen_prompt(k)


def first_turn(k: int) -> str:
    return (_intro(k) + " Go one move at a time: now draw only the state after move 1, as one image from the "
            "same camera as the inputs.")


def next_turn(i: int) -> str:
    return f"Now draw only the state after move {i}, one move on from your previous image, from the same camera."


def single_shot(k: int) -> str:
    return _intro(k) + f" Reply with {k} images, in the order of the moves, one per move."


def _inputs(case, data_dir) -> list[dict]:
    parts = []
    for im in case["images"]:
        parts += [{"type": "text", "text": f"{im['label']}:"}, _image_part((Path(data_dir) / im["path"]).read_bytes())]
    return parts


def _png(data: bytes) -> bytes:
    """Any image format the server sends, as PNG."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            buf = io.BytesIO()
            im.convert("RGB").save(buf, format="PNG")
            return buf.getvalue()
    except (UnidentifiedImageError, OSError) as e:
        raise QueryError(f"the reply's image cannot be read: {e}") from None


def run_case(client: HttpAnswerer, case, data_dir, folder: Path, protocol: str) -> dict:
    """Ask the model for one case's k pictures and write them; the turns' records."""
    folder.mkdir(parents=True, exist_ok=True)
    k, turns = case["k"], []
    if protocol == "single-shot":
        msgs = [{"role": "user", "content": [{"type": "text", "text": single_shot(k)}] + _inputs(case, data_dir)}]
        images = reply_images(client.chat(msgs, max_tokens=MAX_TOKENS, extra=MODALITIES))
        turns.append({**_info(client), "images": len(images)})
        if len(images) != k:
            raise QueryError(f"asked for {k} images in one reply, got {len(images)}", {"turns": turns})
        for i, data in enumerate(images, start=1):
            (folder / GS.STEP_FILE.format(i)).write_bytes(_png(data))
        return {"turns": turns}
    msgs = [{"role": "user", "content": [{"type": "text", "text": first_turn(k)}] + _inputs(case, data_dir)}]
    for i in range(1, k + 1):
        if i > 1:
            msgs.append({"role": "user", "content": [{"type": "text", "text": next_turn(i)}]})
        try:
            images = reply_images(client.chat(msgs, max_tokens=MAX_TOKENS, extra=MODALITIES))
        except QueryError as e:
            raise QueryError(f"turn {i}: {e}", {"turns": turns}) from None
        turns.append({**_info(client), "images": len(images)})
        if not images:
            raise QueryError(f"turn {i}: the reply has no image", {"turns": turns})
        png = _png(images[0])  # one state per turn: the first image
        (folder / GS.STEP_FILE.format(i)).write_bytes(png)
        msgs.append({"role": "assistant", "content": [_image_part(png)]})  # the model's own picture, seen next turn
    return {"turns": turns}


def _info(client) -> dict:
    info = client.last_info or {}
    return {key: info.get(key) for key in ("attempts", "retry_wait_s", "finish_reason", "server_model",
                                           "prompt_tokens", "completion_tokens")}


def generate(data, out, client: HttpAnswerer, protocol: str = "multi-turn", max_fail_share: float = 0.1,
             min_failures: int = 3, progress: bool = True) -> dict:
    """Every case of the set through the model; ``run.json`` beside the folders. Stops (GenError) once at least
    ``min_failures`` cases failed and they are more than ``max_fail_share`` of those asked, or when every case
    failed."""
    from tqdm import tqdm

    if protocol not in PROTOCOLS:
        raise GenError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    cases, manifest = GS.load(data)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    run = {"protocol": protocol, "model": client.model, "endpoint": client.endpoint,
           "set_sha256_states": manifest.get("sha256_states"), "cases": {}}
    failed = 0
    for n, case in enumerate(tqdm(cases, desc=f"generating ({protocol})", unit="case", disable=not progress), start=1):
        try:
            rec = run_case(client, case, data, out / case["id"], protocol)
            rec["error"] = None
        except QueryError as e:
            failed += 1
            rec = {"turns": (e.info or {}).get("turns", []), "error": str(e)}
        run["cases"][case["id"]] = rec
        (out / GS.RUN_FILE).write_text(json.dumps(run, indent=2) + "\n")
        if rec["error"] and failed >= min_failures and failed > max_fail_share * n:
            raise GenError(f"stopped after {n} cases: {failed} failed (more than --max-fail-share "
                           f"{max_fail_share:g}); last: {case['id']}: {rec['error']} (what was drawn is in {out})")
    if cases and failed == len(cases):
        raise GenError(f"every case failed ({failed}); last: {rec['error']}")
    run["failed"] = failed
    (out / GS.RUN_FILE).write_text(json.dumps(run, indent=2) + "\n")
    return run

