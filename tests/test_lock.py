"""requirements/lock.txt: the tested dependency set that make setup installs (pip constraints)."""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)$")


def _pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = PIN.match(line.strip())
        assert m, f"{LOCK}: not a name==version pin: {line!r}"
        pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def test_the_lock_pins_every_dependency_but_never_torch():
    pins = _pins()
    assert {"numpy", "scipy", "mani-skill", "sapien", "onnxruntime", "jax", "ray", "pytest"} <= set(pins)
    assert not {"torch", "torchvision", "triton"} & set(pins)
    assert pins["mani-skill"] == "3.0.1" and pins["sapien"] == "3.0.3"  # the benchmark's simulator


def test_setup_installs_with_the_lock_as_constraints():
    text = (ROOT / "scripts" / "setup.sh").read_text()
    assert '-c "$LOCK"' in text and "requirements/lock.txt" in text


@pytest.mark.skipif(os.environ.get("UNLOCKED") == "1", reason="UNLOCKED=1: installed without the lock")
def test_this_environment_is_the_locked_one():
    installed = {d.metadata["Name"].lower().replace("_", "-"): d.version for d in metadata.distributions()}
    differ = {name: (want, installed[name]) for name, want in _pins().items()
              if name in installed and installed[name] != want}
    assert not differ, f"installed versions differ from {LOCK} (make setup, or make lock after upgrading): {differ}"
