"""Pictures of the scene: both camera views of a setup, for the docs.

    python -m env.gallery --setups A01 --out docs/a01_cameras.png
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def camera_views(setup_id: str, seed: int = 0, arm: str = "panda") -> dict[str, np.ndarray]:
    """Third-person and wrist RGB images (uint8 HxWx3) of the start of a dev try."""
    from env import make_env
    from env.setups import get_setup
    from env.starts import derive_seed, sample_start

    env = make_env(setup_id, arm=arm, obs_mode="rgb")
    try:
        s = derive_seed("dev", setup_id, seed)
        obs, _ = env.reset(seed=s, options={"start": sample_start(get_setup(setup_id), np.random.default_rng(s))})
        sensors = obs["sensor_data"]
        wrist = env.unwrapped.arm.wrist_camera_uid
        return {
            "third_person": sensors["third_person"]["rgb"][0].cpu().numpy(),
            "wrist": sensors[wrist]["rgb"][0].cpu().numpy(),
        }
    finally:
        env.close()


def side_by_side(images: list[np.ndarray], labels: list[str]) -> "PIL.Image.Image":  # noqa: F821
    """Images placed left to right at their own sizes, each with a label under it."""
    from PIL import Image, ImageDraw

    pad, label_h = 6, 16
    w = sum(im.shape[1] for im in images) + pad * (len(images) + 1)
    h = max(im.shape[0] for im in images) + label_h + 2 * pad
    canvas = Image.new("RGB", (w, h), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    x = pad
    for im, label in zip(images, labels):
        canvas.paste(Image.fromarray(im), (x, pad))
        draw.text((x, pad + im.shape[0] + 2), label, fill=(0, 0, 0))
        x += im.shape[1] + pad
    return canvas


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m env.gallery", description="Render both camera views of a setup.")
    p.add_argument("--setup", default="A01")
    p.add_argument("--try-index", type=int, default=0, help="dev-split try whose start is shown")
    p.add_argument("--out", required=True, help="PNG file to write")
    args = p.parse_args(argv)
    from env.setups import UnknownSetupError, get_setup

    try:
        get_setup(args.setup)
    except UnknownSetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    views = camera_views(args.setup, args.try_index)
    img = side_by_side([views["third_person"], views["wrist"]],
                       [f"{args.setup} third-person 256x256", "wrist 128x128"])
    img.save(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
