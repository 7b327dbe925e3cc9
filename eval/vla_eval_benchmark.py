"""Shape assembly as a vla-eval benchmark: the locked task list's tries run from vla-evaluation-harness's own CLI.

    vla-eval run --config configs/vla_eval/shape_assembly_bc_state.yaml --no-docker --server-url ws://HOST:PORT

``benchmark: "eval.vla_eval_benchmark:ShapeAssemblyBenchmark"`` in a vla-eval config (vla-eval 0.8.0 resolves
benchmarks by import string: vla_eval/registry.py, orchestrator.py ``_run_benchmark_inner``). Its ``params``:

- ``split`` (default dev), ``setups`` (ids, group letters, FB or all, as ``eval.run --setups``; a string or a list),
  ``tries`` (tries per setup: the first N of the split's locked task list), ``arm`` (default panda), ``max_steps``
  (a smoke run's cap on every try, as ``eval.run --max-steps``; default the setups' own length);
- ``profile``: how the scene's observation becomes the model server's input and its reply the scene's action, a
  row of :mod:`eval.remote.profiles` written for vla-eval servers: ``bc-state``, ``octo-small``, ``octo-base``
  (this project's ``python -m eval.serve --protocol vla-eval``: the scene's own observation, the scene's action
  back), ``openvla-7b``, ``openvla-oft`` (vla-eval's OpenVLA and OFT servers; the LIBERO layout of
  ``openvla-oft`` -- ``images`` ``agentview`` then ``wrist``, ``states`` 8, LIBERO deltas, gripper
  ``binary_close_positive`` -- is also what vla-eval's pi0 and LeRobot servers read with a LIBERO checkpoint:
  vla_eval/model_servers/pi0.py and lerobot.py ``predict``: the first image, the second as wrist, ``states``
  or ``state``, ``task_description``);
- ``send_wrist_image``, ``send_state``: the names vla-eval's LIBERO benchmark takes and its servers ask for in
  their HELLO's ``observation_params`` (vla_eval/benchmarks/libero/benchmark.py; model_servers/pi0.py, oft.py
  ``get_observation_params``); the orchestrator passes them on (``_merge_observation_params``). The profile
  decides what is sent; a server that asks for an input the profile does not send is refused in one line.

One vla-eval task is one try: ``{"name": setup id, "suite": its group, "setup", "try", "seed", "split"}`` (so
vla-eval's results group the tries by setup and its ``tasks:`` filter takes setup ids and group letters);
``episodes_per_task`` must stay 1 (a second episode of a task replays the same try; :mod:`eval.import_vla_eval`
refuses it). The try's seed goes to the server in EPISODE_START's task (eval.serve resets the policy with it:
eval/serve.py ``Session.start_episode``); every observation carries the instruction as ``task_description``
(vla_eval/types.py: the recommended keys ``images``, ``task_description``, ``state``).

The episode is the project's one episode loop, :func:`eval.rollout.rollout`, run in a thread: its policy is a
:class:`HarnessPolicy` that hands each observation to vla-eval and waits for the action vla-eval's runner got from
the model server (vla_eval/runners/sync_runner.py: one observation -> ``conn.act`` -> one action per step). So the
scenes, seeds, starts, flags, success predicate and the record are exactly ``eval.run``'s
(:class:`eval.records.TryRecord`); the record is the episode's ``metrics`` (``success`` is vla-eval's metric;
every other field rides beside it) and :mod:`eval.import_vla_eval` turns the results into a run folder. A try's
latency per query is the harness's round trip (vla-eval's runner, transport and server), its warm-up apart.

Rendering: the scene renders with SAPIEN; ``render: cpu`` (vla-eval's run-level key, ``--render cpu``) binds
SAPIEN to Mesa's lavapipe before it is imported, as vla-eval's ManiSkill2 and SimplerEnv benchmarks do
(vla_eval/benchmarks/maniskill2/benchmark.py ``configure_render``: vla_eval/render.py
``configure_sapien_render``); it is checked on CPU-only machines. On a CUDA machine the scene picks ManiSkill's
``sapien_cuda`` renderer (env.default_render_backend), so ``render: cpu`` there is refused in one line.

Not supported: vla-eval's real-time mode (``mode: live``): the benchmark declares no hold action
(``get_hold_action``), so vla-eval refuses it before any episode (orchestrator.py); batched scenes (one scene per
benchmark, as vla-eval's runners step one).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from typing import Any, ClassVar, Mapping

import numpy as np
import vla_eval
from vla_eval.benchmarks.base import StepBenchmark, StepResult
from vla_eval.render import DEFAULT_RENDER_MODE, assert_lavapipe_vulkan, configure_sapien_render
from vla_eval.specs import (GRIPPER_01, GRIPPER_CLOSE_NEG, GRIPPER_CLOSE_POS, IMAGE_RGB, LANGUAGE, POSITION_DELTA,
                            RAW, ROTATION_AA, ROTATION_EULER, STATE_EEF_POS_AA_GRIP, DimSpec)

from eval.policies.base import Policy
from eval.remote.client import MalformedReply, RemotePolicy
from eval.remote.profiles import PROFILES, Profile, foreign_inputs, get_profile, to_scene

HARNESS = f"vla-eval {vla_eval.__version__}"
BENCHMARK_IMPORT = "eval.vla_eval_benchmark:ShapeAssemblyBenchmark"
PROTOCOL = "vla-eval"
LAVAPIPE_ICD_ENV_VAR = "SAB_LAVAPIPE_ICD"  # an explicit lavapipe ICD path (vla_eval/render.py resolve_lavapipe_icd)
SERVER = "the vla-eval harness's model server"
# the profiles written for vla-eval servers (eval.remote.profiles: Profile.protocols)
VLA_EVAL_PROFILES = tuple(n for n, p in PROFILES.items() if PROTOCOL in p.protocols and p.action != "joint_velocity")
# the scene's rotation and gripper, as vla-eval's specs name them (eval/serve.py SCENE_ACTION_SPEC: the same)
_ROTATION_SPEC = {"scene": ROTATION_EULER, "bridge": ROTATION_EULER, "libero": ROTATION_AA}
_GRIPPER_SPEC = {"binary_close_negative": GRIPPER_CLOSE_NEG, "binary_close_positive": GRIPPER_CLOSE_POS,
                 "open_01": GRIPPER_01}

# what vla-eval aggregates of each episode's metrics (the try's record): its success rate, the predicate's own
# verdict, and the mean latency per query (vla_eval/benchmarks/base.py get_metric_keys)
METRIC_KEYS = {"success": "mean", "success_raw": "mean", "infer_ms_mean": "mean"}
_OBSERVATION, _DONE, _ERROR = "observation", "done", "error"
_ABORT = object()  # put to the rollout's policy: the try is given up (vla-eval cut it, or the benchmark closed)


class TryAborted(Exception):
    """Raised inside the rollout's thread when its try is given up: the thread ends, nothing is recorded."""


def plan(split: str = "dev", setups: Any = "A01", tries: int = 1, arm: str = "panda", max_steps: int | None = None):
    """(task list, setups, tries, arm spec) of the benchmark's params, checked; one-line ValueError otherwise.
    :mod:`eval.import_vla_eval` reads the params of a result with the same function."""
    from env.arms import get_arm
    from env.setups import get_setup, resolve_setups
    from env.starts import SPLITS
    from env.tasklist import load

    if split not in SPLITS:
        raise ValueError(f"params.split {split!r} is not a split; valid: {', '.join(SPLITS)}")
    if isinstance(setups, (list, tuple)):
        setups = ",".join(str(s) for s in setups)
    if not isinstance(setups, str):
        raise ValueError(f"params.setups must be ids, group letters, FB or all (a string or a list), got {setups!r}")
    chosen = tuple(get_setup(s) for s in resolve_setups(setups))  # UnknownSetupError is a ValueError: one line
    if type(tries) is not int or tries < 1:
        raise ValueError(f"params.tries must be an int of at least 1 (tries per setup), got {tries!r}")
    if max_steps is not None and (type(max_steps) is not int or max_steps < 1):
        raise ValueError(f"params.max_steps must be an int of at least 1 (control steps per try) or null, got "
                         f"{max_steps!r}")
    tasklist = load(split)
    for s in chosen:
        if tries > tasklist.tries(s.id):
            raise ValueError(f"the {split} task list has {tasklist.tries(s.id)} tries of {s.id}; params.tries "
                             f"{tries} asks for more")
    return tasklist, chosen, tries, get_arm(arm)


def suite_of(setup_id: str) -> str:
    """A setup's group letter (FB for the full board): the task's ``suite``, which vla-eval's ``tasks:`` filter
    matches (orchestrator.py: ``t.get("suite") in cfg.tasks or t.get("name") in cfg.tasks``)."""
    return "FB" if setup_id.startswith("FB") else setup_id[0]


class HarnessPolicy(Policy):
    """The policy of the rollout's one scene while vla-eval's runner drives it: each query hands the scene's
    observation to the harness and waits for the action the model server answered, converted to the scene's by
    the profile. Its latency per query is the harness's (query_members times :meth:`act`); the split of each
    query into round trip, the server's own compute (``server_timing.infer_ms``, where the server sends it:
    eval.serve does) and transport is :class:`eval.remote.client.RemotePolicy`'s (``remote_ms``)."""

    warmup_queries = RemotePolicy.warmup_queries
    batchable = False

    def __init__(self, profile: Profile):
        super().__init__()
        self.profile, self.protocol, self.url = profile, PROTOCOL, SERVER
        self.name = f"vla-eval:{profile.name}"
        self.observes, self.track = profile.observes, profile.track
        self.backend = None  # the server's, which only its HELLO says: eval.import_vla_eval fills it in
        self.seed, self.prompt = 0, ""
        self.remote_ms: list[tuple[float, float | None, bool]] = []
        self.to_harness: queue.Queue = queue.Queue()
        self.from_harness: queue.Queue = queue.Queue()

    # the same per-query times and record fields as a served model's through eval.run --model remote
    remote_latency = RemotePolicy.remote_latency
    _remote_fields = RemotePolicy.record_fields
    _actions = RemotePolicy._actions  # the reply's 'actions': present, numbers, the profile's shape, finite

    def record_fields(self) -> dict[str, Any]:
        return {**self._remote_fields(), "harness": HARNESS}

    def reset(self, instruction: str, seed: int | None = None) -> None:
        self.prompt, self.seed = instruction, int(seed or 0)
        self.remote_ms = []

    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        self.to_harness.put((_OBSERVATION, observation))
        reply = self.from_harness.get()
        if reply is _ABORT:
            raise TryAborted
        action, stages, rtt_ms, server_ms = reply
        self.stage_ms.update(stages)
        self.remote_ms.append((rtt_ms, server_ms, self.queries < self.warmup_queries))
        return action

    def scene_action(self, reply: Any) -> tuple[np.ndarray, float | None]:
        """The scene's action (7,) of the harness's reply (the server's ACTION payload), and the server's own
        compute time where it says it; one-line :class:`MalformedReply` otherwise."""
        if not isinstance(reply, dict):
            raise MalformedReply(f"a reply from {SERVER} is a {type(reply).__name__}, not a map")
        timing = reply.get("server_timing") if isinstance(reply.get("server_timing"), dict) else {}
        server_ms = timing.get("infer_ms")
        if server_ms is not None and not (type(server_ms) in (int, float) and math.isfinite(server_ms)
                                          and server_ms >= 0):
            raise MalformedReply(f"the reply from {SERVER} (seed {self.seed}): 'server_timing.infer_ms' must be a "
                                 f"finite number of ms >= 0, got {server_ms!r:.60}")
        action = self._actions(reply, self.profile.reply_shape or (7,))
        return to_scene(self.profile, action.reshape(-1)), None if server_ms is None else float(server_ms)


class ShapeAssemblyBenchmark(StepBenchmark):
    """The shape-assembly benchmark's locked tries under vla-eval's runner (see the module docstring)."""

    _ALL_RECORD_FIELDS = frozenset({"success", "done"})  # step rows, as vla-eval's ManiSkill2 benchmark records
    render_backends = frozenset({"gpu", "cpu"})
    _render_mode: ClassVar[str] = DEFAULT_RENDER_MODE

    @classmethod
    def configure_render(cls, mode: str) -> dict[str, str]:
        # as vla_eval/benchmarks/maniskill2/benchmark.py: SAPIEN bound to lavapipe before its first import
        applied = configure_sapien_render(mode, LAVAPIPE_ICD_ENV_VAR)
        cls._render_mode = mode
        return applied

    def __init__(self, profile: str | None = None, split: str = "dev", setups: Any = "A01", tries: int = 1,
                 arm: str = "panda", max_steps: int | None = None, send_wrist_image: bool | None = None,
                 send_state: bool | None = None) -> None:
        super().__init__()
        if profile not in VLA_EVAL_PROFILES:
            raise ValueError(f"params.profile {profile!r}: name how the model server reads the scene, one of "
                             f"{', '.join(VLA_EVAL_PROFILES)} (eval.remote.profiles)")
        self.profile = get_profile(profile, PROTOCOL)
        sends_wrist = any(cam == "wrist" for cam, _ in self.profile.cameras)
        for name, asked, sent in (("send_wrist_image", send_wrist_image, sends_wrist),
                                  ("send_state", send_state, self.profile.state_key is not None)):
            if asked and not sent and not self.profile.native:
                raise ValueError(f"{name}: the model server asks for an input profile {profile} does not send; pick "
                                 f"the profile of the server's model (openvla-oft sends the wrist image and the state)")
        from env.arms import check_assets

        self.tasklist, self.setups, self.tries, arm_spec = plan(split, setups, tries, arm, max_steps)
        check_assets(arm_spec)  # one line naming the download command when the arm's files are absent
        self.split, self.arm, self.max_steps = split, arm_spec.name, max_steps
        self.policy = HarnessPolicy(self.profile)
        self._scenes = None
        self._thread: threading.Thread | None = None
        self._sent_at = 0.0  # when the last observation went to the harness (perf_counter)
        self._make_obs_ms = 0.0

    # ------------------------------------------------------------ vla-eval's Benchmark
    def get_tasks(self) -> list[dict]:
        return [{"name": s.id, "suite": suite_of(s.id), "setup": s.id, "try": t, "seed": self.tasklist.seed(s.id, t),
                 "split": self.split} for s in self.setups for t in range(self.tries)]

    def get_metadata(self) -> dict[str, Any]:
        # vla-eval's runner stops an episode at max_steps (sync_runner.py); the scene ends its try first (success,
        # or its own length), so the longest setup's length (or the smoke-run cap) never cuts a try
        longest = max(s.max_steps for s in self.setups)
        return {"max_steps": self.max_steps or longest, "split": self.split, "tasklist_sha256": self.tasklist.sha256,
                "render_mode": self._render_mode, "harness": HARNESS}

    def get_metric_keys(self) -> dict[str, str]:
        return dict(METRIC_KEYS)

    def get_action_spec(self) -> dict[str, DimSpec]:
        p = self.profile
        return {"position": POSITION_DELTA, "rotation": _ROTATION_SPEC[p.action], "gripper": _GRIPPER_SPEC[p.gripper]}

    def get_observation_spec(self) -> dict[str, DimSpec]:
        p = self.profile
        if p.native and p.observes == "state":
            return {"state": DimSpec("state", 0, "raw", description="the scene's task_state()"), "language": LANGUAGE}
        if p.native:
            return {"third_person": IMAGE_RGB, "wrist": IMAGE_RGB, "language": LANGUAGE}
        spec = {key: IMAGE_RGB for _, key in p.cameras}
        if p.state_key:
            spec["state"] = STATE_EEF_POS_AA_GRIP if p.state == "libero8" else RAW
        spec["language"] = LANGUAGE
        return spec

    # ------------------------------------------------------------ StepBenchmark
    def reset(self, task: dict) -> Any:
        from env.setups import get_setup
        from eval.rollout import Scenes

        if self._render_mode == "cpu":
            assert_lavapipe_vulkan(type(self).__name__)
            import torch

            if torch.cuda.is_available():
                raise RuntimeError("render: cpu on a CUDA machine: the scene picks ManiSkill's sapien_cuda renderer "
                                   "(env.default_render_backend); use render: gpu here")
        self._stop()
        setup_id, try_index = task.get("setup"), task.get("try")
        setup = get_setup(str(setup_id))
        if type(try_index) is not int or task.get("seed") != self.tasklist.seed(setup.id, try_index):
            raise ValueError(f"task {task.get('name')!r}: not a try of the {self.split} task list (setup "
                             f"{setup_id!r}, try {try_index!r}, seed {task.get('seed')!r})")
        if self._scenes is None or self._scenes.setup.id != setup.id:
            self._close_scenes()
            self._scenes = Scenes(setup, 1, "cpu", self.arm, cameras=self.profile.observes == "cameras",
                                  max_steps=self.max_steps)
        self.policy.to_harness, self.policy.from_harness = queue.Queue(), queue.Queue()
        self._thread = threading.Thread(target=self._rollout, args=(try_index, self.policy.to_harness),
                                        name=f"rollout {setup.id} try {try_index}", daemon=True)
        self._thread.start()
        return self._next()

    def make_obs(self, raw_obs: Any, task: dict) -> dict:
        t0 = time.perf_counter()
        p = self.profile
        if p.native and p.observes == "state":
            obs = {"state": {k: np.asarray(v) for k, v in raw_obs["state"].items()}}
        elif p.native:
            images = raw_obs.get("images") or {}
            obs = {"images": {k: np.ascontiguousarray(v) for k, v in images.items() if v is not None},
                   "proprio": np.asarray(raw_obs["proprio"])}
        else:
            obs = foreign_inputs(p, raw_obs, PROTOCOL)
        obs["task_description"] = raw_obs.get("instruction", "")
        self._sent_at = time.perf_counter()
        self._make_obs_ms = (self._sent_at - t0) * 1e3
        return obs

    def step(self, action: dict) -> StepResult:
        t0 = time.perf_counter()
        rtt_ms = (t0 - self._sent_at) * 1e3
        try:
            scene_action, server_ms = self.policy.scene_action(action)
        except MalformedReply:
            self._stop()
            raise
        stages = {"preprocess": self._make_obs_ms, "inference": rtt_ms,
                  "postprocess": (time.perf_counter() - t0) * 1e3}
        self.policy.from_harness.put((scene_action, stages, rtt_ms, server_ms))
        kind, value = self._next_message()
        if kind == _DONE:
            self._thread.join()
            self._thread = None
            self._recorder.record_step(success=bool(value.success), done=True)
            return StepResult(obs=None, reward=float(value.success), done=True, info={"record": value})
        self._recorder.record_step(success=False, done=False)
        self._record_frame(value)
        return StepResult(obs=value, reward=0.0, done=False, info={})

    def get_step_result(self, step_result: StepResult) -> dict:
        record = step_result.info.get("record")
        if record is None:  # vla-eval's runner reached its max_steps before the scene ended the try
            self._stop()
            raise RuntimeError("vla-eval stopped the episode (its max_steps) before the try ended: leave max_steps "
                               "out of the config (the benchmark gives each setup's length) or set params.max_steps")
        return record.to_json()

    def cleanup(self) -> None:
        self._stop()
        self._close_scenes()

    # ------------------------------------------------------------ internals
    def _rollout(self, try_index: int, to_harness: queue.Queue) -> None:
        """The thread: one try through the project's episode loop; its record, or the error, to the harness."""
        from eval.rollout import rollout

        try:
            records, _ = rollout(self._scenes, [self.policy], self.split, [try_index], self.tasklist)
            to_harness.put((_DONE, records[0]))
        except TryAborted:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the harness's thread, which raises it
            to_harness.put((_ERROR, e))

    def _next_message(self) -> tuple[str, Any]:
        kind, value = self.policy.to_harness.get()
        if kind == _ERROR:
            self._thread.join()
            self._thread = None
            raise value
        return kind, value

    def _next(self) -> Any:
        kind, value = self._next_message()
        if kind != _OBSERVATION:
            raise RuntimeError(f"the try ended before its first query ({kind})")
        self._record_frame(value)
        return value

    def _record_frame(self, observation: Mapping[str, Any]) -> None:
        images = observation.get("images") if isinstance(observation, Mapping) else None
        if images and images.get("third_person") is not None:
            self._recorder.record_video(np.asarray(images["third_person"]))

    def _stop(self) -> None:
        """Give up a try still running (vla-eval cut its episode, or an error): its thread ends without a record."""
        if self._thread is not None:
            self.policy.from_harness.put(_ABORT)
            self._thread.join()
            self._thread = None

    def _close_scenes(self) -> None:
        if self._scenes is not None:
            self._scenes.close()
            self._scenes = None
