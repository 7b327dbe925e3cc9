"""jetson/: tegrastats parsing on recorded lines, device detection on fake roots,
the telemetry sampler (fake, recorded-tegrastats, stubbed-NVML and stubbed-jtop sources)
and zero-copy binding of frames to runners."""

import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from jetson import device as dev
from jetson import telemetry as tel
from engines import zero_copy as zc
from jetson.tegrastats import TegrastatsParseError, parse_line, parse_lines

FIX = Path(__file__).resolve().parent / "fixtures" / "tegrastats"
ROOT = Path(__file__).resolve().parents[1]


def lines(name):
    return [ln for ln in (FIX / name).read_text().splitlines() if ln.strip()]


# ------------------------------------------------------------------ imports
def test_modules_import_without_optional_dependencies():
    code = ("import sys, jetson.device, jetson.tegrastats, jetson.telemetry, engines.zero_copy; "
            "bad = {'jtop', 'tensorrt', 'pynvml', 'torch', 'cuda'} & set(sys.modules); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


# --------------------------------------------------------------- tegrastats
@pytest.mark.parametrize("name", sorted(p.name for p in FIX.glob("*.txt")))
def test_every_fixture_line_parses(name):
    for line in lines(name):
        s = parse_line(line)
        assert s.rails or s.cpus or s.temps_c


def test_jetpack4_xavier_rails_without_units_and_named_like_the_cpu():
    s = parse_line(lines("jp4_l4t32_agx_xavier.txt")[0])
    assert (s.ram_used_mb, s.ram_total_mb) == (10881, 31919)
    assert len(s.cpus) == 8 and s.cpus[7].freq_mhz == 1574 and s.cpus[0].load_pct == 17
    assert s.rails["GPU"].instant_mw == 18401 and s.rails["GPU"].average_mw == 18525
    assert s.rails["CPU"].instant_mw == 2301  # the rail, not the CPU load list
    assert set(s.rails) == {"GPU", "CPU", "SOC", "CV", "VDDRQ", "SYS5V"}
    assert (s.gpu_load_pct, s.gpu_freq_mhz, s.emc_load_pct, s.emc_freq_mhz) == (95, 1377, 55, 2133)
    assert s.temps_c["gpu"] == 54.5 and s.temps_c["thermal"] == 49.45
    total, label = s.total_power()
    assert total == 18401 + 2301 + 4602 + 0 + 2914 + 4632 and label.startswith("sum(")


def test_jetpack4_nano_pom_rails_and_iram():
    a, b = (parse_line(ln) for ln in lines("jp4_l4t32_nano.txt"))
    assert a.total_power() == (2545, "POM_5V_IN")
    assert a.rails["POM_5V_CPU"].average_mw == 529
    assert (b.ram_used_mb, b.swap_used_mb, b.swap_cached_mb) == (1180, 149, 7)
    assert "IRAM" not in b.rails and "NVENC" not in b.rails
    assert b.gpu_freqs_mhz == (76,) and b.emc_freq_mhz == 1600


def test_l4t28_shared_cpu_clock_and_short_names():
    s = parse_line(lines("l4t28_tx1.txt")[1])
    assert [c.load_pct for c in s.cpus] == [17, 11, 65, 0]
    assert {c.freq_mhz for c in s.cpus} == {1734}
    assert (s.gpu_load_pct, s.gpu_freq_mhz, s.emc_freq_mhz) == (39, 76, 1600)
    assert s.total_power() is None


def test_jetpack5_orin_drops_disabled_sensors_and_nc_channels():
    a, b = (parse_line(ln) for ln in lines("jp5_l4t35_agx_orin.txt"))
    assert a.timestamp == "04-11-2025 10:36:27"
    assert "cv0" not in a.temps_c and "gpu" not in a.temps_c  # -256C = sensor off
    assert a.temps_c["tj"] == 44.343 and a.temps_c["soc2"] == 40.093
    assert "NC" not in a.rails and a.rails["VDDQ_VDD2_1V8AO"].instant_mw == 301
    assert (b.gpu_load_pct, b.gpu_freqs_mhz) == (14, (407, 407))
    assert b.rails["VDD_CPU_CV"].instant_mw == 14312 and b.rails["VDD_CPU_CV"].average_mw == 12415
    assert b.cpu_load_mean_pct == pytest.approx((90 + 11 * 100) / 12)


def test_jetpack5_xavier_line_without_head_keeps_rails():
    s = parse_line(lines("jp5_l4t35_agx_xavier.txt")[0])
    assert s.ram_used_mb is None
    assert s.rails["SYS5V"].instant_mw == 2768 and s.rails["CPU"].instant_mw == 467
    assert s.temps_c["pmic"] == 50


def test_jetpack6_orin_rails_clocks_and_temps():
    samples = [parse_line(ln) for ln in lines("jp6_l4t36_agx_orin.txt")]
    s = samples[1]
    assert s.timestamp == "05-09-2026 18:42:07"
    assert (s.ram_used_mb, s.ram_total_mb, s.swap_used_mb) == (18202, 62841, 86)
    assert len(s.cpus) == 12 and s.cpus[0].load_pct == 16 and s.cpus[0].freq_mhz == 1949
    assert (s.emc_load_pct, s.emc_freq_mhz) == (3, 2133)
    assert (s.gpu_load_pct, s.gpu_freqs_mhz) == (0, (0, 0))
    assert set(s.rails) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"}
    assert (s.rails["VIN_SYS_5V0"].instant_mw, s.rails["VIN_SYS_5V0"].average_mw) == (4607, 4657)
    assert s.temps_c == {"cpu": 52.343, "soc2": 48.343, "soc0": 49.062, "tj": 52.343, "soc1": 49.531}
    assert s.total_power() == (2412 + 1607 + 4607, "sum(VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0)")


def test_orin_nano_offline_cores_and_truncated_unit():
    s = parse_line(lines("orin_nano_lowercase_2024.txt")[0])
    assert [c.online for c in s.cpus] == [True] * 4 + [False] * 2
    assert s.cpus[4].load_pct is None and s.cpu_load_mean_pct == pytest.approx(0.25)
    assert s.rails["VDD_CPU_GPU_CV"].average_mw == 598
    assert s.total_power() == (3913, "VDD_IN")
    assert s.gpu_load_pct == 1 and s.gpu_freq_mhz is None


def test_newer_format_inst_avg_max_and_temperature_pairs():
    a, b = (parse_line(ln) for ln in lines("triple_inst_avg_max.txt"))
    r = a.rails["VDD_CPU_CV"]
    assert (r.instant_mw, r.average_mw, r.max_mw) == (1137, 1296, 2273)
    assert a.temps_c["tj"] == 47.906  # the current value, not the max after the slash
    assert (b.gpu_load_pct, b.gpu_freq_mhz, b.emc_freq_mhz) == (12, 1300, 3199)


def test_thor_clock_without_load_and_vin_total():
    s = parse_line(lines("jp7_l4t38_thor.txt")[0])
    assert s.gpu_load_pct is None and s.gpu_freqs_mhz == (314, 314, 314)
    assert s.total_power() == (19780, "VIN")
    assert s.swap_used_mb is None and len(s.cpus) == 14


def test_non_tegrastats_lines():
    with pytest.raises(TegrastatsParseError):
        parse_line("hello world")
    got = parse_lines(["", "garbage", *lines("jp6_l4t36_agx_orin.txt")])
    assert len(got) == 3


# ------------------------------------------------------------------- device
NVPMODEL_Q = "NVPM WARN: fan mode is not set!\nNV Power Mode: MAXN\n0\n"


def fake_runner(outputs):
    calls = []

    def run(argv):
        calls.append(list(argv))
        return outputs.get(argv[0])
    run.calls = calls
    return run


def write(root, rel, text):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


@pytest.fixture
def orin_root(tmp_path):
    r = tmp_path / "orin"
    write(r, "etc/nv_tegra_release", "# R36 (release), REVISION: 4.4, GCID: 41062509, BOARD: generic, "
          "EABI: aarch64, DATE: Mon Jun 16 16:07:13 UTC 2025\n# KERNEL_VARIANT: oot\n")
    write(r, "proc/device-tree/model", "NVIDIA Jetson AGX Orin Developer Kit\x00")
    write(r, "proc/device-tree/compatible", "nvidia,p3737-0000+p3701-0005\x00nvidia,p3701-0005\x00nvidia,tegra234\x00")
    write(r, "proc/cpuinfo", "".join(f"processor\t: {i}\nBogoMIPS\t: 62.50\nCPU implementer\t: 0x41\n"
                                     f"CPU part\t: 0xd42\n\n" for i in range(12)))
    for i in range(12):  # jetson_clocks pins every CPU at its maximum
        write(r, f"sys/devices/system/cpu/cpu{i}/online", "1\n")
        write(r, f"sys/devices/system/cpu/cpu{i}/cpufreq/scaling_min_freq", "2201600\n")
        write(r, f"sys/devices/system/cpu/cpu{i}/cpufreq/scaling_max_freq", "2201600\n")
    write(r, "sys/class/devfreq/17000000.gpu/min_freq", "1300500000\n")
    write(r, "sys/class/devfreq/17000000.gpu/max_freq", "1300500000\n")
    write(r, "usr/local/cuda/version.json", '{"cuda": {"name": "CUDA SDK", "version": "12.6.68"}}')
    write(r, "usr/include/aarch64-linux-gnu/NvInferVersion.h",
          "#define NV_TENSORRT_MAJOR 10\n#define NV_TENSORRT_MINOR 3\n#define NV_TENSORRT_PATCH 0\n")
    return r


@pytest.fixture
def x86_root(tmp_path):
    r = tmp_path / "x86"
    write(r, "proc/cpuinfo", "".join(f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: "
                                     f"Intel(R) Xeon(R) CPU @ 2.20GHz\n\n" for i in range(2)))
    return r


class FailingNvml(types.ModuleType):
    def __init__(self):
        super().__init__("pynvml")

    def nvmlInit(self):
        raise RuntimeError("NVML Shared Library Not Found")


def stub_nvml(power_mw=75000, energy_step_mj=100):
    m = types.ModuleType("pynvml")
    state = {"energy": 1_000_000, "shutdown": 0}
    m.NVML_CLOCK_GRAPHICS, m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 0, 1, 2, 0
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: state.__setitem__("shutdown", state["shutdown"] + 1)
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    m.nvmlSystemGetCudaDriverVersion = lambda: 12040
    m.nvmlDeviceGetCount = lambda: 1
    m.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    m.nvmlDeviceGetName = lambda h: "NVIDIA L4"
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (8, 9)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=24 * 2**30, used=3 * 2**30, free=21 * 2**30)
    m.nvmlDeviceGetPowerUsage = lambda h: power_mw
    m.nvmlDeviceGetClockInfo = lambda h, kind: {0: 2040, 1: 2040, 2: 6251}[kind]
    m.nvmlDeviceGetTemperature = lambda h, sensor: 61
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=40)

    def energy(h):
        state["energy"] += energy_step_mj
        return state["energy"]
    m.nvmlDeviceGetTotalEnergyConsumption = energy
    m.state = state
    return m


def test_orin_fake_root_is_identified(orin_root):
    run = fake_runner({"nvpmodel": NVPMODEL_Q})
    info = dev.identify_device(orin_root, run, use_nvml=False)
    assert info.kind == "jetson" and info.name == "NVIDIA Jetson AGX Orin Developer Kit"
    j = info.jetson
    assert (j.l4t, j.jetpack, j.jetpack_major, j.board, j.soc) == ("36.4.4", "6.2.1", "6", "generic", "tegra234")
    assert (j.power_mode, j.power_mode_id) == ("MAXN", 0)
    assert j.jetson_clocks == "on" and "sysfs" in j.jetson_clocks_how  # jetson_clocks --show needs root
    assert ["jetson_clocks", "--show"] in run.calls
    assert info.cpu.cores == 12 and info.cpu.model == "ARM CPU part 0xd42"
    assert info.software.cuda == "12.6.68"
    assert info.software.tensorrt == "10.3.0"  # the root's header, not this interpreter's packages
    assert info.software.torch is None
    text = "\n".join(info.summary_lines())
    assert "L4T 36.4.4, JetPack 6.2.1, power mode MAXN (0), jetson_clocks on" in text
    assert info.to_dict()["jetson"]["l4t"] == "36.4.4"


def test_orin_clocks_off_and_unknown_mode(orin_root):
    write(orin_root, "sys/class/devfreq/17000000.gpu/min_freq", "306000000\n")
    info = dev.identify_device(orin_root, fake_runner({}), use_nvml=False, probe_software=False)
    assert info.jetson.jetson_clocks == "off"
    assert info.jetson.power_mode is None and any("nvpmodel" in n for n in info.notes)
    assert info.software is None


def test_x86_fake_root_without_gpu_is_the_cpu(x86_root):
    info = dev.identify_device(x86_root, fake_runner({}), nvml=FailingNvml(), probe_software=False)
    assert info.kind == "cpu" and info.jetson is None and info.gpus == ()
    assert info.name == "CPU: Intel(R) Xeon(R) CPU @ 2.20GHz" and info.cpu.cores == 2
    assert any("NVML unavailable" in n for n in info.notes)


def test_x86_fake_root_with_nvml_gpu(x86_root):
    info = dev.identify_device(x86_root, fake_runner({}), nvml=stub_nvml(), probe_software=False)
    assert info.kind == "nvidia-gpu" and info.name == "NVIDIA L4"
    g = info.gpus[0]
    assert (g.driver, g.cuda_driver, g.compute_capability, g.memory_total_mb) == ("550.54.15", "12.4", "8.9", 24576)


def test_jetpack7_releases_of_the_orin_and_of_thor():
    # JetPack 7.2 (L4T r39.2) is the first JetPack 7 for the Orin; r38 (7.0, 7.1) is Thor's only
    assert dev.jetpack_for_l4t("39.2.0") == ("7.2", "7")
    assert dev.jetpack_for_l4t("39.2.1") == ("7.2.1", "7")
    assert dev.jetpack_for_l4t("38.4.0") == ("7.1", "7")
    assert dev.jetpack_for_l4t("38.2.1") == ("7.0", "7")
    assert dev.jetpack_for_l4t("39.9.0") == (None, "7")  # a later r39: only the line
    assert dev.parse_nv_tegra_release("# R39 (release), REVISION: 2.0, GCID: 1, BOARD: generic, EABI: aarch64, "
                                      "DATE: Mon Jun 1 00:00:00 UTC 2026") == ("39.2.0", "generic")


def test_orin_on_jetpack_7_2_is_identified(orin_root):
    write(orin_root, "etc/nv_tegra_release", "# R39 (release), REVISION: 2.0, GCID: 1, BOARD: generic, "
                                             "EABI: aarch64, DATE: Mon Jun 1 00:00:00 UTC 2026\n")
    info = dev.identify_device(orin_root, fake_runner({"nvpmodel": NVPMODEL_Q}), use_nvml=False,
                               probe_software=False)
    j = info.jetson
    assert info.kind == "jetson" and (j.l4t, j.jetpack, j.jetpack_major, j.soc) == ("39.2.0", "7.2", "7", "tegra234")
    assert "L4T 39.2.0, JetPack 7.2, power mode MAXN (0)" in "\n".join(info.summary_lines())


def test_release_and_tool_parsers():
    assert dev.parse_nv_tegra_release("# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t186ref, EABI: "
                                      "aarch64, DATE: Sat Feb 19 17:07:00 UTC 2022") == ("32.7.1", "t186ref")
    assert dev.jetpack_for_l4t("32.7.1") == ("4.6.1", "4")
    assert dev.jetpack_for_l4t("35.4.1") == ("5.1.2", "5")
    assert dev.jetpack_for_l4t("36.9.0") == (None, "6")  # newer than the table: only the line
    assert dev.jetpack_for_l4t(None) == (None, None)
    assert dev.parse_nvpmodel_query("NV Power Mode: MODE_30W\n2\n") == ("MODE_30W", 2)
    assert dev.parse_nvpmodel_query("garbage") == (None, None)
    on = ("cpu0: Online=1 Governor=schedutil MinFreq=1428000 MaxFreq=1428000 CurrentFreq=1428000\n"
          "cpu1: Online=0 Governor=schedutil MinFreq=102000 MaxFreq=1428000 CurrentFreq=100000\n"
          "GPU MinFreq=921600000 MaxFreq=921600000 CurrentFreq=921600000\n")
    assert dev.parse_jetson_clocks_show(on) == "on"
    assert dev.parse_jetson_clocks_show(on.replace("GPU MinFreq=921600000", "GPU MinFreq=76800000")) == "off"
    assert dev.parse_jetson_clocks_show("") == "unknown"


def test_power_mode_from_nvpmodel_files_when_the_tool_is_missing(orin_root):
    write(orin_root, "var/lib/nvpmodel/status", "pmode:0002 fmode:quiet\n")
    write(orin_root, "etc/nvpmodel.conf", "< POWER_MODEL ID=0 NAME=MAXN >\nCPU_ONLINE CORE_0 1\n"
          "< POWER_MODEL ID=2 NAME=MODE_30W >\nCPU_ONLINE CORE_0 1\n")
    j = dev.detect_jetson(orin_root, fake_runner({}))
    assert (j.power_mode, j.power_mode_id) == ("MODE_30W", 2)


def test_jetson_clocks_show_preferred_when_it_runs(orin_root):
    show = "cpu0: Online=1 Governor=schedutil MinFreq=1 MaxFreq=2 CurrentFreq=2\n"
    assert dev.jetson_clocks_state(orin_root, fake_runner({"jetson_clocks": show})) == ("off", "jetson_clocks --show")


# ---------------------------------------------------------------- telemetry
def ramp():
    return [tel.Sample(0.0, {"A": 1000.0}, 1000.0, "A"), tel.Sample(1.0, {"A": 3000.0}, 3000.0, "A"),
            tel.Sample(2.0, {"A": 2000.0}, 2000.0, "A")]


def test_trapezoid_energy_hand_computed():
    t, p = [0.0, 1.0, 2.0], [1000.0, 3000.0, 2000.0]
    assert tel.integrate_energy_j(t, p, 0.0, 2.0) == pytest.approx(2.0 + 2.5)  # (1+3)/2*1 + (3+2)/2*1
    assert tel.integrate_energy_j(t, p, 0.5, 2.0) == pytest.approx(1.25 + 2.5)  # P(0.5)=2 W
    assert tel.integrate_energy_j(t, p, -1.0, 3.0) == pytest.approx(1.0 + 4.5 + 2.0)  # edges held
    assert tel.integrate_energy_j([], [], 0.0, 1.0) == 0.0


def test_summary_energy_per_query_and_success():
    s = tel.summarize(ramp(), 0.0, 2.0, "fake", queries=9, successes=2)
    assert s.energy_j == pytest.approx(4.5) and s.total.max_mw == 3000 and s.total.mean_mw == 2000
    assert s.energy_per_query_j == pytest.approx(0.5) and s.energy_per_success_j == pytest.approx(2.25)
    assert s.rails["A"].energy_j == pytest.approx(4.5)
    assert tel.summarize(ramp(), 0.0, 2.0, "fake", queries=0, successes=0).energy_per_success_j is None
    assert any("energy per query: 0.5000 J" in ln for ln in s.lines())


class ConstantSource(tel.TelemetrySource):
    name = "fake"

    def __init__(self, mw=5000.0, fail_after=None):
        super().__init__()
        self.mw, self.n, self.fail_after = mw, 0, fail_after
        self.closed = False

    def read(self):
        self.n += 1
        if self.fail_after is not None and self.n > self.fail_after:
            raise OSError("sensor gone")
        return tel.Sample(0.0, {"VDD_IN": self.mw}, self.mw, "VDD_IN", {"gpu": 1300.0}, {"tj": 50.0 + self.n})

    def close(self):
        self.closed = True


def wait_for(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while not pred() and time.monotonic() < end:
        time.sleep(0.01)
    return pred()


def test_sampler_with_fake_source_integrates_the_run_window():
    src = ConstantSource(5000.0)
    with tel.TelemetrySampler(src, interval_s=0.01).start() as sampler:  # started, then entered: one thread
        assert wait_for(lambda: len(sampler.samples) >= 5)
    assert src.closed and sampler.t_end > sampler.t_start
    ts = [s.t for s in sampler.samples]
    assert ts == sorted(ts) and all(sampler.t_start <= t for t in ts)
    s = sampler.summary(queries=10, successes=4)
    window = sampler.t_end - sampler.t_start
    assert s.available and s.window_s == pytest.approx(window)
    assert s.energy_j == pytest.approx(5.0 * window)  # 5 W held over the whole window
    assert s.energy_per_query_j == pytest.approx(5.0 * window / 10)
    assert s.clocks_mhz["gpu"].mean == 1300 and s.temps_c["tj"].max > 50
    assert s == tel.summarize(sampler.samples, sampler.t_start, sampler.t_end, "fake", 10, 4)
    with pytest.raises(RuntimeError, match="cannot restart"):
        sampler.start()


def test_sampler_reports_a_failing_source():
    with tel.TelemetrySampler(ConstantSource(fail_after=3), interval_s=0.005) as sampler:
        assert wait_for(lambda: sampler.error is not None)
    s = sampler.summary()
    assert s.n_samples == 3 and "telemetry stopped: fake failed: sensor gone" in s.reason


def test_null_source_says_why():
    with tel.TelemetrySampler(tel.NullSource("no Jetson and no NVIDIA GPU")) as sampler:
        pass
    s = sampler.summary(queries=5, successes=1)
    assert not s.available and s.energy_j is None and s.n_samples == 0
    assert s.reason == "telemetry unavailable: no Jetson and no NVIDIA GPU"
    assert s.lines() == ["telemetry unavailable: no Jetson and no NVIDIA GPU"]


def test_best_source_on_a_cpu_machine_is_null(x86_root, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FailingNvml())
    src = tel.open_best_source(x86_root)
    assert isinstance(src, tel.NullSource)
    assert "jtop: not a Jetson" in src.reason and "nvml: NVML unavailable" in src.reason


def test_source_that_cannot_open_falls_back_to_null():
    src = tel.TegrastatsSource(command=["/nonexistent/tegrastats"])
    with tel.TelemetrySampler(src) as sampler:
        pass
    s = sampler.summary()
    assert not s.available and s.reason.startswith("telemetry unavailable: tegrastats: cannot start tegrastats")


def replay_command(fixture, delay_s=0.02, linger_s=30.0):
    """A process that prints recorded tegrastats lines like tegrastats does, then keeps running."""
    code = (f"import sys, time\nfor ln in open({str(FIX / fixture)!r}):\n"
            f"    print(ln, end='', flush=True); time.sleep({delay_s})\ntime.sleep({linger_s})\n")
    return [sys.executable, "-c", code]


def test_tegrastats_source_on_recorded_lines():
    src = tel.TegrastatsSource(command=replay_command("jp6_l4t36_agx_orin.txt"))
    with tel.TelemetrySampler(src) as sampler:
        assert wait_for(lambda: len(sampler.samples) == 3)
    assert src.proc is None  # stop() ended the process
    s = sampler.summary(queries=3)
    assert s.rails["VDD_GPU_SOC"].mean_mw == 2412 and s.rails["VIN_SYS_5V0"].max_mw == 4707
    assert s.total_label == "sum(VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0)"
    assert s.clocks_mhz["emc"].max == 2133 and s.temps_c["tj"].max == 52.562
    assert s.util_pct["gpu"].mean == 0 and s.memory_mb["ram_total"].max == 62841
    assert s.energy_j > 0


def test_tegrastats_source_ends_with_its_process():
    src = tel.TegrastatsSource(command=replay_command("jp4_l4t32_nano.txt", 0.0, 0.0))
    sampler = tel.TelemetrySampler(src).start()
    assert wait_for(lambda: src.ended)
    sampler.stop()
    assert [s.total_power_mw for s in sampler.samples] == [2545, 4520]


def test_nvml_source_with_stubbed_pynvml(monkeypatch):
    stub = stub_nvml(power_mw=75000, energy_step_mj=100)
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    src = tel.open_best_source("/nonexistent-root", order=("nvml",))
    assert isinstance(src, tel.NvmlSource)
    with tel.TelemetrySampler(src, interval_s=0.005) as sampler:
        assert wait_for(lambda: len(sampler.samples) >= 4)
    assert stub.state["shutdown"] == 1
    s = sampler.summary(queries=2)
    assert s.total_label == "GPU board power (NVML)" and s.rails["GPU"].mean_mw == 75000
    assert s.energy_j == pytest.approx(75.0 * s.window_s)
    assert s.clocks_mhz["sm"].mean == 2040 and s.clocks_mhz["mem"].mean == 6251
    assert s.temps_c["gpu"].max == 61 and s.util_pct["gpu"].mean == 87
    assert s.memory_mb["gpu_used"].mean == 3072
    assert s.energy_counter_j == pytest.approx(0.1 * (s.n_samples - 1))


class StubJtop:
    def __init__(self, interval):
        self.interval, self.n, self.started, self.closed = interval, 0, False, False
        self.power = {"rail": {"VDD_GPU_SOC": {"power": 3990, "avg": 3990}, "VDD_CPU_CV": {"power": 798, "avg": 798}},
                      "tot": {"power": 8766, "avg": 8700}}
        self.temperature = {"tj": {"temp": 51.5, "online": True}, "cv0": {"temp": -256, "online": False}}
        self.gpu = {"gpu": {"status": {"load": 42.0}, "freq": {"cur": 1300500}}}
        self.cpu = {"total": {"idle": 75.0}, "cpu": [{"online": True, "freq": {"cur": 2201600}}]}
        self.memory = {"RAM": {"used": 4 * 1024 * 1024, "tot": 64 * 1024 * 1024}}

    def start(self):
        self.started = True

    def ok(self):
        time.sleep(0.005)
        return not self.closed

    def close(self):
        self.closed = True


def test_jtop_source_with_stub_client():
    src = tel.JtopSource(0.05, factory=StubJtop)
    with tel.TelemetrySampler(src) as sampler:
        assert wait_for(lambda: len(sampler.samples) >= 2)
    s = sampler.summary()
    assert s.total.mean_mw == 8766 and s.total_label == "sum(rails)"
    assert s.temps_c == {"tj": tel.Stat(51.5, 51.5, 51.5, s.n_samples)}
    assert s.clocks_mhz["gpu"].mean == pytest.approx(1300.5) and s.util_pct["cpu"].mean == 25
    assert s.memory_mb["ram_used"].mean == 4096


# ---------------------------------------------------------------- zero copy
def test_cpu_frames_reach_the_runner_as_views():
    from engines.runners import CallableRunner

    obs = {"rgb": np.random.default_rng(0).integers(0, 255, (2, 64, 64, 3), dtype=np.uint8)[0],
           "state": np.zeros(9, np.float32)}
    seen = {}

    def fn(image, state):
        seen.update(image=image, state=state)
        return {"action": np.zeros(7, np.float32)}

    counter = zc.CopyCounter()
    with CallableRunner("capture", fn) as runner:
        for _ in range(3):
            runner.infer(zc.host_feeds(obs, {"image": "rgb", "state": "state"}, counter))
            counter.end_step()
    assert seen["image"].shape == (1, 64, 64, 3)
    assert np.shares_memory(obs["rgb"], seen["image"]) and np.shares_memory(obs["state"], seen["state"])
    rep = counter.report()
    assert rep == {"steps": 3, "h2d_bytes": 0, "d2h_bytes": 0, "host_copy_bytes": 0,
                   "bytes_per_step_mean": 0.0, "bytes_per_step_max": 0, "zero_copy": True}


def test_layout_or_dtype_changes_are_counted_as_host_copies():
    counter = zc.CopyCounter()
    frame = np.zeros((8, 8, 3), np.uint8)
    chw = zc.as_host_view(frame.transpose(2, 0, 1), counter)  # non-contiguous: one copy
    assert not np.shares_memory(frame, chw) and counter.host_copy_bytes == frame.nbytes
    zc.as_host_view(frame, counter, dtype=np.float32)
    assert counter.host_copy_bytes == frame.nbytes * 5 and counter.report()["zero_copy"]
    with pytest.raises(zc.ZeroCopyError, match="observation lacks rgb"):
        zc.host_feeds({"depth": frame}, {"image": "rgb"})


def test_torch_cpu_tensor_is_viewed_not_copied():
    torch = pytest.importorskip("torch")
    t = torch.zeros((16, 16, 3), dtype=torch.uint8)
    view = zc.as_host_view(t, add_batch=True)
    t[0, 0, 0] = 7
    assert view[0, 0, 0, 0] == 7 and view.shape == (1, 16, 16, 3)


# TensorRT binding by device pointer is TensorRtRunner's (engines/runners.py); these check it with the fake
# tensorrt and cuda-python of tests/fake_trt.py (the "device" is host memory) and, where there is one, on a GPU.
def test_tensorrt_runner_passes_device_pointers_without_copies(monkeypatch, tmp_path):
    from engines.runners import TensorRtRunner
    from tests import fake_trt

    f = fake_trt.install(monkeypatch)
    engine = tmp_path / "fake.engine"
    engine.write_bytes(fake_trt.ENGINE_BYTES)
    counter = zc.CopyCounter()
    frame = fake_trt.DeviceArray(np.array([[1, -1, 2, -2]], np.float32))
    with TensorRtRunner(engine, counter=counter) as runner:
        runner.infer({"x": frame})
        assert runner.context.addresses["x"] == frame.array.ctypes.data
        assert runner.context.shape_calls == [("x", (1, 4))]
        assert counter.end_step() == 0 and f.cudart.h2d == 0  # bound as is: nothing crossed the bus
        host = np.zeros((1, 4), np.float32)
        runner.infer({"x": host})  # a host frame is copied to the device, and counted
        assert counter.end_step() == host.nbytes and f.cudart.h2d == 1
    assert counter.per_step == [0, host.nbytes] and not counter.report()["zero_copy"]


@pytest.mark.gpu
def test_cuda_frame_to_the_host_is_counted():
    reason = zc.cuda_unavailable_reason()
    if reason:
        pytest.skip(f"needs CUDA: {reason}")
    import torch

    counter = zc.CopyCounter()
    gpu = torch.zeros((1, 64, 64, 3), dtype=torch.uint8, device="cuda")
    host = zc.as_host_view(gpu, counter)
    assert host.shape == (1, 64, 64, 3) and counter.d2h_bytes == 64 * 64 * 3


@pytest.mark.gpu
def test_tensorrt_engine_binding_on_gpu(tmp_path):
    from engines import trt as trt_cache

    reason = zc.cuda_unavailable_reason() or trt_cache.unavailable_reason()
    if reason:
        pytest.skip(f"needs CUDA and TensorRT: {reason}")
    import tensorrt as trt
    import torch

    from engines.runners import TensorRtRunner

    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    net = builder.create_network(0)
    x = net.add_input("image", trt.float32, (1, 8))
    net.mark_output(net.add_activation(x, trt.ActivationType.RELU).get_output(0))
    net.get_output(0).name = "out"
    engine = tmp_path / "relu.engine"
    engine.write_bytes(bytes(builder.build_serialized_network(net, builder.create_builder_config())))
    counter = zc.CopyCounter()
    inp = torch.linspace(-1, 1, 8, device="cuda").reshape(1, 8)
    torch.cuda.synchronize()
    with TensorRtRunner(engine, counter=counter) as runner:
        out = runner.infer({"image": inp})["out"]
    np.testing.assert_allclose(out, inp.clamp(min=0).cpu().numpy())
    assert counter.end_step() == 0
