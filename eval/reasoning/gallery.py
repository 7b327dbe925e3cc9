"""Example question composites: the prompt, the images (small tiles) and the answer, one PNG each."""

from __future__ import annotations

import textwrap
from pathlib import Path

from eval.reasoning import questions as Q

EXAMPLES = [(t, 0) for t in Q.TYPES] + [("plan", 3), ("plan", 6)]  # first item of each type, Plan-3 and Plan-6


def composite(item, data_dir, tile=192, columns=8):
    from PIL import Image, ImageDraw

    pad, label_h = 4, 13
    n = len(item["images"])
    cols = min(columns, n)
    rows = (n + cols - 1) // cols
    width = max(cols * (tile + pad) + pad, 520)
    answer = item["answer"] if not isinstance(item["answer"], list) else ", ".join(item["answer"])
    text = textwrap.wrap(f"[{item['id']}] {item['prompt']}", width=width // 6) + [f"answer: {answer}"]
    head = 12 * len(text) + 2 * pad
    canvas = Image.new("RGB", (width, head + rows * (tile + label_h + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for i, line in enumerate(text):
        draw.text((pad, pad + 12 * i), line, fill=(0, 0, 0))
    for i, im in enumerate(item["images"]):
        x = pad + (i % cols) * (tile + pad)
        y = head + (i // cols) * (tile + label_h + pad)
        img = Image.open(Path(data_dir) / im["path"]).convert("RGB").resize((tile, tile), Image.LANCZOS)
        draw.text((x, y), im["label"], fill=(0, 0, 0))
        canvas.paste(img, (x, y + label_h))
    return canvas.quantize(colors=128, dither=Image.Dither.NONE)  # palette PNG: a few times smaller


def write_gallery(items, data_dir, out, tile=192) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind, which in EXAMPLES:
        if kind == "plan":
            pick = [it for it in items if it["type"] == "plan" and it["k"] == which]
        else:
            pick = [it for it in items if it["type"] == kind]
        if not pick:
            continue
        item = pick[0]
        path = out / f"{item['id']}.png"
        composite(item, data_dir, tile).save(path, optimize=True)
        paths.append(path)
    return paths

