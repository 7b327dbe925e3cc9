"""Device identification, telemetry and zero-copy buffers for latency profiling on Jetson and NVIDIA GPUs.

- :mod:`jetson.device`: ``identify_device()`` -> ``DeviceInfo`` (a Jetson with its
  L4T/JetPack release, nvpmodel mode and jetson_clocks state; else NVIDIA GPUs
  through NVML; else the CPU), with CUDA/TensorRT versions.
- :mod:`jetson.tegrastats`: ``parse_line()`` for tegrastats output of L4T 28 to 38.
- :mod:`jetson.telemetry`: ``start_telemetry()`` / ``TelemetrySampler`` sample power,
  clocks, temperatures and memory in a background thread (jtop, tegrastats, NVML,
  or a null source that says why there is nothing); ``summary()`` gives energy,
  energy per query and per successful try.
- :mod:`jetson.zero_copy`: frames to engine inputs without copies (numpy views on the
  CPU, DLPack into JAX; TensorRT binds device pointers in
  :class:`engines.runners.TensorRtRunner`) and a per-step counter of host<->device bytes.

Every module imports on a CPU-only machine; jtop, pynvml, torch and tensorrt are
imported only when used.
"""
