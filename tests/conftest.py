"""Shared pytest setup: make the repo root importable (also without `pip install -e .`)."""
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# Tests never open windows.
os.environ.setdefault("MPLBACKEND", "Agg")

# No test reaches the real Hugging Face Hub, whatever the machine has: huggingface_hub (and engines.hub) make no
# request in offline mode, and an endpoint nobody listens on is refused at once. tests/test_hub.py runs its
# subprocesses against its own local hub (tests/hub_stub.py) with these overridden.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
