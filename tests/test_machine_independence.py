"""What is hashed or locked is the same on every CPU: the dev task list, the reasoning set's states and the
generation set's states,
derived in subprocesses under other OpenBLAS kernels (``OPENBLAS_CORETYPE``) and the machine's own, must
give identical bytes, and the committed ones."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from env import tasklist

REPO_ROOT = Path(__file__).resolve().parents[1]
KERNELS = ("", "Prescott", "Haswell")  # "": the kernel OpenBLAS picks for this CPU
DERIVE = """
import hashlib
from env import tasklist
from assembly_probe import genset
from assembly_probe.build import states_sha256
print(hashlib.sha256(tasklist.serialise(tasklist.build("dev"))).hexdigest())
print(states_sha256())
print(genset.states_sha256())
"""


@pytest.mark.slow
def test_dev_split_and_reasoning_sets_states_are_identical_under_every_blas_kernel():
    procs = {}
    for kernel in KERNELS:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
        if kernel:
            env["OPENBLAS_CORETYPE"] = kernel
        procs[kernel] = subprocess.Popen([sys.executable, "-c", DERIVE], cwd=REPO_ROOT, env=env, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = {}
    for kernel, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"OPENBLAS_CORETYPE={kernel!r}: {stderr[-2000:]}"
        out[kernel] = stdout.split()
    assert len(set(map(tuple, out.values()))) == 1, out
    dev_sha, states_sha, gen_states_sha = out[""]
    assert dev_sha == tasklist.read_lock()["splits"]["dev"]["sha256"]
    manifest = json.loads((REPO_ROOT / "results" / "reasoning" / "manifest.json").read_text())
    assert states_sha == manifest["sha256_states"]
    gen_manifest = json.loads((REPO_ROOT / "results" / "reasoning" / "generation" / "manifest.json").read_text())
    assert gen_states_sha == gen_manifest["sha256_states"]
