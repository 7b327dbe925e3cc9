"""bc-state: an MLP from the 40-number input (eval.training.state_features) to the 7-D normalised action.

Weights and the observation normalisation live in one safetensors file; its
metadata holds the format tag and the architecture, so a file that does not
match the code fails with one line naming what differs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engines.weights_file import BadCheckpointError, load_checked, read_checkpoint, write_checkpoint

FORMAT = "shape-assembly-bench/bc-state/3"
DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "weights" / "bc_state.safetensors"
# the input's two parts (eval.training.state_features builds them): scene features, then the action history
SCENE_DIM = 32
HISTORY_DIM = 8


@dataclass(frozen=True)
class BCConfig:
    state_dim: int = SCENE_DIM + HISTORY_DIM
    action_dim: int = 7
    hidden: tuple[int, ...] = (256, 256, 256)
    # fine-scale copies, tanh(x / scale), of (first, end, scale) state slices: the relative vectors 16..21 at
    # 4 mm and the gripper tilt and yaw error 29..31 at 0.02 rad. Normalised by their dataset spread
    # (decimetres, tenths of a radian) a 0.5 mm or 0.5 degree misalignment would be invisible to the net
    fine: tuple[tuple[int, int, float], ...] = ((16, 22, 0.004), (29, 32, 0.02))


def mlp(dims, out: int):
    """Linear layers through ``dims`` (input width, then each hidden width), GELU after each, then a Linear to
    ``out``: the shape of every MLP in bc-state's and bc-camera's networks."""
    from torch import nn

    layers: list[nn.Module] = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(dims[-1], out))


def build(config: BCConfig):
    import torch
    from torch import nn

    class BCStateMLP(nn.Module):
        def __init__(self):
            super().__init__()
            dims = (config.state_dim + sum(hi - lo for lo, hi, _ in config.fine), *config.hidden)
            self.net = mlp(dims, config.action_dim)
            self.register_buffer("obs_mean", torch.zeros(config.state_dim))
            self.register_buffer("obs_std", torch.ones(config.state_dim))

        def raw(self, state):
            """The network's output in the trained space: signed square roots of the action."""
            fine = [torch.tanh(state[:, lo:hi] / scale) for lo, hi, scale in config.fine]
            return torch.tanh(self.net(torch.cat([(state - self.obs_mean) / self.obs_std, *fine], -1)))

        def forward(self, state):
            # normalisation and the square are inside the network, so the exported graph maps raw state to action
            r = self.raw(state)
            return torch.sign(r) * r * r

    return BCStateMLP()


def save(model, config: BCConfig, path: str | Path, extra: dict | None = None) -> None:
    write_checkpoint(model, FORMAT, asdict(config), path, extra)


def load(path: str | Path = DEFAULT_WEIGHTS):
    """(model in eval mode, config, metadata); one-line BadCheckpointError on any mismatch."""
    path = Path(path)
    tensors, meta = read_checkpoint(path, "bc-state", FORMAT, "python -m eval.training.train_bc")
    try:
        cfg_dict = json.loads(meta["config"])
    except KeyError:
        raise BadCheckpointError(f"{path} has no 'config' metadata (it records the network's shape): save "
                                 f"checkpoints with eval.training.train_bc") from None
    except ValueError as e:
        raise BadCheckpointError(f"{path}: its 'config' metadata is not JSON ({e})") from None
    try:
        config = BCConfig(**{**cfg_dict, "hidden": tuple(cfg_dict["hidden"]),
                             "fine": tuple(tuple(f) for f in cfg_dict["fine"])})
    except (TypeError, KeyError) as e:
        raise BadCheckpointError(f"{path} has a config this code does not know ({e})") from None
    if config.state_dim != BCConfig.state_dim or config.action_dim != BCConfig.action_dim:
        raise BadCheckpointError(f"{path} maps {config.state_dim} -> {config.action_dim} numbers; this code's state "
                                 f"has {BCConfig.state_dim} and its action {BCConfig.action_dim}")
    model = load_checked(build(config), tensors, path, positive=("obs_std",))
    return model, config, meta


def export_onnx(model, config: BCConfig, path: str | Path, source: str = "") -> Path:
    """ONNX with a dynamic batch: input ``state`` (N, 40) float32, output ``action`` (N, 7)."""
    import torch

    from engines.onnx_utils import check_onnx_file, set_metadata

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dummy = torch.zeros(1, config.state_dim)
    # the TorchScript exporter: the dynamo one needs onnxscript, and this MLP needs nothing it adds
    torch.onnx.export(model, (dummy,), str(path), input_names=["state"], output_names=["action"],
                      dynamic_axes={"state": {0: "batch"}, "action": {0: "batch"}}, opset_version=17, dynamo=False)
    set_metadata(path, exporter=f"torch.onnx {torch.__version__}", opset="17", model="bc-state", source=source)
    check_onnx_file(path)
    return path


def numpy_forward(model, state: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(state, dtype=torch.float32)).numpy()


def torch_outputs(model, feeds) -> dict[str, np.ndarray]:
    """The graph's outputs computed by the torch network (the ``torch`` backend)."""
    return {"action": numpy_forward(model, feeds["state"])}
