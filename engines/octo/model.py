"""Octo 1.5 as pure JAX functions over the released parameter tree.

The parameter tree is the one of the release (nested dicts, names as flax gave
them upstream)::

    octo_transformer/
        observation_tokenizers_<cam>/SmallStem16_0/{StdConv_i, GroupNorm_i, embedding}
        task_tokenizers_language/hf_model/{shared, encoder}      (t5 encoder, see engines.octo.t5)
        task_language_projection, task_language_pos_embedding
        obs_<cam>_projection, obs_<cam>_pos_embedding, readout_action_pos_embedding
        BlockTransformer_0/Transformer_0/{encoderblock_i, encoder_norm}
    heads_action/diffusion_model/{time_preprocess, cond_encoder, reverse_network}

Two functions carry the model, both free of Python control flow on data, so
that they export (jax2onnx) as they are:

- ``backbone(params, images, lang_embedding, masks) -> readout`` (see
  :func:`make_backbone`): uint8 images in, image normalisation inside, float
  padding masks, the structural attention mask a constant; optionally goal
  images (``goals``, see below);
- ``denoise_step(params, readout, x_t, t, z) -> x_{t-1}`` (see
  :func:`make_denoise_step`): one reverse-diffusion step of the action head.

:func:`make_sampler` runs the 20 steps with the noise given as arrays (initial
noise and one noise vector per step), :func:`noise_from_rng` draws those arrays
from a key the way upstream ``predict_action`` does.

Masks (float, 1 = present): ``masks[b, t, 0]`` is the timestep pad mask of
window step ``t`` (0 for the padding copies at the start of a try), then
``masks[b, t, 1 + k]`` says whether camera ``k`` (config order: primary, wrist)
is present; a camera marked absent is masked out of attention as keys, which
gives the same readout as upstream's model run without that image key.

Goal images (``goals``, a mapping camera name -> uint8 (B, H, W, 3) at the
camera's image size): every camera with ``stack_task_image`` (upstream
``task_stack_keys``) stacks the task's goal image after the observation's 3
channels, the same goal for every window step, before its stem; normalisation
is per pixel, so normalising before or after the concatenation is the same. A
camera without a goal (``goals`` None, or its name absent) stacks zeros as
upstream does for a language-only task (``jnp.zeros_like``): exactly today's
computation. Upstream keeps no pad mask for the goal image (the image tokens'
mask is the observation's), and the language mask stays as given: goal and
instruction together are upstream's ``create_tasks(goals=..., texts=...)``.
"""

from __future__ import annotations

import functools
import math
from fnmatch import fnmatch
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from engines.octo.arrays import goal_cameras, unnormalize  # noqa: F401 (unnormalize: re-exported)
from engines.octo.config import CameraSpec, OctoConfig

Params = Any
NEG = float(np.finfo(np.float32).min)
MASK_TIMESTEP = 0  # masks[..., 0]; masks[..., 1 + k] = camera k present


# ------------------------------------------------------------------ layers
def _matmul(x, w):
    """``x @ w`` over the last axis of x, as one 2-D product: jax2onnx lowers a 2-D dot_general to Gemm and
    anything else to Einsum, which ONNX Runtime runs about 3x slower on CPU."""
    lead = x.shape[:-1]
    y = x.reshape(math.prod(lead), x.shape[-1]) @ w
    return y.reshape(*lead, w.shape[-1])


def dense(p, x):
    return _matmul(x, p["kernel"]) + p["bias"]


def layer_norm(p, x, eps: float = 1e-6):
    # as flax.linen.LayerNorm: var = E[x^2] - E[x]^2, clipped at 0
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.maximum(jnp.mean(jnp.square(x), axis=-1, keepdims=True) - jnp.square(mean), 0.0)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def group_norm(p, x, groups: int = 32, eps: float = 1e-6):
    n, h, w, c = x.shape
    g = x.reshape(n, h, w, groups, c // groups)
    mean = jnp.mean(g, axis=(1, 2, 4), keepdims=True)
    var = jnp.maximum(jnp.mean(jnp.square(g), axis=(1, 2, 4), keepdims=True) - jnp.square(mean), 0.0)
    g = (g - mean) * jax.lax.rsqrt(var + eps)
    return g.reshape(n, h, w, c) * p["scale"] + p["bias"]


def standardize_kernel(w, eps: float = 1e-5):
    """Weight standardisation of an HWIO kernel over (H, W, I), population std."""
    w = w - jnp.mean(w, axis=(0, 1, 2))
    return w / (jnp.std(w, axis=(0, 1, 2)) + eps)


def conv(x, w, b, stride: int, padding):
    y = jax.lax.conv_general_dilated(x, w, (stride, stride), padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + b


def normalize_images(img_uint8):
    """uint8 pixels to [-1, 1] ("default" normalisation of the upstream encoders)."""
    return img_uint8.astype(jnp.float32) / 127.5 - 1.0


def small_stem(p, cam: CameraSpec, x):
    """SmallStem16/32: 4 x (weight-standardised 3x3 conv stride 2, GroupNorm 32, ReLU), then a patch conv.

    ``x``: float (N, H, W, C) already in [-1, 1]. Returns (N, tokens, num_features).
    """
    for i, _ in enumerate(cam.stem_features):
        c = p[f"StdConv_{i}"]
        x = conv(x, standardize_kernel(c["kernel"]), c["bias"], 2, ((1, 1), (1, 1)))
        x = jax.nn.relu(group_norm(p[f"GroupNorm_{i}"], x))
    k = cam.patch_size // 16
    x = conv(x, p["embedding"]["kernel"], p["embedding"]["bias"], k, "VALID")
    n, h, w, f = x.shape
    return x.reshape(n, h * w, f)


def attention(p, x, allowed, num_heads: int):
    """flax MultiHeadDotProductAttention (self-attention) with a boolean (B, 1|H, T, T) mask (or its bias).

    Written as 2-D and head-batched products (same arithmetic as flax's einsums)
    so that the ONNX export has MatMul/Gemm nodes, not Einsum; the mask is applied
    as an additive bias of 0 / float32 min, which equals flax's ``where`` for any
    score below 1e31 in magnitude and is one broadcast Add instead of a Where.
    """
    b, t, d = x.shape

    def heads(name):  # (B, H, T, K)
        w = p[name]["kernel"]
        h, k = w.shape[1], w.shape[2]
        y = _matmul(x, w.reshape(d, h * k)) + p[name]["bias"].reshape(h * k)
        return y.reshape(b, t, h, k).transpose(0, 2, 1, 3)

    q, k, v = heads("query"), heads("key"), heads("value")
    q = q / jnp.sqrt(jnp.float32(q.shape[-1]))
    s = jnp.matmul(q, k.transpose(0, 1, 3, 2))  # (B, H, T, T)
    s = s + attention_bias(allowed)
    w = jax.nn.softmax(s, axis=-1)
    o = jnp.matmul(w, v).transpose(0, 2, 1, 3)  # (B, T, H, K)
    wo = p["out"]["kernel"]
    return _matmul(o.reshape(b, t, wo.shape[0] * wo.shape[1]), wo.reshape(-1, wo.shape[-1])) + p["out"]["bias"]


def prefix_groups(struct: np.ndarray) -> tuple[tuple[int, int, int, tuple[int, ...]], ...]:
    """The block-causal structure as query groups: ``(start, stop, keys, excluded)`` for each run of
    consecutive rows of ``struct`` (T, T) that allow the same keys, ``keys`` the end of the prefix of keys
    they may attend (nothing after it is ever allowed) and ``excluded`` the keys inside that prefix they may
    not (Octo: an earlier step's readout tokens). Keys past ``keys`` are skipped, not masked."""
    groups = []
    start = 0
    for i in range(1, len(struct) + 1):
        if i < len(struct) and np.array_equal(struct[i], struct[start]):
            continue
        row = struct[start]
        allowed = np.flatnonzero(row)
        keys = int(allowed[-1]) + 1 if len(allowed) else 1
        groups.append((start, i, keys, tuple(int(j) for j in np.flatnonzero(~row[:keys]))))
        start = i
    return tuple(groups)


def group_key_biases(groups, keys_ok):
    """Per query group: the (B, keys) float bias of its keys, 0 where allowed (present and not excluded),
    float32 min where not; computed once, used by every layer."""
    out = []
    for _, _, keys, excluded in groups:
        ok = keys_ok[:, :keys]
        if excluded:
            keep = np.ones(keys, bool)
            keep[list(excluded)] = False
            ok = jnp.logical_and(ok, jnp.asarray(keep)[None])
        out.append(jnp.where(ok, jnp.float32(0.0), jnp.float32(NEG)))
    return out


def grouped_attention(p, x, groups, key_biases, num_heads: int):
    """:func:`attention` over the block-causal structure's query groups (:func:`prefix_groups`): each group's
    queries against the prefix of keys it may attend only. The key mask is folded into the product as one
    more head dimension (q' = [q / sqrt(K), 1], k' = [k, bias]: q'.k' = q.k / sqrt(K) + bias), so that each
    group is an unmasked softmax(q' k'^T) v: the form ONNX Runtime runs as its fused (flash) CPU attention.
    Same arithmetic as the masked form up to rounding: a masked key's weight is exp(float32 min) = 0 in both."""
    b, t, d = x.shape

    def proj(name):  # (B, T, H * K)
        w = p[name]["kernel"]
        return _matmul(x, w.reshape(d, w.shape[1] * w.shape[2])) + p[name]["bias"].reshape(-1), w.shape[1], w.shape[2]

    q3, h, k = proj("query")
    k3, v3 = proj("key")[0], proj("value")[0]
    scale = 1.0 / math.sqrt(k)

    def heads(z, size):  # (B, S, H * size) -> (B, H, S, size)
        return z.reshape(b, -1, h, size).transpose(0, 2, 1, 3)

    outs = []
    for (start, stop, keys, _), bias in zip(groups, key_biases):
        n = stop - start
        one = jnp.broadcast_to(jnp.ones((1, 1, 1, 1), x.dtype), (b, n, h, 1))  # the batch may be symbolic
        qg = jnp.concatenate([(q3[:, start:stop] * scale).reshape(b, n, h, k), one], -1).reshape(b, n, h * (k + 1))
        kb = jnp.broadcast_to(bias[:, :, None, None], (b, keys, h, 1))
        kg = jnp.concatenate([k3[:, :keys].reshape(b, keys, h, k), kb], -1).reshape(b, keys, h * (k + 1))
        w = jax.nn.softmax(jnp.matmul(heads(qg, k + 1), heads(kg, k + 1).transpose(0, 1, 3, 2)), axis=-1)
        outs.append(jnp.matmul(w, heads(v3[:, :keys], k)).transpose(0, 2, 1, 3).reshape(b, n, h * k))
    o = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)
    wo = p["out"]["kernel"]
    return _matmul(o, wo.reshape(-1, wo.shape[-1])) + p["out"]["bias"]


def attention_bias(allowed):
    """0 where attention is allowed, float32 min where not (a float bias passes through unchanged)."""
    if allowed.dtype == jnp.bool_:
        return jnp.where(allowed, jnp.float32(0.0), jnp.float32(NEG))
    return allowed


def encoder_block(p, x, allowed, num_heads: int, eps: float, groups=None):
    """Pre-LayerNorm transformer block: attention, then MLP (tanh-approximate GELU). With ``groups``
    (:func:`prefix_groups`), ``allowed`` is their key biases (:func:`group_key_biases`) and attention is
    :func:`grouped_attention`."""
    y = layer_norm(p["LayerNorm_0"], x, eps)
    att = p["MultiHeadDotProductAttention_0"]
    x = x + (attention(att, y, allowed, num_heads) if groups is None
             else grouped_attention(att, y, groups, allowed, num_heads))
    y = layer_norm(p["LayerNorm_1"], x, eps)
    m = p["MlpBlock_0"]
    y = dense(m["Dense_1"], jax.nn.gelu(dense(m["Dense_0"], y), approximate=True))
    return x + y


# ------------------------------------------------------------------ attention structure
def token_groups(cfg: OctoConfig) -> list[tuple[str, int, int]]:
    """(group name, timestep, tokens) of the whole sequence in order; timestep -1 for task tokens."""
    out = [("task_language", -1, cfg.lang_tokens)]
    for t in range(cfg.window):
        out += [(name, t, n) for name, n in cfg.timestep_groups()]
    return out


def _rules(group: str) -> dict[str, str]:
    # upstream OctoTransformer: every rule is "causal" (other.timestep <= self.timestep); unmatched = never
    if group.startswith("task_"):
        return {"task_*": "causal"}
    if group.startswith("obs_"):
        return {"task_*": "causal", "obs_*": "causal"}
    return {"task_*": "causal", "obs_*": "causal", group: "causal"}  # a readout: tasks, observations, itself


def token_metadata(cfg: OctoConfig) -> list[tuple[str, int]]:
    """(group, timestep) of each token.

    With ``use_correct_attention`` false (the December 2023 models) the first
    token of every group but the first one is labelled with the previous group,
    as upstream's ``searchsorted(side="left")`` did; Octo 1.5 sets it true.
    """
    meta: list[tuple[str, int]] = []
    prefix = [("task_language", cfg.lang_tokens)]
    step = cfg.timestep_groups()
    for groups, timesteps in ((prefix, [-1]), (step, range(cfg.window))):
        sizes = np.cumsum([n for _, n in groups])
        for t in timesteps:
            for i in range(int(sizes[-1])):
                side = "right" if cfg.use_correct_attention else "left"
                g = int(np.searchsorted(sizes, i, side=side))
                meta.append((groups[g][0], t))
    return meta


@functools.lru_cache(maxsize=8)
def structural_mask(cfg: OctoConfig) -> np.ndarray:
    """(T, T) bool: may token i (row) attend to token j (column), before padding."""
    meta = token_metadata(cfg)
    names = sorted({g for g, _ in meta})
    allowed_group = {}
    for a in names:
        for b in names:
            rule = next((r for pat, r in _rules(a).items() if fnmatch(b, pat)), "never")
            allowed_group[a, b] = rule == "causal"
    g = np.array([names.index(n) for n, _ in meta])
    t = np.array([ts for _, ts in meta])
    table = np.array([[allowed_group[a, b] for b in names] for a in names])
    mask = table[g[:, None], g[None, :]] & (t[None, :] <= t[:, None])
    mask.setflags(write=False)
    return mask


def key_mask(cfg: OctoConfig, masks, lang_mask):
    """(B, T) float: which tokens may be attended to (padding masks apply to keys).

    Camera tokens: timestep pad mask x camera present; repeated language tokens:
    the language mask (not the timestep mask, as upstream); readouts: always.
    """
    b = masks.shape[0]
    parts = [jnp.broadcast_to(lang_mask[:, None], (b, cfg.lang_tokens))]
    for t in range(cfg.window):
        for k, cam in enumerate(cfg.cameras):
            m = masks[:, t, MASK_TIMESTEP] * masks[:, t, 1 + k]
            parts.append(jnp.broadcast_to(m[:, None], (b, cam.num_tokens)))
        if cfg.repeat_task_tokens:
            parts.append(jnp.broadcast_to(lang_mask[:, None], (b, cfg.lang_tokens)))
        # broadcast of a constant, not jnp.ones: the batch may be symbolic when exported (jax2onnx)
        parts.append(jnp.broadcast_to(jnp.ones((1, cfg.readout_tokens), masks.dtype), (b, cfg.readout_tokens)))
    return jnp.concatenate(parts, axis=1)


# ------------------------------------------------------------------ backbone
def embed_tokens(params, cfg: OctoConfig, images: Sequence[Any], lang_embedding, drop: Sequence[str] = (),
                 goals: Mapping[str, Any] | None = None):
    """Input tokens (B, T, d) of the whole sequence. ``drop``: camera groups left out (reference only);
    ``goals``: uint8 (B, H, W, 3) goal image per camera name (see the module docstring)."""
    ot = params["octo_transformer"]
    b, w = images[0].shape[:2]
    task = dense(ot["task_language_projection"], lang_embedding) + ot["task_language_pos_embedding"]
    groups = []
    goals = goals or {}
    for cam, img in zip(cfg.cameras, images):
        if cam.name in drop:
            continue
        x = normalize_images(img)
        if cam.stack_task_image and goals.get(cam.name) is not None:
            # observation channels, then the goal's (upstream's order), the same goal at every window step
            g = normalize_images(goals[cam.name])[:, None]
            x = jnp.concatenate([x, jnp.broadcast_to(g, x.shape)], axis=-1)
        elif cam.stack_task_image:  # the (absent) goal image: zeros, i.e. -1 after normalisation
            x = jnp.concatenate([x, jnp.broadcast_to(jnp.asarray(-1.0, x.dtype), x.shape)], axis=-1)
        x = x.reshape(b * w, *x.shape[2:])
        tok = small_stem(ot[f"observation_tokenizers_{cam.name}"][f"{cam.encoder_name}_0"], cam, x)
        tok = tok.reshape(b, w, tok.shape[1], tok.shape[2])
        tok = dense(ot[f"obs_{cam.name}_projection"], tok) + ot[f"obs_{cam.name}_pos_embedding"][:, :w]
        groups.append(tok)
    if cfg.repeat_task_tokens:
        groups.append(jnp.broadcast_to(task[:, None], (b, w, *task.shape[1:])))
    readout = ot["readout_action_pos_embedding"][:, :w]
    groups.append(jnp.broadcast_to(readout, (b, w, cfg.readout_tokens, cfg.token_dim)))
    steps = jnp.concatenate(groups, axis=2)
    return jnp.concatenate([task, steps.reshape(b, -1, cfg.token_dim)], axis=1)


def transformer(params, cfg: OctoConfig, x, allowed, groups=None):
    """The blocks and the final norm; ``allowed``: the (B, 1|H, T, T) mask, or with ``groups`` (the
    structural mask's :func:`prefix_groups`) the (B, T) key mask."""
    tp = params["octo_transformer"]["BlockTransformer_0"]["Transformer_0"]
    # once, not per layer
    bias = attention_bias(allowed) if groups is None else group_key_biases(groups, allowed)
    for i in range(cfg.num_layers):
        x = encoder_block(tp[f"encoderblock_{i}"], x, bias, cfg.num_heads, cfg.ln_eps, groups)
    return layer_norm(tp["encoder_norm"], x, cfg.ln_eps)


def readout_embeddings(cfg: OctoConfig, out, tokens_per_step: int | None = None):
    """Mean of the readout tokens at every window step: (B, W, d)."""
    per = tokens_per_step or cfg.tokens_per_step
    b = out.shape[0]
    steps = out[:, cfg.n_task_tokens:].reshape(b, cfg.window, per, cfg.token_dim)
    return jnp.mean(steps[:, :, per - cfg.readout_tokens:], axis=2)


def make_backbone(cfg: OctoConfig, all_timesteps: bool = False) -> Callable:
    """``backbone(params, images, lang_embedding, masks, lang_mask=None) -> readout``.

    - ``images``: sequence of uint8 (B, W, H, W, 3), one per camera in config order;
    - ``lang_embedding``: float32 (B, lang_tokens, t5.d_model), the T5 encoder output;
    - ``masks``: float32 (B, W, 1 + cameras), see the module docstring;
    - ``lang_mask``: float32 (B,), 1 when the instruction is present (default);
    - ``goals``: None (language only: zero goal images), or uint8 (B, H, W, 3) per camera name of
      :func:`goal_cameras` (a camera left out gets zeros);
    - returns float32 (B, d), the action readout embedding of the last window
      step (``all_timesteps``: (B, W, d)).
    """
    # the block-causal structure's query groups: keys a group can never attend are skipped (tests check the
    # readout against the masked form, backbone_without)
    groups = prefix_groups(structural_mask(cfg))

    def backbone(params, images, lang_embedding, masks, lang_mask=None, goals=None):
        masks = jnp.asarray(masks, jnp.float32)
        if lang_mask is None:
            lang_mask = jnp.broadcast_to(jnp.float32(1.0), (masks.shape[0],))
        x = embed_tokens(params, cfg, images, lang_embedding, goals=goals)
        keys = key_mask(cfg, masks, lang_mask)
        out = transformer(params, cfg, x, keys > 0.5, groups)
        r = readout_embeddings(cfg, out)
        return r if all_timesteps else r[:, -1]

    return backbone


def backbone_without(params, cfg: OctoConfig, images, lang_embedding, timestep_mask, drop: Sequence[str],
                     goals: Mapping[str, Any] | None = None):
    """Reference: the backbone run with camera groups left out of the sequence entirely.

    This is what upstream does when an observation lacks an image key (the
    tokenizer is skipped). Used by tests to show that masking a camera gives
    the same readout. Returns (B, d) of the last window step.
    """
    kept = [c for c in cfg.cameras if c.name not in drop]
    per = sum(c.num_tokens for c in kept) + (cfg.lang_tokens if cfg.repeat_task_tokens else 0) + cfg.readout_tokens
    x = embed_tokens(params, cfg, images, lang_embedding, drop=drop, goals=goals)
    names = []
    for t in range(cfg.window):
        for c in kept:
            names += [(f"obs_{c.name}", t)] * c.num_tokens
        if cfg.repeat_task_tokens:
            names += [("obs_language", t)] * cfg.lang_tokens
        names += [("readout_action", t)] * cfg.readout_tokens
    meta = [("task_language", -1)] * cfg.lang_tokens + names
    struct = np.array([[any(fnmatch(gj, p) for p in _rules(gi)) and tj <= ti for gj, tj in meta]
                       for gi, ti in meta])
    b = x.shape[0]
    key = [jnp.ones((b, cfg.lang_tokens))]
    for t in range(cfg.window):
        for c in kept:
            key.append(jnp.broadcast_to(timestep_mask[:, t:t + 1], (b, c.num_tokens)))
        if cfg.repeat_task_tokens:
            key.append(jnp.ones((b, cfg.lang_tokens)))
        key.append(jnp.ones((b, cfg.readout_tokens)))
    keys = jnp.concatenate(key, axis=1)
    allowed = jnp.logical_and(jnp.asarray(struct)[None, None], (keys > 0.5)[:, None, None, :])
    out = transformer(params, cfg, x, allowed)
    return readout_embeddings(cfg, out, per)[:, -1]


# ------------------------------------------------------------------ diffusion head
@functools.lru_cache(maxsize=8)
def diffusion_schedule(steps: int, s: float = 0.008) -> dict[str, np.ndarray]:
    """Cosine beta schedule (Nichol & Dhariwal), betas clipped to [0, 0.999]; float32 as upstream."""
    t = np.linspace(0, steps, steps + 1, dtype=np.float32) / np.float32(steps)
    f = np.cos((t + np.float32(s)) / np.float32(1 + s) * np.float32(np.pi * 0.5)).astype(np.float32) ** 2
    f = f / f[0]
    betas = np.clip(1 - f[1:] / f[:-1], 0, 0.999).astype(np.float32)
    alphas = (1 - betas).astype(np.float32)
    alpha_hats = np.cumprod(alphas, dtype=np.float32)
    return {"betas": betas, "alphas": alphas, "alpha_hats": alpha_hats}


def score_net(hp, cfg: OctoConfig, readout, x_t, t):
    """Predicted noise eps(readout, x_t, t). ``t`` float (B, 1); ``x_t`` (B, horizon*dim)."""
    dm = hp["diffusion_model"]
    w = dm["time_preprocess"]["kernel"]  # (time_dim / 2, 1): learnable Fourier features
    f = 2 * jnp.pi * t @ w.T
    tf = jnp.concatenate([jnp.cos(f), jnp.sin(f)], axis=-1)
    ce = dm["cond_encoder"]
    c = dense(ce["Dense_1"], jax.nn.swish(dense(ce["Dense_0"], tf)))
    rn = dm["reverse_network"]
    h = dense(rn["Dense_0"], jnp.concatenate([c, readout, x_t], axis=-1))
    for i in range(cfg.score_blocks):
        bp = rn[f"MLPResNetBlock_{i}"]
        y = layer_norm(bp["LayerNorm_0"], h, 1e-6) if cfg.score_layer_norm else h
        y = dense(bp["Dense_1"], jax.nn.swish(dense(bp["Dense_0"], y)))
        h = h + y
    return dense(rn["Dense_1"], jax.nn.swish(h))


def make_denoise_step(cfg: OctoConfig) -> Callable:
    """``denoise_step(params, readout, x_t, t, z) -> x_{t-1}``.

    ``readout`` (B, d); ``x_t``, ``z`` (B, horizon*dim); ``t`` int32 scalar
    (diffusion time, steps-1 .. 0). ``z`` is this step's noise (unused at t = 0).
    """
    sched = diffusion_schedule(cfg.diffusion_steps)

    def denoise_step(params, readout, x_t, t, z):
        hp = params["heads_action"]
        t = jnp.asarray(t, jnp.int32)
        alphas, alpha_hats, betas = (jnp.asarray(sched[k]) for k in ("alphas", "alpha_hats", "betas"))
        tt = jnp.broadcast_to(t.astype(jnp.float32), (x_t.shape[0], 1))
        eps = score_net(hp, cfg, readout, x_t, tt)
        a1 = 1.0 / jnp.sqrt(alphas[t])
        a2 = (1.0 - alphas[t]) / jnp.sqrt(1.0 - alpha_hats[t])
        x = a1 * (x_t - a2 * eps)
        x = x + (t > 0).astype(jnp.float32) * jnp.sqrt(betas[t]) * z
        return jnp.clip(x, -cfg.max_action, cfg.max_action)

    return denoise_step


def make_sampler(cfg: OctoConfig) -> Callable:
    """``sample(params, readout, init_noise, step_noise) -> (B, horizon, dim)`` normalised actions.

    ``init_noise`` (B, horizon*dim); ``step_noise`` (steps, B, horizon*dim),
    ``step_noise[i]`` used at diffusion time ``steps - 1 - i``.
    """
    step = make_denoise_step(cfg)

    def sample(params, readout, init_noise, step_noise):
        def body(x, inp):
            t, z = inp
            return step(params, readout, x, t, z), None

        ts = jnp.arange(cfg.diffusion_steps - 1, -1, -1, dtype=jnp.int32)
        x, _ = jax.lax.scan(body, init_noise, (ts, step_noise))
        return x.reshape(x.shape[0], cfg.action_horizon, cfg.action_dim)

    return sample


def upstream_prng():
    """The PRNG setting of upstream Octo: a context under which every key split and draw of Octo runs.

    Upstream pins jax 0.4.20, whose threefry was not partitionable; JAX has defaulted to partitionable
    threefry since 0.5, which draws other numbers from the same key (by up to 3.9 in a standard normal) and
    splits keys differently. Under this context the same key gives upstream's draws, also inside ``jit``
    (the setting is read while tracing)."""
    return jax.threefry_partitionable(False)


def split_key(rng):
    """``jax.random.split(rng)`` as upstream splits it (see :func:`upstream_prng`): (rng, key)."""
    with upstream_prng():
        rng, key = jax.random.split(rng)
    return rng, key


def noise_from_rng(cfg: OctoConfig, rng, batch: int):
    """(init_noise, step_noise) drawn as upstream ``DiffusionActionHead.predict_action`` draws them.

    Upstream draws noise for every window step (B, W, horizon*dim) and keeps the
    last step's actions; the draws here have the same shapes, key splits, draw
    order and PRNG setting (:func:`upstream_prng`) and keep the last window step,
    so equal keys give upstream's noise.
    """
    shape = (batch, cfg.window, cfg.flat_action_dim)
    with upstream_prng():
        rng, key = jax.random.split(rng)
        init = jax.random.normal(key, shape)[:, -1]

        def body(r, _):
            r, k = jax.random.split(r)
            return r, jax.random.normal(k, shape)[:, -1]

        _, steps = jax.lax.scan(body, rng, None, length=cfg.diffusion_steps)
    return init, steps


def make_infer(cfg: OctoConfig, with_rng: bool = False) -> Callable:
    """One query: backbone then sampling. ``infer(params, images, lang, masks, init_noise, step_noise,
    goals=None)``, or with ``with_rng``: ``infer(params, images, lang, masks, rng, goals=None)``. Returns
    normalised (B, horizon, dim). ``goals``: see :func:`make_backbone` (None: language only)."""
    backbone, sample = make_backbone(cfg), make_sampler(cfg)

    def infer(params, images, lang, masks, init_noise, step_noise, goals=None):
        return sample(params, backbone(params, images, lang, masks, goals=goals), init_noise, step_noise)

    def infer_rng(params, images, lang, masks, rng, goals=None):
        init, steps = noise_from_rng(cfg, rng, masks.shape[0])
        return infer(params, images, lang, masks, init, steps, goals=goals)

    return infer_rng if with_rng else infer
