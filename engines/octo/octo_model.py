"""OctoModel: a loaded (or randomly initialised) Octo model, ready to answer queries on the JAX backend.

    octo = OctoModel.load("octo-small")   # released weights (HF cache, Hub); or checkpoint=DIR, random_weights=True
    lang = octo.embed("put the square block into the square hole")      # cached per (checkpoint, text)
    actions = octo.predict(images, masks, lang[None], rng=key)            # (B, 4, 7), normalised
    actions = octo.unnormalize(actions)                                   # dataset statistics, mask kept

``predict`` takes the noise from outside as well (``noise=(init, steps)``),
so that other backends can be compared on exactly the same draws, and
optionally goal images (``goals={"primary": uint8 (B | 1, H, W, 3)}``, see
:func:`goal_arrays`); without them the task is language only, as upstream's
zero goal images.

Instruction embeddings are cached in memory per (checkpoint, tokenizer,
instruction); with ``embed_cache_dir`` (or ``$OCTO_EMBED_CACHE``) also as
``.npy`` files, so that a device that runs only the backbone can be given them.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from engines.octo import checkpoint as ckpt
from engines.octo.arrays import ModelArrays, goal_arrays  # noqa: F401 (goal_arrays: its home was here)
from engines.octo.config import ANY_SIZE, PRESETS, RANDOM_WEIGHTS_NOTE, UNNORM_KEY, OctoConfig, random_weights_identity
from engines.octo.errors import OctoCheckpointError
from engines.octo.model import make_infer, noise_from_rng, split_key
from engines.octo.params import init_params, t5_subtree, without_t5
from engines.octo.t5 import t5_encode
from engines.octo.text import InstructionCache, make_tokenizer, random_weights_spiece

# Octo's actions are normalised per dataset; the scene is closest to Bridge (delta end-effector position and
# roll-pitch-yaw in the robot base frame, absolute gripper 1 = open), Octo's most-used zero-shot setting and
# the key of upstream's own examples. Its mask leaves the gripper dimension as the model outputs it.
EMBED_CACHE_ENV = "OCTO_EMBED_CACHE"  # a folder: instruction embeddings are also kept there as .npy files


def synthetic_statistics(cfg: OctoConfig) -> dict:
    """Statistics for random weights only: Bridge-like scale (1 cm, 0.01 rad), gripper left as output."""
    a = cfg.action_dim
    std = [0.01] * (a - 1) + [1.0]
    mask = [True] * (a - 1) + [False]
    action = {"mean": [0.0] * a, "std": std, "mask": mask, "min": [-0.05] * a, "max": [0.05] * a,
              "p01": [-0.03] * a, "p99": [0.03] * a}
    return {UNNORM_KEY: {"action": action, "num_transitions": 0, "num_trajectories": 0,
                         "note": RANDOM_WEIGHTS_NOTE}}


class OctoModel(ModelArrays):
    def __init__(self, cfg: OctoConfig, params: dict, dataset_statistics: dict, *, identity: str, tokenizer,
                 random_weights: bool, path: Path | None = None, embed_cache_dir: str | Path | None = None,
                 weights: "ckpt.OctoWeights | None" = None):
        self.cfg = cfg
        self.identity = identity
        self.random_weights = random_weights
        self.path = path
        self.weights = weights  # the files loaded: repo, commit and sha256 of each (None: random weights)
        self.weights_sha256 = weights.sha256 if weights is not None else None
        self.dataset_statistics = dataset_statistics
        self.tokenizer = tokenizer
        self.t5_params = jax.tree_util.tree_map(jnp.asarray, t5_subtree(params))
        self.params = jax.tree_util.tree_map(jnp.asarray, without_t5(params))
        self._infer = jax.jit(make_infer(cfg))
        self._infer_rng = jax.jit(make_infer(cfg, with_rng=True))
        self._noise = jax.jit(functools.partial(noise_from_rng, cfg), static_argnums=(1,))
        spec = cfg.t5
        self._t5 = jax.jit(lambda p, ids, m: t5_encode(p, spec, ids, m))
        # the embedding depends on the T5 weights (the checkpoint) and on the tokenizer
        tok_id = f"{getattr(tokenizer, 'kind', type(tokenizer).__name__)}:{getattr(tokenizer, 'path', '')}"
        folder = embed_cache_dir if embed_cache_dir is not None else os.environ.get(EMBED_CACHE_ENV) or None
        self.cache = InstructionCache(f"{identity}|{tok_id}", self._encode_text, folder)
        self.note = RANDOM_WEIGHTS_NOTE if random_weights else None

    # ------------------------------------------------------------ construction
    @classmethod
    def load(cls, model: str, checkpoint: str | Path | None = None, random_weights: bool = False, seed: int = 0,
             step: int | None = None, embed_cache_dir: str | Path | None = None, spiece: str | Path | None = None,
             check_size: bool = True, revision: str | None = None,
             weights: "ckpt.OctoWeights | None" = None) -> "OctoModel":
        """``model``: "octo-small" | "octo-base" (their released weights unless ``checkpoint`` names others: a
        folder or ``hf://ORG/NAME``), or "octo" (any checkpoint, its own architecture). ``weights``: the files
        :func:`~engines.octo.checkpoint.resolve_weights` resolved already (a run's parent does it once)."""
        if model not in PRESETS and model != ANY_SIZE:
            raise OctoCheckpointError(f"unknown Octo model {model!r}; valid: {', '.join(PRESETS)}, {ANY_SIZE}")
        preset = PRESETS[model]() if model in PRESETS else None
        if random_weights:
            if checkpoint or revision or weights:
                raise OctoCheckpointError("--random-weights excludes --checkpoint and --revision")
            if preset is None:
                raise OctoCheckpointError(f"--model {ANY_SIZE} takes its architecture from --checkpoint; random "
                                          f"weights need {' or '.join(PRESETS)}")
            params = init_params(preset, seed)
            tok = make_tokenizer(random_weights_spiece(spiece), preset.lang_tokens, preset.t5.vocab_size)
            return cls(preset, params, synthetic_statistics(preset), identity=random_weights_identity(model, seed),
                       tokenizer=tok, random_weights=True, embed_cache_dir=embed_cache_dir)
        w = weights or ckpt.resolve_weights(model, checkpoint, revision, spiece=spiece, check_size=check_size)
        c = ckpt.load(w.checkpoint.folder, model=model, step=step,
                      expect=preset if check_size and preset is not None else None)
        tok = make_tokenizer(w.tokenizer, c.config.lang_tokens, c.config.t5.vocab_size)
        return cls(c.config, c.params, c.dataset_statistics, identity=f"{w.checkpoint.where}@{c.step}",
                   tokenizer=tok, random_weights=False, path=w.checkpoint.folder, embed_cache_dir=embed_cache_dir,
                   weights=w)

    @classmethod
    def from_checkpoint(cls, ck: "ckpt.Checkpoint", tokenizer, embed_cache_dir=None) -> "OctoModel":
        return cls(ck.config, ck.params, ck.dataset_statistics, identity=ck.identity, tokenizer=tokenizer,
                   random_weights=False, path=ck.path, embed_cache_dir=embed_cache_dir)

    # ------------------------------------------------------------ language
    def tokenize(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        return self.tokenizer(text)

    def _encode_text(self, text: str) -> np.ndarray:
        ids, mask = self.tokenize(text)
        out = self._t5(self.t5_params, jnp.asarray(ids)[None], jnp.asarray(mask)[None])
        return np.asarray(out[0], np.float32)

    def embed(self, text: str) -> np.ndarray:
        """T5 output (lang_tokens, d_model) for an instruction, cached per (checkpoint, instruction)."""
        return self.cache(text)

    # ------------------------------------------------------------ actions
    def predict(self, images: Sequence[Any], masks, lang, rng=None, noise: tuple[Any, Any] | None = None,
                goals: Mapping[str, Any] | None = None):
        """Normalised action chunks (B, horizon, dim).

        ``images``: uint8 (B, W, H, W, 3) per camera; ``masks`` float (B, W, 1 + cameras);
        ``lang`` (B, lang_tokens, d_model); exactly one of ``rng`` (a key) or ``noise``
        (``(init (B, horizon*dim), steps (diffusion_steps, B, horizon*dim))``); ``goals``: None (language
        only, today's computation) or {camera: uint8 goal image} (:func:`goal_arrays`).
        """
        if (rng is None) == (noise is None):
            raise ValueError("give exactly one of rng or noise")
        images = [jnp.asarray(i, jnp.uint8) for i in images]
        masks = jnp.asarray(masks, jnp.float32)
        lang = jnp.asarray(lang, jnp.float32)
        g = goal_arrays(self.cfg, goals, int(masks.shape[0]))
        kw = {} if g is None else {"goals": {k: jnp.asarray(v) for k, v in g.items()}}
        if noise is not None:
            out = self._infer(self.params, images, lang, masks, jnp.asarray(noise[0], jnp.float32),
                              jnp.asarray(noise[1], jnp.float32), **kw)
        else:
            out = self._infer_rng(self.params, images, lang, masks, rng, **kw)
        return np.asarray(out)

    def new_key(self, seed: int):
        """A try's key: ``jax.random.PRNGKey(seed)`` (seeds taken modulo 2**32, as the policy gives them)."""
        return jax.random.PRNGKey(int(seed) % (2 ** 32))

    def split_key(self, rng):
        """(rng, key) as upstream's evaluation splits a try's key per query (:func:`engines.octo.model.split_key`)."""
        return split_key(rng)

    def draw_noise(self, rng, batch: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """The (init, steps) noise arrays ``predict(rng=rng)`` would use."""
        init, steps = self._noise(rng, batch)
        return np.asarray(init), np.asarray(steps)

    def warmup(self) -> None:
        """Compile the query function (so that the first timed query is not a compilation)."""
        images, masks, lang = self.blank_inputs()
        self.predict(images, masks, lang, rng=jax.random.PRNGKey(0))


_ENGINES: dict[tuple, OctoModel] = {}


def load_octo(model: str, checkpoint: str | Path | None = None, random_weights: bool = False,
               **kwargs) -> OctoModel:
    """A process-wide loaded model per (model, checkpoint, random_weights, the rest: revision, resolved weights, ...);
    only the last one is kept."""
    where = None
    if checkpoint:
        from engines.hub import HF_SCHEME

        named = str(checkpoint)
        where = named if named.startswith(HF_SCHEME) else str(Path(named).expanduser().resolve())
    key = (model, where, bool(random_weights), tuple(sorted(kwargs.items())))
    if key not in _ENGINES:
        _ENGINES.clear()
        _ENGINES[key] = OctoModel.load(model, checkpoint=checkpoint, random_weights=random_weights, **kwargs)
    return _ENGINES[key]
