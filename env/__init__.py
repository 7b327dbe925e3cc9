"""The shape-assembly task on ManiSkill 3: geometry, setups, starts, arms and the env.

Importing :mod:`env.task` (which :func:`make_env`, ``env.ENV_ID`` and ``env.ShapeAssemblyEnv`` do)
registers ``ShapeAssembly-v1`` with gymnasium. The package itself imports no simulator, so command-line
tools answer ``--help`` and argument errors without loading SAPIEN, ManiSkill or torch.
"""

from __future__ import annotations

from env.setups import SETUPS, Setup, get_setup  # noqa: F401

_FROM_TASK = ("ENV_ID", "ShapeAssemblyEnv")


def one_torch_thread() -> None:
    """Run torch on one thread in a process that steps scenes (the rollout's ``Scenes``, an eval worker, a
    benchmark's scene). ManiSkill keeps a CPU scene's state in small torch tensors: no op on them gains from
    threads, but torch's OpenMP pool spins after each op and takes the cores that lavapipe's rasterizer,
    PhysX and the policy need. Measured on a 2-core Intel Xeon (``benchmarks/render_cost.py``, 2026-12-05): both
    cameras' render 32.0 ms p50 with torch's default 2 threads, 27.8 ms with one. One worker per core needs no more."""
    import torch

    torch.set_num_threads(1)


def __getattr__(name: str):
    if name in _FROM_TASK:
        from env import task  # registers the env

        return getattr(task, name)
    raise AttributeError(f"module 'env' has no attribute {name!r}")


def make_env(setup: "str | Setup" = "A01", arm: str = "panda", obs_mode: str = "state",
             render_mode: str | None = None, max_steps: int | None = None, **kwargs):
    """Make one ShapeAssembly-v1 scene of a setup (an id or the Setup itself), with the setup's episode length
    unless ``max_steps`` cuts it (truncation)."""
    import gymnasium as gym

    from env.task import ENV_ID  # registers the env

    s = setup if isinstance(setup, Setup) else get_setup(setup)
    if "render_backend" not in kwargs:
        kwargs["render_backend"] = default_render_backend()
    return gym.make(ENV_ID, setup=s, arm=arm, obs_mode=obs_mode, render_mode=render_mode,
                    max_episode_steps=max_steps or s.max_steps, **kwargs)


def default_render_backend() -> str:
    """ManiSkill's default renderer, ``sapien_cuda``, where CUDA is, else ``sapien_cpu`` (lavapipe): asked for
    by name, so that ManiSkill does not warn at every scene that it fell back to the CPU."""
    import torch

    return "sapien_cuda" if torch.cuda.is_available() else "sapien_cpu"
