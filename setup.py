"""Packaging for shape-assembly-bench.

torch is deliberately NOT listed: mani-skill depends on it, and `make setup`
installs a CPU wheel first only when no torch is present, so a GPU or Jetson
(JetPack) torch that a user already has is never replaced.
"""
from setuptools import find_packages, setup

TOP_LEVEL = ["binomial_stats", "env", "eval", "engines", "jetson", "benchmarks", "assembly_probe"]

setup(
    name="shape-assembly-bench",
    version="0.1.0",
    description=(
        "Shape-assembly benchmark (ManiSkill 3 / SAPIEN 3): simulation, "
        "policy tracks, ONNX/TensorRT export and Jetson latency profiling"
    ),
    python_requires=">=3.10",
    packages=find_packages(include=TOP_LEVEL + [p + ".*" for p in TOP_LEVEL]),
    package_data={"env": ["*.json", "*.md", "**/*.json", "**/*.jsonl", "**/*.md"]},
    install_requires=[
        "numpy",
        "scipy",
        "trimesh",
        # trimesh's quadric decimation backend: the scene's visual meshes at the detail its cameras show (env.appearance)
        "fast-simplification",
        "shapely",
        "gymnasium",
        "tqdm",
        "matplotlib",
        "h5py",
        "safetensors",
        "pillow",
    ],
    extras_require={
        # sapien named on its own, not left to mani-skill: env/ imports it directly, and ManiSkill's next release
        # moves it into an extra (mani-skill[sapien]); tests/test_sim_requirements.py checks the installed metadata
        "sim": ["mani-skill==3.0.1", "sapien==3.0.3"],
        # jax2onnx exports the JAX Octo graphs (engines.octo.export); 0.17 is the version checked here
        "export": ["onnx", "onnxruntime", "jax2onnx>=0.17,<0.18"],
        # TensorRT is not installed from PyPI here: on Jetson it comes with
        # JetPack, on x86 from NVIDIA's pip index (see docs/development.md). cuda-python
        # (the runner's CUDA calls) must not be newer than the driver's CUDA
        # major: 13.x (JetPack 7: CUDA 13) needs a CUDA 13 driver, JetPack 6
        # has CUDA 12.6 and needs 12.x (12.x also runs on newer drivers), so
        # a CUDA 12 machine adds the constraint cuda-python<13 (Dockerfile.l4t
        # does). Both majors import as cuda.bindings.runtime (13 dropped
        # cuda.cudart). engines.runners checks the major at runtime.
        "trt": ["cuda-python>=12.6,<14"],
        "jetson": ["jetson-stats", "nvidia-ml-py"],
        "jax": ["jax", "flax", "orbax-checkpoint", "sentencepiece", "msgpack"],
        # eval.run --executor ray: plain ray is enough (ray[default] only adds the dashboard); checked with 2.60
        "ray": ["ray>=2.9"],
        # transformers: the T5 encoder and tokenizer cross-checks against Hugging Face's reference (tests
        # only; they build tiny models and tokenizers locally, nothing is downloaded); it uses the CPU torch;
        # pytest-xdist: CI (.ci/run) runs the suite on both cores (-n 2)
        # pandas and av: the readers LeRobot itself uses for meta/tasks.parquet and the videos (PyAV, its
        # decoder where torchcodec is missing), in the dataset tests
        "dev": ["pytest", "pytest-timeout", "pytest-xdist", "transformers>=5,<6", "pandas", "av"],
        # eval.remote / eval.serve: the WebSocket transport and msgpack codecs of the openpi and vla-eval
        # protocols; vla-eval (0.8 checked) for its model servers, client and image codec in the tests;
        # json-numpy (2.1.1 checked: the codec openvla-oft's deploy.py patches json with) for the tests' stub of
        # that server and the check of eval.remote.wire's own json_numpy codec (the client does not need it).
        # openpi-client (0.1.2) is not listed: it declares numpy<2, which JAX here excludes, while the modules
        # used (websocket_client_policy, msgpack_numpy) need only websockets and msgpack: install it with
        # pip install --no-deps openpi-client==0.1.2 (its tests skip without it)
        "remote": ["websockets>=13", "msgpack", "vla-eval>=0.8,<0.9", "json-numpy>=2.1,<3"],
        # eval.record: LeRobotDataset v3.0 parquet files, the videos through imageio-ffmpeg's own ffmpeg, the
        # upload (--push-to-hub) through huggingface_hub
        "dataset": ["pyarrow>=15", "imageio-ffmpeg", "huggingface_hub"],
    },
)
