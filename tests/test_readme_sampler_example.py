"""docs/sampling.md's "with your own model" snippet, executed verbatim (keep the document and this in sync), and its
mesh example."""
import numpy as np

SNIPPET = '''
import functools

import jax
import jax.numpy as jnp

from refiner_jax.sampling import sample

VOCAB, DIM, EOS, PAD = 32, 16, 1, 0


def init_params(key):
    k1, k2 = jax.random.split(key)
    return {"embed": jax.random.normal(k1, (VOCAB, DIM)), "out": jax.random.normal(k2, (DIM, VOCAB)) * 4 / DIM**0.5}


def step(params, tokens, index, cache):
    """Your model's one-token step. This toy LM predicts from the mean embedding of the tokens fed so far, so its
    cache is their running sum; a transformer's cache would hold per-layer keys/values written at `index`."""
    cache = cache + params["embed"][tokens]  # [n, DIM]
    logits = (cache / (index + 1)) @ params["out"]  # [n, VOCAB]
    return logits, cache


@functools.partial(jax.jit, static_argnames=("max_new_tokens", "num_samples"))
def generate(params, prompt, prompt_lengths, rng, temperature, top_p, max_new_tokens=12, num_samples=4):
    # Params are jit arguments (not constants baked into the program); temperature / top_p are traced,
    # so new values reuse the compiled program.
    def tokens_to_logits(tokens, index, cache):  # tokens [n] int32 (n = batch * num_samples), index: their position
        return step(params, tokens, index, cache)

    cache = jnp.zeros((prompt.shape[0], DIM))  # one row per prompt: `sample` repeats it for the samples
    return sample(tokens_to_logits, cache, prompt, rng, max_new_tokens=max_new_tokens, num_samples=num_samples,
                  prompt_lengths=prompt_lengths, temperature=temperature, top_p=top_p, eos_id=EOS, pad_id=PAD)


params = init_params(jax.random.key(0))
prompt = jnp.array([[5, 9, 3], [7, 0, 0]])  # right-padded prompts: row 1 has a single token
lengths = jnp.array([3, 1])
out = generate(params, prompt, lengths, jax.random.key(1), 0.8, 0.9)
print(out.tokens.shape)  # (2, 4, 12): 4 samples of each prompt, PAD after EOS
print(out.lengths, out.log_prob)  # [2, 4]: tokens generated (EOS included); their summed model log-probs
greedy = generate(params, prompt, lengths, jax.random.key(1), 0.0, 1.0)  # temperature 0: argmax
'''


def test_readme_sampler_snippet_runs_and_greedy_matches_a_plain_loop():
    namespace: dict = {}
    exec(compile(SNIPPET, "README-sampler-snippet", "exec"), namespace)
    out, greedy, step, params = namespace["out"], namespace["greedy"], namespace["step"], namespace["params"]
    assert out.tokens.shape == (2, 4, 12) and out.lengths.shape == out.log_prob.shape == (2, 4)
    for row, length in zip(np.asarray(out.tokens).reshape(8, 12), np.asarray(out.lengths).reshape(8)):
        assert (row[length:] == 0).all() and (row[:length - 1] != 1).all()
    assert namespace["generate"]._cache_size() == 1  # temperature / top_p changed, no recompilation

    # Reference: feed each prompt token by token, then the argmax, with the model's step in a Python loop.
    import jax.numpy as jnp

    for row, (prompt, length) in enumerate([([5, 9, 3], 3), ([7], 1)]):
        cache = jnp.zeros((1, 16))
        fed, generated = list(prompt), []
        for index in range(length + 11):
            logits, cache = step(params, jnp.asarray([fed[index]]), index, cache)
            if index + 1 < length:
                continue
            generated.append(int(np.argmax(np.asarray(logits[0]))))
            fed.append(generated[-1])
            if generated[-1] == 1 or len(generated) == 12:
                break
        for k in range(4):  # greedy samples of a prompt agree
            np.testing.assert_array_equal(np.asarray(greedy.tokens[row, k, :len(generated)]), generated)
            assert int(greedy.lengths[row, k]) == len(generated)


def test_docs_show_this_snippet():
    import pathlib

    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "sampling.md").read_text(encoding="utf-8")
    assert SNIPPET in doc


def _doc_block(document: str, marker: str) -> str:
    """The python code block of `document` (a path in the repository) that contains `marker`."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / document).read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if marker in b]
    assert len(blocks) == 1, f"expected one {document} python block with {marker!r}, found {len(blocks)}"
    return blocks[0]


def test_docs_mesh_snippet_runs_on_two_host_devices():
    """docs/sampling.md's `sample_t5(..., mesh=...)` block, run verbatim in a fresh process (it sets XLA_FLAGS
    before JAX starts): 8 prompts x 4 samples, split 4 prompts per device."""
    import os
    import pathlib
    import subprocess
    import sys

    repo = pathlib.Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(repo))
    proc = subprocess.run([sys.executable, "-c", _doc_block("docs/sampling.md", "mesh=mesh")], env=env, cwd=repo,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "(8, 4, 16) P('data',)"
