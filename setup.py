"""refiner_jax: REFINER critics/generators and process/outcome reward models in JAX/Flax."""
from setuptools import find_packages, setup

CORE = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "ml-collections==1.1.0",
    "numpy>=2.0",
    "transformers>=4.45",
    "tokenizers>=0.20",
    "safetensors>=0.4",
    "datasets>=3.0",
    "tqdm>=4.66",
    "tensorboardX>=2.6",
    "matplotlib>=3.8",
    "absl-py>=2.1",
    "sentencepiece>=0.2",
]

setup(
    name="refiner_jax",
    version="0.1.0",
    description="Reasoning feedback (REFINER) and process/outcome reward models in pure-functional JAX/Flax.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["refiner_jax", "refiner_jax.*"]),
    install_requires=CORE,
    extras_require={
        # torch, rouge-score and sacrebleu are only reference implementations for parity tests and benchmarks.
        "test": ["pytest>=8", "hypothesis>=6.100", "torch==2.13.0", "rouge-score==0.1.2", "sacrebleu==2.6.0"],
        "gpu": ["jax[cuda12]==0.10.2"],
        "tpu": ["jax[tpu]==0.10.2"],
    },
)
