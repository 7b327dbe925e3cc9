"""Parse `tegrastats` output lines into typed samples.

tegrastats changes its spelling between L4T releases and boards: rails are
bare numbers on L4T 32 (`POM_5V_IN 2545/2547`, Xavier `GPU 18401/18525`),
`inst/avg` in mW on L4T 35/36 (`VDD_GPU_SOC 3990mW/3990mW`) and `inst/avg/max`
on newer releases; the GPU is `GR3D 3%@76`, `GR3D_FREQ 95%@1377`,
`GR3D_FREQ 0%@[0,0]` (per GPC) or `GR3D_FREQ @[314,314,314]` (Thor, no load);
thermal names are capitalised on L4T 32/35 and lowercase on 36. The parser is
token-driven rather than positional so that a new field in between does not
break it. tests/fixtures/tegrastats/ holds real lines of each format.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Iterable

# Rails whose reading is the whole input (module or board), in order of preference.
# Where none is printed (AGX Xavier, AGX Orin) the total is the sum of the rails,
# as jtop does; it then excludes the carrier board.
TOTAL_RAILS = ("VDD_IN", "POM_5V_IN", "VIN")
# Disabled thermal zones report this value; it is not a temperature.
_SENSOR_OFF_C = -256.0

_DATE = re.compile(r"^\s*(\d{2}-\d{2}-\d{4} \d{2}:\d{2}:\d{2})\s+")
_RAM = re.compile(r"\bRAM (\d+)/(\d+)([kMG])B(?: ?\(lfb (\d+)x(\d+)([kMG])B\))?")
_SWAP = re.compile(r"\bSWAP (\d+)/(\d+)([kMG])B(?: ?\(cached (\d+)([kMG])B\))?")
_CPU = re.compile(r"\bCPU \[([^\]]*)\](?:@(\d+))?", re.IGNORECASE)
_CORE = re.compile(r"^(\d+)%(?:@(\d+))?$")
_GR3D = re.compile(r"\bGR3D(?:_FREQ)? (?:(\d+)%)?(?:@\[?([\d,]+)\]?)?")
_EMC = re.compile(r"\bEMC(?:_FREQ)? (?:(\d+)%)?(?:@(\d+))?")
_TEMP = re.compile(r"(?<![\w%])([A-Za-z][A-Za-z0-9_]*)@(-?\d+(?:\.\d+)?)C(?:/(-?\d+(?:\.\d+)?)C)?")
_NUM = r"(\d+(?:\.\d+)?)(?:mW)?"
# NAME inst/avg[/max], each value optionally in mW; the lookahead rejects
# `RAM 1/2MB`, `IRAM 0/252kB` and similar.
_RAIL = re.compile(rf"(?<![\w@])([A-Za-z][A-Za-z0-9_]*) {_NUM}/{_NUM}(?:/{_NUM})?(?=\s|$)")
_RAIL_SINGLE = re.compile(r"(?<![\w@])([A-Z][A-Z0-9_]*) (\d+(?:\.\d+)?)mW(?=\s|$)")
_UNIT_MB = {"k": 1 / 1024, "M": 1.0, "G": 1024.0}


class TegrastatsParseError(ValueError):
    """A line that is not tegrastats output (one line)."""


@dataclass(frozen=True)
class Rail:
    name: str
    instant_mw: float
    average_mw: float | None = None
    max_mw: float | None = None  # printed by newer releases only


@dataclass(frozen=True)
class CpuCore:
    index: int
    online: bool
    load_pct: float | None
    freq_mhz: int | None


@dataclass(frozen=True)
class TegraSample:
    raw: str
    timestamp: str | None = None  # wall-clock stamp printed by newer releases; never used for timing
    ram_used_mb: float | None = None
    ram_total_mb: float | None = None
    swap_used_mb: float | None = None
    swap_total_mb: float | None = None
    swap_cached_mb: float | None = None
    cpus: tuple[CpuCore, ...] = ()
    gpu_load_pct: float | None = None
    gpu_freqs_mhz: tuple[int, ...] = ()  # one per GPC where printed so
    emc_load_pct: float | None = None
    emc_freq_mhz: int | None = None
    temps_c: dict[str, float] = field(default_factory=dict)  # names lowercased: releases differ in case
    rails: dict[str, Rail] = field(default_factory=dict)

    @property
    def gpu_freq_mhz(self) -> int | None:
        return max(self.gpu_freqs_mhz) if self.gpu_freqs_mhz else None

    @property
    def cpu_load_mean_pct(self) -> float | None:
        loads = [c.load_pct for c in self.cpus if c.online and c.load_pct is not None]
        return sum(loads) / len(loads) if loads else None

    @property
    def cpu_freq_max_mhz(self) -> int | None:
        freqs = [c.freq_mhz for c in self.cpus if c.online and c.freq_mhz is not None]
        return max(freqs) if freqs else None

    def total_power(self) -> tuple[float, str] | None:
        """(instant mW, what it is): the input rail where printed, else the sum of all rails."""
        return total_power_mw({n: r.instant_mw for n, r in self.rails.items()})

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("raw")
        return d


def total_power_mw(rails_mw: dict[str, float]) -> tuple[float, str] | None:
    """Total of a rail reading: the input rail where there is one, else the sum (labelled so)."""
    if not rails_mw:
        return None
    for name in TOTAL_RAILS:
        if name in rails_mw:
            return rails_mw[name], name
    return sum(rails_mw.values()), "sum(" + "+".join(rails_mw) + ")"


def _mb(value: str, unit: str) -> float:
    return float(value) * _UNIT_MB[unit]


def _parse_cpus(body: str, shared_freq: str | None) -> tuple[CpuCore, ...]:
    cores = []
    for i, tok in enumerate(t.strip() for t in body.split(",")):
        if not tok:
            continue
        if tok == "off":
            cores.append(CpuCore(i, False, None, None))
            continue
        m = _CORE.match(tok)
        if not m:
            raise TegrastatsParseError(f"unreadable CPU entry {tok!r}")
        freq = m.group(2) or shared_freq
        cores.append(CpuCore(i, True, float(m.group(1)), int(freq) if freq else None))
    return tuple(cores)


def parse_line(line: str) -> TegraSample:
    """Parse one tegrastats line; raises TegrastatsParseError if it carries none of its fields."""
    text = line.strip()
    kw: dict = {"raw": text}
    m = _DATE.match(text)
    if m:
        kw["timestamp"] = m.group(1)
        text = text[m.end():]
    m = _RAM.search(text)
    if m:
        kw["ram_used_mb"], kw["ram_total_mb"] = _mb(m.group(1), m.group(3)), _mb(m.group(2), m.group(3))
    m = _SWAP.search(text)
    if m:
        kw["swap_used_mb"], kw["swap_total_mb"] = _mb(m.group(1), m.group(3)), _mb(m.group(2), m.group(3))
        if m.group(4):
            kw["swap_cached_mb"] = _mb(m.group(4), m.group(5))
    m = _CPU.search(text)
    if m:
        kw["cpus"] = _parse_cpus(m.group(1), m.group(2))
    m = _GR3D.search(text)
    if m and (m.group(1) or m.group(2)):
        kw["gpu_load_pct"] = float(m.group(1)) if m.group(1) else None
        kw["gpu_freqs_mhz"] = tuple(int(f) for f in m.group(2).split(",") if f) if m.group(2) else ()
    m = _EMC.search(text)
    if m and (m.group(1) or m.group(2)):
        kw["emc_load_pct"] = float(m.group(1)) if m.group(1) else None
        kw["emc_freq_mhz"] = int(m.group(2)) if m.group(2) else None
    temps = {}
    for name, cur, _max in _TEMP.findall(text):
        if float(cur) != _SENSOR_OFF_C:
            temps[name.lower()] = float(cur)
    kw["temps_c"] = temps
    # Rails: drop the CPU list first so Xavier's `CPU 2301/2330` rail is not confused with it.
    rail_text = _CPU.sub(" ", text)
    rails: dict[str, Rail] = {}
    for name, inst, avg, mx in _RAIL.findall(rail_text):
        if name in ("NC", "RAM", "SWAP", "IRAM"):  # NC: unconnected monitor channel
            continue
        rails[name] = Rail(name, float(inst), float(avg), float(mx) if mx else None)
    for name, inst in _RAIL_SINGLE.findall(rail_text):
        if name not in rails and name != "NC":
            rails[name] = Rail(name, float(inst))
    kw["rails"] = rails
    if "ram_used_mb" not in kw and not kw.get("cpus") and not rails and not temps:
        raise TegrastatsParseError(f"not a tegrastats line: {line.strip()[:60]!r}")
    return TegraSample(**kw)


def parse_lines(lines: Iterable[str]) -> list[TegraSample]:
    """Parse every tegrastats line, skipping blank lines and others that are not tegrastats output."""
    out = []
    for line in lines:
        if not line.strip():
            continue
        try:
            out.append(parse_line(line))
        except TegrastatsParseError:
            continue
    return out
