"""Pictures of the scene for the docs.

    python -m env.gallery --setup A01 --out docs/a01_cameras.png      # both cameras of one setup
    python -m env.gallery --all --out docs/gallery_third_person.png --wrist-out docs/gallery_wrist.png
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def camera_views(setup_id: str, seed: int = 0, arm: str = "panda") -> dict[str, np.ndarray]:
    """Third-person and wrist RGB images (uint8 HxWx3) of the start of a dev try."""
    from env import make_env
    from env.tasklist import load

    dev = load("dev")
    env = make_env(setup_id, arm=arm, obs_mode="rgb")
    try:
        obs, _ = env.reset(seed=dev.seed(setup_id, seed), options={"start": dev.start(setup_id, seed)})
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


def montage(images: list[np.ndarray], labels: list[str], columns: int = 6) -> "PIL.Image.Image":  # noqa: F821
    """A grid of equally sized images with a label above each."""
    from PIL import Image, ImageDraw

    h, w = images[0].shape[:2]
    pad, label_h = 4, 14
    rows = (len(images) + columns - 1) // columns
    canvas = Image.new("RGB", (columns * (w + pad) + pad, rows * (h + label_h + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for i, (im, label) in enumerate(zip(images, labels)):
        x = pad + (i % columns) * (w + pad)
        y = pad + (i // columns) * (h + label_h + pad)
        draw.text((x, y), label, fill=(0, 0, 0))
        canvas.paste(Image.fromarray(im), (x, y + label_h))
    return canvas


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m env.gallery", description="Render camera views of the setups.")
    p.add_argument("--setup", default="A01", help="setup whose two camera views are drawn side by side")
    p.add_argument("--all", action="store_true", help="a montage of the 30 scored setups instead")
    p.add_argument("--try-index", type=int, default=0, help="dev-split try whose start is shown")
    p.add_argument("--out", required=True, help="PNG file to write (third-person montage with --all)")
    p.add_argument("--wrist-out", help="with --all: PNG file for the wrist-camera montage")
    args = p.parse_args(argv)
    from env.setups import SCORED_IDS, SETUPS, UnknownSetupError, get_setup

    try:
        get_setup(args.setup)
    except UnknownSetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.all:
        from tqdm import tqdm

        views = [camera_views(sid, args.try_index) for sid in tqdm(SCORED_IDS, desc="rendering", unit="setup")]
        labels = [f"{sid} {SETUPS[sid].name}" for sid in SCORED_IDS]
        montage([v["third_person"] for v in views], labels).save(args.out)
        print(f"wrote {args.out}")
        if args.wrist_out:
            montage([v["wrist"] for v in views], labels, columns=10).save(args.wrist_out)
            print(f"wrote {args.wrist_out}")
        return 0
    views = camera_views(args.setup, args.try_index)
    img = side_by_side([views["third_person"], views["wrist"]],
                       [f"{args.setup} third-person 256x256", "wrist 128x128"])
    img.save(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
