"""Small stand-ins for tests: a tiny Octo config (same structure, tiny sizes), tiny checkpoints in the
released layout, and a tiny sentencepiece model trained on the fly (nothing is downloaded).

The tiny architecture has every group, name and rule of the real one (two
cameras, 16 task tokens repeated per step, one readout, window 2, a T5 encoder,
the diffusion head with 20 steps); only widths, depths and image sizes shrink.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engines.octo.config import CameraSpec, OctoConfig, T5Spec

TINY_T5 = T5Spec(vocab_size=128, d_model=16, d_kv=8, num_heads=2, d_ff=32, num_layers=2)


def tiny_config(use_correct_attention: bool = True, name: str = "octo-tiny") -> OctoConfig:
    cams = (
        CameraSpec("primary", "image_primary", (32, 32), stem_features=(32, 32, 32, 32), num_features=32),
        CameraSpec("wrist", "image_wrist", (16, 16), stem_features=(32, 32, 32, 32), num_features=32),
    )
    return OctoConfig(name=name, token_dim=32, num_layers=2, num_heads=2, mlp_dim=64, cameras=cams,
                      t5_name="t5-tiny-test", t5=TINY_T5, use_correct_attention=use_correct_attention,
                      score_hidden=32)


def tiny_statistics(action_dim: int = 7) -> dict:
    mean = np.linspace(-0.01, 0.01, action_dim).astype(np.float32)
    std = np.full(action_dim, 0.02, np.float32)
    mask = np.array([True] * (action_dim - 1) + [False])
    return {"bridge_dataset": {"action": {"mean": mean, "std": std, "mask": mask, "p01": mean - 0.05,
                                          "p99": mean + 0.05, "min": mean - 0.1, "max": mean + 0.1},
                               "num_transitions": 10, "num_trajectories": 1}}


CORPUS = [
    "put the square block into the square hole",
    "put the circle block into the circle hole",
    "put the triangle block into the triangle hole",
    "pick up the fork and put it on the plate",
    "insert the red block into the board",
    "move the blue square to the left",
]


def train_spiece(folder: str | Path, vocab_size: int = 64) -> Path:
    """A tiny sentencepiece model with T5's special ids (pad 0, eos 1, unk 2, no bos): folder/spiece.model."""
    import sentencepiece as spm

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    text = folder / "corpus.txt"
    text.write_text("\n".join(CORPUS * 20) + "\n")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / "spiece"), vocab_size=vocab_size,
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False,
                                   minloglevel=2)
    return folder / "spiece.model"


def tiny_octo(seed: int = 1, diffusion_steps: int = 5):
    """A random-weights :class:`~engines.octo.octo_model.OctoModel` of the tiny config with fewer diffusion
    steps (the unrolled sampler is exported per step; 5 keep the export test fast, the structure is the same)."""
    from dataclasses import replace

    from engines.octo.octo_model import OctoModel, synthetic_statistics
    from engines.octo.params import init_params
    from engines.octo.text import HashTokenizer

    cfg = replace(tiny_config(), diffusion_steps=diffusion_steps)
    return OctoModel(cfg, init_params(cfg, seed=seed), synthetic_statistics(cfg),
                      identity=f"random-weights:tiny:seed{seed}", tokenizer=HashTokenizer(cfg.t5.vocab_size,
                                                                                           cfg.lang_tokens),
                      random_weights=True)
