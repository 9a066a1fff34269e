"""The hash-based dropout of `models.layers` against what dropout must be: Bernoulli(1 - rate) keeps, scaled by
1 / (1 - rate), independent across elements, calls and keys, and a pure function of the key."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from refiner_jax.models.layers import Dropout


def _apply(rate, x, key, deterministic=False):
    return Dropout(rate).apply({}, x, deterministic, rngs={"dropout": key})


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_rate_and_scale(rate):
    n = 1 << 20
    out = np.asarray(_apply(rate, jnp.ones((64, n // 64)), jax.random.key(3)))
    kept = out != 0
    # Binomial(n, 1 - rate): 5 standard deviations.
    assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)
    np.testing.assert_allclose(out[kept], 1.0 / (1.0 - rate), rtol=1e-6)


def test_masks_are_uncorrelated_across_neighbours_keys_and_calls():
    n = 1 << 18
    x = jnp.ones((n,))
    a = np.asarray(_apply(0.5, x, jax.random.key(0))) != 0
    b = np.asarray(_apply(0.5, x, jax.random.key(1))) != 0

    class Twice(nn.Module):
        @nn.compact
        def __call__(self, x):
            drop = Dropout(0.5)
            return drop(x, False), drop(x, False)

    c, d = (np.asarray(m) != 0 for m in Twice().apply({}, x, rngs={"dropout": jax.random.key(0)}))
    bound = 5 / np.sqrt(n)  # correlation of independent masks: mean 0, std 1/sqrt(n)
    for u, v in [(a[1:], a[:-1]), (a[512:], a[:-512]), (a, b), (c, d)]:  # neighbours, a row apart, keys, calls
        assert abs(np.corrcoef(u, v)[0, 1]) < bound


def test_same_key_same_mask_and_deterministic_is_identity():
    x = jax.random.normal(jax.random.key(9), (4, 33, 7))
    np.testing.assert_array_equal(_apply(0.3, x, jax.random.key(5)), _apply(0.3, x, jax.random.key(5)))
    np.testing.assert_array_equal(_apply(0.3, x, jax.random.key(5), deterministic=True), x)
    np.testing.assert_array_equal(_apply(0.0, x, jax.random.key(5)), x)
    np.testing.assert_array_equal(_apply(1.0, x, jax.random.key(5)), jnp.zeros_like(x))


def test_mean_is_preserved_through_a_jitted_gradient():
    # E[dropout(x)] = x, so the expected gradient of sum(w * dropout(x)) w.r.t. w is x.
    x = jnp.linspace(0.5, 1.5, 1 << 16)
    grad = jax.jit(jax.grad(lambda w, k: jnp.sum(w * _apply(0.25, x, k))))(jnp.ones_like(x), jax.random.key(2))
    assert abs(float(grad.sum() / x.sum()) - 1.0) < 0.01
