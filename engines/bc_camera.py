"""bc-camera: a small convolutional policy that sees what the camera models see (both cameras, the arm's joint
positions, the instruction) and its own last action, and predicts a chunk of actions.

The network (``BCCameraNetConfig``; its FLOPs in ``flops_per_query``):

- each camera's frame enters as rendered, uint8 (N, H, W, 3): the graph itself averages it down to 64 x 64
  (third person 256 -> 64 by 4 x 4 blocks, wrist 128 -> 64 by 2 x 2), so a camera frame goes to the engine as
  the renderer wrote it (the zero-copy path on a GPU: no resize or layout change on the host);
- per camera, four convolutions (5x5 stride 2, 3x3 stride 2, 3x3, 1x1) and a spatial softmax: the expected
  image position of each of ``keypoints`` feature maps (Levine et al. 2016), two numbers each;
- the low-dimensional input (``low_dim`` numbers): the joint positions, the instruction as a one-hot over
  every instruction, and the last gripper command sent with how long it has been held (2 of bc-state's 8
  history numbers, eval.training.state_features.ActionHistory: ``BCCameraNetConfig.history``), normalised inside
  the graph;
- an MLP to ``chunk`` actions (action chunking, Zhao et al. 2023): trained on all of them, the policy executes
  the first and asks again at the next step. As bc-state's, the outputs are trained as signed square roots
  (a 0.5 mm correction weighs like 7 cm, not like 0.5 mm) and squared inside the graph.

Weights, the normalisation and the configuration live in one safetensors file; a file that does not match
the code fails in one line naming what differs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engines.weights_file import BadCheckpointError, load_checked, read_checkpoint
from env.instructions import all_instructions

FORMAT = "shape-assembly-bench/bc-camera/1"
DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "weights" / "bc_camera.safetensors"
IMAGE_SIDE = 64  # what each camera is averaged down to inside the graph
INPUT_NAMES = ("third_person", "wrist", "low_dim")


@dataclass(frozen=True)
class BCCameraNetConfig:
    # (observation key, rendered side in pixels): the project's cameras (env/arms.py), square frames
    cameras: tuple[tuple[str, int], ...] = (("third_person", 256), ("wrist", 128))
    proprio_dim: int = 9  # the Panda's 7 arm joints and 2 fingers, as Scenes.proprio gives them
    instructions: tuple[str, ...] = all_instructions()
    channels: tuple[int, int, int] = (32, 32, 32)
    keypoints: int = 32
    hidden: tuple[int, ...] = (256, 256)
    chunk: int = 8
    action_dim: int = 7
    # which of the 8 action-history numbers (eval.training.state_features.ActionHistory: the last action sent,
    # then its gripper command's hold) the network reads: the gripper command and its hold only, which tell the
    # reference's timed gripper phases apart. Given the last motion too, it learns to copy it ("copycat", Wen et
    # al. 2020): open loop its actions matched the reference's, but its first yaw command, copied from the
    # try's initial hold, stayed 0 and it never turned to the block (dev A01)
    history: tuple[int, ...] = (6, 7)

    @property
    def low_dim(self) -> int:
        return self.proprio_dim + len(self.instructions) + len(self.history)

    def pool(self, side: int) -> int:
        if side % IMAGE_SIDE:
            raise ValueError(f"a camera of side {side} does not average down to {IMAGE_SIDE} pixels")
        return side // IMAGE_SIDE


def instruction_one_hot(instruction: str, config: BCCameraNetConfig) -> np.ndarray:
    """The instruction as a one-hot over ``config.instructions``; one-line ValueError for another."""
    try:
        i = config.instructions.index(instruction)
    except ValueError:
        raise ValueError(f"bc-camera knows the instructions {list(config.instructions)}, not {instruction!r}") from None
    out = np.zeros(len(config.instructions), np.float32)
    out[i] = 1.0
    return out


def pool_frames(frames: np.ndarray, factor: int) -> np.ndarray:
    """uint8 (N, H, W, 3) frames averaged by ``factor`` x ``factor`` blocks to uint8 (N, 3, H/f, W/f): what the
    graph computes from a rendered frame (to rounding), for the training set's frame cache."""
    n, h, w, c = frames.shape
    x = frames.reshape(n, h // factor, factor, w // factor, factor, c).mean(axis=(2, 4), dtype=np.float32)
    return np.clip(np.rint(x), 0, 255).astype(np.uint8).transpose(0, 3, 1, 2)


def build(config: BCCameraNetConfig):
    import torch
    from torch import nn

    class SpatialSoftmax(nn.Module):
        """(N, K, H, W) maps -> (N, 2K): each map's softmax-weighted x and y in [-1, 1]."""

        def __init__(self, side: int):
            super().__init__()
            grid = torch.linspace(-1.0, 1.0, side)
            self.register_buffer("xs", grid.repeat(side), persistent=False)
            self.register_buffer("ys", grid.repeat_interleave(side), persistent=False)

        def forward(self, maps):
            p = torch.softmax(maps.flatten(2), dim=-1)
            return torch.cat([p @ self.xs, p @ self.ys], dim=-1)

    def encoder() -> nn.Module:
        c1, c2, c3 = config.channels
        return nn.Sequential(
            nn.Conv2d(3, c1, 5, stride=2, padding=2), nn.GELU(),
            nn.Conv2d(c1, c2, 3, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(c2, c3, 3, padding=1), nn.GELU(),
            nn.Conv2d(c3, config.keypoints, 1),
            SpatialSoftmax(IMAGE_SIDE // 4))

    class BCCameraNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoders = nn.ModuleDict({name: encoder() for name, _ in config.cameras})
            dims = (2 * config.keypoints * len(config.cameras) + config.low_dim, *config.hidden)
            layers: list[nn.Module] = []
            for a, b in zip(dims[:-1], dims[1:]):
                layers += [nn.Linear(a, b), nn.GELU()]
            layers.append(nn.Linear(dims[-1], config.chunk * config.action_dim))
            self.head = nn.Sequential(*layers)
            self.register_buffer("low_mean", torch.zeros(config.low_dim))
            self.register_buffer("low_std", torch.ones(config.low_dim))

        def raw(self, images: dict, low_dim):
            """Trained space: ``images`` camera -> float (N, 3, 64, 64) in [0, 1]; signed square roots of the
            chunk's actions (N, chunk, 7)."""
            feats = [self.encoders[name]((images[name] - 0.5) * 4.0) for name, _ in config.cameras]
            x = torch.cat([*feats, (low_dim - self.low_mean) / self.low_std], dim=-1)
            return torch.tanh(self.head(x)).reshape(-1, config.chunk, config.action_dim)

        def forward(self, third_person, wrist, low_dim):
            """Rendered uint8 frames (N, H, W, 3) of each camera and the low-dimensional input -> actions
            (N, chunk, 7)."""
            images = {}
            for (name, side), frame in zip(config.cameras, (third_person, wrist)):
                x = frame.float().permute(0, 3, 1, 2)  # cast first: TensorRT's Transpose on uint8 is not a given
                f = config.pool(side)
                images[name] = (torch.nn.functional.avg_pool2d(x, f) if f > 1 else x) / 255.0
            r = self.raw(images, low_dim)
            return torch.sign(r) * r * r

    return BCCameraNet()


def to_raw(actions):
    """Actions -> the trained space (signed square roots); torch tensors or numpy."""
    return (actions.sign() * actions.abs().sqrt()) if hasattr(actions, "sqrt") else np.sign(actions) * np.sqrt(np.abs(actions))


def save(model, config: BCCameraNetConfig, path: str | Path, extra: dict | None = None) -> None:
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    meta = {"format": FORMAT, "config": json.dumps(asdict(config)), **{k: str(v) for k, v in (extra or {}).items()}}
    save_file(tensors, str(path), metadata=meta)


def config_from_json(text: str) -> BCCameraNetConfig:
    d = json.loads(text)
    return BCCameraNetConfig(**{**d, "cameras": tuple((str(n), int(s)) for n, s in d["cameras"]),
                             "instructions": tuple(d["instructions"]), "channels": tuple(d["channels"]),
                             "hidden": tuple(d["hidden"]), "history": tuple(d["history"])})


def load(path: str | Path = DEFAULT_WEIGHTS):
    """(model in eval mode, config, metadata); one-line BadCheckpointError on any mismatch."""
    path = Path(path)
    tensors, meta = read_checkpoint(path, "bc-camera", FORMAT, "python -m eval.training.train_bc_camera")
    try:
        config = config_from_json(meta["config"])
    except KeyError:
        raise BadCheckpointError(f"{path} has no 'config' metadata; save checkpoints with "
                                 f"eval.training.train_bc_camera") from None
    except (TypeError, ValueError) as e:
        raise BadCheckpointError(f"{path} has a config this code cannot read ({e})") from None
    if config.action_dim != BCCameraNetConfig.action_dim:
        raise BadCheckpointError(f"{path} predicts {config.action_dim}-number actions; the scene takes "
                                 f"{BCCameraNetConfig.action_dim}")
    try:
        model = build(config)
    except ValueError as e:
        raise BadCheckpointError(f"{path}: {e}") from None
    model = load_checked(model, tensors, path, positive=("low_std",))
    return model, config, meta


def dummy_inputs(config: BCCameraNetConfig, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds of the graph's shapes and dtypes (random frames, zero low-dimensional input)."""
    rng = np.random.default_rng(seed)
    feeds = {name: rng.integers(0, 256, (batch, side, side, 3), dtype=np.uint8) for name, side in config.cameras}
    feeds["low_dim"] = np.zeros((batch, config.low_dim), np.float32)
    return feeds


def export_onnx(model, config: BCCameraNetConfig, path: str | Path, source: str = "") -> Path:
    """ONNX with a dynamic batch: inputs ``third_person`` (N, 256, 256, 3) and ``wrist`` (N, 128, 128, 3) uint8,
    ``low_dim`` (N, LOW_DIM) float32; output ``actions`` (N, chunk, 7)."""
    import torch

    from engines.onnx_utils import check_onnx_file, set_metadata

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    feeds = dummy_inputs(config)
    args = tuple(torch.as_tensor(feeds[name]) for name in INPUT_NAMES)
    dynamic = {name: {0: "batch"} for name in (*INPUT_NAMES, "actions")}
    # the TorchScript exporter, as bc-state's: the dynamo one needs onnxscript
    torch.onnx.export(model, args, str(path), input_names=list(INPUT_NAMES), output_names=["actions"],
                      dynamic_axes=dynamic, opset_version=17, dynamo=False)
    set_metadata(path, exporter=f"torch.onnx {torch.__version__}", opset="17", model="bc-camera", source=source)
    check_onnx_file(path)
    return path


def numpy_forward(model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(*(torch.as_tensor(feeds[name]) for name in INPUT_NAMES)).numpy()


def onnx_for_weights(weights: str | Path, sha256: str) -> Path:
    """The ONNX export of a weights file, made once and cached (sealed, :mod:`engines.cache`) under a name from
    the weights' sha256; a damaged cached file is exported again."""
    from engines.cache import onnx_dir, reuse, write_sealed

    weights = Path(weights)
    digest = sha256[:16]
    path = onnx_dir() / f"bc_camera_{digest}.onnx"
    if not reuse(path, "ONNX export"):
        model, config, _ = load(weights)
        write_sealed(path, lambda tmp: export_onnx(model, config, tmp, source=f"{weights.name} sha256 {digest}"))
    return path


def torch_outputs(model, feeds) -> dict[str, np.ndarray]:
    """The graph's outputs computed by the torch network (the ``torch`` backend)."""
    return {"actions": numpy_forward(model, feeds)}
