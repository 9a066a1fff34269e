"""Sharded training engine: state, optimizers, jitted train/eval steps and a resumable data order.

A minimal loop (see ``refiner_jax.sharding`` for the mesh and ``refiner_jax.checkpoint`` for saving)::

    mesh = sharding.make_mesh({'fsdp': -1})
    tx, schedule = make_optimizer(config.optimizer)
    init = lambda k: model.init(k, dummy_inputs, dummy_targets)['params']
    state, shardings = create_train_state(init, tx, mesh, seed=config.seed)
    loss_fn = seq2seq_loss(model.apply)
    train_step = make_train_step(loss_fn, tx, mesh, shardings, num_microbatches=4, schedule=schedule)
    eval_step = make_eval_step(loss_fn, mesh, shardings.params)
    order = EpochOrder(len(dataset), global_batch_size, seed=config.seed)
    for indices in order:
        rows = indices[sharding.host_batch_slice(global_batch_size)]
        state, metrics = train_step(state, sharding.make_global_batch(collate(rows), mesh))
"""
from refiner_jax.training.data_order import EpochOrder
from refiner_jax.training.optim import make_optimizer, make_schedule
from refiner_jax.training.state import (TrainState, abstract_train_state, create_train_state, train_state_from_params,
                                        train_state_shardings, with_shardings)
from refiner_jax.training.steps import (ShardedStep, make_eval_step, make_train_step, masked_cross_entropy,
                                        mean_metrics, seq2seq_loss)

__all__ = ["EpochOrder", "ShardedStep", "TrainState", "abstract_train_state", "create_train_state", "make_eval_step",
           "make_optimizer", "make_schedule", "make_train_step", "masked_cross_entropy", "mean_metrics",
           "seq2seq_loss", "train_state_from_params", "train_state_shardings", "with_shardings"]
