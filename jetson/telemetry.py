"""Power, clocks, temperatures and memory sampled in a background thread during a run.

One sampler, several sources behind one interface: jtop (jetson-stats), a
`tegrastats` subprocess, NVML (other NVIDIA GPUs) and a null source whose
report says why there is no telemetry. Samples carry a monotonic timestamp;
the summary integrates power over the run window (trapezoids between samples,
the first and last reading held to the window's edges) into energy, and
divides it by queries and by successful tries when given. jtop and pynvml are
imported only when their source is opened.
"""

from __future__ import annotations

import abc
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Callable, Sequence

from engines.optional import available, require
from jetson.tegrastats import TegrastatsParseError, parse_line, total_power_mw


class TelemetryUnavailable(RuntimeError):
    """A source cannot run here; the message is the reason shown in the report (one line)."""


@dataclass(frozen=True)
class Sample:
    t: float  # time.monotonic() seconds, stamped by the sampler when the reading arrived
    power_mw: dict[str, float] = field(default_factory=dict)  # rail -> instantaneous mW
    total_power_mw: float | None = None
    total_label: str | None = None  # which rail, or which sum, the total is
    clocks_mhz: dict[str, float] = field(default_factory=dict)
    temps_c: dict[str, float] = field(default_factory=dict)
    util_pct: dict[str, float] = field(default_factory=dict)
    memory_mb: dict[str, float] = field(default_factory=dict)
    energy_counter_mj: float | None = None  # NVML's cumulative counter, where the GPU has one


# ------------------------------------------------------------------- sources
class TelemetrySource(abc.ABC):
    name = "source"
    paced = False  # True: read() blocks until the source's own next reading

    def __init__(self) -> None:
        self.ended = False  # set when the source has no more readings (process exited)
        self.opened = False

    def ensure_open(self) -> None:
        """open() once; a source handed over already opened is not opened again."""
        if not self.opened:
            self.open()
            self.opened = True

    def open(self) -> None:
        """Acquire the device or process; raise TelemetryUnavailable with the reason if it cannot."""

    @abc.abstractmethod
    def read(self) -> Sample | None:
        """One reading (t is stamped by the sampler), or None when there is none now."""

    def close(self) -> None:
        pass


class NullSource(TelemetrySource):
    name = "none"

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason
        self.ended = True

    def read(self) -> Sample | None:
        return None


def sample_from_tegrastats(line: str) -> Sample:
    """A tegrastats line as a Sample (t=0; the sampler stamps it)."""
    s = parse_line(line)
    power = {n: r.instant_mw for n, r in s.rails.items()}
    total = total_power_mw(power)
    clocks = {}
    if s.gpu_freq_mhz is not None:
        clocks["gpu"] = float(s.gpu_freq_mhz)
    if s.emc_freq_mhz is not None:
        clocks["emc"] = float(s.emc_freq_mhz)
    if s.cpu_freq_max_mhz is not None:
        clocks["cpu_max"] = float(s.cpu_freq_max_mhz)
    util = {k: v for k, v in (("gpu", s.gpu_load_pct), ("emc", s.emc_load_pct), ("cpu", s.cpu_load_mean_pct))
            if v is not None}
    mem = {k: v for k, v in (("ram_used", s.ram_used_mb), ("ram_total", s.ram_total_mb),
                             ("swap_used", s.swap_used_mb)) if v is not None}
    return Sample(0.0, power, total[0] if total else None, total[1] if total else None,
                  clocks, dict(s.temps_c), util, mem)


class TegrastatsSource(TelemetrySource):
    """Reads a `tegrastats --interval N` subprocess line by line; the process paces the samples."""

    name = "tegrastats"
    paced = True

    def __init__(self, interval_ms: int = 100, command: Sequence[str] | None = None) -> None:
        super().__init__()
        self.interval_ms = interval_ms
        self.command = list(command) if command else None  # tests pass a process that prints recorded lines
        self.proc: subprocess.Popen | None = None
        self.parse_errors = 0

    def open(self) -> None:
        cmd = self.command
        if cmd is None:
            exe = shutil.which("tegrastats")
            if exe is None:
                raise TelemetryUnavailable("tegrastats not found on PATH")
            cmd = [exe, "--interval", str(self.interval_ms)]
        try:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        except OSError as e:
            raise TelemetryUnavailable(f"cannot start tegrastats: {e}") from None

    def read(self) -> Sample | None:
        if self.proc is None or self.proc.stdout is None:
            self.ended = True
            return None
        line = self.proc.stdout.readline()
        if not line:
            self.ended = True
            return None
        try:
            return sample_from_tegrastats(line)
        except TegrastatsParseError:
            self.parse_errors += 1
            return None

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            if self.proc.stdout:
                self.proc.stdout.close()
            self.proc = None


def _num(x) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def sample_from_jtop(j) -> Sample:
    """A jtop client's current state as a Sample; fields this jtop version lacks are left out."""
    power, total, label = {}, None, None
    pw = getattr(j, "power", None) or {}
    for name, r in (pw.get("rail") or {}).items():
        if isinstance(r, dict) and _num(r.get("power")) is not None:
            power[name] = float(r["power"])
    tot = pw.get("tot") or {}
    if _num(tot.get("power")) is not None:
        total, label = float(tot["power"]), tot.get("name") or "sum(rails)"
    elif power:
        total, label = total_power_mw(power)
    temps = {}
    for name, t in (getattr(j, "temperature", None) or {}).items():
        v = _num(t.get("temp")) if isinstance(t, dict) else _num(t)
        if v is not None and v > -256 and (not isinstance(t, dict) or t.get("online", True)):
            temps[name.lower()] = v
    clocks, util, mem = {}, {}, {}
    for g in (getattr(j, "gpu", None) or {}).values():  # {name: {'status': {'load'}, 'freq': {'cur' kHz}}}
        if isinstance(g, dict):
            load = _num((g.get("status") or {}).get("load"))
            cur = _num((g.get("freq") or {}).get("cur"))
            if load is not None:
                util["gpu"] = load
            if cur is not None:
                clocks["gpu"] = cur / 1000.0
            break
    cpu = getattr(j, "cpu", None) or {}
    idle = _num((cpu.get("total") or {}).get("idle"))
    if idle is not None:
        util["cpu"] = 100.0 - idle
    freqs = [_num((c.get("freq") or {}).get("cur")) for c in cpu.get("cpu", []) if isinstance(c, dict) and c.get("online", True)]
    freqs = [f for f in freqs if f is not None]
    if freqs:
        clocks["cpu_max"] = max(freqs) / 1000.0
    ram = (getattr(j, "memory", None) or {}).get("RAM") or {}
    if _num(ram.get("used")) is not None:
        mem["ram_used"] = float(ram["used"]) / 1024.0  # jtop reports kB
    if _num(ram.get("tot")) is not None:
        mem["ram_total"] = float(ram["tot"]) / 1024.0
    return Sample(0.0, power, total, label, clocks, temps, util, mem)


class JtopSource(TelemetrySource):
    """jetson-stats' jtop client (needs the jtop service); ok() waits for its next update."""

    name = "jtop"
    paced = True

    def __init__(self, interval_s: float = 0.1, factory: Callable | None = None) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.factory = factory  # tests inject a stub client
        self.client = None

    def open(self) -> None:
        factory = self.factory
        if factory is None:
            if not available("jtop"):
                raise TelemetryUnavailable("jtop is not installed (pip install -e '.[jetson]')")
            factory = require("jtop").jtop
        try:
            self.client = factory(interval=self.interval_s)
            self.client.start()
        except Exception as e:  # JtopException when the service is not running
            raise TelemetryUnavailable(f"jtop could not start: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None

    def read(self) -> Sample | None:
        if self.client is None or not self.client.ok():
            self.ended = True
            return None
        return sample_from_jtop(self.client)

    def close(self) -> None:
        if self.client is not None:
            try:
                self.client.close()
            finally:
                self.client = None


class NvmlSource(TelemetrySource):
    """One NVIDIA GPU through NVML: board power, SM/memory clocks, temperature, utilisation, memory."""

    name = "nvml"

    def __init__(self, index: int = 0, nvml: ModuleType | None = None) -> None:
        super().__init__()
        self.index = index
        self.nvml = nvml
        self.handle = None

    def open(self) -> None:
        if self.nvml is None:
            if not available("pynvml"):
                raise TelemetryUnavailable("pynvml is not installed (pip install nvidia-ml-py)")
            self.nvml = require("pynvml")
        n = self.nvml
        try:
            n.nvmlInit()
        except Exception as e:
            raise TelemetryUnavailable(f"NVML unavailable: {e}") from None
        try:
            if n.nvmlDeviceGetCount() <= self.index:
                raise TelemetryUnavailable(f"NVML has no GPU {self.index}")
            self.handle = n.nvmlDeviceGetHandleByIndex(self.index)
        except TelemetryUnavailable:
            n.nvmlShutdown()
            raise
        except Exception as e:
            n.nvmlShutdown()
            raise TelemetryUnavailable(f"NVML query failed: {e}") from None

    def _call(self, fn, *args):
        try:
            return fn(self.handle, *args)
        except Exception:  # NVMLError_NotSupported on GPUs without that sensor
            return None

    def read(self) -> Sample | None:
        n, h = self.nvml, self.handle
        if h is None:
            self.ended = True
            return None
        power, clocks, temps, util, mem = {}, {}, {}, {}, {}
        p = self._call(n.nvmlDeviceGetPowerUsage)  # mW
        if p is not None:
            power["GPU"] = float(p)
        for key, const in (("sm", "NVML_CLOCK_SM"), ("mem", "NVML_CLOCK_MEM"), ("graphics", "NVML_CLOCK_GRAPHICS")):
            if hasattr(n, const):
                v = self._call(n.nvmlDeviceGetClockInfo, getattr(n, const))
                if v is not None:
                    clocks[key] = float(v)
        t = self._call(n.nvmlDeviceGetTemperature, getattr(n, "NVML_TEMPERATURE_GPU", 0))
        if t is not None:
            temps["gpu"] = float(t)
        u = self._call(n.nvmlDeviceGetUtilizationRates)
        if u is not None:
            util["gpu"], util["mem"] = float(u.gpu), float(u.memory)
        m = self._call(n.nvmlDeviceGetMemoryInfo)
        if m is not None:
            mem["gpu_used"], mem["gpu_total"] = m.used / 2**20, m.total / 2**20
        e = self._call(n.nvmlDeviceGetTotalEnergyConsumption)  # mJ since driver load (Volta+)
        return Sample(0.0, power, power.get("GPU"), "GPU board power (NVML)" if power else None,
                      clocks, temps, util, mem, float(e) if e is not None else None)

    def close(self) -> None:
        if self.handle is not None:
            self.handle = None
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass


def open_best_source(root: str | Path = "/", interval_s: float = 0.1,
                     order: Sequence[str] = ("jtop", "tegrastats", "nvml")) -> TelemetrySource:
    """The first source that opens here, already opened; else a NullSource naming every reason."""
    on_jetson = (Path(root) / "etc/nv_tegra_release").exists() or \
        "jetson" in ((Path(root) / "proc/device-tree/model").read_text(errors="replace").lower()
                     if (Path(root) / "proc/device-tree/model").exists() else "")
    reasons = []
    for kind in order:
        if kind in ("jtop", "tegrastats") and not on_jetson:
            reasons.append(f"{kind}: not a Jetson")
            continue
        src: TelemetrySource = {"jtop": lambda: JtopSource(interval_s),
                                "tegrastats": lambda: TegrastatsSource(max(int(interval_s * 1000), 10)),
                                "nvml": lambda: NvmlSource()}[kind]()
        try:
            src.ensure_open()
            return src
        except TelemetryUnavailable as e:
            reasons.append(f"{kind}: {e}")
    return NullSource("; ".join(reasons) if reasons else "no source tried")


# ------------------------------------------------------------------- summary
@dataclass(frozen=True)
class Stat:
    mean: float
    min: float
    max: float
    n: int


@dataclass(frozen=True)
class PowerStat:
    mean_mw: float  # mean of the samples in the window
    max_mw: float
    energy_j: float  # integral over the window


@dataclass(frozen=True)
class TelemetrySummary:
    available: bool
    source: str
    reason: str | None  # "telemetry unavailable: ..." or why power/energy is missing
    window_s: float
    n_samples: int
    rails: dict[str, PowerStat] = field(default_factory=dict)
    total: PowerStat | None = None
    total_label: str | None = None
    energy_j: float | None = None
    queries: int | None = None
    successes: int | None = None
    energy_per_query_j: float | None = None
    energy_per_success_j: float | None = None
    energy_counter_j: float | None = None  # NVML hardware counter over the samples, as a cross-check
    clocks_mhz: dict[str, Stat] = field(default_factory=dict)
    temps_c: dict[str, Stat] = field(default_factory=dict)
    util_pct: dict[str, Stat] = field(default_factory=dict)
    memory_mb: dict[str, Stat] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """Report text, a line per item."""
        if not self.available:
            return [self.reason or "telemetry unavailable"]
        out = [f"telemetry: {self.source}, {self.n_samples} samples over {self.window_s:.2f} s"]
        if self.total is not None:
            out.append(f"power ({self.total_label}): mean {self.total.mean_mw / 1000:.2f} W, "
                       f"max {self.total.max_mw / 1000:.2f} W, energy {self.total.energy_j:.2f} J")
            if self.energy_per_query_j is not None:
                out.append(f"energy per query: {self.energy_per_query_j:.4f} J ({self.queries} queries)")
            if self.energy_per_success_j is not None:
                out.append(f"energy per successful try: {self.energy_per_success_j:.2f} J ({self.successes} successes)")
        elif self.reason:
            out.append(self.reason)
        for name, p in self.rails.items():
            out.append(f"  rail {name}: mean {p.mean_mw:.0f} mW, max {p.max_mw:.0f} mW, {p.energy_j:.2f} J")
        for title, group, unit in (("clock", self.clocks_mhz, "MHz"), ("temp", self.temps_c, "C"),
                                   ("util", self.util_pct, "%"), ("memory", self.memory_mb, "MB")):
            for name, s in group.items():
                out.append(f"  {title} {name}: mean {s.mean:.1f} {unit}, max {s.max:.1f} {unit}")
        return out


def integrate_energy_j(times_s: Sequence[float], power_mw: Sequence[float], t_start: float, t_end: float) -> float:
    """Energy in J over [t_start, t_end] of the piecewise-linear power through the samples.

    Before the first and after the last sample the nearest reading is held, so a
    window wider than the samples is still covered (sampling starts a little late
    and stops a little early relative to the run).
    """
    if t_end <= t_start or not times_s:
        return 0.0
    pts = sorted(zip(times_s, power_mw))
    ts = [t for t, _ in pts]
    ps = [p for _, p in pts]

    def at(t: float) -> float:
        if t <= ts[0]:
            return ps[0]
        if t >= ts[-1]:
            return ps[-1]
        for i in range(1, len(ts)):
            if t <= ts[i]:
                t0, t1 = ts[i - 1], ts[i]
                return ps[i - 1] + (ps[i] - ps[i - 1]) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)
        return ps[-1]

    knots = [t_start] + [t for t in ts if t_start < t < t_end] + [t_end]
    vals = [at(t) for t in knots]
    mj = sum((knots[i + 1] - knots[i]) * (vals[i] + vals[i + 1]) / 2 for i in range(len(knots) - 1))
    return mj / 1000.0


def _stats(samples: Sequence[Sample], attr: str) -> dict[str, Stat]:
    vals: dict[str, list[float]] = {}
    for s in samples:
        for k, v in getattr(s, attr).items():
            vals.setdefault(k, []).append(v)
    return {k: Stat(sum(v) / len(v), min(v), max(v), len(v)) for k, v in vals.items()}


def summarize(samples: Sequence[Sample], t_start: float, t_end: float, source: str = "unknown",
              queries: int | None = None, successes: int | None = None) -> TelemetrySummary:
    """Summary of the samples in [t_start, t_end]; energy integrates all samples over that window."""
    window = max(t_end - t_start, 0.0)
    inside = [s for s in samples if t_start <= s.t <= t_end]
    rails: dict[str, PowerStat] = {}
    for name in sorted({k for s in samples for k in s.power_mw}):
        ts = [s.t for s in samples if name in s.power_mw]
        ps = [s.power_mw[name] for s in samples if name in s.power_mw]
        vals = [s.power_mw[name] for s in inside if name in s.power_mw] or ps
        rails[name] = PowerStat(sum(vals) / len(vals), max(vals), integrate_energy_j(ts, ps, t_start, t_end))
    tot = [s for s in samples if s.total_power_mw is not None]
    total = label = energy = None
    reason = None
    if tot:
        vals = [s.total_power_mw for s in inside if s.total_power_mw is not None] or [s.total_power_mw for s in tot]
        energy = integrate_energy_j([s.t for s in tot], [s.total_power_mw for s in tot], t_start, t_end)
        total = PowerStat(sum(vals) / len(vals), max(vals), energy)
        label = tot[-1].total_label
    else:
        reason = f"power unavailable: source {source} reported no power rails"
    counters = [s.energy_counter_mj for s in inside if s.energy_counter_mj is not None]
    return TelemetrySummary(
        available=True, source=source, reason=reason, window_s=window, n_samples=len(inside),
        rails=rails, total=total, total_label=label, energy_j=energy, queries=queries, successes=successes,
        energy_per_query_j=energy / queries if energy is not None and queries else None,
        energy_per_success_j=energy / successes if energy is not None and successes else None,
        energy_counter_j=(counters[-1] - counters[0]) / 1000.0 if len(counters) >= 2 else None,
        clocks_mhz=_stats(inside, "clocks_mhz"), temps_c=_stats(inside, "temps_c"),
        util_pct=_stats(inside, "util_pct"), memory_mb=_stats(inside, "memory_mb"))


# ------------------------------------------------------------------- sampler
class TelemetrySampler:
    """Samples a source in a background thread between start() and stop() (or as a context manager)."""

    def __init__(self, source: TelemetrySource | None = None, interval_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, max_samples: int = 1_000_000) -> None:
        self.source = source if source is not None else NullSource("no telemetry source given")
        self.interval_s = interval_s
        self.clock = clock
        self.max_samples = max_samples  # bound memory on very long runs; later samples are dropped
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t_start: float | None = None
        self.t_end: float | None = None
        self.error: str | None = None  # why sampling stopped early

    @property
    def available(self) -> bool:
        return not isinstance(self.source, NullSource)

    @property
    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    def start(self) -> "TelemetrySampler":
        if self.t_start is not None:
            if self.t_end is None:
                return self  # already running (start() then `with`)
            raise RuntimeError("a stopped telemetry sampler cannot restart; make a new one")
        if self.available:
            try:
                self.source.ensure_open()
            except TelemetryUnavailable as e:
                self.source = NullSource(f"{self.source.name}: {e}")
        self.t_start = self.clock()
        self.t_end = None
        if self.available:
            self._thread = threading.Thread(target=self._loop, name=f"telemetry-{self.source.name}", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = self.clock()
            try:
                s = self.source.read()
            except Exception as e:
                if not self._stop.is_set():  # a read cut short by stop() is not a failure
                    self.error = f"telemetry stopped: {self.source.name} failed: {e}"
                return
            if s is not None:
                stamped = replace(s, t=self.clock())
                with self._lock:
                    if len(self._samples) < self.max_samples:
                        self._samples.append(stamped)
            elif self.source.ended:
                return
            if not self.source.paced:
                self._stop.wait(max(0.0, self.interval_s - (self.clock() - t0)))

    def stop(self) -> None:
        if self.t_start is None or self.t_end is not None:
            return
        self.t_end = self.clock()
        self._stop.set()
        # A paced source blocks in read() until closed (closing ends the tegrastats process);
        # a polled one is closed only after its thread is done with it.
        if self.source.paced:
            self.source.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if not self.source.paced:
            self.source.close()

    def __enter__(self) -> "TelemetrySampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def summary(self, queries: int | None = None, successes: int | None = None,
                start: float | None = None, end: float | None = None) -> TelemetrySummary:
        """Summary over the run window (or [start, end] in the same monotonic clock)."""
        t0 = start if start is not None else (self.t_start if self.t_start is not None else 0.0)
        t1 = end if end is not None else (self.t_end if self.t_end is not None else self.clock())
        if not self.available:
            return TelemetrySummary(False, self.source.name, f"telemetry unavailable: {self.source.reason}",
                                    max(t1 - t0, 0.0), 0, queries=queries, successes=successes)
        s = summarize(self.samples, t0, t1, self.source.name, queries, successes)
        if self.error:
            s = replace(s, reason=(s.reason + "; " if s.reason else "") + self.error)
        return s


def start_telemetry(root: str | Path = "/", interval_s: float = 0.1) -> TelemetrySampler:
    """The best source here, sampling already; stop() it (or use it in a with block) at the end of the run."""
    return TelemetrySampler(open_best_source(root, interval_s), interval_s).start()
