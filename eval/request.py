"""One run request, resolved once: the model's typed configuration, its runtime and the run's settings.

Every model of the benchmark has a configuration dataclass registered by name (LeRobot's configuration
classes are the model): its fields are the model's options, validated in ``__post_init__``, and it builds the
model's policy. :func:`resolve_model` is the one place a model name and its options become a
:class:`ModelConfig` and its runtime (the backend and precision, from :func:`engines.backends.resolve_runtime`,
called nowhere else: :meth:`ResolvedModel.of`), with every check that can fail before a scene is built (weights that
cannot load, a server that does not answer). :class:`RunRequest` carries the result, with the
:class:`~env.setups.Setup` objects, the arm, the split and the scenes, from the parent to every worker: a
worker never looks a model, a setup or a backend up by name again.

The command lines of ``eval.run``, ``eval.orin`` and ``eval.serve`` are generated from the same fields
(:func:`add_model_arguments`), so an option exists everywhere it applies; ``run.json`` keeps the request
(:meth:`RunRequest.to_json`, credentials as where they came from, never their values) and every try record its
identity (:meth:`RunRequest.identity`: model, track, backend, precision, profile, and the released files the model
loaded: repo, commit and each file's sha256).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Mapping, Sequence

from env.setups import Setup
from eval.policies.base import Policy


class UnknownModelError(ValueError):
    pass


# ------------------------------------------------------------------ model configurations
def option(default: Any = None, help: str = "", metavar: str | None = None, secret: bool = False) -> Any:
    """A model option: a dataclass field with its command-line help (``secret``: a credential, never written)."""
    return field(default=default, metadata={"help": help, "metavar": metavar, "secret": secret})


@dataclass(frozen=True)
class ModelConfig:
    """A model and its options. Subclasses set ``track`` and ``observes`` (spec section 4), the runtime
    ``family`` (the models of engines.backends.MODEL_BACKENDS; None: runs in Python) and build the policy."""

    name: str
    track: ClassVar[str] = "reference"
    observes: ClassVar[str] = "state"  # "state" | "cameras"
    family: ClassVar[str | None] = None
    description: ClassVar[str] = ""

    @classmethod
    def describe(cls, name: str) -> str:
        """What the model is, in a few words (the model table of the results page)."""
        return cls.description

    @classmethod
    def option_fields(cls) -> list[dataclasses.Field]:
        return [f for f in fields(cls) if f.name != "name"]

    def options(self, with_secrets: bool = False) -> dict[str, Any]:
        """The options set (not at their defaults), credentials left out unless asked."""
        return {f.name: getattr(self, f.name) for f in self.option_fields()
                if getattr(self, f.name) != f.default and (with_secrets or not f.metadata.get("secret"))}

    def credentials(self) -> dict[str, str]:
        """Where each credential set came from ("--token", "$SAB_REMOTE_TOKEN"): what run.json says of them."""
        return {}

    @property
    def backend_option(self) -> str | None:
        return getattr(self, "backend", None)

    @property
    def precision_option(self) -> str | None:
        return getattr(self, "precision", None)

    @property
    def profile_name(self) -> str | None:
        return None

    def check(self, runtime) -> None:
        """Everything that can fail before a scene is built (weights, files, a server): one-line errors."""

    def weights_sha256(self) -> str | None:
        """Of the weights file the options select, where the model has one (the run's identity)."""
        return None

    def weights(self) -> dict | None:
        """The released files the model loads, once :meth:`check` resolved them: repo, commit (revision) and
        each file's sha256 (the run's identity: run.json and every record)."""
        return None

    def policy(self, runtime=None, setup: Setup | None = None, arm: str = "panda", **build) -> Policy:
        raise NotImplementedError


MODEL_CONFIGS: dict[str, type[ModelConfig]] = {}


def register_model(*names: str):
    def deco(cls: type[ModelConfig]) -> type[ModelConfig]:
        for n in names:
            MODEL_CONFIGS[n] = cls
        return cls
    return deco


@register_model("scripted")
@dataclass(frozen=True)
class ScriptedConfig(ModelConfig):
    track: ClassVar[str] = "reference"
    description: ClassVar[str] = "scripted controller reading exact poses"

    def policy(self, runtime=None, setup=None, arm="panda", **build):
        from eval.policies.scripted import ScriptedPolicy

        return ScriptedPolicy(clearance=setup.clearance_m, latency_steps=setup.latency_steps)


@dataclass(frozen=True)
class NoisyScriptedConfig(ScriptedConfig):
    """``--model scripted --noise S``: the scripted reference perturbed (eval.policies.dart), its clean action
    kept as each step's label. The noise is a model option, so the run's options carry it (run.json and the
    run's identity, meta/recording.json): a recording resumed with another noise is another run. eval.record's
    own, not registered: eval.run scores the reference unperturbed."""

    noise: float = option(0.0, help="std of the Gaussian noise on each executed motion component", metavar="S")

    def __post_init__(self):
        if not 0 <= self.noise < float("inf"):
            raise ValueError(f"--noise must be a finite number, 0 or more (the std of the noise on each motion "
                             f"component), got {self.noise:g}")

    def policy(self, runtime=None, setup=None, arm="panda", **build):
        from eval.policies.dart import NoisyReference

        return NoisyReference(setup, self.noise)


@register_model("random")
@dataclass(frozen=True)
class RandomConfig(ModelConfig):
    track: ClassVar[str] = "sanity"
    description: ClassVar[str] = "uniform random actions"

    def policy(self, runtime=None, setup=None, arm="panda", **build):
        from eval.policies.sanity import RandomPolicy

        return RandomPolicy()


@register_model("hold")
@dataclass(frozen=True)
class HoldConfig(ModelConfig):
    track: ClassVar[str] = "sanity"
    description: ClassVar[str] = "holds still, gripper open"

    def policy(self, runtime=None, setup=None, arm="panda", **build):
        from eval.policies.sanity import HoldPolicy

        return HoldPolicy()


def _check_backend_options(backend: str | None, precision: str | None) -> None:
    from engines.backends import BACKENDS, PRECISIONS

    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown --backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"unknown --precision {precision!r}; valid: {', '.join(PRECISIONS)}")


@register_model("octo-small", "octo-base")
@dataclass(frozen=True)
class OctoConfig(ModelConfig):
    checkpoint: str | None = option(help="checkpoint: Octo a folder in the released layout or a Hub repo "
                                         "hf://ORG/NAME (default: the model's released repo, from the Hugging Face "
                                         "cache or downloaded into it); bc-state a weights file",
                                    metavar="DIR|hf://ORG/NAME")
    revision: str | None = option(help="Octo: the Hub revision of the weights, a branch, tag or commit (default "
                                       "main); what ran is recorded as its commit", metavar="REV")
    random_weights: bool = option(False, help="the exact architecture with seeded random weights: latency only, "
                                              "success meaningless")
    exec_horizon: int | None = option(help="actions executed per query from a predicted chunk", metavar="K")
    temporal_ensembling: bool = option(False, help="average overlapping action chunks")
    goal_image: str | None = option(help="Octo: condition on a goal image as well as the instruction: a PNG/JPEG "
                                         "file, or 'solved' (each try's start rendered with its blocks in their "
                                         "holes); default: language only", metavar="FILE|solved")
    backend: str | None = option(help="runtime backend of the model (bc-state: ort, trt, torch, default ort; octo: "
                                      "jax, ort, trt, default jax; eval.orin: the fastest available)")
    precision: str | None = option(help="numeric precision of the model's graphs: ort fp32 (default) or int8 (the "
                                        "Q/DQ graph make engines builds; bf16 is refused: ONNX Runtime's CPU has no "
                                        "bf16 kernels); trt fp32, fp16, int8, fp8 (default: the model's own); jax "
                                        "and torch fp32")
    engines: str | None = option(help="the engines folder make engines wrote (default build/engines): on ort and trt "
                                      "the model runs from it alone (graphs, TensorRT engines, Octo's statistics and "
                                      "instruction embeddings; no checkpoint, no JAX, nothing built)", metavar="DIR")
    track: ClassVar[str] = "frozen"
    observes: ClassVar[str] = "cameras"
    family: ClassVar[str | None] = "octo"

    def __post_init__(self):
        _check_backend_options(self.backend, self.precision)
        if self.random_weights and (self.checkpoint or self.revision):
            raise ValueError("--random-weights excludes --checkpoint and --revision")
        if self.checkpoint:
            from engines.hub import parse_repo

            parse_repo(self.checkpoint)  # hf://ORG/NAME or a folder; a malformed repo is one line now
        if self.goal_image not in (None, "solved"):  # workers (and Ray actors) read it by absolute path
            object.__setattr__(self, "goal_image", str(Path(self.goal_image).expanduser().resolve()))
        _absolute_engines(self)
        self._check_horizon(self._horizon())

    def _horizon(self) -> int | None:
        """Actions the model predicts per query (None: known once its checkpoint is read)."""
        from engines.octo.config import PRESETS

        return PRESETS[self.name]().action_horizon

    def _check_horizon(self, horizon: int | None) -> None:
        if horizon is not None and self.exec_horizon is not None and not 1 <= self.exec_horizon <= horizon:
            raise ValueError(f"--exec-horizon must be 1..{horizon} (the actions {self.name} predicts per query), "
                             f"got {self.exec_horizon}")

    @classmethod
    def describe(cls, name: str) -> str:
        size = "27M" if name == "octo-small" else "93M"
        return f"Octo 1.5 {name.split('-')[1]} ({size} + t5-base), released weights, zero-shot"

    def check(self, runtime) -> None:
        if self.goal_image and self.goal_image != "solved":
            from eval.policies.octo import read_goal_image

            read_goal_image(self.goal_image)  # a missing or unreadable file: one line (GoalImageError, a ValueError)
        if self._from_engines(runtime):
            # the engines folder is the model: its entry read (every file's sha256 checked) and its weights
            # compared with what the run asks for, once here; every worker loads this entry
            object.__setattr__(self, "_entry", self._engines_entry())
            return
        if not self.random_weights:
            from engines.octo.checkpoint import resolve_weights

            # the folder, or the Hub repo's files from the cache or downloaded, checked against the Hub's record of
            # them (and of the model's size), and the tokenizer: resolved once here; every worker loads these files
            object.__setattr__(self, "_weights", resolve_weights(self.name, self.checkpoint, self.revision))

    def _resolved(self):
        return getattr(self, "_weights", None)

    def weights_sha256(self) -> str | None:
        entry = getattr(self, "_entry", None)
        if entry is not None:
            return (entry.get("weights") or {}).get("sha256")
        w = self._resolved()
        return w.sha256 if w is not None else None

    def weights(self) -> dict | None:
        entry = getattr(self, "_entry", None)
        if entry is not None:  # the files the graphs were exported from, as make engines resolved them
            return entry.get("weights")
        w = self._resolved()
        return w.to_json() if w is not None else None

    def _from_engines(self, runtime) -> bool:
        """Whether this run's model is the engines folder's: on ONNX Runtime or TensorRT (the jax backend loads the
        checkpoint)."""
        from engines.backends import GRAPH_BACKENDS

        return runtime is not None and runtime.backend in GRAPH_BACKENDS

    def engines_dir(self) -> Path:
        from engines.folder import default_dir

        return Path(self.engines) if self.engines else default_dir()

    def _engines_entry(self) -> dict:
        """The model's entry of the engines folder, checked against the weights the run asks for: released (no
        option), --random-weights, or --checkpoint (a folder: its files' sha256; a Hub repo: its name, and the
        commit when --revision is one). One line (EnginesFolderError) naming the folder and how to build it."""
        from engines.folder import EnginesFolderError, build_command, model_entry
        from engines.octo.config import HF_REPOS

        folder = self.engines_dir()
        entry = model_entry(folder, self.name)
        build = build_command(self.name, folder)
        built = entry.get("weights") or {}
        ckpt = built.get("checkpoint") or {}
        has = ("random weights" if entry.get("random_weights") else
               f"the weights of {ckpt.get('repo') or ckpt.get('folder') or 'an unnamed checkpoint'}")
        if self.random_weights != bool(entry.get("random_weights")):
            asked = "random weights (--random-weights)" if self.random_weights else "trained weights"
            if self.random_weights:
                build = build_command(self.name, folder, "--random-weights")
            raise EnginesFolderError(f"{folder} holds {self.name} with {has}, the run asks for {asked}; build "
                                     f"those with: {build}")
        if self.random_weights:
            return entry
        if self.checkpoint and not str(self.checkpoint).startswith("hf://"):
            from engines.octo.checkpoint import resolve

            files = resolve(self.name, self.checkpoint)
            if dict(files.sha256) != ckpt.get("files"):
                build = build_command(self.name, folder, f"--checkpoint-{self.name} {self.checkpoint}")
                raise EnginesFolderError(f"{folder} holds {self.name} with {has}, not the files of --checkpoint "
                                         f"{self.checkpoint}; build them with: {build}")
            return entry
        from engines.hub import parse_repo

        repo = parse_repo(self.checkpoint) if self.checkpoint else HF_REPOS.get(self.name)
        rev = self.revision
        if ckpt.get("repo") != repo or (rev and len(rev) == 40 and ckpt.get("revision") != rev):
            raise EnginesFolderError(f"{folder} holds {self.name} with {has}, the run asks for {repo}"
                                     f"{'@' + rev if rev else ''}; build it with: {build}")
        return entry

    def policy(self, runtime=None, setup=None, arm="panda", engine=None, seed: int = 0, check_size: bool = True,
               unnorm_key: str | None = None, **build):
        """The Octo policy: its engine (loaded, random, or the one given) and the engine's runner on the resolved
        runtime, from the one backend factory. ``goal_image``: None (language only), a PNG/JPEG file, or
        "solved" (each try of ``setup`` rendered with its blocks in their holes, by ``arm``)."""
        from engines.backends import BackendUnavailable, model_runner
        from engines.octo.errors import OctoError
        from eval.policies.octo import OctoPolicy, resolve_goal

        goal = resolve_goal(self.goal_image, setup, arm)  # a bad file: one line, before loading
        if engine is None and self._from_engines(runtime):  # the engines folder alone: no JAX, no checkpoint
            from engines.octo.deployed import DeployedOcto

            entry = getattr(self, "_entry", None) or self._engines_entry()
            engine = DeployedOcto.load(self.engines_dir(), self.name, entry)
        elif engine is None:
            from engines.octo.octo_model import load_octo
            from engines.optional import require

            for module in ("jax", "flax", "sentencepiece"):
                require(module, "jax")
            engine = load_octo(self.name, checkpoint=self.checkpoint, random_weights=self.random_weights, seed=seed,
                                check_size=check_size, revision=self.revision, weights=self._resolved())
        try:
            runner = model_runner(self.name, runtime, engine=engine, engines=self.engines_dir())
        except BackendUnavailable as e:
            raise OctoError(str(e)) from None
        return OctoPolicy(engine, runner, name=self.name, exec_horizon=self.exec_horizon,
                          temporal_ensembling=self.temporal_ensembling, unnorm_key=unnorm_key, goal=goal)


def _absolute_engines(config) -> None:
    """--engines as an absolute path: workers (and Ray actors) read it wherever they run."""
    if config.engines:
        object.__setattr__(config, "engines", str(Path(config.engines).expanduser().resolve()))


@register_model("octo")
@dataclass(frozen=True)
class OctoCheckpointConfig(OctoConfig):
    """Any Octo checkpoint in the released layout (a fine-tuned one, another size): its architecture is its own
    config.json's. Not a released model of the frozen track, so never ranked."""

    track: ClassVar[str] = "adapted"

    def __post_init__(self):
        if not self.checkpoint:
            raise ValueError(f"--model {self.name} needs --checkpoint DIR or hf://ORG/NAME (an Octo checkpoint in the "
                             f"released layout, of any size); the released models are octo-small and octo-base")
        if self.random_weights:
            raise ValueError(f"--model {self.name} takes its architecture from --checkpoint; random weights need "
                             f"octo-small or octo-base")
        super().__post_init__()

    def _horizon(self) -> int | None:
        w = self._resolved()
        if w is None:
            return None
        from engines.octo.checkpoint import read_config

        return read_config(w.checkpoint.folder, self.name)[0].action_horizon

    @classmethod
    def describe(cls, name: str) -> str:
        return "an Octo checkpoint of any size (--checkpoint DIR or hf://ORG/NAME): fine-tuned or other, not ranked"

    def _from_engines(self, runtime) -> bool:
        # make engines builds octo-small and octo-base: a checkpoint of any size runs on jax, or on ort from its
        # graphs exported on first use
        if runtime is not None and runtime.backend == "trt":
            raise ValueError(f"--model {self.name} runs on jax or ort; TensorRT engines are built by make engines "
                             "for octo-small and octo-base (python -m engines.build --models octo-small "
                             "--checkpoint-octo-small DIR takes a checkpoint of that size)")
        return False

    def check(self, runtime) -> None:
        super().check(runtime)
        self._check_horizon(self._horizon())


@dataclass(frozen=True)
class WeightsFileConfig(ModelConfig):
    """A model of one weights file of the project (engines.backends.WEIGHTS_FILE_MODELS: bc-state, bc-camera):
    the file (its default, or --checkpoint), checked strictly before any scene, and its runtime."""

    checkpoint: str | None = option(help=OctoConfig.__dataclass_fields__["checkpoint"].metadata["help"],
                                    metavar="PATH")
    backend: str | None = option(help=OctoConfig.__dataclass_fields__["backend"].metadata["help"])
    precision: str | None = option(help=OctoConfig.__dataclass_fields__["precision"].metadata["help"])
    engines: str | None = option(help=OctoConfig.__dataclass_fields__["engines"].metadata["help"], metavar="DIR")
    track: ClassVar[str] = "adapted"

    def __post_init__(self):
        _check_backend_options(self.backend, self.precision)
        _absolute_engines(self)

    def _model_file(self):
        from engines.backends import WEIGHTS_FILE_MODELS

        return WEIGHTS_FILE_MODELS[self.family]

    def weights_path(self) -> Path:
        return Path(self.checkpoint) if self.checkpoint else self._model_file().weights()

    def check(self, runtime) -> None:
        self._model_file().code().load(self.weights_path())  # shapes, normalisation, metadata: one line

    def weights_sha256(self) -> str | None:
        from engines.onnx_utils import sha256_file

        return sha256_file(self.weights_path())

    def runner(self, runtime):
        from engines.backends import model_runner

        return model_runner(self.family, runtime, weights=self.weights_path(), engines=self.engines)


@register_model("bc-state")
@dataclass(frozen=True)
class BCStateConfig(WeightsFileConfig):
    family: ClassVar[str | None] = "bc-state"
    description: ClassVar[str] = "MLP on exact state trained on scripted demos"

    def policy(self, runtime=None, setup=None, arm="panda", **build):
        from eval.policies.bc_state import BCStatePolicy

        return BCStatePolicy(self.runner(runtime), self.weights_path())


@register_model("bc-camera")
@dataclass(frozen=True)
class BCCameraConfig(WeightsFileConfig):
    observes: ClassVar[str] = "cameras"
    family: ClassVar[str | None] = "bc-camera"
    description: ClassVar[str] = ("CNN state estimate from both cameras, joints and instruction, bc-state acting "
                                  "on it")

    def policy(self, runtime=None, setup=None, arm="panda", **build):
        from eval.policies.bc_camera import BCCameraPolicy

        _, config, _ = self._model_file().code().load(self.weights_path())
        return BCCameraPolicy(self.runner(runtime), config, self.weights_path())


@register_model("remote")
@dataclass(frozen=True)
class RemoteConfig(ModelConfig):
    server: str | None = option(help="the model server: ws://HOST:PORT (openpi, vla-eval), http://HOST:PORT "
                                     "(openvla-http)", metavar="URL")
    protocol: str = option("openpi", help="openpi, vla-eval, or openvla-http (openvla-oft's own deploy.py server: "
                                          "POST /act) (default openpi)")
    profile: str | None = option(help="how observations and actions map to the model: octo-small, octo-base, "
                                      "bc-state (servers of this project: python -m eval.serve), openvla-7b, "
                                      "openvla-oft (vla-eval's servers), openvla-oft-http (openvla-http), "
                                      "pi0-libero, pi05-libero (openpi)")
    token: str | None = option(help="the token the server was started with ($SAB_REMOTE_TOKEN is read when this is "
                                    "not given); never written: run.json says only where it came from", secret=True)
    live_latency: bool = option(False, help="apply each action at the first control step after its own measured "
                                            "round trip (the arm holds until then), as --replay-latency does with "
                                            "a profile")
    description: ClassVar[str] = "a model behind a server (openpi, vla-eval or openvla-http protocol; eval.remote)"

    def __post_init__(self):
        from eval.remote import wire
        from eval.remote.client import TOKEN_ENV
        from eval.remote.profiles import get_profile

        wire.check_url(self.server, self.protocol)  # an unknown protocol or a URL of another scheme: one line
        # looked up once (unknown, not applicable, or another protocol's: one line); its track and observations
        # are the run's
        object.__setattr__(self, "_profile_row", get_profile(self.profile or "", self.protocol))
        if self.token is None and os.environ.get(TOKEN_ENV):  # read once, in the parent; never written
            object.__setattr__(self, "token", os.environ[TOKEN_ENV])
            object.__setattr__(self, "_token_source", f"${TOKEN_ENV}")
        elif self.token:
            object.__setattr__(self, "_token_source", "--token")

    @property
    def track(self) -> str:  # type: ignore[override]
        return self._profile_row.track  # what a served model observes, and its track, are its profile's

    @property
    def observes(self) -> str:  # type: ignore[override]
        return self._profile_row.observes

    @property
    def profile_name(self) -> str | None:
        return self.profile

    def credentials(self) -> dict[str, str]:
        return {"token": self._token_source} if self.token else {}

    def check(self, runtime) -> None:
        from eval.remote.client import check_server

        check_server(self.server, self.protocol, self.profile, self.token)  # the handshake: one line naming the URL

    def policy(self, runtime=None, setup=None, arm="panda", **build):
        from eval.remote.client import LiveLatencyPolicy, RemotePolicy

        policy = RemotePolicy(self.server, self.protocol, self.profile or "", token=self.token)
        return LiveLatencyPolicy(policy) if self.live_latency else policy


@dataclass(frozen=True)
class PolicyClassConfig(ModelConfig):
    """``package.module:Class``: any Policy subclass, built with no arguments (tests, experiments)."""

    def _cls(self) -> type[Policy]:
        import importlib

        module, _, cls_name = self.name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError) as e:
            raise UnknownModelError(f"cannot load policy {self.name!r}: {e}") from None
        if not (isinstance(cls, type) and issubclass(cls, Policy)):
            raise UnknownModelError(f"{self.name!r} is not a subclass of eval.policies.Policy")
        return cls

    def __post_init__(self):
        self._cls()

    @property
    def track(self) -> str:  # type: ignore[override]
        return self._cls().track

    @property
    def observes(self) -> str:  # type: ignore[override]
        return self._cls().observes

    def policy(self, runtime=None, setup=None, arm="panda", **build):
        return self._cls()()


def secret_options() -> frozenset[str]:
    """The options that are credentials (``option(secret=True)``): never written, never shown."""
    return frozenset(f.name for cls in MODEL_CONFIGS.values() for f in cls.option_fields() if f.metadata.get("secret"))


def config_class(name: str) -> type[ModelConfig]:
    if name in MODEL_CONFIGS:
        return MODEL_CONFIGS[name]
    if ":" in name:
        return PolicyClassConfig
    raise UnknownModelError(f"unknown model {name!r}; valid: {', '.join(MODEL_CONFIGS)}, or package.module:PolicyClass")


def model_config(name: str, **options) -> ModelConfig:
    """The configuration of model ``name`` with ``options`` (one-line ValueError for an option it does not take
    or a value it refuses)."""
    cls = config_class(name)
    taken = {f.name for f in cls.option_fields()}
    extra = sorted(set(options) - taken)
    if extra:
        raise ValueError(f"{name} takes no {', '.join('--' + o.replace('_', '-') for o in extra)}")
    # an empty text option ('--revision ""') would read as unset and silently run the default
    empty = sorted(k for k, v in options.items() if isinstance(v, str) and not v.strip())
    if empty:
        raise ValueError(f"--{empty[0].replace('_', '-')} is empty; give a value or leave the option out")
    return cls(name=name, **options)


# ------------------------------------------------------------------ resolution
@dataclass(frozen=True)
class ResolvedModel:
    """A model's configuration, its runtime, and why that runtime (eval.orin prints it)."""

    config: ModelConfig
    runtime: Any = None  # engines.backends.BackendSpec, or None (runs in Python)
    runtime_reason: str = ""

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def backend(self) -> str:
        return self.runtime.backend if self.runtime is not None else "python"

    @property
    def precision(self) -> str | None:
        return self.runtime.precision if self.runtime is not None else None

    def policy(self, setup: Setup | None = None, arm: str = "panda", **build) -> Policy:
        return self.config.policy(self.runtime, setup=setup, arm=arm, **build)

    @classmethod
    def of(cls, config: ModelConfig, device_default: bool = False, check: bool = True) -> "ResolvedModel":
        """THE one resolution of a model's runtime on a run's path (backend and precision, their availability
        checked once) and, with ``check``, every check that can fail before a scene is built (weights, a
        server). One-line errors (ValueError and its kinds, FileNotFoundError, ImportError)."""
        from engines.backends import resolve_runtime, runtime_reason

        runtime = None  # models that run in Python have none
        if config.family is not None:
            runtime = resolve_runtime(config.name, config.backend_option, config.precision_option,
                                      device_default=device_default)
        if check:
            config.check(runtime)
        reason = (runtime_reason(config.backend_option, runtime, device_default) if runtime is not None
                  else f"{config.name} has no runtime backend (runs in Python)")
        return cls(config, runtime, reason)


def resolve_model(name: str, options: Mapping[str, Any] | None = None, *, device_default: bool = False,
                  check: bool = True) -> ResolvedModel:
    """A model name and its options as a configuration (:func:`model_config`) and its runtime
    (:meth:`ResolvedModel.of`)."""
    return ResolvedModel.of(model_config(name, **dict(options or {})), device_default=device_default, check=check)


# ------------------------------------------------------------------ the request
@dataclass(frozen=True)
class RunRequest:
    """What a run asks for, resolved: the model (configuration and runtime), the setups, the arm, the split,
    the tries, the scenes, and the run options every model takes (``replay_latency``)."""

    model: ResolvedModel
    setups: tuple[Setup, ...]
    split: str
    tries: int
    arm: str = "panda"
    sim: str = "cpu"
    num_envs: int = 1
    first_try: int = 0  # the tries run are first_try .. first_try + tries - 1 of each setup (eval.record --first-try)
    replay_latency: str | None = None  # a latency profile every action is delayed by: its absolute path, or published:LABEL
    replay_ms: tuple[float, ...] | None = None  # its latencies, read once by the command line (eval.latency_replay)
    max_steps: int | None = None  # a smoke run: every try cut at this many control steps (None: the setup's own)
    record: bool = False  # every try's frames, joint positions and actions staged as a dataset episode (eval.record)

    def __post_init__(self):
        # checked here, once, before any scene is built: a worker builds num_envs scenes whatever it is given
        if self.tries < 1:
            raise ValueError(f"--tries must be at least 1, got {self.tries}")
        if isinstance(self.first_try, bool) or not isinstance(self.first_try, int) or self.first_try < 0:
            raise ValueError(f"--first-try must be 0 or more (a try index of the task list), got {self.first_try}")
        if self.num_envs < 1:
            raise ValueError(f"--num-envs must be at least 1, got {self.num_envs}")
        if self.num_envs > self.tries:  # a batch holds tries of one setup: scenes beyond --tries never run a try
            raise ValueError(f"--num-envs {self.num_envs} is more than the {self.tries} tries per setup this run "
                             f"asks for (a batch holds tries of one setup): the largest useful value is "
                             f"--num-envs {self.tries}")
        if (self.replay_latency is None) != (self.replay_ms is None) or (self.replay_ms is not None
                                                                          and not self.replay_ms):
            raise ValueError("a replayed latency needs both its profile's name (replay_latency) and its latencies "
                             "(replay_ms)")
        if self.max_steps is not None and (isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int)
                                           or self.max_steps < 1):
            raise ValueError(f"--max-steps must be at least 1 (control steps per try), got {self.max_steps}")

    @property
    def track(self) -> str:
        return self.model.config.track

    @property
    def observes(self) -> str:
        return self.model.config.observes

    def identity(self) -> dict[str, Any]:
        """What every try record carries of the run: model, track, arm, backend, precision, profile, the
        released files the model loaded (``weights``: repo, commit, each file's sha256), and a smoke run's
        ``max_steps``."""
        out = {"model": self.model.name, "track": self.track, "arm": self.arm, "backend": self.model.backend}
        if self.model.precision is not None:
            out["precision"] = self.model.precision
        if self.observes == "cameras" or self.record:  # what its (or the recording's) frames look like
            from env.appearance import APPEARANCE_VERSION

            out["appearance"] = APPEARANCE_VERSION
        if self.model.config.profile_name:
            out["profile"] = self.model.config.profile_name
        weights = self.model.config.weights()
        if weights is not None:
            out["weights"] = weights
        if self.max_steps is not None:  # tries cut short: their records say so wherever they are read
            out["max_steps"] = self.max_steps
        return out

    def options(self) -> dict[str, Any]:
        """The model options and run options set, as the command line gave them (credentials left out)."""
        out = self.model.config.options()
        if self.replay_latency:
            out["replay_latency"] = self.replay_latency
        if self.max_steps is not None:
            out["max_steps"] = self.max_steps
        if self.record:  # another run than an evaluation's: its tries have staged episodes
            from eval.lerobot import DATASET_FORMAT

            out["record"] = DATASET_FORMAT
        return out

    def policy(self, setup: Setup, **build) -> Policy:
        """A policy for one scene of ``setup``, with the run options applied around it."""
        policy = self.model.policy(setup=setup, arm=self.arm, **build)
        if self.replay_latency:
            import numpy as np

            from eval.latency_replay import ReplayLatencyPolicy

            policy = ReplayLatencyPolicy(policy, np.asarray(self.replay_ms, dtype=float))
        return policy

    def to_json(self) -> dict[str, Any]:
        """The request as run.json keeps it (credentials as where they came from, never their values)."""
        out = {"model": self.model.name, "track": self.track, "observes": self.observes, "options": self.options(),
               "backend": self.model.backend, "backend_reason": self.model.runtime_reason,
               "setups": [s.id for s in self.setups], "split": self.split, "tries": self.tries, "arm": self.arm,
               "sim": self.sim, "num_envs": self.num_envs}
        if self.first_try:  # tries other than the first N: older run.jsons, which never had any, stay as they were
            out["first_try"] = self.first_try
        if self.model.precision is not None:
            out["precision"] = self.model.precision
        if self.model.config.profile_name:
            out["profile"] = self.model.config.profile_name
        weights = self.model.config.weights()
        if weights is not None:
            out["weights"] = weights
        creds = self.model.config.credentials()
        if creds:
            out["credentials"] = {k: f"set (from {v})" for k, v in creds.items()}
        return out


# ------------------------------------------------------------------ command lines
def _option_fields(models: Sequence[str] | None = None) -> dict[str, tuple[dataclasses.Field, list[str]]]:
    """Every model option of ``models`` (default all): field name -> (its field, the models that take it)."""
    out: dict[str, tuple[dataclasses.Field, list[str]]] = {}
    for name, cls in MODEL_CONFIGS.items():
        if models is not None and name not in models:
            continue
        for f in cls.option_fields():
            entry = out.setdefault(f.name, (f, []))
            entry[1].append(name)
    return out


def add_model_arguments(parser: argparse.ArgumentParser, models: Sequence[str] | None = None,
                        title: str = "model options (only for models that take them)") -> None:
    """One argument per option of the models' configurations (defaults None: unset, so only the options given
    reach the configuration, which applies its own defaults)."""
    group = parser.add_argument_group(title)
    for fname, (f, takers) in _option_fields(models).items():
        flag = "--" + fname.replace("_", "-")
        who = "" if models is not None and len(takers) == len(models) else f" [{', '.join(takers)}]"
        help_ = f.metadata.get("help", "") + who
        if f.type in (bool, "bool"):
            group.add_argument(flag, action="store_true", default=None, help=help_)
        else:
            typ = int if f.type in (int, "int | None", "int") else str
            group.add_argument(flag, type=typ, default=None, help=help_, metavar=f.metadata.get("metavar"))


def options_from_args(args: argparse.Namespace, models: Sequence[str] | None = None) -> dict[str, Any]:
    """The model options given on the command line (unset ones left out: a 0 is given, not unset)."""
    return {k: getattr(args, k) for k in _option_fields(models) if getattr(args, k, None) is not None}


MODEL_NAMES = MappingProxyType(MODEL_CONFIGS)


def make_policy(model: str, setup: Setup | None = None, arm: str = "panda", **options_and_build) -> Policy:
    """A policy of ``model`` built with its options, for tools and tests that drive one outside a run: the
    model is resolved by :func:`resolve_model` (without its load checks: building the policy makes them).
    ``engine`` / ``seed`` / ``check_size`` / ``unnorm_key`` (Octo) are passed to the builder."""
    build_keys = ("engine", "seed", "check_size", "unnorm_key")
    build = {k: options_and_build.pop(k) for k in build_keys if k in options_and_build}
    return resolve_model(model, options_and_build, check=False).policy(setup=setup, arm=arm, **build)
