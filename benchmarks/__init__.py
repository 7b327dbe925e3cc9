"""Benchmarks: scripts that time the models on this machine and write JSON under results/benchmarks/.

- :mod:`benchmarks.octo_ort_vs_jax`: octo-small through ONNX Runtime fp32 against jitted JAX on the CPU;
- :mod:`benchmarks.device_check` (run by ``benchmarks/device_check.sh``): TensorRT engines of octo-small and
  bc-state in FP32 and FP16 on a GPU machine, parity against ONNX Runtime, CUDA-event timings.
"""
