"""The released parameter tree: seeded random init of the exact architecture, shapes, counts, flattening.

:func:`init_params` builds the tree with the release's names and shapes
(initialisers as upstream: lecun-normal dense layers, xavier-uniform attention
and MLPs, normal(0.02) position embeddings, T5's own normal initialisers); every
array is drawn by numpy from the seed ``[seed, crc32(name)]``, so a name's
values do not depend on the order of the others (and 137M draws take seconds,
not minutes). :func:`param_shapes` is the same tree with
``jax.ShapeDtypeStruct`` leaves, drawing nothing.
"""

from __future__ import annotations

import zlib
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from engines.octo.config import OctoConfig, T5Spec

T5_PATH = ("octo_transformer", "task_tokenizers_language", "hf_model")


class _Init:
    """Seeded numpy draws per parameter name (fast on CPU, independent of the order of names)."""

    def __init__(self, seed: int):
        self.seed = int(seed)

    def _rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng([self.seed & 0xFFFFFFFF, zlib.crc32(name.encode())])

    def zeros(self, shape):
        return np.zeros(shape, np.float32)

    def ones(self, shape):
        return np.ones(shape, np.float32)

    def normal(self, name, shape, std):
        return (std * self._rng(name).standard_normal(shape, np.float32)).astype(np.float32)

    def lecun(self, name, shape, fan_in):
        # flax lecun_normal: normal truncated at +-2 std, variance 1 / fan_in
        rng = self._rng(name)
        x = rng.standard_normal(shape, np.float32)
        bad = np.abs(x) > 2
        while bad.any():
            x[bad] = rng.standard_normal(int(bad.sum()), np.float32)
            bad = np.abs(x) > 2
        return (x * np.float32(np.sqrt(1.0 / fan_in) / 0.87962566103423978)).astype(np.float32)

    def xavier(self, name, shape, fan_in, fan_out):
        lim = np.float32(np.sqrt(6.0 / (fan_in + fan_out)))
        return self._rng(name).uniform(-lim, lim, shape).astype(np.float32)


class _Shapes(_Init):
    """Same tree, ``jax.ShapeDtypeStruct`` leaves, nothing drawn."""

    def __init__(self):
        super().__init__(0)

    def zeros(self, shape):
        return jax.ShapeDtypeStruct(tuple(shape), jnp.float32)

    ones = zeros

    def normal(self, name, shape, std):
        return self.zeros(shape)

    def lecun(self, name, shape, fan_in):
        return self.zeros(shape)

    def xavier(self, name, shape, fan_in, fan_out):
        return self.zeros(shape)


def _dense(ini: _Init, name: str, n_in: int, n_out: int, kind: str = "lecun", bias_std: float = 0.0):
    if kind == "xavier":
        kernel = ini.xavier(name + "/kernel", (n_in, n_out), n_in, n_out)
    else:
        kernel = ini.lecun(name + "/kernel", (n_in, n_out), n_in)
    bias = ini.normal(name + "/bias", (n_out,), bias_std) if bias_std else ini.zeros((n_out,))
    return {"kernel": kernel, "bias": bias}


def _ln(ini: _Init, n: int):
    return {"scale": ini.ones((n,)), "bias": ini.zeros((n,))}


def _stem(ini: _Init, name: str, cam) -> dict:
    p, c_in = {}, cam.in_channels
    for i, c_out in enumerate(cam.stem_features):
        p[f"StdConv_{i}"] = {"kernel": ini.lecun(f"{name}/StdConv_{i}/kernel", (3, 3, c_in, c_out), 9 * c_in),
                             "bias": ini.zeros((c_out,))}
        p[f"GroupNorm_{i}"] = _ln(ini, c_out)
        c_in = c_out
    k = cam.patch_size // 16
    p["embedding"] = {"kernel": ini.lecun(f"{name}/embedding/kernel", (k, k, c_in, cam.num_features), k * k * c_in),
                      "bias": ini.zeros((cam.num_features,))}
    return p


def init_t5(ini: _Init, spec: T5Spec) -> dict:
    d, inner, f = spec.d_model, spec.num_heads * spec.d_kv, spec.d_ff
    n = "hf_model"
    blocks = {}
    for i in range(spec.num_layers):
        b = f"{n}/encoder/block/{i}/layer"
        sa = {
            "q": {"kernel": ini.normal(f"{b}/0/q", (d, inner), (inner * spec.d_kv) ** -0.5)},
            "k": {"kernel": ini.normal(f"{b}/0/k", (d, inner), inner ** -0.5)},
            "v": {"kernel": ini.normal(f"{b}/0/v", (d, inner), inner ** -0.5)},
            "o": {"kernel": ini.normal(f"{b}/0/o", (inner, d), inner ** -0.5)},
        }
        if i == 0:
            sa["relative_attention_bias"] = {"embedding": ini.normal(f"{b}/0/rel", (spec.num_buckets, spec.num_heads),
                                                                     inner ** -0.5)}
        blocks[str(i)] = {"layer": {
            "0": {"SelfAttention": sa, "layer_norm": {"weight": ini.ones((d,))}},
            "1": {"DenseReluDense": {"wi": {"kernel": ini.normal(f"{b}/1/wi", (d, f), d ** -0.5)},
                                     "wo": {"kernel": ini.normal(f"{b}/1/wo", (f, d), f ** -0.5)}},
                  "layer_norm": {"weight": ini.ones((d,))}},
        }}
    return {"shared": {"embedding": ini.normal(f"{n}/shared", (spec.vocab_size, d), 1.0)},
            "encoder": {"block": blocks, "final_layer_norm": {"weight": ini.ones((d,))}}}


def init_params(cfg: OctoConfig, seed: int = 0, with_t5: bool = True, _ini: _Init | None = None) -> dict:
    """Seeded random parameters (numpy float32) in the release's tree (``with_t5``: include the T5 encoder)."""
    ini = _ini or _Init(seed)
    d = cfg.token_dim
    ot: dict[str, Any] = {}
    for cam in cfg.cameras:
        ot[f"observation_tokenizers_{cam.name}"] = {
            f"{cam.encoder_name}_0": _stem(ini, f"observation_tokenizers_{cam.name}", cam)}
    if with_t5:
        ot["task_tokenizers_language"] = {"hf_model": init_t5(ini, cfg.t5)}
    ot["task_language_projection"] = _dense(ini, "task_language_projection", cfg.t5.d_model, d)
    ot["task_language_pos_embedding"] = ini.normal("task_language_pos_embedding", (1, cfg.lang_tokens, d), 0.02)
    for cam in cfg.cameras:
        ot[f"obs_{cam.name}_projection"] = _dense(ini, f"obs_{cam.name}_projection", cam.num_features, d)
        ot[f"obs_{cam.name}_pos_embedding"] = ini.normal(f"obs_{cam.name}_pos_embedding",
                                                         (1, cfg.max_horizon, cam.num_tokens, d), 0.02)
    ot["readout_action_pos_embedding"] = ini.normal("readout_action_pos_embedding",
                                                    (1, cfg.max_horizon, cfg.readout_tokens, d), 0.02)
    h, hd = cfg.num_heads, cfg.head_dim
    layers = {}
    for i in range(cfg.num_layers):
        n = f"encoderblock_{i}"
        mha = {}
        for part in ("query", "key", "value"):
            mha[part] = {"kernel": ini.xavier(f"{n}/{part}", (d, h, hd), d, h * hd),
                         "bias": ini.zeros((h, hd))}
        mha["out"] = {"kernel": ini.xavier(f"{n}/out", (h, hd, d), h * hd, d), "bias": ini.zeros((d,))}
        layers[n] = {
            "LayerNorm_0": _ln(ini, d),
            "MultiHeadDotProductAttention_0": mha,
            "LayerNorm_1": _ln(ini, d),
            "MlpBlock_0": {"Dense_0": _dense(ini, f"{n}/mlp0", d, cfg.mlp_dim, "xavier", 1e-6),
                           "Dense_1": _dense(ini, f"{n}/mlp1", cfg.mlp_dim, d, "xavier", 1e-6)},
        }
    layers["encoder_norm"] = _ln(ini, d)
    ot["BlockTransformer_0"] = {"Transformer_0": layers}

    hid, td, a = cfg.score_hidden, cfg.time_dim, cfg.flat_action_dim
    rev: dict[str, Any] = {"Dense_0": _dense(ini, "rev/Dense_0", td + d + a, hid, "xavier")}
    for i in range(cfg.score_blocks):
        blk = {"Dense_0": _dense(ini, f"rev/b{i}/Dense_0", hid, 4 * hid),
               "Dense_1": _dense(ini, f"rev/b{i}/Dense_1", 4 * hid, hid)}
        if cfg.score_layer_norm:
            blk["LayerNorm_0"] = _ln(ini, hid)
        rev[f"MLPResNetBlock_{i}"] = blk
    rev["Dense_1"] = _dense(ini, "rev/Dense_1", hid, a, "xavier")
    head = {"diffusion_model": {
        "time_preprocess": {"kernel": ini.normal("time_preprocess", (td // 2, 1), 0.2)},
        "cond_encoder": {"Dense_0": _dense(ini, "cond/Dense_0", td, 2 * td, "xavier"),
                         "Dense_1": _dense(ini, "cond/Dense_1", 2 * td, td, "xavier")},
        "reverse_network": rev,
    }}
    return {"octo_transformer": ot, "heads_action": head}


def param_shapes(cfg: OctoConfig, with_t5: bool = True) -> dict:
    """The release's tree of ``jax.ShapeDtypeStruct``, built without drawing or allocating anything."""
    return init_params(cfg, with_t5=with_t5, _ini=_Shapes())


def flatten(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """("a/b/c", leaf) pairs of a nested mapping, in key order."""
    for k in tree:
        v = tree[k]
        name = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            yield from flatten(v, name)
        else:
            yield name, v


def count(tree: Mapping[str, Any], skip_t5: bool = True) -> int:
    t5 = "/".join(T5_PATH)
    return int(sum(int(np.prod(v.shape)) for n, v in flatten(tree) if not (skip_t5 and n.startswith(t5))))


def t5_subtree(params: Mapping[str, Any]) -> Mapping[str, Any]:
    p = params
    for k in T5_PATH:
        p = p[k]
    return p


def without_t5(params: Mapping[str, Any]) -> dict:
    """The tree less the T5 encoder (what the control loop needs)."""
    ot = {k: v for k, v in params["octo_transformer"].items() if k != "task_tokenizers_language"}
    return {**params, "octo_transformer": ot}
