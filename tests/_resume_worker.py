"""A small, deterministic T5 training run that checkpoints and resumes; driven by tests/test_checkpoint.py and
tests/test_multiprocess.py.

    python tests/_resume_worker.py WORKDIR --steps 24 --ckpt_every 5 [--pause_at 13] [--mesh 1,2,1]
        [--devices 2 --coordinator HOST:PORT --num_processes 2 --process_id I] [--unreadable P:S]

Prints ``RESUMED <step>`` when it continues from a checkpoint, ``STEP <n>`` after every update (flushed) and, with
``--pause_at n``, stops after update n and sleeps (so a test can SIGKILL it mid-run). ``--unreadable P:S`` makes
process P fail to read checkpoint step S (a file only that process cannot read). At the end it writes the final
parameters to ``WORKDIR/final_params.npz``.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NUM_EXAMPLES, BATCH, VOCAB = 40, 8, 64


def toy_dataset() -> dict[str, np.ndarray]:
    """Copy-reverse pairs of random lengths: targets are the reversed inputs, then eos (1), padded with 0."""
    rng = np.random.default_rng(1234)
    inputs = np.zeros((NUM_EXAMPLES, 10), np.int32)
    targets = np.zeros((NUM_EXAMPLES, 11), np.int32)
    for i in range(NUM_EXAMPLES):
        n = int(rng.integers(3, 10))
        seq = rng.integers(2, VOCAB, n)
        inputs[i, :n] = seq
        targets[i, :n] = seq[::-1]
        targets[i, n] = 1
    return {"inputs": inputs, "targets": targets}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--ckpt_every", type=int, default=5)
    ap.add_argument("--pause_at", type=int, default=0)
    ap.add_argument("--mesh", default="1,-1,1")
    ap.add_argument("--devices", type=int, default=0)
    ap.add_argument("--coordinator", default=None)
    ap.add_argument("--num_processes", type=int, default=None)
    ap.add_argument("--process_id", type=int, default=None)
    ap.add_argument("--unreadable", default="")
    args = ap.parse_args()
    if args.devices:
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    import jax
    import jax.numpy as jnp

    from refiner_jax import sharding as shd
    from refiner_jax.checkpoint import Checkpointer
    from refiner_jax.models.t5 import T5
    from refiner_jax.models.t5_config import preset
    from refiner_jax.training import (EpochOrder, abstract_train_state, create_train_state, make_optimizer,
                                      make_train_step, seq2seq_loss)

    shd.maybe_initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    if args.unreadable:
        process, step = (int(n) for n in args.unreadable.split(":"))
        if jax.process_index() == process:
            restore = Checkpointer._restore

            def unreadable(self, candidate, target):
                if candidate == step:
                    raise OSError(f"injected: process {process} cannot read step {step}")
                return restore(self, candidate, target)

            Checkpointer._restore = unreadable

    data = toy_dataset()
    model = T5(preset("t5-tiny", num_layers=1, vocab_size=VOCAB, dropout_rate=0.1))
    init = lambda k: model.init(k, jnp.ones((2, 10), jnp.int32), jnp.ones((2, 11), jnp.int32))["params"]  # noqa
    tx, schedule = make_optimizer(dict(name="adamw", learning_rate=3e-3, schedule="warmup_linear", warmup_steps=4,
                                       total_steps=args.steps, weight_decay=0.01))
    mesh = shd.make_mesh([int(s) for s in args.mesh.split(",")])
    order = EpochOrder(NUM_EXAMPLES, BATCH, seed=7)

    with Checkpointer(os.path.join(args.workdir, "ckpt"), save_interval_steps=args.ckpt_every, keep_last=2) as ckpt:
        if ckpt.latest_step() is not None:
            target, shardings = abstract_train_state(init, tx, mesh)
            state, extra = ckpt.restore(target)
            order.load_state_dict(extra["data"])
            print(f"RESUMED {int(state.step)}", flush=True)
        else:
            state, shardings = create_train_state(init, tx, mesh, seed=0)
        train_step = make_train_step(seq2seq_loss(model.apply), tx, mesh, shardings, num_microbatches=2,
                                     schedule=schedule)
        while int(state.step) < args.steps:
            rows = order.next_indices()[shd.host_batch_slice(BATCH)]
            batch = shd.make_global_batch({k: v[rows] for k, v in data.items()}, mesh)
            state, metrics = train_step(state, batch)
            step = int(state.step)
            ckpt.save(step, state, extra={"data": order.state_dict()})
            print(f"STEP {step} loss {float(metrics['loss']):.4f}", flush=True)
            if step == args.pause_at:
                time.sleep(600)
    params = state.params
    if jax.process_count() > 1:  # each process holds only its shards
        from jax.experimental import multihost_utils

        params = multihost_utils.process_allgather(params, tiled=True)
    flat = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(params)}
    if shd.is_main_process():
        np.savez(os.path.join(args.workdir, "final_params.npz"), **flat)


if __name__ == "__main__":
    main()
