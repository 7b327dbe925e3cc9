"""Device identification and telemetry for latency profiling on Jetson and NVIDIA GPUs.

- :mod:`jetson.device`: ``identify_device()`` -> ``DeviceInfo`` (a Jetson with its
  L4T/JetPack release, nvpmodel mode and jetson_clocks state; else NVIDIA GPUs
  through NVML; else the CPU), with CUDA/TensorRT versions.
- :mod:`jetson.tegrastats`: ``parse_line()`` for tegrastats output of L4T 28 to 38.
- :mod:`jetson.telemetry`: ``start_telemetry()`` / ``TelemetrySampler`` sample power,
  clocks, temperatures and memory in a background thread (jtop, tegrastats, NVML,
  or a null source that says why there is nothing); ``summary()`` gives energy,
  energy per query and per successful try.

Frames reach engine inputs without copies through :mod:`engines.zero_copy` (the engines' layer, below this
one).

Every module imports on a CPU-only machine; jtop, pynvml, torch and tensorrt are
imported only when used.
"""
