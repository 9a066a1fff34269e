"""Optimizers and learning-rate schedules built from a config mapping (an ``ml_collections.ConfigDict`` or dict).

Config fields (defaults in ``DEFAULTS``)::

    name            'adamw' | 'adafactor'
    learning_rate   peak learning rate
    schedule        'constant' | 'linear' (decay from the start) | 'warmup_linear' | 'warmup_cosine' |
                    'warmup_constant' (linear warm-up, then constant: no end forced on a stage that stops on a
                    validation plateau) |
                    'rsqrt' (T5: learning_rate * sqrt(warmup_steps / max(step, warmup_steps)))
    warmup_steps    linear warmup from 0 (warmup_* schedules; the rsqrt plateau length)
    total_steps     length of the decay (linear / warmup_* schedules)
    end_lr_factor   final learning rate = learning_rate * end_lr_factor
    grad_clip_norm  clip gradients by global norm before the update; 0 or None disables
    weight_decay    decoupled weight decay (AdamW) / weight_decay_rate (Adafactor); applied only to parameters
                    with ndim >= 2 (norm scales are not decayed)
    b1, b2, eps     AdamW moments
    decay_rate, min_dim_size_to_factor, multiply_by_parameter_scale, clipping_threshold, momentum   Adafactor

Gradient accumulation is not an optimizer wrapper here: the train step (``training.steps.make_train_step``,
``num_microbatches``) scans over microbatches inside one jitted step, which keeps the loss normalisation exact
(token-weighted over the whole batch) and needs no extra optimizer state.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

DEFAULTS: dict[str, Any] = dict(
    name="adamw",
    learning_rate=1e-3,
    schedule="constant",
    warmup_steps=0,
    total_steps=0,
    end_lr_factor=0.0,
    grad_clip_norm=1.0,
    weight_decay=0.0,
    b1=0.9,
    b2=0.999,
    eps=1e-8,
    decay_rate=0.8,
    min_dim_size_to_factor=128,
    multiply_by_parameter_scale=False,
    clipping_threshold=1.0,
    momentum=None,
)

SCHEDULES = ("constant", "linear", "warmup_linear", "warmup_cosine", "warmup_constant", "rsqrt")
# Schedules that do not decay over `total_steps`, so any number of steps suits them.
NO_DECAY = ("constant", "warmup_constant", "rsqrt")


def _resolve(config: Mapping[str, Any] | None) -> dict[str, Any]:
    cfg = dict(DEFAULTS)
    given = dict(config.items()) if config is not None else {}
    unknown = set(given) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"optimizer config has unknown fields {sorted(unknown)}; valid fields: {sorted(DEFAULTS)}")
    cfg.update(given)
    return cfg


def make_schedule(config: Mapping[str, Any] | None) -> optax.Schedule:
    """The learning-rate schedule ``step -> lr`` described by ``config`` (see module docstring)."""
    cfg = _resolve(config)
    lr, warmup, total = float(cfg["learning_rate"]), int(cfg["warmup_steps"]), int(cfg["total_steps"])
    end = lr * float(cfg["end_lr_factor"])
    kind = cfg["schedule"]
    if kind not in SCHEDULES:
        raise ValueError(f"optimizer.schedule={kind!r}; choose one of {SCHEDULES}")
    if kind == "constant" or (kind == "warmup_constant" and warmup < 1):
        return optax.constant_schedule(lr)
    if kind == "warmup_constant":  # linear_schedule holds its end value past `warmup`
        return optax.linear_schedule(0.0, lr, warmup)
    if kind == "rsqrt":
        if warmup < 1:
            raise ValueError("optimizer.schedule='rsqrt' needs optimizer.warmup_steps >= 1")
        return lambda step: lr * jax.lax.rsqrt(jnp.maximum(step, warmup) / warmup)
    if kind == "linear":  # no warm-up: from lr down to end over total_steps
        return optax.linear_schedule(lr, end, total)
    if total <= warmup:
        raise ValueError(f"optimizer.schedule={kind!r} needs optimizer.total_steps ({total}) > "
                         f"optimizer.warmup_steps ({warmup})")
    if kind == "warmup_cosine":
        return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, total, end)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, lr, warmup), optax.linear_schedule(lr, end, total - warmup)], [warmup])


def _decay_mask(params: Any) -> Any:
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(config: Mapping[str, Any] | None) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Returns ``(tx, schedule)``: gradient clipping (optional) followed by AdamW or Adafactor on ``schedule``."""
    cfg = _resolve(config)
    schedule = make_schedule(cfg)
    wd = float(cfg["weight_decay"])
    if cfg["name"] == "adamw":
        opt = optax.adamw(schedule, b1=cfg["b1"], b2=cfg["b2"], eps=cfg["eps"], weight_decay=wd,
                          mask=_decay_mask)
    elif cfg["name"] == "adafactor":
        opt = optax.adafactor(
            schedule, min_dim_size_to_factor=int(cfg["min_dim_size_to_factor"]), decay_rate=cfg["decay_rate"],
            multiply_by_parameter_scale=bool(cfg["multiply_by_parameter_scale"]),
            clipping_threshold=cfg["clipping_threshold"], momentum=cfg["momentum"],
            weight_decay_rate=wd or None, weight_decay_mask=_decay_mask)
    else:
        raise ValueError(f"optimizer.name={cfg['name']!r}; choose 'adamw' or 'adafactor'")
    clip = cfg["grad_clip_norm"]
    if clip:
        opt = optax.chain(optax.clip_by_global_norm(float(clip)), opt)
    return opt, schedule
