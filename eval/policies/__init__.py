"""Policies of every track behind one interface, and the table of model names."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

from eval.policies.base import ACTION_DIM, TRACKS, BadActionError, Policy  # noqa: F401


@dataclass(frozen=True)
class ModelSpec:
    name: str
    track: str
    observes: str  # "state" | "cameras"
    factory: Callable[..., Policy]
    description: str


def _scripted(clearance: float, **_):
    from eval.policies.scripted import ScriptedPolicy

    return ScriptedPolicy(clearance=clearance)


def _random(**_):
    from eval.policies.sanity import RandomPolicy

    return RandomPolicy()


def _hold(**_):
    from eval.policies.sanity import HoldPolicy

    return HoldPolicy()


MODELS: Mapping[str, ModelSpec] = MappingProxyType({
    m.name: m for m in (
        ModelSpec("scripted", "reference", "state", _scripted, "scripted controller reading exact poses"),
        ModelSpec("random", "sanity", "state", _random, "uniform random actions"),
        ModelSpec("hold", "sanity", "state", _hold, "holds still, gripper open"),
    )
})


class UnknownModelError(ValueError):
    pass


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise UnknownModelError(f"unknown model {name!r}; valid: {', '.join(MODELS)}") from None
