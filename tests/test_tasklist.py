"""The locked task list (env/tasklist.py, env/tasklists/v1/)."""
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from env import geometry, tasklist
from env.setups import FULL_BOARD_IDS, SCORED_IDS, SETUPS, get_setup
from env.starts import SPLITS, derive_seed, sample_start

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def derived():
    """Every split derived once in memory: {split: (entries, bytes)}."""
    out = {}
    for split in SPLITS:
        entries = tasklist.build(split)
        out[split] = (entries, tasklist.serialise(entries))
    return out


def test_sizes_table():
    assert dict(tasklist.TRIES_PER_SETUP) == {"train": 100, "dev": 20, "test": 50, "confirm": 50}
    assert len(SETUPS) == 33 and len(SCORED_IDS) == 30 and FULL_BOARD_IDS == ("FB01", "FB02", "FB03")


def test_build_is_deterministic(derived):
    entries, data = derived["dev"]
    again = tasklist.serialise(tasklist.build("dev"))
    assert tasklist.sha256_hex(again) == tasklist.sha256_hex(data)
    n = tasklist.TRIES_PER_SETUP["dev"]
    assert len(entries) == n * len(SETUPS)
    assert [(e["setup"], e["try"]) for e in entries] == [(s, i) for s in SETUPS for i in range(n)]


def test_splits_are_seed_disjoint(derived):
    seen = {}
    for split, (entries, _) in derived.items():
        seeds = {e["seed"] for e in entries}
        for other, other_seeds in seen.items():
            assert not seeds & other_seeds, f"{split} and {other} share seeds"
        seen[split] = seeds


def test_serialisation_is_canonical(derived):
    _, data = derived["dev"]
    text = data.decode("utf-8")
    assert text.endswith("\n") and "\r" not in text
    for line in text.splitlines():
        assert line == json.dumps(json.loads(line), sort_keys=True, separators=(",", ":"))


def test_committed_files_match_lock_and_verify(derived):
    lock = tasklist.read_lock()
    assert lock["version"] == "v1" and set(lock["splits"]) == set(SPLITS)
    for split in SPLITS:
        entries, data = derived[split]
        rec = lock["splits"][split]
        assert tasklist.split_path(split).read_bytes() == data, f"{split}.jsonl is stale: run generate"
        assert rec == {"sha256": tasklist.sha256_hex(data), "tries": len(entries),
                       "per_setup": tasklist.TRIES_PER_SETUP[split]}
        tl = tasklist.load(split)
        assert tl.sha256 == rec["sha256"] and len(tl) == rec["tries"]
    assert all(ok for _, ok, _ in tasklist.verify(["dev", "test"]))


def test_verify_cli(capsys):
    assert tasklist.main(["verify"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(SPLITS) and all(": OK " in line for line in out)


def _copy_v1(tmp_path) -> Path:
    dst = tmp_path / "v1"
    shutil.copytree(tasklist.version_dir(), dst)
    return tmp_path


def test_tampered_copy_is_refused(tmp_path):
    root = _copy_v1(tmp_path)
    path = root / "v1" / "dev.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    e = json.loads(lines[3])
    e["start"]["board_x"] += 0.001
    lines[3] = json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n"
    path.write_text("".join(lines))
    assert tasklist.load("test", root=root).split == "test"  # untouched split still loads
    with pytest.raises(tasklist.TaskListHashError) as exc:
        tasklist.load("dev", root=root)
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg
    assert tasklist.read_lock()["splits"]["dev"]["sha256"] in msg
    assert tasklist.sha256_hex(path.read_bytes()) in msg
    assert "python -m env.tasklist" in msg
    ok, line = tasklist.verify_split("dev", root=root)
    assert not ok and f"setup {e['setup']} try {e['try']}" in line


def test_generate_into_root_is_deterministic(tmp_path):
    first = tasklist.generate(["dev"], root=tmp_path)
    data = (tmp_path / "v1" / "dev.jsonl").read_bytes()
    lock = (tmp_path / "v1" / "LOCK.json").read_bytes()
    second = tasklist.generate(["dev"], root=tmp_path)
    assert (tmp_path / "v1" / "dev.jsonl").read_bytes() == data
    assert (tmp_path / "v1" / "LOCK.json").read_bytes() == lock
    assert first["dev"]["previous_sha256"] is None
    assert second["dev"]["previous_sha256"] == second["dev"]["sha256"] == tasklist.read_lock()["splits"]["dev"]["sha256"]


def test_missing_file_names_generate_command(tmp_path):
    with pytest.raises(tasklist.TaskListMissingError) as exc:
        tasklist.load("test", root=tmp_path)
    msg = str(exc.value)
    assert "\n" not in msg and "python -m env.tasklist generate --split test" in msg


def test_unknown_split_in_load():
    with pytest.raises(tasklist.UnknownSplitError, match="valid: train, dev, test, confirm"):
        tasklist.load("bogus")


def test_show_test_split(capsys):
    assert tasklist.main(["show", "--split", "test"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "scored: 1,500 tries (30 setups)" in lines
    assert "full board: 150 tries (3 setups)" in lines
    assert "total: 1,650 tries" in lines
    assert lines[-1] == f"sha256: {tasklist.read_lock()['splits']['test']['sha256']}"


def test_unknown_split_cli_exits_2():
    proc = subprocess.run([sys.executable, "-m", "env.tasklist", "show", "--split", "bogus"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "bogus" in err[0] and "train, dev, test, confirm" in err[0]
    assert proc.stdout == ""


def test_start_equals_sample_start():
    tl = tasklist.load("test")
    for setup_id, i in [("A01", 0), ("B05", 17), ("C04", 49), ("FB03", 3)]:
        seed = derive_seed("test", setup_id, i)
        assert tl.seed(setup_id, i) == seed
        assert tl.start(setup_id, i) == sample_start(get_setup(setup_id), np.random.default_rng(seed))
    with pytest.raises(KeyError):
        tl.start("A01", 50)


def _footprint(outline, x, y, yaw):
    from shapely.geometry import Polygon

    c, s = np.cos(yaw), np.sin(yaw)
    pts = outline @ np.array([[c, s], [-s, c]]) + [x, y]
    return Polygon(pts)


def test_starts_never_overlap():
    """Footprints of blocks and distractors never overlap (packed C05 blocks may touch)."""
    n_multi = 0
    for split in SPLITS:
        for e in tasklist.load(split).entries:
            st = e["start"]
            shapes = [_footprint(geometry.block_outline(b["shape"]), b["x"], b["y"], b["yaw"]) for b in st["blocks"]]
            shapes += [_footprint(geometry.distractor_outline(d["kind"]), d["x"], d["y"], d["yaw"])
                       for d in st.get("distractors", [])]
            n_multi += len(shapes) > 1
            for k, a in enumerate(shapes):
                for b in shapes[k + 1:]:
                    assert a.intersection(b).area < 1e-9, (split, e["setup"], e["try"])
    assert n_multi > 0

def _store(root: Path, split: str, index: int, change) -> dict:
    """Change entry ``index`` of the stored split and re-lock the file: the stored starts stay the contract."""
    path = root / "v1" / f"{split}.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    e = json.loads(lines[index])
    change(e)
    lines[index] = json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n"
    path.write_text("".join(lines))
    lock_file = root / "v1" / "LOCK.json"
    lock = json.loads(lock_file.read_text())
    lock["splits"][split]["sha256"] = tasklist.sha256_hex(path.read_bytes())
    lock_file.write_text(json.dumps(lock))
    return e


@pytest.mark.parametrize("change, rounding", [
    (lambda e: e["start"].update(board_x=math.nextafter(e["start"]["board_x"], 1.0)), True),  # 1 ulp
    (lambda e: e["start"].update(board_x=e["start"]["board_x"] + 1e-9), False),
    (lambda e: e.update(seed=e["seed"] + 1), False),
])
def test_verify_reports_float_rounding_and_fails_any_other_difference(tmp_path, change, rounding):
    root = _copy_v1(tmp_path)
    e = _store(root, "dev", 3, change)
    ok, line = tasklist.verify_split("dev", root=root)
    assert ok is rounding and "\n" not in line
    if rounding:
        assert line.startswith("dev: OK") and "float rounding" in line and "at most 1 ulp" in line
        assert f"setup {e['setup']} try {e['try']} start.board_x" in line
    else:
        assert "DIFFERS" in line and f"setup {e['setup']} try {e['try']}" in line
