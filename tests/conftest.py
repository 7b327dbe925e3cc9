"""Shared pytest setup: make the repo root importable (also without `pip install -e .`)."""
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# Tests never open windows.
os.environ.setdefault("MPLBACKEND", "Agg")
