"""Benchmarks: scripts that time the models on this machine and write JSON under results/benchmarks/.

- :mod:`benchmarks.octo_ort_vs_jax`: octo-small through ONNX Runtime fp32 against jitted JAX on the CPU;
- :mod:`benchmarks.octo_rollout`: one octo-small try through the one rollout loop, its wall time and shares,
  on CPU scenes or GPU scenes;
- :mod:`benchmarks.device_check` (run by ``benchmarks/device_check.sh``): the prepared run for a lent GPU
  machine: Octo in JAX on the GPU, bc-state on torch CUDA, the DLPack hand-off, TensorRT engines, GPU PhysX
  and GPU scene batches, each step under its own timeout (see docs/jetson.md, "What runs where").
"""
