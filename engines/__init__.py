"""Model engines: the models the benchmark runs, their exports and their runtime backends.

Models, written here so that they load their files unchanged:

- :mod:`engines.octo`: Octo 1.5 (octo-small-1.5, octo-base-1.5) in JAX, loading the
  released checkpoints; its observation backbone and denoising step are plain
  functions, ready for ONNX export;
- :mod:`engines.bc_mlp`: the bc-state MLP (safetensors, strict loading);
- :mod:`engines.bc_camera`: the bc-camera network on both cameras (safetensors, strict loading).

Exports and backends: :mod:`engines.backends` (the one factory from an ONNX
graph and a backend spec to a runner), :mod:`engines.folder` (the engines
folder ``make engines`` writes and a run reads alone), :mod:`engines.cache`
(exports made on first use by tests and benchmarks), :mod:`engines.onnx_utils`
(checks and metadata of ONNX files), :mod:`engines.trt` (TensorRT engines with
a strict key), :mod:`engines.runners`
(ONNX Runtime, TensorRT, JAX and in-process callables behind one interface),
:mod:`engines.build` (``make engines``). :mod:`engines.optional` names the
optional dependencies and how to install each; every module imports on a
CPU-only machine.
"""
