"""The benchmark inside vla-evaluation-harness (eval.vla_eval_benchmark) and its results both ways
(eval.import_vla_eval, eval.export_vla_eval), against vla-eval 0.8.0's own code: its CLI (the `vla-eval` console
script, vla_eval/cli/main.py), its config loader, render check, result collector and printer.

The end-to-end test serves bc-state with `python -m eval.serve --protocol vla-eval`, runs `vla-eval run --no-docker`
on a dev try, imports the results and checks the run folder's records are those `eval.run --model remote` writes for
the same try against the same server (same seed, same success, same flags, the same run identity)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytest.importorskip("vla_eval")
pytest.importorskip("websockets")

CONFIG = REPO_ROOT / "configs" / "vla_eval" / "shape_assembly_bc_state.yaml"
VLA_EVAL = Path(sys.executable).with_name("vla-eval")  # the console script pip installed beside this Python
# what differs between two runs of the same tries: timings, where they ran, and what names the run or the harness
TIMING = {"wall_s", "infer_ms", "infer_ms_mean", "infer_ms_p99", "warmup_ms", "step_ms", "machine", "remote_ms",
          "remote_warmup_ms", "harness"}


def _outcomes(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------ the real CLI against a served model
@pytest.fixture(scope="module")
def served_bc_state():
    proc = subprocess.Popen([sys.executable, "-m", "eval.serve", "--model", "bc-state", "--backend", "ort",
                             "--protocol", "vla-eval", "--port", "0"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving bc-state" in line, proc.stderr.read()
        yield line.split(" on ")[1].split()[0]
    finally:
        proc.terminate()
        proc.wait(10)


def _vla_eval_run(url: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    if not VLA_EVAL.exists():
        pytest.skip(f"no vla-eval console script at {VLA_EVAL}")
    return subprocess.run([str(VLA_EVAL), "run", "--config", str(CONFIG), "--no-docker", "--server-url", url,
                           "--output-dir", str(out), *extra], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.sim
def test_vla_eval_cli_runs_a_dev_try_and_its_import_is_eval_runs_record(served_bc_state, tmp_path):
    from eval.import_vla_eval import main as import_main

    url = served_bc_state
    r = _vla_eval_run(url, tmp_path / "ve", "--param", "tries=1", "--param", "max_steps=30")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Spec validation passed" in r.stderr  # vla-eval's own check of our specs against eval.serve's HELLO
    agg = json.loads(next((tmp_path / "ve").glob("*_aggregate.json")).read_text())
    episode = agg["tasks"][0]["episodes"][0]
    assert agg["tasks"][0]["task"] == "A01" and episode["setup"] == "A01" and episode["try"] == 0
    assert episode["metrics"]["steps"] == episode["steps"] == 30  # vla-eval counted the steps the rollout ran
    assert agg["render"]["requested"] == "cpu" and "lvp_icd" in agg["render"]["applied_env"]["VK_ICD_FILENAMES"]

    assert import_main([str(tmp_path / "ve"), "--server", url, "--out", str(tmp_path / "imported")]) == 0
    r = subprocess.run([sys.executable, "-m", "eval.run", "--model", "remote", "--server", url, "--protocol",
                        "vla-eval", "--profile", "bc-state", "--split", "dev", "--setups", "A01", "--tries", "1",
                        "--max-steps", "30", "--out", str(tmp_path / "eval_run")], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    imported, ran = _outcomes(tmp_path / "imported" / "tries.jsonl"), _outcomes(tmp_path / "eval_run" / "tries.jsonl")
    assert imported == ran  # seed, success, flags, steps, margins, target, backend, weights, labels, run identity
    assert imported[0]["backend"] == "ort" and imported[0]["max_steps"] == 30 and imported[0]["profile"] == "bc-state"
    rec = json.loads((tmp_path / "imported" / "tries.jsonl").read_text().splitlines()[0])
    assert rec["harness"] == "vla-eval 0.8.0" and len(rec["remote_ms"]["rtt_ms"]) == 30 - 3  # warm-up apart
    assert len(rec["remote_ms"]["server_ms"]) == 27  # eval.serve's own compute time came through vla-eval's runner
    assert (tmp_path / "imported" / "REPORT.md").is_file()
    run_json = json.loads((tmp_path / "imported" / "run.json").read_text())
    assert run_json["request"]["harness"]["name"] == "vla-eval"

    # vla-eval's max_steps cutting a try before it ended fails the episode there, and the import refuses it
    r = _vla_eval_run(url, tmp_path / "cut", "--param", "tries=1", "--benchmark-field", "max_steps=4")
    assert r.returncode == 0, r.stderr[-3000:]
    with pytest.raises(ValueError, match="failed in vla-eval .env_step: .*RuntimeError: vla-eval stopped the episode .its max_steps."):
        from eval.import_vla_eval import import_run

        import_run(tmp_path / "cut", tmp_path / "cut_run", url)


@pytest.mark.sim
def test_camera_tries_reach_vla_evals_own_echo_server_in_the_libero_layout(tmp_path):
    """The camera path (profile openvla-oft: both cameras, LIBERO's 'states') against the zero-action server vla-eval's
    own smoke tests use (vla_eval/cli/smoke.py _make_echo_server, served by model_servers/serve.py serve)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("from vla_eval.cli.smoke import _make_echo_server; from vla_eval.model_servers.serve import serve; "
            f"serve(_make_echo_server(7), '127.0.0.1', {port})")
    server = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        if not VLA_EVAL.exists():
            pytest.skip(f"no vla-eval console script at {VLA_EVAL}")
        r = subprocess.run([str(VLA_EVAL), "run", "--config",
                            str(REPO_ROOT / "configs" / "vla_eval" / "shape_assembly_libero_layout.yaml"), "--no-docker",
                            "--server-url", f"ws://127.0.0.1:{port}", "--output-dir", str(tmp_path), "--param",
                            "split=dev", "--param", "setups=A01", "--param", "tries=1", "--param", "max_steps=5"],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    finally:
        server.terminate()
        server.wait(10)
    assert r.returncode == 0, r.stderr[-3000:]
    agg = json.loads(next(tmp_path.glob("*_aggregate.json")).read_text())
    episode = agg["tasks"][0]["episodes"][0]
    assert agg["num_errors"] == 0 and "failure_reason" not in episode, episode.get("failure_detail")
    assert episode["metrics"]["steps"] == 5 and episode["metrics"]["success"] is False
    assert len(episode["metrics"]["warmup_ms"]) == 3 and len(episode["metrics"]["infer_ms"]) == 2


# ------------------------------------------------------------------ import refusals (no scenes)
def _aggregate(tmp_path: Path, episodes: list[dict], **config) -> Path:
    from eval.vla_eval_benchmark import BENCHMARK_IMPORT

    params = {"profile": "bc-state", "split": "dev", "setups": "A01", "tries": 2, **config.pop("params", {})}
    body = {"benchmark": "shape_assembly", "mode": "sync", "harness_version": "0.8.0",
            "config": {"benchmark": BENCHMARK_IMPORT, "episodes_per_task": 1, "params": params, **config},
            "tasks": [{"task": "A01", "episodes": episodes}],
            "server_info": {"server": "eval.serve", "model_server": "eval.serve", "model": "bc-state",
                            "backend": "ort", "weights_sha256": "ab" * 32}}
    folder = tmp_path / "ve"
    folder.mkdir(exist_ok=True)
    (folder / "shape_assembly_aggregate.json").write_text(json.dumps(body))
    return folder


def _episode(t: int, **metrics) -> dict:
    from env.tasklist import load
    from eval.vla_eval_benchmark import HARNESS

    tl = load("dev")
    record = {"v": 2, "setup": "A01", "try": t, "seed": tl.seed("A01", t), "split": "dev", "predicate": 2,
              "success": t == 0, "success_raw": t == 0, "flags": [], "steps": 120, "tasklist_sha256": tl.sha256,
              "backend": None, "infer_ms": [1.0, 2.0], "warmup_ms": [3.0], "harness": HARNESS,
              "machine": {"cpu": "AMD EPYC", "cores": "2"}, **metrics}
    return {"episode_id": 0, "metrics": record, "steps": 120, "setup": "A01", "try": t, "seed": record["seed"],
            "name": "A01"}


def _refused(tmp_path, capsys, folder) -> str:
    from eval.import_vla_eval import main

    assert main([str(folder), "--server", "ws://127.0.0.1:8001", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: "), err
    return err


@pytest.mark.parametrize("episodes, config, expected", [
    ([0], {}, "setup A01 lacks tries 1 of its first 2"),
    ([0, 1, 1], {}, "setup A01 try 1 is recorded twice"),
    ([0, 1], {"episodes_per_task": 3}, "episodes_per_task is 3"),
    ([0, 1], {"partial": True}, "a partial vla-eval run"),
    ([0, "seed"], {}, "seed 1 is not the task list's"),
    ([0, "nan"], {}, "field 'success' is"),
    ([0, "failed"], {}, r"failed in vla-eval \(env_step: RuntimeError: boom\)"),
    ([0, 5], {}, "not one of the params' tries"),
    ([0, 1], {"params": {"profile": "pi05-droid"}}, "params.profile 'pi05-droid' is not one of"),
])
def test_import_refuses_episodes_that_are_not_the_task_lists_tries_in_one_line(tmp_path, capsys, episodes, config,
                                                                               expected):
    made = []
    for e in episodes:
        if e == "seed":
            ep = _episode(1, seed=1)
            ep["seed"] = 1
        elif e == "nan":
            ep = _episode(1, success=float("nan"))
        elif e == "failed":
            ep = _episode(1)
            ep.update(failure_reason="env_step", failure_detail="Traceback ...\nRuntimeError: boom\n")
        else:
            ep = _episode(e)
        made.append(ep)
    partial = config.pop("partial", False)
    folder = _aggregate(tmp_path, made, **config)
    if partial:
        body = json.loads((folder / "shape_assembly_aggregate.json").read_text())
        (folder / "shape_assembly_aggregate.json").write_text(json.dumps({**body, "partial": True}))
    assert re.search(expected, _refused(tmp_path, capsys, folder))


def test_import_then_export_gives_vla_evals_format_with_latency_hardware_and_energy(tmp_path, capsys):
    """A run folder from vla-eval's results (no scenes: records as the benchmark writes them), exported back:
    vla-eval's own printer reads it, the success rate is the run's, and the fields vla-eval lacks are there; the
    export itself is refused by the import."""
    from vla_eval.results.export import print_export_summary

    from eval.import_vla_eval import export_run, main

    folder = _aggregate(tmp_path, [_episode(0), _episode(1)])
    assert main([str(folder), "--server", "ws://127.0.0.1:8001/?token=s3cret", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "remote under vla-eval: 1/2 successes" in out
    run_json = (tmp_path / "run" / "run.json").read_text()
    assert "s3cret" not in run_json and json.loads(run_json)["options"]["server"] == "ws://127.0.0.1:8001/"
    assert not [p for p in (tmp_path / "run").rglob("*") if p.is_file() and b"s3cret" in p.read_bytes()]
    records = [json.loads(line) for line in (tmp_path / "run" / "tries.jsonl").read_text().splitlines()]
    assert [r["backend"] for r in records] == ["ort", "ort"] and records[0]["weights_sha256"] == "ab" * 32
    assert records[0]["model"] == "remote" and records[0]["profile"] == "bc-state"

    path = export_run(tmp_path / "run", tmp_path / "exported")
    body = json.loads(path.read_text())
    assert body["mean_success"] == 0.5 and body["num_episodes_total"] == 2 and body["tasks"][0]["task"] == "A01"
    assert body["latency_ms_per_query"]["p50"] == 1.5 and body["latency_ms_per_query"]["warmup_queries"] == 2
    assert body["hardware"]["cpu"] == "AMD EPYC" and body["hardware"]["jetpack"] is None and body["energy_j_per_query"] is None
    print_export_summary([body])  # vla-eval's own summary of aggregates (rich, to stdout)
    printed = capsys.readouterr().out
    assert "A01" in printed and "50.0%" in printed and "(1/2)" in printed
    with pytest.raises(ValueError, match="an export of the run folder"):
        from eval.import_vla_eval import read_vla_eval

        read_vla_eval(tmp_path / "exported")


# ------------------------------------------------------------------ the benchmark's params and vla-eval's checks
def test_the_benchmarks_tasks_are_the_task_lists_tries_and_its_params_are_checked():
    from env.tasklist import load
    from eval.vla_eval_benchmark import ShapeAssemblyBenchmark

    b = ShapeAssemblyBenchmark(profile="bc-state", split="dev", setups=["A01", "B"], tries=2)
    tl = load("dev")
    tasks = b.get_tasks()
    assert [(t["setup"], t["try"]) for t in tasks][:3] == [("A01", 0), ("A01", 1), ("B01", 0)]
    assert all(t["seed"] == tl.seed(t["setup"], t["try"]) and t["name"] == t["setup"] for t in tasks)
    assert {t["suite"] for t in tasks} == {"A", "B"}
    assert b.get_metadata()["max_steps"] == 300 and b.get_metadata()["tasklist_sha256"] == tl.sha256
    for kwargs, expected in [({"profile": None}, "params.profile None"), ({"profile": "pi0-libero"}, "params.profile"),
                             ({"profile": "bc-state", "split": "nope"}, "not a split"),
                             ({"profile": "bc-state", "tries": 21}, "has 20 tries of A01"),
                             ({"profile": "bc-state", "setups": "Z9"}, "unknown setup"),
                             ({"profile": "openvla-7b", "send_wrist_image": True}, "send_wrist_image: the model")]:
        with pytest.raises(ValueError, match=expected):
            ShapeAssemblyBenchmark(**kwargs)
    ShapeAssemblyBenchmark(profile="openvla-oft", send_wrist_image=True, send_state=True)  # what its server asks


def test_vla_evals_own_loader_accepts_the_configs_and_cpu_rendering():
    from vla_eval.cli.config_loader import load_config
    from vla_eval.config import EvalConfig
    from vla_eval.orchestrator import _accepted_init_params
    from vla_eval.registry import resolve_import_string
    from vla_eval.render import check_run_render_support, supports_render_mode

    for path in sorted((REPO_ROOT / "configs" / "vla_eval").glob("*.yaml")):
        config = load_config(str(path))
        check_run_render_support(config, config["render"])  # vla-eval's own refusal of an undeclared backend
        for entry in config["benchmarks"]:
            cfg = EvalConfig.from_dict(entry)
            cls = resolve_import_string(cfg.benchmark)
            assert supports_render_mode(cls, "cpu") and cfg.episodes_per_task == 1
            # what vla-eval's servers ask for in their HELLO reaches the constructor (orchestrator.py)
            assert {"send_wrist_image", "send_state"} <= _accepted_init_params(cls)
            cls(**cfg.params)


def test_the_layers_hold_and_the_benchmark_module_imports_no_simulator():
    r = subprocess.run([sys.executable, "-c", "import sys, eval.vla_eval_benchmark, eval.import_vla_eval; "
                        "print(sorted(m for m in ('sapien', 'mani_skill', 'torch') if m in sys.modules))"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    # vla-eval binds the renderer (configure_render) after importing the benchmark: SAPIEN must not be loaded yet
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
