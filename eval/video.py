"""The project's video writer (H.264 through imageio-ffmpeg's ffmpeg, frames streamed as they come), and the MP4
of a try it writes for ``eval.run --video``: both cameras side by side, with the step, the success conditions and
the flags drawn on. Recorded datasets (eval.lerobot.episode) write each camera with the same writer."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from env.setups import CONTROL_FREQ

CONDITIONS = ("matched", "deep", "released", "settled")
FLAGS = ("wrong_hole", "rim", "penetration", "glitch", "dropped")
VIDEO_CODEC = "libx264"  # the encoder; the stream's codec is H.264 ("h264", as decoders name it)
VIDEO_CODEC_NAME = "h264"
VIDEO_PIX_FMT = "yuv420p"
VIDEO_CRF = 23  # x264's own default quality
# a keyframe every 2 frames, as LeRobot's RGB encoder keeps them for random access in training
# (lerobot configs/video.py RGBEncoderConfig g=2); no B-frames, so that the first frame's time is 0
VIDEO_GOP = 2


def video_writer(path: str | Path, width: int, height: int, fps: int = CONTROL_FREQ):
    """An H.264 writer of RGB uint8 frames of ``width`` x ``height``: ``send(frame)`` each, ``close()`` at the end."""
    import imageio_ffmpeg

    writer = imageio_ffmpeg.write_frames(
        str(path), (width, height), fps=fps, codec=VIDEO_CODEC, pix_fmt_out=VIDEO_PIX_FMT, quality=None,
        macro_block_size=2, ffmpeg_log_level="error",
        output_params=["-crf", str(VIDEO_CRF), "-g", str(VIDEO_GOP), "-bf", "0", "-movflags", "+faststart"])
    writer.send(None)  # start the generator
    return writer


class TryVideo:
    def __init__(self, path: str, fps: int = CONTROL_FREQ):
        self.path = path
        self.fps = fps
        self.frames = 0
        self._writer = None

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
        if self._writer is None:
            self._writer = video_writer(self.path, canvas.width, canvas.height, self.fps)
        self._writer.send(np.asarray(canvas))
        self.frames += 1

    def write(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def video_frames(path: str | Path):
    """The RGB uint8 (H, W, 3) frames of a video file, decoded one after another (imageio-ffmpeg's ffmpeg)."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    meta = next(reader)
    width, height = meta["size"]
    for raw in reader:
        yield np.frombuffer(raw, np.uint8).reshape(height, width, 3)
