"""Float32 tolerances that follow from the quantity compared.

Two float32 computations of the same mathematics (another device mesh, a cache instead of a full pass, another
framework's kernels, another CPU's thread split) differ by rounding: each of them is within a few units of
float32's machine epsilon (EPS32 = 2**-23) of the exact value, relative to the *magnitude* of what is summed, not
of the result. So every comparison here is

    |actual - expected| <= ulps * EPS32 * scale

with `scale` the magnitude of the quantity (by default max |expected|; for a sum with cancellation, the sum of
the absolute values of its terms) and `ulps` a margin named by the kind of computation compared, at least 7
times the worst deviation seen for that kind across CPU thread counts and 2, 4 and 8 virtual devices
(docs/testing.md). A real bug (a dropped shard, a missing term, a reduction over the wrong axis) moves the result
by a fraction of `scale`, 10**3 to 10**6 ulps, far beyond any margin used.

With REFINER_TOLERANCE_LOG=path, every check appends {what, deviation, tolerance, ulps} as a JSON line to `path`,
so a study can report the worst deviation seen against each tolerance on a given machine and thread count.
"""
import json
import os

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)

# Margins (in float32 ulps of the quantity's scale) by the kind of computation compared:
ELEMENTWISE = 2 ** 4  # a few elementwise operations (a power, a division), each rounding once
REORDER = 2 ** 7  # one float32 reduction taken in another order or blocking (a loss over shards or microbatches)
NETWORK = 2 ** 11  # a forward (and backward) pass through a network on another layout: every layer's roundings
PARITY = 2 ** 12  # the same network in another framework: other kernels, fused differently (rsqrt, softmax, GELU)


def tolerance(ulps: float, scale: float) -> float:
    return float(ulps) * EPS32 * float(scale)


def _log(what: str, deviation: float, tol: float, ulps: float) -> None:
    path = os.environ.get("REFINER_TOLERANCE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"what": what, "deviation": deviation, "tolerance": tol, "ulps": ulps}) + "\n")


def check_close(what: str, deviation: float, *, ulps: float, scale: float) -> None:
    """Asserts a measured deviation (e.g. max |a - b| from a subprocess report) is within `ulps` of `scale`."""
    tol = tolerance(ulps, scale)
    _log(what, float(deviation), tol, ulps)
    assert float(deviation) <= tol, f"{what}: deviation {deviation:.3e} > {ulps} ulps x scale {scale:.3e} = {tol:.3e}"


def assert_f32_close(actual, expected, *, ulps: float, scale: float | None = None, what: str = "",
                     elementwise: bool = False) -> None:
    """|actual - expected| <= ulps * EPS32 * scale, scale defaulting to max |expected|; with `elementwise`, each
    entry against its own magnitude (values that span orders of magnitude, computed without reductions)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    if elementwise:
        ratio = np.abs(actual - expected) / np.maximum(np.abs(expected), np.finfo(np.float32).tiny)
        check_close(what or "values", float(ratio.max()) if ratio.size else 0.0, ulps=ulps, scale=1.0)
        return
    if scale is None:
        scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    deviation = float(np.max(np.abs(actual - expected))) if actual.size else 0.0
    check_close(what or "values", deviation, ulps=ulps, scale=scale)
