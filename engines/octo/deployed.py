"""DeployedOcto: Octo as ``make engines`` left it in an engines folder (:mod:`engines.folder`), run without JAX.

    octo = DeployedOcto.load("build/engines", "octo-small")    # the manifest's entry, every file checked
    lang = octo.embed("put the square block into the square hole")   # computed by make engines (T5), looked up
    key = octo.new_key(seed)                                   # jax.random.PRNGKey(seed), bit for bit (NumPy)
    key, sub = octo.split_key(key)                             # jax.random.split, as upstream Octo splits
    init, steps = octo.draw_noise(sub)                         # jax.random.normal's draws (engines.octo.prng)

It answers what :class:`eval.policies.octo.OctoPolicy` asks of a model (the configuration, instruction
embeddings, keys and noise, dataset statistics) as :class:`~engines.octo.octo_model.OctoModel` does, and names
the graphs (:meth:`graph`) that :func:`engines.backends.model_runner` runs on ONNX Runtime or TensorRT. Nothing
is computed that ``make engines`` did not compute: an instruction without an embedding is one line saying how
to add it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from engines import folder as engines_folder
from engines.octo import prng
from engines.octo.arrays import ModelArrays
from engines.octo.config import RANDOM_WEIGHTS_NOTE, config_from_dict
from engines.octo.errors import OctoCheckpointError

EMBEDDINGS_FORMAT = "shape-assembly-bench/octo-instructions/1"


def text_key(text: str) -> str:
    """The key of an instruction's embedding: sha256 of its UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def embeddings_file(stem: str) -> str:
    return f"{stem}.instructions.npz"


def statistics_file(stem: str) -> str:
    return f"{stem}.statistics.json"


def write_embeddings(path: Path, embeddings: dict[str, np.ndarray], t5_sha256: str) -> None:
    """The instructions' embeddings, keyed by :func:`text_key`, with the T5 weights' digest (arrays, no pickle)."""
    import os

    arrays = {f"e_{text_key(t)}": np.asarray(e, np.float32) for t, e in sorted(embeddings.items())}
    meta = {"format": EMBEDDINGS_FORMAT, "t5_sha256": t5_sha256, "texts": sorted(embeddings)}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, meta=np.frombuffer(json.dumps(meta, sort_keys=True).encode(), np.uint8), **arrays)
    os.replace(tmp, path)


def read_embeddings(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(metadata, {text key: (lang_tokens, d_model) float32}); one line for a file that is not one."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            arrays = {k[2:]: z[k] for k in z.files if k.startswith("e_")}
    except (OSError, ValueError, KeyError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise engines_folder.EnginesFolderError(f"{path}: not an instruction-embeddings file ({type(e).__name__}); "
                                                "rebuild it with: make engines") from None
    if not isinstance(meta, dict) or meta.get("format") != EMBEDDINGS_FORMAT:
        raise engines_folder.EnginesFolderError(f"{path}: not an instruction-embeddings file of this project; "
                                                "rebuild it with: make engines")
    return meta, arrays


class DeployedOcto(ModelArrays):
    """An Octo model from an engines folder's entry (see the module docstring); its statistics, unnormalisation
    and blank inputs are :class:`~engines.octo.arrays.ModelArrays`'."""

    def __init__(self, folder: Path, model: str, entry: dict[str, Any]):
        self.folder = Path(folder)
        self.model = model
        self.entry = entry
        where = str(self.folder / engines_folder.MANIFEST)
        self.cfg = config_from_dict(entry.get("config") or {}, where)
        self.identity = str(entry.get("source") or "")
        self.random_weights = bool(entry.get("random_weights"))
        self.note = RANDOM_WEIGHTS_NOTE if self.random_weights else None
        self.weights_json = entry.get("weights")  # what a run records of the weights (None: random)
        self.weights_sha256 = self.weights_json.get("sha256") if isinstance(self.weights_json, dict) else None
        stats = self._file(entry.get("statistics"), "dataset statistics")
        try:
            self.dataset_statistics = json.loads(stats.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise engines_folder.EnginesFolderError(f"{stats} cannot be read ({type(e).__name__}); rebuild it with: "
                                                    f"{engines_folder.build_command(model, self.folder)}") from None
        emb = self._file(entry.get("embeddings"), "instruction embeddings")
        meta, self._embeddings = read_embeddings(emb)
        if meta.get("t5_sha256") != entry.get("t5_sha256"):
            raise engines_folder.EnginesFolderError(
                f"{emb} holds embeddings of another T5 (t5 sha256 {str(meta.get('t5_sha256'))[:16]}, the model's "
                f"{str(entry.get('t5_sha256'))[:16]}); rebuild it with: "
                f"{engines_folder.build_command(model, self.folder)}")
        want = (self.cfg.lang_tokens, self.cfg.t5.d_model)
        for k, a in self._embeddings.items():
            if a.shape != want or a.dtype != np.float32:
                raise engines_folder.EnginesFolderError(f"{emb}: an embedding of shape {a.shape} {a.dtype}, expected "
                                                        f"{want} float32; rebuild it with: make engines")
            a.setflags(write=False)
        self.instructions = tuple(meta.get("texts") or ())

    @classmethod
    def load(cls, folder: str | Path, model: str, entry: dict[str, Any] | None = None) -> "DeployedOcto":
        """``model``'s entry of the folder (every file checked against its sha256 unless ``entry`` was read
        already, by the run's parent)."""
        entry = entry if entry is not None else engines_folder.model_entry(folder, model)
        return cls(Path(folder), model, entry)

    def _file(self, name: str | None, what: str) -> Path:
        return engines_folder.file_of(self.folder, self.entry, name, what, self.model)

    # ------------------------------------------------------------ graphs
    def graph(self, part: str, precision: str = "fp32", loaded_by: str = "ort") -> Path:
        """The graph of ``part`` ("backbone", "sampler") a backend runs: ``loaded_by`` "ort" the graph as ONNX
        Runtime loads it (rewritten by make engines), "trt" the graph its TensorRT engine was built from;
        ``precision`` int8: the backbone's Q/DQ graph (the sampler stays fp32)."""
        graphs = self.entry.get("graphs") or {}
        name = part if not (precision == "int8" and part == "backbone") else "backbone_int8"
        if loaded_by == "ort" and f"{name}_ort" in graphs:
            name = f"{name}_ort"
        if name not in graphs and precision == "int8":
            raise engines_folder.EnginesFolderError(
                f"{self.folder / engines_folder.MANIFEST} lists no INT8 graph of {self.model}; build it with: "
                f"{engines_folder.build_command(self.model, self.folder)}")
        return self._file(graphs.get(name), f"{name} graph")

    # ------------------------------------------------------------ language
    def embed(self, text: str) -> np.ndarray:
        """The T5 output (lang_tokens, d_model) make engines computed for ``text``."""
        found = self._embeddings.get(text_key(text))
        if found is None:
            raise OctoCheckpointError(f"instruction {text!r} has no embedding in {self.folder / self.entry['embeddings']}"
                                      f"; add it with: python -m engines.build --models {self.model} --out "
                                      f"{self.folder} --instruction {json.dumps(text)}")
        return found

    # ------------------------------------------------------------ keys and noise (engines.octo.prng: no JAX)
    def new_key(self, seed: int) -> np.ndarray:
        return prng.prng_key(int(seed) % (2 ** 32))

    def split_key(self, rng) -> tuple[np.ndarray, np.ndarray]:
        return prng.split_key(np.asarray(rng, np.uint32))

    def draw_noise(self, rng, batch: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """The (init, steps) noise ``OctoModel.draw_noise`` draws from the same key (to float rounding)."""
        return prng.noise_for(self.cfg, np.asarray(rng, np.uint32), batch)
