"""The project's requirements name what the simulator needs without relying on mani-skill pulling it in: SAPIEN,
which env/ imports directly, is a requirement of the sim extra itself, pinned to the version installed and locked.
ManiSkill's next release moves SAPIEN into an extra (``mani-skill[sapien]``), so a plain mani-skill would no longer
bring it. Read from the installed distributions' metadata (importlib.metadata), as pip resolved them."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys

from packaging.requirements import Requirement

from tests.conftest import REPO_ROOT

PROJECT = "shape-assembly-bench"
# deliberately not a requirement (setup.py): a GPU or Jetson torch a user has must never be replaced
NOT_REQUIRED = {"torch"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(extra: str | None) -> dict[str, Requirement]:
    """The project's requirements active with ``extra`` (None: the base ones), by normalised name."""
    out = {}
    for text in metadata.requires(PROJECT) or []:
        req = Requirement(text)
        active = req.marker is None if extra is None else (req.marker is not None
                                                          and req.marker.evaluate({"extra": extra}))
        if active:
            out[_norm(req.name)] = req
    return out


def test_sapien_is_the_sim_extras_own_requirement_at_the_installed_and_locked_version():
    sim = _requirements("sim")
    assert "sapien" in sim, f"the sim extra does not name sapien: {sorted(sim)}"
    installed = metadata.version("sapien")
    assert sim["sapien"].specifier.contains(installed), (sim["sapien"], installed)
    assert "mani-skill" in sim and sim["mani-skill"].specifier.contains(metadata.version("mani-skill"))
    locked = dict(line.split("==", 1) for line in (REPO_ROOT / "requirements" / "lock.txt").read_text().splitlines()
                  if "==" in line and not line.startswith("#"))
    assert {_norm(k): v for k, v in locked.items()}["sapien"] == installed


def test_every_distribution_the_scene_imports_is_a_requirement_of_its_own():
    """Every third-party module env/ (the scene) imports comes from a distribution the project names (base or sim
    extra), not from one another package happens to pull in."""
    provided = metadata.packages_distributions()
    named = set(_requirements(None)) | set(_requirements("sim"))
    imported: set[str] = set()
    for path in sorted((REPO_ROOT / "env").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m in provided and m not in sys.stdlib_module_names and m != "env"}
    assert {"sapien", "mani_skill"} <= third_party, sorted(third_party)
    missing = {m: provided[m] for m in third_party
               if not ({_norm(d) for d in provided[m]} & (named | NOT_REQUIRED))}
    assert not missing, f"imported by env/ but not a requirement of {PROJECT}: {missing}"
