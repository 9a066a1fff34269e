"""One process of a small multi-process REFINER run; driven by tests/test_multiprocess.py.

    python tests/_pipeline_worker.py WORKDIR --devices 2 --mesh 2,2,1 [--coordinator HOST:PORT --num_processes 2
                                     --process_id I]

Each process gets ``--devices`` virtual CPU devices; the run is `refiner_run.run` on the small config of
tests/test_pipeline.py with 2 updates per stage and the given mesh, every stage including evaluation.
"""
import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir")
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--mesh", default="1,1,1")
    ap.add_argument("--coordinator", default=None)
    ap.add_argument("--num_processes", type=int, default=None)
    ap.add_argument("--process_id", type=int, default=None)
    args = ap.parse_args()
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

    from refiner_jax import sharding as shd

    shd.maybe_initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    from refiner_jax.runs import refiner_run
    from test_pipeline import tiny_config

    c = tiny_config()
    for stage in (c.critic, c.warmup, c.refiner):
        stage.steps = stage.eval_every = 2
    c.eval.examples, c.eval.turns, c.eval.bootstrap_samples, c.eval.noise_levels = 8, 2, 50, (0.0, 1.0)
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = (int(n) for n in args.mesh.split(","))
    refiner_run.run(c, args.workdir)


if __name__ == "__main__":
    main()
