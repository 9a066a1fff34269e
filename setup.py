"""refiner_jax: REFINER critics/generators and process/outcome reward models in JAX/Flax."""
from setuptools import find_packages, setup

# Exact tested pins per Python: jax 0.11 dropped Python 3.11, so 3.11 keeps jax 0.10 and 3.12+ gets the newest
# release; refiner_jax/jax_compat.py absorbs the API differences between the two.
PY311 = 'python_version < "3.12"'
PY312_PLUS = 'python_version >= "3.12"'
JAX_PY311, JAX_PY312_PLUS = "0.10.2", "0.12.0.1"

CORE = [
    f"jax=={JAX_PY311}; {PY311}",
    f"jaxlib=={JAX_PY311}; {PY311}",
    f"flax==0.12.8; {PY311}",
    f"jax=={JAX_PY312_PLUS}; {PY312_PLUS}",
    f"jaxlib=={JAX_PY312_PLUS}; {PY312_PLUS}",
    f"flax==0.12.12; {PY312_PLUS}",
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

# The documentation site (mkdocs.yml): guides, results and the API reference generated from the docstrings.
DOCS = ["mkdocs==1.6.1", "mkdocstrings==1.0.8", "mkdocstrings-python==2.0.11"]

setup(
    name="refiner_jax",
    version="0.1.0",
    description="Reasoning feedback (REFINER) and process/outcome reward models in pure-functional JAX/Flax.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.14",
    packages=find_packages(include=["refiner_jax", "refiner_jax.*"]),
    install_requires=CORE,
    extras_require={
        # torch, rouge-score and sacrebleu are only reference implementations for parity tests and benchmarks.
        # torch 2.13.0 is a CPU wheel on 3.11 only; on 3.12+ it is a multi-GB CUDA download, so there the
        # transformers-parity tests skip (tests/_helpers.import_torch) and the 3.11 run is the one that checks them.
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.5",
            "hypothesis>=6.100",
            f"torch==2.13.0; {PY311}",
            f"peft==0.22.0; {PY311}",  # the reference that reads and writes LoRA adapter files (tests/test_lora.py)
            "rouge-score==0.1.2",
            "sacrebleu==2.6.0",
            *DOCS,
        ],
        "docs": DOCS,
        "gpu": [f"jax[cuda12]=={JAX_PY311}; {PY311}", f"jax[cuda12]=={JAX_PY312_PLUS}; {PY312_PLUS}"],
        "tpu": [f"jax[tpu]=={JAX_PY311}; {PY311}", f"jax[tpu]=={JAX_PY312_PLUS}; {PY312_PLUS}"],
    },
)
