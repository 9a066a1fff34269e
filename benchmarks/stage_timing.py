"""`bench.py stage`: where an update of a REFINER run's stage goes, on that run's own data, model and mesh.

Times the stage's first updates from the parameters it starts from (`runs.refiner_run.stage_plan`: the stage as the
run would train it, driven here through `training.loop.StageProgram`): making the pairs (the REFINER loop draws its
revision turns there), collating them and the train step, medians of `--steps` after `--warm` untimed ones. For the
REFINER loop also one turn's draw alone, on the stage's batch of problems and on `--ahead` times as many in one call:
decoding later batches' turns ahead pays only where the second costs less per problem. Needs a run whose warm-up is
done (`launch/train.py ... --stages=warmup`); nothing of the run is changed.
"""
from __future__ import annotations

import contextlib
import sys
import time


def time_steps(plan, steps: int, warm: int) -> dict:
    """`train_stage`'s first `warm` + `steps` updates of `plan` (a `refiner_run.StagePlan`), the last `steps` timed
    part by part (median seconds): making the pairs, collating them into the batch, and the train step, waited for;
    `last_loss` is the last update's loss. Nothing is written."""
    import jax
    import numpy as np

    from refiner_jax.training.loop import StageProgram, real_tokens

    kwargs = plan.train_kwargs
    program = StageProgram(plan.spec, kwargs["model_config"], kwargs["tokenizer"], kwargs["mesh"], kwargs["seed"],
                           plan.init_params, kwargs["rules"], kwargs["pack"])
    state = program.state
    parts: dict[str, list[float]] = {"make_pairs": [], "collate": [], "train_step": [], "update": []}
    shapes, tokens = set(), []
    for step in range(warm + steps):
        start = time.perf_counter()
        pairs = plan.spec.make_pairs(state.params, program.order.next_indices(), step)
        paired = time.perf_counter()
        batch = program.collate(pairs)
        collated = time.perf_counter()
        state, metrics = program.train_step(state, program.feed(batch))
        jax.block_until_ready(metrics)
        done = time.perf_counter()
        if step >= warm:
            for name, seconds in (("make_pairs", paired - start), ("collate", collated - paired),
                                  ("train_step", done - collated), ("update", done - start)):
                parts[name].append(seconds)
            shapes.add(tuple(next(iter(batch.values())).shape))
            tokens.append(real_tokens(batch))
    return {"steps": steps, "warm": warm, "pairs": len(pairs), "batch_shapes": sorted(shapes),
            "tokens_per_batch": float(np.mean(tokens)), "last_loss": float(metrics["loss"]),
            **{f"{name}_s": float(np.median(seconds)) for name, seconds in parts.items()}}


def time_turn_draw(plan, problems: int, repeats: int) -> dict:
    """Median seconds of one REFINER turn's draw (`refiner.samples` nucleus samples of each of `problems` training
    problems, as `stage_data.refiner_pairs` draws them) from the parameters the REFINER loop starts from, after two
    untimed calls."""
    import jax
    import numpy as np

    from refiner_jax.text_model import TextModel

    r, lengths, kwargs = plan.config.refiner, plan.config.lengths, plan.train_kwargs
    model = TextModel(kwargs["model_config"], plan.init_params, kwargs["tokenizer"], lengths.refine_input,
                      lengths.target, bucket=lengths.refine_input, batch_size=problems, mesh=kwargs["mesh"])
    inputs = [ex.x for ex in plan.train_problems[:problems]]
    seconds = []
    for call in range(2 + repeats):
        start = time.perf_counter()
        model.generate(inputs, num_samples=r.samples, top_p=r.top_p, temperature=r.temperature,
                       rng=jax.random.key(call))
        seconds.append(time.perf_counter() - start)
    median = float(np.median(seconds[2:]))
    return {"problems": problems, "rows": problems * r.samples, "seconds": median,
            "ms_per_problem": 1000 * median / problems}


def time_stage(args) -> dict:
    from refiner_jax import cpu

    cpu.expose_host_devices(args.host_devices)
    import jax

    from refiner_jax.runs import refiner_run

    with contextlib.redirect_stdout(sys.stderr):  # the run's own messages; stdout carries the JSON alone
        with refiner_run.stage_plan(args.workdir, args.stage) as plan:
            out = {"stage": args.stage, **time_steps(plan, args.steps, args.warm)}
            if args.stage == "refiner":
                batch = plan.config.refiner.batch_size
                out["sampler"] = [time_turn_draw(plan, problems, args.steps)
                                  for problems in (batch, batch * args.ahead)]
    return {"workdir": args.workdir, "devices": jax.local_device_count(), "malloc": cpu.malloc_in_use(), **out}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("stage", help="a REFINER run's stage update, part by part (sampling, batch, step)")
    p.add_argument("--workdir", required=True, help="a REFINER run (launch/train.py) whose warm-up is done")
    p.add_argument("--stage", choices=("warmup", "critic", "refiner", "matched"), default="refiner")
    p.add_argument("--steps", type=int, default=20, help="timed updates (median reported)")
    p.add_argument("--warm", type=int, default=3, help="untimed updates first (they compile)")
    p.add_argument("--ahead", type=int, default=4, help="the larger draw: this many batches of problems in one call")
    p.add_argument("--host-devices", type=int, default=1,
                   help="XLA:CPU host devices, as launch/train.py's --host_devices (ignored on GPU and TPU)")
    p.set_defaults(func=time_stage)
