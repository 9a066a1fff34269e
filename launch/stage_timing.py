"""`bench.py stage`: where an update of a REFINER run's stage goes, on that run's own data, model and mesh.

Times the stage's first updates from the parameters it starts from (`runs.refiner_run.time_stage`): making the
pairs (the REFINER loop draws its revision turns there), collating them and the train step, medians of `--steps`
after `--warm` untimed ones. For the REFINER loop also one turn's draw alone, on the stage's batch of problems and on
`--ahead` times as many in one call. Needs a run whose warm-up is done (`launch/train.py ... --stages=warmup`);
nothing of the run is changed.
"""
from __future__ import annotations

import contextlib
import sys


def time_stage(args) -> dict:
    from refiner_jax import cpu

    cpu.expose_host_devices(args.host_devices)
    import jax

    from refiner_jax.runs import refiner_run

    with contextlib.redirect_stdout(sys.stderr):  # the run's own messages; stdout carries the JSON alone
        out = refiner_run.time_stage(args.workdir, args.stage, steps=args.steps, warm=args.warm, ahead=args.ahead)
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
