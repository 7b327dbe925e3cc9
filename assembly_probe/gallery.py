"""The gallery: example items as a person reads them, one composite PNG each and a page listing them.

Every elementary type's first ``PER_TYPE`` items (the start of its Lite subset) and the first Plan-k-step item
of every k. A composite holds the question in the official prompt style (:mod:`assembly_probe.prompts`), the
options, the answer, and each picture under its number (``<image N>``) and its label.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from assembly_probe import prompts
from assembly_probe import questions as Q

PER_TYPE = 5
PAGE = "README.md"


def pick(items, per_type: int = PER_TYPE) -> list[dict]:
    out = []
    for t in Q.TYPES:
        out += [it for it in items if it["type"] == t][:per_type]
    for k in sorted({it["k"] for it in items if it["type"] == "plan"}):
        out += [it for it in items if it["type"] == "plan" and it["k"] == k][:1]
    return out


def _answer(item) -> str:
    return item["answer"] if not isinstance(item["answer"], list) else ", ".join(item["answer"])


def composite(item, data_dir, tile=224, columns=6, show_answer: bool = True):
    from PIL import Image, ImageDraw

    pad, label_h = 4, 13
    n = len(item["images"])
    cols = min(columns, n)
    rows = (n + cols - 1) // cols
    width = max(cols * (tile + pad) + pad, 640)
    text = []
    for para in f"[{item['id']}] {prompts.official_text(item)}".splitlines():
        text += textwrap.wrap(para, width=width // 6) or [""]
    if show_answer:
        text.append(f"answer: {_answer(item)}")
    head = 12 * len(text) + 2 * pad
    canvas = Image.new("RGB", (width, head + rows * (tile + label_h + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for i, line in enumerate(text):
        draw.text((pad, pad + 12 * i), line, fill=(0, 0, 0))
    for i, im in enumerate(item["images"]):
        x = pad + (i % cols) * (tile + pad)
        y = head + (i // cols) * (tile + label_h + pad)
        img = Image.open(Path(data_dir) / im["path"]).convert("RGB").resize((tile, tile), Image.LANCZOS)
        draw.text((x, y), f"<image {i + 1}>  {im['label']}", fill=(0, 0, 0))
        canvas.paste(img, (x, y + label_h))
    return canvas.quantize(colors=96, dither=Image.Dither.NONE)  # palette PNG: a few times smaller


def write_gallery(items, data_dir, out, tile=224, per_type: int = PER_TYPE,
                  set_sha256_states: str | None = None) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.png"):
        stale.unlink()
    chosen = pick(items, per_type)
    from assembly_probe import caveats

    lines = ["# Reasoning probe: gallery", "",
             f"The first {per_type} items of every elementary type (the start of its Lite subset) and the first "
             "Plan-k-step item of every k, as a model sees them in the default (official) prompt style: the question, "
             "the options, each picture under its `<image N>`; the answer last."
             + (f" Set sha256_states `{set_sha256_states}`." if set_sha256_states else ""), "", caveats.WHAT_THE_SET_IS, ""]
    paths, current = [], None
    for item in chosen:
        kind = item["type"] if item["type"] != "plan" else "plan"
        if kind != current:
            current = kind
            lines += [f"## {kind.replace('_', ' ')}", ""]
        path = out / f"{item['id']}.png"
        composite(item, data_dir, tile).save(path, optimize=True)
        paths.append(path)
        extra = item["meta"].get("distractor_kinds") or item["meta"].get("placement") or item["meta"].get("outlier_kind")
        lines += [f"**{item['id']}**: answer {_answer(item)}" + (f" ({extra})" if extra else "") + ".", "",
                  f"![{item['id']}]({path.name})", ""]
    (out / PAGE).write_text("\n".join(lines))
    return paths
