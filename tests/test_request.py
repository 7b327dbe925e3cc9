"""One run request, resolved once (eval.request): the real command lines become a RunRequest whose Setup
objects, model and runtime reach the workers as they are; the parsers of eval.run, eval.orin and eval.serve
come from the same model configurations; records carry the run's identity."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from env.setups import Setup
from tests.conftest import REPO_ROOT


def _stop_at_the_workers(monkeypatch):
    """Capture the request where it leaves the parent (the executor boundary) and stop the run there."""
    import eval.executors as executors
    from eval.executors import WorkerError

    seen = {}

    def make_executor(kind, n, request, video_dir, **kw):
        seen.update(kind=kind, n=n, request=request)
        raise WorkerError("stopped at the workers by the test")

    monkeypatch.setattr(executors, "make_executor", make_executor)
    return seen


def test_a_gpu_batched_run_hands_its_setups_as_objects_to_the_workers(monkeypatch, tmp_path, capsys):
    """`eval.run --model bc-state --num-envs 4` on a CUDA machine picks GPU physics; the --setups ids become Setup
    objects once, in the parent (the batch check reads their fields). CUDA is faked at its one boundary."""
    import engines.zero_copy as zero_copy
    from eval.run import build_parser, run

    monkeypatch.setattr(zero_copy, "cuda_unavailable_reason", lambda: None)
    seen = _stop_at_the_workers(monkeypatch)
    args = build_parser().parse_args(["--model", "bc-state", "--num-envs", "4", "--split", "dev", "--setups", "A01,D03",
                                      "--tries", "4", "--out", str(tmp_path / "run")])
    outcome = run(args)
    err = capsys.readouterr().err
    assert outcome.rc == 2 and "Traceback" not in err and "stopped at the workers by the test" in err
    request = seen["request"]
    assert request.sim == "gpu" and request.num_envs == 4  # the default where CUDA is, for a state model
    assert all(isinstance(s, Setup) for s in request.setups) and [s.id for s in request.setups] == ["A01", "D03"]
    assert request.model.name == "bc-state" and request.model.backend == "ort" and request.track == "adapted"


def test_a_camera_model_on_gpu_scenes_is_refused_for_per_try_colours_in_one_line(monkeypatch, tmp_path, capsys):
    import engines.zero_copy as zero_copy
    from eval.run import main

    monkeypatch.setattr(zero_copy, "cuda_unavailable_reason", lambda: None)
    _stop_at_the_workers(monkeypatch)
    rc = main(["--model", "octo-small", "--random-weights", "--num-envs", "4", "--sim", "gpu", "--split", "dev",
               "--setups", "D03", "--tries", "1", "--out", str(tmp_path / "run")])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(lines) == 1 and "D03 draw colours per try" in lines[0]
    assert not (tmp_path / "run" / "run.json").exists()


def test_every_option_eval_run_takes_for_a_servable_model_eval_serve_takes_too():
    from eval.request import MODEL_CONFIGS
    from eval.run import build_parser as run_parser
    from eval.serve import build_parser as serve_parser
    from eval.serve import servable

    run_flags = {a.dest for a in run_parser()._actions}
    serve = serve_parser()
    serve_flags = {a.dest for a in serve._actions}
    assert set(servable()) == {"octo-small", "octo-base", "octo", "bc-state", "bc-camera"}
    for model in servable():
        for f in MODEL_CONFIGS[model].option_fields():
            assert f.name in run_flags and f.name in serve_flags, (model, f.name)
            flag = "--" + f.name.replace("_", "-")
            value = [] if f.type in (bool, "bool") else ["4" if f.name == "exec_horizon" else "x"]
            assert getattr(serve.parse_args(["--model", model, flag, *value]), f.name) not in (None, False)


@pytest.mark.sim
def test_records_carry_the_runs_identity(tmp_path):
    """A bc-state try through the real command line: its record names the model, the track, the arm, the
    backend and the precision it ran at, and run.json keeps the resolved request."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "eval.run", "--model", "bc-state", "--split", "dev", "--setups", "A01",
                        "--tries", "1", "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = [json.loads(line) for line in (out / "tries.jsonl").read_text().splitlines()]
    assert (rec["model"], rec["track"], rec["arm"], rec["backend"], rec["precision"]) == \
        ("bc-state", "adapted", "panda", "ort", "fp32")
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["runtime"] == {"backend": "ort", "precision": "fp32"}
    assert run_json["request"]["model"] == "bc-state" and run_json["request"]["setups"] == ["A01"]


def test_the_runtime_is_resolved_at_one_call_site():
    """engines.backends.resolve_runtime (backend and precision) is called in one place of the house."""
    calls = []
    for top in ("env", "engines", "jetson", "eval", "benchmarks"):
        for path in (REPO_ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    fn = node.func
                    name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
                    if name == "resolve_runtime":
                        calls.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert len(calls) == 1 and calls[0].startswith("eval/request.py"), calls


@pytest.mark.parametrize("argv,needle", [
    (["--model", "scripted", "--exec-horizon", "2"], "scripted takes no --exec-horizon"),
    (["--model", "bc-state", "--backend", "jax"], "bc-state has no backend 'jax'"),
    (["--model", "nope"], "valid: scripted"),
])
def test_options_a_model_does_not_take_are_one_line(argv, needle, tmp_path, capsys):
    from eval.run import main

    rc = main([*argv, "--split", "dev", "--setups", "A01", "--out", str(tmp_path / "run")])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(lines) == 1 and needle in lines[0]
