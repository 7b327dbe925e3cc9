"""Model engines: the released models the benchmark runs, their exports and runtime backends.

Each subpackage holds one model family, written here so that it loads the
released files unchanged and runs on the backends the benchmark measures:

- :mod:`engines.octo`: Octo 1.5 (octo-small-1.5, octo-base-1.5) in JAX, loading
  the released checkpoints (config.json, dataset_statistics.json,
  example_batch.msgpack, the step folder); its observation backbone and its
  denoising step are plain functions, ready for ONNX export.

Backends: ``jax`` (CPU or GPU, the reference); ONNX Runtime and TensorRT
exports of the same functions are added beside them.
"""
