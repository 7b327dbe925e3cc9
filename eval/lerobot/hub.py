"""Upload a recorded dataset to the Hugging Face Hub as LeRobot's ``push_to_hub`` does
(datasets/lerobot_dataset.py): a dataset repo, the folder's data, videos, meta and card, then the tag
``v3.0``, the revision LeRobot's reader asks for (datasets/utils.py get_safe_version)."""

from __future__ import annotations

import re
from pathlib import Path

from eval.lerobot import CODEBASE_VERSION

UPLOADED = ["data/**", "videos/**", "meta/**", "README.md"]  # never the recording's run folder
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def check_repo_id(repo_id: str) -> None:
    if not _REPO_ID.match(repo_id) or ".." in repo_id or repo_id.endswith((".git", ".")):
        raise ValueError(f"--push-to-hub {repo_id!r} is not a Hub repo id; give USER/NAME (letters, digits, - _ .)")


def push(root: Path, repo_id: str, private: bool = False) -> str:
    """Upload ``root`` to the dataset repo ``repo_id`` and tag it v3.0; the repo's URL. The token is
    huggingface_hub's own (HF_TOKEN or the login's), never passed or written here."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RevisionNotFoundError

    api = HfApi()
    url = api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    api.upload_folder(repo_id=repo_id, repo_type="dataset", folder_path=str(root), allow_patterns=UPLOADED,
                      commit_message="Shape assembly demonstrations (python -m eval.record)")
    try:  # the tag moves to the new commit, as LeRobot's push_to_hub moves it
        api.delete_tag(repo_id, tag=CODEBASE_VERSION, repo_type="dataset")
    except RevisionNotFoundError:
        pass
    api.create_tag(repo_id, tag=CODEBASE_VERSION, repo_type="dataset")
    return str(url)
