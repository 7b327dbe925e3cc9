"""The shape-assembly task on ManiSkill 3: geometry, setups, starts, arms and the env.

Importing this package registers ``ShapeAssembly-v1`` with gymnasium.
"""

from __future__ import annotations

from env.setups import SETUPS, get_setup  # noqa: F401
from env.task import ENV_ID, ShapeAssemblyEnv  # noqa: F401  (registers the env)


def make_env(setup: str = "A01", arm: str = "panda", obs_mode: str = "state", render_mode: str | None = None, **kwargs):
    """Make one ShapeAssembly-v1 scene with the setup's episode length."""
    import gymnasium as gym

    s = get_setup(setup)
    return gym.make(ENV_ID, setup=s.id, arm=arm, obs_mode=obs_mode, render_mode=render_mode,
                    max_episode_steps=s.max_steps, **kwargs)
