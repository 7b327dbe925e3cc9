"""The Octo 1.5 architecture as a frozen config, read from (and written to) the released ``config.json``.

The released ``config.json`` describes the model as nested "module specs"
(``{"module", "name", "args", "kwargs"}``) naming the upstream classes. This
module reads the parts that fix the architecture into :class:`OctoConfig` and
refuses anything this implementation does not run (FiLM, token learners, MAP
heads, other heads), with a one-line :class:`~engines.octo.errors.OctoCheckpointError`.

Sizes (upstream ``common_transformer_sizes``): vit_s = octo-small (d 384,
12 layers, 6 heads, MLP 1536), vit_b = octo-base (d 768, 12 layers, 12 heads,
MLP 3072). Token layout of both: 16 task-language tokens, then per timestep of
the window of 2: 256 primary-image tokens, 64 wrist-image tokens, 16 repeated
language tokens and 1 readout token: 16 + 2 x 337 = 690 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from engines.octo.errors import OctoCheckpointError


@dataclass(frozen=True)
class T5Spec:
    """Dimensions of a T5 encoder (defaults: t5-base)."""

    vocab_size: int = 32128
    d_model: int = 768
    d_kv: int = 64
    num_heads: int = 12
    d_ff: int = 3072
    num_layers: int = 12
    num_buckets: int = 32
    max_distance: int = 128
    eps: float = 1e-6


# Language encoders by the name the released config gives them. Other names can be described in a
# config's top-level "t5_configs" entry (this project's extension, used by the tests' tiny checkpoints).
T5_SPECS: Mapping[str, T5Spec] = {"t5-base": T5Spec()}


@dataclass(frozen=True)
class CameraSpec:
    """One image tokenizer: ``obs_key`` image (stacked with the task's goal image) through a SmallStem."""

    name: str  # "primary" | "wrist": token group obs_<name>, params observation_tokenizers_<name>
    obs_key: str  # "image_primary"
    image_size: tuple[int, int]  # (height, width) the model takes
    stack_task_image: bool = True  # goal image (zeros for language tasks) stacked as 3 more channels
    patch_size: int = 16  # SmallStem16; SmallStem32 would be 32
    stem_features: tuple[int, ...] = (32, 96, 192, 384)
    num_features: int = 512

    @property
    def in_channels(self) -> int:
        return 6 if self.stack_task_image else 3

    @property
    def grid(self) -> tuple[int, int]:
        h, w = self.image_size
        for _ in self.stem_features:  # 3x3 stride-2 convs, padding 1: ceil(n / 2)
            h, w = (h + 1) // 2, (w + 1) // 2
        k = self.patch_size // 16
        return h // k, w // k

    @property
    def num_tokens(self) -> int:
        gh, gw = self.grid
        return gh * gw

    @property
    def encoder_name(self) -> str:
        return f"SmallStem{self.patch_size}"


@dataclass(frozen=True)
class OctoConfig:
    name: str
    token_dim: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    cameras: tuple[CameraSpec, ...]
    window: int = 2
    max_horizon: int = 10
    lang_tokens: int = 16
    t5_name: str = "t5-base"
    t5: T5Spec = field(default_factory=T5Spec)
    repeat_task_tokens: bool = True
    use_correct_attention: bool = True
    readout_tokens: int = 1
    action_horizon: int = 4
    action_dim: int = 7
    diffusion_steps: int = 20
    time_dim: int = 32
    score_blocks: int = 3
    score_hidden: int = 256
    score_layer_norm: bool = True
    max_action: float = 5.0
    ln_eps: float = 1e-6

    # ---------------------------------------------------------------- token layout
    @property
    def head_dim(self) -> int:
        return self.token_dim // self.num_heads

    @property
    def n_task_tokens(self) -> int:
        return self.lang_tokens

    def timestep_groups(self) -> list[tuple[str, int]]:
        """(group name, tokens) of one timestep, in sequence order."""
        groups = [(f"obs_{c.name}", c.num_tokens) for c in self.cameras]
        if self.repeat_task_tokens:
            groups.append(("obs_language", self.lang_tokens))
        groups.append(("readout_action", self.readout_tokens))
        return groups

    @property
    def tokens_per_step(self) -> int:
        return sum(n for _, n in self.timestep_groups())

    @property
    def n_tokens(self) -> int:
        return self.n_task_tokens + self.window * self.tokens_per_step

    @property
    def flat_action_dim(self) -> int:
        return self.action_horizon * self.action_dim


def _camera(name: str, size: int) -> CameraSpec:
    return CameraSpec(name=name, obs_key=f"image_{name}", image_size=(size, size))


def octo_small_config() -> OctoConfig:
    return OctoConfig(name="octo-small", token_dim=384, num_layers=12, num_heads=6, mlp_dim=1536,
                      cameras=(_camera("primary", 256), _camera("wrist", 128)))


def octo_base_config() -> OctoConfig:
    return OctoConfig(name="octo-base", token_dim=768, num_layers=12, num_heads=12, mlp_dim=3072,
                      cameras=(_camera("primary", 256), _camera("wrist", 128)))


PRESETS = {"octo-small": octo_small_config, "octo-base": octo_base_config}
HF_REPOS = {"octo-small": "rail-berkeley/octo-small-1.5", "octo-base": "rail-berkeley/octo-base-1.5"}
ANY_SIZE = "octo"  # the model of any Octo checkpoint (--checkpoint): its architecture is its config.json's
RANDOM_WEIGHTS_LABEL = "random weights (latency only)"


def random_weights_identity(model: str, seed: int) -> str:
    """The identity of ``model``'s seeded random weights (what its exports and engines-folder entry record)."""
    return f"random-weights:{model}:seed{seed}"
  # what every console line of a random-weights run says


# ------------------------------------------------------------------ released config.json
_TOKENIZERS = "octo.model.components.tokenizers"
_ENCODERS = "octo.model.components.vit_encoders"
_HEADS = "octo.model.components.action_heads"


def _spec(module: str, name: str, **kwargs) -> dict:
    return {"module": module, "name": name, "args": [], "kwargs": kwargs}


def release_config_dict(cfg: OctoConfig) -> dict[str, Any]:
    """``config.json`` content in the released layout (the keys ``load_pretrained`` reads)."""
    def encoder(c: CameraSpec) -> dict:
        kw: dict[str, Any] = {}
        if c.stem_features != CameraSpec.stem_features:  # SmallStem's own defaults are left out, as released
            kw["features"] = list(c.stem_features)
            kw["kernel_sizes"] = [3] * len(c.stem_features)
            kw["strides"] = [2] * len(c.stem_features)
            kw["padding"] = [1] * len(c.stem_features)
        if c.num_features != CameraSpec.num_features:
            kw["num_features"] = c.num_features
        return _spec(_ENCODERS, c.encoder_name, **kw)

    cams = {
        c.name: _spec(_TOKENIZERS, "ImageTokenizer", obs_stack_keys=[c.obs_key],
                      task_stack_keys=[c.obs_key] if c.stack_task_image else [], encoder=encoder(c))
        for c in cfg.cameras
    }
    model = {
        "observation_tokenizers": cams,
        "task_tokenizers": {"language": _spec(_TOKENIZERS, "LanguageTokenizer", encoder=cfg.t5_name,
                                              finetune_encoder=False)},
        "heads": {"action": _spec(_HEADS, "DiffusionActionHead", readout_key="readout_action", use_map=False,
                                  action_horizon=cfg.action_horizon, action_dim=cfg.action_dim,
                                  max_action=cfg.max_action, time_dim=cfg.time_dim, num_blocks=cfg.score_blocks,
                                  hidden_dim=cfg.score_hidden, use_layer_norm=cfg.score_layer_norm,
                                  diffusion_steps=cfg.diffusion_steps, n_diffusion_samples=1, dropout_rate=0.0)},
        "readouts": {"action": cfg.readout_tokens},
        "token_embedding_size": cfg.token_dim,
        "transformer_kwargs": {"attention_dropout_rate": 0.0, "add_position_embedding": False,
                               "num_layers": cfg.num_layers, "mlp_dim": cfg.mlp_dim,
                               "num_attention_heads": cfg.num_heads, "dropout_rate": 0.0},
        "max_horizon": cfg.max_horizon,
        "repeat_task_tokens": cfg.repeat_task_tokens,
        "use_correct_attention": cfg.use_correct_attention,
    }
    out: dict[str, Any] = {
        "model": model,
        "window_size": cfg.window,
        "text_processor": _spec("octo.data.utils.text_processing", "HFTokenizer", tokenizer_name=cfg.t5_name,
                                encode_with_model=False,
                                tokenizer_kwargs={"max_length": cfg.lang_tokens, "padding": "max_length",
                                                  "truncation": True, "return_tensors": "np"}),
    }
    if cfg.t5_name not in T5_SPECS:
        out["t5_configs"] = {cfg.t5_name: dict(vars(cfg.t5))}
    return out


def _fail(where: str, msg: str) -> OctoCheckpointError:
    return OctoCheckpointError(f"{where}: {msg}")


def _kwargs(spec: Any, where: str, what: str, names: tuple[str, ...]) -> dict:
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise _fail(where, f"{what} is not a module spec")
    if spec["name"] not in names:
        raise _fail(where, f"{what} is {spec['name']}, this implementation runs {' or '.join(names)}")
    return dict(spec.get("kwargs") or {})


def config_from_release(raw: Mapping[str, Any], example_batch: Mapping[str, Any] | None = None,
                        name: str = "octo", where: str = "config.json") -> OctoConfig:
    """:class:`OctoConfig` of a released ``config.json`` (and its example batch, for image sizes and window)."""
    try:
        model = raw["model"]
        obs_tok = model["observation_tokenizers"]
        task_tok = model["task_tokenizers"]
        heads = model["heads"]
        tk = model["transformer_kwargs"]
    except (KeyError, TypeError) as e:
        raise _fail(where, f"missing key {e} (not an Octo config.json)") from None
    obs_batch = (example_batch or {}).get("observation", {}) if example_batch else {}

    cameras = []
    for cam_name, spec in obs_tok.items():
        kw = _kwargs(spec, where, f"observation tokenizer {cam_name!r}", ("ImageTokenizer",))
        if kw.get("use_token_learner") or kw.get("task_film_keys"):
            raise _fail(where, f"observation tokenizer {cam_name!r} uses a token learner or FiLM, not supported")
        keys = list(kw.get("obs_stack_keys", []))
        if len(keys) != 1 or any(ch in keys[0] for ch in ".*[]()"):
            raise _fail(where, f"observation tokenizer {cam_name!r} stacks {keys}; one plain image key is supported")
        enc = kw.get("encoder") or {}
        enc_kw = _kwargs(enc, where, f"encoder of {cam_name!r}", ("SmallStem16", "SmallStem32"))
        if enc_kw.get("use_film"):
            raise _fail(where, f"encoder of {cam_name!r} uses FiLM, not supported")
        n_layers = len(enc_kw.get("features", (32, 96, 192, 384)))
        for key, want in (("kernel_sizes", 3), ("strides", 2), ("padding", 1)):
            if list(enc_kw.get(key, [want] * n_layers)) != [want] * n_layers:
                raise _fail(where, f"encoder of {cam_name!r} has {key} {enc_kw[key]}; 3x3 stride-2 padding-1 "
                                   f"layers are supported")
        patch = int(enc_kw.get("patch_size", 16 if enc["name"] == "SmallStem16" else 32))
        default_size = 256 if cam_name == "primary" else 128
        size = (default_size, default_size)
        img = obs_batch.get(keys[0]) if isinstance(obs_batch, Mapping) else None
        if img is not None and getattr(img, "ndim", 0) >= 3:
            size = (int(img.shape[-3]), int(img.shape[-2]))
        stack = bool(kw.get("task_stack_keys"))
        cameras.append(CameraSpec(name=cam_name, obs_key=keys[0], image_size=size, stack_task_image=stack,
                                  patch_size=patch,
                                  stem_features=tuple(enc_kw.get("features", (32, 96, 192, 384))),
                                  num_features=int(enc_kw.get("num_features", 512))))
    if set(task_tok) != {"language"}:
        raise _fail(where, f"task tokenizers {sorted(task_tok)}; only 'language' (no goal images) is supported")
    lkw = _kwargs(task_tok["language"], where, "task tokenizer 'language'", ("LanguageTokenizer",))
    t5_name = lkw.get("encoder")
    if not isinstance(t5_name, str):
        raise _fail(where, "the language tokenizer has no encoder")
    if t5_name in T5_SPECS:
        t5 = T5_SPECS[t5_name]
    elif t5_name in (raw.get("t5_configs") or {}):
        t5 = T5Spec(**raw["t5_configs"][t5_name])
    else:
        raise _fail(where, f"language encoder {t5_name!r} unknown; known: {', '.join(T5_SPECS)}")

    if set(heads) != {"action"}:
        raise _fail(where, f"heads {sorted(heads)}; only 'action' is supported")
    hkw = _kwargs(heads["action"], where, "head 'action'", ("DiffusionActionHead",))
    if hkw.get("use_map"):
        raise _fail(where, "the diffusion head pools with MAP, not supported")
    if hkw.get("readout_key", "readout_action") != "readout_action":
        raise _fail(where, f"the action head reads {hkw.get('readout_key')!r}, expected 'readout_action'")
    readouts = model.get("readouts") or {}
    if set(readouts) != {"action"}:
        raise _fail(where, f"readouts {sorted(readouts)}; only 'action' is supported")

    window = int(raw.get("window_size", 2) or 2)
    pad = obs_batch.get("timestep_pad_mask", obs_batch.get("pad_mask")) if isinstance(obs_batch, Mapping) else None
    if pad is not None and getattr(pad, "ndim", 0) == 2:
        window = int(pad.shape[1])
    lang_tokens = 16
    tp = raw.get("text_processor") or {}
    if isinstance(tp, Mapping):
        lang_tokens = int(((tp.get("kwargs") or {}).get("tokenizer_kwargs") or {}).get("max_length", 16))
    d = int(model["token_embedding_size"])
    heads_n = int(tk["num_attention_heads"])
    if d % heads_n:
        raise _fail(where, f"token_embedding_size {d} is not a multiple of num_attention_heads {heads_n}")
    return OctoConfig(
        name=name, token_dim=d, num_layers=int(tk["num_layers"]), num_heads=heads_n, mlp_dim=int(tk["mlp_dim"]),
        cameras=tuple(cameras), window=window, max_horizon=int(model.get("max_horizon", 10)),
        lang_tokens=lang_tokens, t5_name=t5_name, t5=t5,
        repeat_task_tokens=bool(model.get("repeat_task_tokens", False)),
        use_correct_attention=bool(model.get("use_correct_attention", False)),
        readout_tokens=int(readouts["action"]),
        action_horizon=int(hkw.get("action_horizon", hkw.get("pred_horizon", 1))),
        action_dim=int(hkw.get("action_dim", 7)), diffusion_steps=int(hkw.get("diffusion_steps", 20)),
        time_dim=int(hkw.get("time_dim", 32)), score_blocks=int(hkw.get("num_blocks", 3)),
        score_hidden=int(hkw.get("hidden_dim", 256)), score_layer_norm=bool(hkw.get("use_layer_norm", True)),
        max_action=float(hkw.get("max_action", 5.0)),
    )


def same_architecture(a: OctoConfig, b: OctoConfig) -> bool:
    """True when two configs describe the same network (names aside)."""
    return replace(a, name="") == replace(b, name="")


# ------------------------------------------------------------------ the engines folder's copy
UNNORM_KEY = "bridge_dataset"  # the dataset statistics Octo's actions are unnormalised with (eval.policies.octo)
RANDOM_WEIGHTS_NOTE = "random weights: latency only, success meaningless"


def config_to_dict(cfg: OctoConfig) -> dict[str, Any]:
    """The architecture as plain JSON (the engines folder's manifest keeps it: :mod:`engines.folder`)."""
    from dataclasses import asdict

    return asdict(cfg)


def config_from_dict(d: Mapping[str, Any], where: str = "manifest.json") -> OctoConfig:
    """:func:`config_to_dict`'s inverse; a config of another shape is one line naming ``where``."""
    try:
        cams = tuple(CameraSpec(**{**c, "image_size": tuple(c["image_size"]),
                                   "stem_features": tuple(c["stem_features"])}) for c in d["cameras"])
        return OctoConfig(**{**d, "cameras": cams, "t5": T5Spec(**d["t5"])})
    except (KeyError, TypeError, ValueError) as e:
        raise OctoCheckpointError(f"{where}: not an Octo architecture of this project ({type(e).__name__}: {e}); "
                                  "rebuild it with: make engines") from None
