"""Policies of every track behind one interface, and the table of model names."""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Callable, Mapping

from eval.policies.base import ACTION_DIM, TRACKS, BadActionError, Policy  # noqa: F401


@dataclass(frozen=True)
class ModelSpec:
    name: str
    track: str
    observes: str  # "state" | "cameras"
    factory: Callable[..., Policy]  # factory(setup=Setup, arm=str, **options) -> Policy
    description: str
    options: tuple[str, ...] = ()  # model options the factory takes (checkpoint, random_weights, ...)
    # options -> sha256 of the weights file they select, for the run's identity (None: no single file)
    weights_sha256: Callable[..., str | None] | None = None
    # options -> None, or a one-line ValueError when the weights they select cannot be loaded: run before
    # any scene is built or any run folder is written
    check: Callable[..., None] | None = None


def _scripted(setup, **_):
    from eval.policies.scripted import ScriptedPolicy

    return ScriptedPolicy(clearance=setup.clearance_m, latency_steps=setup.latency_steps)


def _random(**_):
    from eval.policies.sanity import RandomPolicy

    return RandomPolicy()


def _hold(**_):
    from eval.policies.sanity import HoldPolicy

    return HoldPolicy()


def octo_policy(model: str = "octo-small", *, engine=None, backend: str | None = None, checkpoint: str | None = None,
                random_weights: bool = False, exec_horizon: int | None = None, temporal_ensembling: bool = False,
                seed: int = 0, check_size: bool = True, unnorm_key: str | None = None,
                goal_image: str | None = None, setup=None, arm: str = "panda", precision: str | None = None) -> Policy:
    """An Octo policy: its engine (loaded, random, or the one given) and the engine's runner on ``backend``
    (default jax) from the one backend factory. Every missing module or backend is one line, before loading.
    ``goal_image``: None (language only), a PNG/JPEG file, or "solved" (each try of ``setup`` rendered with its
    blocks in their holes, rendered with ``arm``); see eval.policies.octo. ``precision``: None (fp32; on trt the
    policy's TRT_PRECISION) or one the backend runs (ort: fp32, int8; engines.quantize), resolved once here."""
    from engines.backends import BackendSpec, BackendUnavailable, model_backend, model_runner, unavailable_reason
    from engines.octo.engine import get_engine
    from engines.octo.errors import OctoError
    from engines.optional import require
    from eval.policies.octo import TRT_BATCH_MAX, TRT_PRECISION, OctoPolicy, resolve_goal

    for module in ("jax", "flax", "sentencepiece"):
        require(module, "jax")
    try:
        backend = model_backend(model, backend)
    except ValueError as e:
        raise OctoError(str(e)) from None
    spec = BackendSpec(backend, precision=resolve_precision(backend, precision, TRT_PRECISION), max_batch=TRT_BATCH_MAX)
    reason = unavailable_reason(backend)
    if reason:  # before loading anything
        raise OctoError(f"backend {backend!r} {reason}")
    try:
        _check_precision(spec.backend, spec.precision)
    except ValueError as e:
        raise OctoError(str(e)) from None
    goal = resolve_goal(goal_image, setup, arm)  # a bad file: one line, before loading
    if engine is None:
        engine = get_engine(model, checkpoint=checkpoint, random_weights=random_weights, seed=seed,
                            check_size=check_size)
    try:
        runner = model_runner(model, spec, engine=engine)
    except BackendUnavailable as e:
        raise OctoError(str(e)) from None
    return OctoPolicy(engine, runner, name=model, exec_horizon=exec_horizon,
                      temporal_ensembling=temporal_ensembling, unnorm_key=unnorm_key, goal=goal)


def resolve_precision(backend: str, precision: str | None, trt_default: str) -> str:
    """The precision a model runs at, resolved once: the one asked, else ``trt_default`` (the model's
    TensorRT precision) on trt and fp32 on every other backend."""
    return precision or (trt_default if backend == "trt" else "fp32")


def _check_precision(backend: str, precision: str, model: str | None = None) -> None:
    """One-line ValueError for a precision ``backend`` cannot run, or ``model`` is refused at
    (engines.quantize.check_precision)."""
    from engines.quantize import check_precision

    check_precision(backend, precision, model)


def bc_state_policy(checkpoint: str | None = None, backend: str | None = None, precision: str | None = None) -> Policy:
    """bc-state from a weights file (default: the shipped ones) on ``backend`` (default ort), its runner from
    the one backend factory."""
    from engines.backends import BackendSpec, model_backend, model_runner
    from engines.bc_mlp import DEFAULT_WEIGHTS
    from eval.policies.bc_state import ORT_THREADS, TRT_BATCH_MAX, TRT_PRECISION, BCStatePolicy

    weights = checkpoint or DEFAULT_WEIGHTS
    backend = model_backend("bc-state", backend)
    spec = BackendSpec(backend, precision=resolve_precision(backend, precision, TRT_PRECISION), max_batch=TRT_BATCH_MAX,
                       threads=ORT_THREADS)
    return BCStatePolicy(model_runner("bc-state", spec, weights=weights), weights)


def _octo(model: str):
    def factory(setup=None, arm="panda", **options):
        return octo_policy(model, setup=setup, arm=arm, **options)

    return factory


OCTO_OPTIONS = ("checkpoint", "random_weights", "exec_horizon", "temporal_ensembling", "backend", "goal_image",
                "precision")


def _octo_check(model: str):
    def check(checkpoint=None, random_weights=False, goal_image=None, backend=None, precision=None, **_):
        if precision:
            from engines.backends import model_backend

            b = model_backend(model, backend)
            _check_precision(b, resolve_precision(b, precision, "fp32"))
        if goal_image and goal_image != "solved":
            from eval.policies.octo import read_goal_image

            read_goal_image(goal_image)  # a missing or unreadable file: one line (GoalImageError, a ValueError)
        if not random_weights:
            from engines.octo.checkpoint import resolve

            resolve(model, checkpoint)  # the folder exists, or the HF cache has it: else one line of advice

    return check


def _bc_state(checkpoint=None, backend=None, precision=None, **_):
    return bc_state_policy(checkpoint, backend, precision)


def _bc_state_weights(checkpoint=None, **_):
    from eval.policies.bc_state import weights_sha256

    return weights_sha256(checkpoint)


def _bc_state_check(checkpoint=None, backend=None, precision=None, **_):
    if precision:
        from engines.backends import model_backend

        b = model_backend("bc-state", backend)
        _check_precision(b, resolve_precision(b, precision, "fp32"), "bc-state")
    from engines.bc_mlp import DEFAULT_WEIGHTS, load

    load(checkpoint or DEFAULT_WEIGHTS)  # shapes, normalisation, metadata: BadCheckpointError in one line


def _remote(setup=None, server=None, protocol=None, profile=None, token=None, live_latency=False, **_):
    from eval.remote.client import LiveLatencyPolicy, RemotePolicy

    policy = RemotePolicy(server, protocol or "openpi", profile or "", token=token)
    return LiveLatencyPolicy(policy) if live_latency else policy


def _remote_check(server=None, protocol=None, profile=None, token=None, **_):
    from eval.remote.client import check_server

    check_server(server, protocol, profile, token)  # options, then the server's handshake: one line naming the URL


REMOTE_OPTIONS = ("server", "protocol", "profile", "token", "live_latency")

MODELS: Mapping[str, ModelSpec] = MappingProxyType({
    m.name: m for m in (
        ModelSpec("scripted", "reference", "state", _scripted, "scripted controller reading exact poses"),
        ModelSpec("random", "sanity", "state", _random, "uniform random actions"),
        ModelSpec("hold", "sanity", "state", _hold, "holds still, gripper open"),
        ModelSpec("octo-small", "frozen", "cameras", _octo("octo-small"),
                  "Octo 1.5 small (27M + t5-base), released weights, zero-shot", OCTO_OPTIONS,
                  check=_octo_check("octo-small")),
        ModelSpec("octo-base", "frozen", "cameras", _octo("octo-base"),
                  "Octo 1.5 base (93M + t5-base), released weights, zero-shot", OCTO_OPTIONS,
                  check=_octo_check("octo-base")),
        ModelSpec("bc-state", "adapted", "state", _bc_state, "MLP on exact state trained on scripted demos",
                  options=("checkpoint", "backend", "precision"), weights_sha256=_bc_state_weights,
                  check=_bc_state_check),
        # the profile decides what it observes and its track; the spec renders cameras (any profile may read them)
        ModelSpec("remote", "frozen", "cameras", _remote, "a model behind a server (openpi or vla-eval protocol; "
                  "eval.remote)", REMOTE_OPTIONS, check=_remote_check),
    )
})


class UnknownModelError(ValueError):
    pass


# options every model takes, applied around the policy the model's factory builds
RUN_OPTIONS = ("replay_latency",)
# every model option a command line can give (each model takes its ``options`` and RUN_OPTIONS)
MODEL_OPTIONS = tuple(dict.fromkeys([o for m in MODELS.values() for o in m.options] + list(RUN_OPTIONS)))


def _with_run_options(spec: ModelSpec) -> ModelSpec:
    def factory(setup=None, arm="panda", replay_latency=None, **options):
        policy = spec.factory(setup=setup, arm=arm, **options)
        if replay_latency:
            from eval.latency_replay import ReplayLatencyPolicy, load_profile

            policy = ReplayLatencyPolicy(policy, load_profile(replay_latency))
        return policy

    return replace(spec, factory=factory, options=spec.options + RUN_OPTIONS)


def get_model(name: str) -> ModelSpec:
    """A model of the table, or ``package.module:Class`` naming any Policy subclass (built with no arguments)."""
    return _with_run_options(_lookup(name))


def _lookup(name: str) -> ModelSpec:
    if name in MODELS:
        return MODELS[name]
    if ":" in name:
        import importlib

        module, _, cls_name = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError) as e:
            raise UnknownModelError(f"cannot load policy {name!r}: {e}") from None
        if not (isinstance(cls, type) and issubclass(cls, Policy)):
            raise UnknownModelError(f"{name!r} is not a subclass of eval.policies.Policy")
        return ModelSpec(name, cls.track, cls.observes, lambda **_: cls(), cls.__doc__ or name)
    raise UnknownModelError(f"unknown model {name!r}; valid: {', '.join(MODELS)}, or package.module:PolicyClass")
