"""sat_jax: Sequential Agent Tuning for teams of small language models, in JAX."""

import setuptools

# The runtime stack at the versions verified together (DEVELOPERS.md).
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "chex==0.1.92",
    "transformers==5.24.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "tensorflow-datasets==4.9.10",
    # tfds needs it for builders defined in a package (undeclared by tfds).
    "importlib_resources>=6.0",
    "grain==0.2.18",
    "ml-collections==1.1.0",
    "absl-py>=2.1",
    "numpy>=2.0",
    "tqdm>=4.66",
    "matplotlib>=3.8",
    "tensorboardX>=2.6",
    "math-verify==0.9.0",
    "pyyaml>=6.0",
]

EXTRAS_REQUIRE = {
    # torch only for the logits-parity tests and the PyTorch benchmarks.
    # Exactly this pin: anything else pulls a multi-GB CUDA build.
    "test": [
        "pytest==9.2.0",
        "pytest-xdist==3.8.0",  # the README's test command runs 2 workers
        "chex==0.1.92",
        "torch==2.13.0",
        "pyink==26.5.1",
        "scipy>=1.11",
    ],
}
EXTRAS_REQUIRE["bench"] = EXTRAS_REQUIRE["test"] + ["trl==1.16.0"]

setuptools.setup(
    name="sat_jax",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["sat_jax", "sat_jax.*"]),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    entry_points={"console_scripts": ["sat-jax=sat_jax.main:run"]},
)
