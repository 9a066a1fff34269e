"""Shared test fixtures: paths to the shared datasets, and CPU-only JAX."""
import os
import pathlib

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The tests run tiny models whose cost is XLA compilation, not execution: skipping most compiler optimisation
# passes makes the suite 2-3x faster and changes no semantics (benchmarks run fully optimised).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# Tests never download: `datasets` and the hub client read only their caches (set before either is imported).
os.environ["HF_DATASETS_OFFLINE"] = os.environ["HF_HUB_OFFLINE"] = "1"

REPO = pathlib.Path(__file__).resolve().parents[1]
# The shared datasets sit beside the checkout (../shared/data); REFINER_DATA overrides.
SHARED_DATA = pathlib.Path(os.environ.get("REFINER_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared datasets not found at {SHARED_DATA} (set REFINER_DATA)")
    return SHARED_DATA
