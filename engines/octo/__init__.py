"""Octo 1.5 (octo-small-1.5, octo-base-1.5) in JAX, loading the released checkpoints unchanged.

Modules:

- :mod:`~engines.octo.config`: the architecture (:class:`OctoConfig`, presets) read from/written to ``config.json``;
- :mod:`~engines.octo.model`: pure functions over the released parameter tree:
  ``make_backbone`` (images + language embedding + float masks -> readout embedding),
  ``make_denoise_step``, ``make_sampler`` (noise given as arrays), ``noise_from_rng``, ``unnormalize``;
- :mod:`~engines.octo.t5`: the t5-base encoder from the checkpoint's own weights;
- :mod:`~engines.octo.params`: seeded random init of the exact tree, shapes, counts;
- :mod:`~engines.octo.checkpoint`: resolve (``--checkpoint DIR``, else the Hub repo through :mod:`engines.hub`:
  the Hugging Face cache or a download), read (single-file msgpack or orbax folder), check (one-line errors) and
  write checkpoints in the released layout;
- :mod:`~engines.octo.text`: t5 tokenisation from t5-base's ``spiece.model`` (resolved the same way), the
  random-weights fallback, the instruction-embedding cache;
- :mod:`~engines.octo.octo_model`: :class:`OctoModel`, everything above behind ``embed`` / ``predict``.

And what a run on ONNX Runtime or TensorRT uses instead, without JAX:

- :mod:`~engines.octo.deployed`: :class:`DeployedOcto`, the model as ``make engines`` left it in the engines folder
  (its graphs, architecture, dataset statistics and instruction embeddings);
- :mod:`~engines.octo.prng`: JAX's threefry2x32 in NumPy (the same keys and noise draws from the same seed);
- :mod:`~engines.octo.arrays`: goal images, unnormalisation and blank inputs as NumPy arrays (both models').

Errors (:class:`OctoError` and subclasses) carry one-line messages.
"""

from engines.octo.config import HF_REPOS, PRESETS, CameraSpec, OctoConfig, T5Spec, octo_base_config, octo_small_config
from engines.octo.errors import OctoCheckpointError, OctoError, OctoTokenizerError

__all__ = [
    "HF_REPOS", "PRESETS", "CameraSpec", "OctoConfig", "T5Spec", "octo_base_config", "octo_small_config",
    "OctoCheckpointError", "OctoError", "OctoTokenizerError", "OctoModel", "load_octo", "UNNORM_KEY",
    "RANDOM_WEIGHTS_NOTE",
]


def __getattr__(name):  # the loaded model imports jax; load it on first use
    if name in ("OctoModel", "load_octo", "UNNORM_KEY", "RANDOM_WEIGHTS_NOTE"):
        from engines.octo import octo_model

        return getattr(octo_model, name)
    raise AttributeError(name)
