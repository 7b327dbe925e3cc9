"""MP4 of a try: both cameras side by side, with the step, the success conditions and the flags drawn on."""

from __future__ import annotations

import numpy as np

CONDITIONS = ("matched", "deep", "released", "settled")
FLAGS = ("wrong_hole", "rim", "penetration", "glitch", "dropped")


class TryVideo:
    def __init__(self, path: str, fps: int = 20):
        self.path = path
        self.fps = fps
        self.frames: list[np.ndarray] = []

    def add(self, third_person: np.ndarray, wrist: np.ndarray, step: int, info: dict) -> None:
        from PIL import Image, ImageDraw

        h = third_person.shape[0]
        canvas = Image.new("RGB", (third_person.shape[1] + h, h + 44), (20, 20, 20))
        canvas.paste(Image.fromarray(third_person), (0, 0))
        canvas.paste(Image.fromarray(wrist).resize((h, h), Image.NEAREST), (third_person.shape[1], 0))
        draw = ImageDraw.Draw(canvas)
        conds = "  ".join(f"{c}:{'Y' if bool(info[c][0]) else 'n'}" for c in CONDITIONS)
        flags = " ".join(f for f in FLAGS if bool(info[f][0])) or "-"
        draw.text((4, h + 2), f"step {step}  streak {int(info['success_streak'][0])}  success "
                  f"{'YES' if bool(info['success'][0]) else 'no'}", fill=(255, 255, 255))
        draw.text((4, h + 16), conds, fill=(180, 255, 180))
        draw.text((4, h + 30), f"flags: {flags}", fill=(255, 180, 180))
        self.frames.append(np.asarray(canvas))

    def write(self) -> None:
        import imageio.v2 as imageio

        with imageio.get_writer(self.path, fps=self.fps, codec="libx264", quality=6, macro_block_size=4) as w:
            for f in self.frames:
                w.append_data(f)
