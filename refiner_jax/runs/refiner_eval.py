"""A trained REFINER run directory after training: its generator and critic, its re-evaluation into
`results.md` (`launch/evaluate.py`) and an interactive session with a person as the critic (`launch/refine.py`).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence

from jax.sharding import Mesh

from refiner_jax import atomic_files
from refiner_jax import sharding as shd
from refiner_jax import text_model
from refiner_jax.refiner import baselines, critics, feedback_loop, inference_factorial
from refiner_jax.refiner.critic_tool import interactive_loop
from refiner_jax.refiner.evaluation import evaluate_refinement, noise_study
from refiner_jax.runs import results as results_lib
from refiner_jax.runs import run_config
from refiner_jax.runs.run_info import RunInfo
from refiner_jax.tasks.base import Task


def generator_stage_dir(workdir: str, stages: Sequence[str] = ("refiner", "warmup")) -> str:
    """The first stage directory of `stages` that has an export (the REFINER generator, else the warm-up one)."""
    for stage in stages:
        path = os.path.join(workdir, stage)
        if os.path.isdir(os.path.join(path, "export")):
            return path
    raise FileNotFoundError(f"no trained generator in {workdir}: expected {' or '.join(s + '/export' for s in stages)} "
                            "(train with launch/train.py --workdir=...)")


def load_run_models(run: RunInfo, task: Task, batch_size: int, with_critic: bool = True,
                    mesh: Mesh | None = None) -> tuple[str, text_model.TextModel, critics.Critic | None]:
    """(generator stage directory, generator, trained critic) of a run: the REFINER generator (else the warm-up
    one) and the critic, None when it was not trained or `with_critic` is False. Prompts are padded to the run's
    token budgets, so each model compiles its sampler once; with a `mesh`, they are split over its devices."""
    generator_dir = generator_stage_dir(run.workdir)
    tokenizer = run.tokenizer()
    lengths = run.lengths
    generator = text_model.load_text_model(generator_dir, tokenizer, lengths["refine_input"], lengths["target"],
                                           lengths["refine_input"], batch_size, mesh=mesh)
    critic = None
    critic_dir = os.path.join(run.workdir, "critic")
    if with_critic and os.path.isdir(os.path.join(critic_dir, "export")):
        critic = critics.load_critic(run, task, batch_size, mesh=mesh)
    return generator_dir, generator, critic


def evaluate_run(workdir: str, config_dict: Mapping | None = None, max_examples: int | None = None,
                 turns: int | None = None, out_dir: str | None = None, mesh: Mesh | None = None) -> dict[str, Any]:
    """Evaluates a trained run directory and writes `results.md`, `results.json`, `predictions.jsonl` and plots
    to `out_dir` (default `<workdir>/eval`).

    Generator: `<workdir>/refiner` (else `<workdir>/warmup`); critic: `<workdir>/critic` (rows left out when it
    was not trained). Settings come from the run's config (`config_dict`, default `<workdir>/config.json`, missing
    fields at their defaults): `eval.examples/turns/batch_size/noise_levels/bootstrap_samples`, `refiner.template`,
    `task.data_dir`. With a
    `mesh`, the models sample over its devices (`text_model.TextModel`).
    """
    config = run_config.load(workdir) if config_dict is None else run_config.with_defaults(config_dict)
    run = RunInfo(workdir, config)
    eval_cfg = config.eval
    turns = int(turns if turns is not None else eval_cfg.turns)
    if turns < 1:
        raise ValueError(f"turns={turns}: refinement needs at least one critic/revision turn")
    batch_size = int(eval_cfg.batch_size)
    samples = int(eval_cfg.bootstrap_samples)
    epsilons = tuple(eval_cfg.noise_levels)
    template = config.refiner.template
    seed = int(config.seed)
    limit = max_examples if max_examples is not None else eval_cfg.examples
    if limit is not None and int(limit) < 1:
        raise ValueError(f"examples={limit}: evaluate at least one test problem")

    task = run.task()
    data_dir = config.task.data_dir or None
    examples = task.load("test", data_dir)
    examples = examples[:int(limit)] if limit is not None else examples
    generator_dir, generator, critic = load_run_models(run, task, batch_size, mesh=mesh)
    if critic is None:
        print(f"[eval] {os.path.join(workdir, 'critic')}/export not found: the trained-critic rows are left out")

    z0 = generator.greedy([ex.x for ex in examples])
    results = evaluate_refinement(task, generator, critic, None, examples, turns, template, samples, seed,
                                  initial=z0)
    answers, labels = baseline_answers(run, task, examples, generator, critic, turns, batch_size, mesh)
    baselines.add_baselines(task, examples, results, answers, labels, samples, seed)
    results["noise"] = noise_study(task, generator, None, examples, epsilons, turns, template, samples, seed,
                                   initial=z0)
    if eval_cfg.factorial:
        results["factorial"] = factorial(run, task, examples, generator, critic, turns, batch_size, initial=z0,
                                         mesh=mesh)
    results["seed"] = seed
    results["generator_stage"] = os.path.basename(generator_dir)
    results["workdir"] = os.path.abspath(workdir)
    results["training"] = results_lib.training_summary(workdir)
    if shd.is_main_process():  # every process of a multi-process run evaluates (on its own devices); one writes
        results_lib.write_results(results, out_dir or os.path.join(workdir, "eval"), workdir=workdir)
    return results


def factorial_run(workdir: str, max_examples: int | None = None, turns: int | None = None,
                  out_dir: str | None = None, mesh: Mesh | None = None) -> dict[str, Any]:
    """The inference factorial alone (`factorial`) of a trained run on its test problems, written as
    `factorial.json` and `factorial.md` to `out_dir` (default `<workdir>/eval`)."""
    config = run_config.load(workdir)
    run = RunInfo(workdir, config)
    task = run.task()
    examples = task.load("test", config.task.data_dir or None)[:int(max_examples or config.eval.examples)]
    _, generator, critic = load_run_models(run, task, int(config.eval.batch_size), mesh=mesh)
    block = factorial(run, task, examples, generator, critic, int(turns or config.eval.turns),
                      int(config.eval.batch_size), mesh=mesh)
    block["seed"], block["workdir"] = int(config.seed), os.path.abspath(workdir)
    if shd.is_main_process():
        out_dir = out_dir or os.path.join(workdir, "eval")
        os.makedirs(out_dir, exist_ok=True)
        atomic_files.write_json(os.path.join(out_dir, "factorial.json"), block, indent=2)
        atomic_files.write_text(os.path.join(out_dir, "factorial.md"), "\n".join(
            inference_factorial.factorial_markdown(block, results_lib.FACTORIAL_LABELS)))
    return block


def factorial(run: RunInfo, task: Task, examples: Sequence, generator: text_model.TextModel,
              critic: critics.Critic | None, turns: int, batch_size: int, initial: Sequence[str] | None = None,
              mesh: Mesh | None = None) -> dict[str, Any]:
    """`inference_factorial.run_factorial` on the run's REFINER generator and, when trained, its matched generator,
    with the run's calibrated critic (one threshold, calibrated on the REFINER generator)."""
    if not isinstance(critic, critics.CalibratedCritic):
        raise run_config.ConfigError(f"eval.factorial: {run.workdir} has no trained critic to cross with the oracle; "
                                     "train the critic stage first or leave eval.factorial off")
    generators: dict[str, Any] = {"refiner": generator}
    matched_dir = os.path.join(run.workdir, "matched")
    if os.path.isdir(os.path.join(matched_dir, "export")):
        lengths = run.lengths
        generators["matched"] = text_model.load_text_model(matched_dir, run.tokenizer(), lengths["refine_input"],
                                                           lengths["target"], lengths["refine_input"], batch_size,
                                                           mesh=mesh)
    return inference_factorial.run_factorial(
        task, generators, critic, examples, turns, run.config.refiner.template, int(run.config.eval.bootstrap_samples),
        int(run.config.seed), initial={"refiner": initial} if initial is not None else None)


def baseline_answers(run: RunInfo, task: Task, examples, generator: text_model.TextModel,
                     critic: critics.Critic | None, turns: int, batch_size: int, mesh: Mesh | None = None
                     ) -> tuple[dict[str, list[str]], dict[str, str]]:
    """({baseline key: one answer per problem}, {key: row label}) of the run's baselines (`refiner.baselines`):
    the critic's own answer (a solving critic only), each compared generator's (`baselines.COMPARED`, when its
    stage is trained) alone and with the trained and the oracle critic, and the generator's best of `turns` + 1
    samples (the REFINER stage's temperature and nucleus)."""
    config = run.config
    answers, labels = {}, dict(baselines.BASELINE_LABELS)
    if isinstance(critic, critics.SolverCritic):
        answers["critic_alone"] = [z for z, _, _ in critic.references(examples)]
        old_extra = config.critic.get("fresh_problems", 0)  # the critic alone learned from more problems
        if old_extra:
            labels["critic_alone"] += f", trained on {old_extra} generated problems more than the generator"
    lengths, with_critics = run.lengths, {"critic": critic, "oracle": critics.OracleCritic(task)}
    for stage, (key, name) in baselines.COMPARED.items():
        stage_dir = os.path.join(run.workdir, stage)
        if not os.path.isdir(os.path.join(stage_dir, "export")):
            if stage == "matched" or config.refiner.controls:
                print(f"[eval] {stage_dir}/export not found: the {key} rows are left out")
            continue
        model = text_model.load_text_model(stage_dir, run.tokenizer(), lengths["refine_input"], lengths["target"],
                                           lengths["refine_input"], batch_size, mesh=mesh)
        more, more_labels = baselines.refined_answers(
            task, model, key, name, {k: c for k, c in with_critics.items() if c is not None}, examples, turns,
            config.refiner.template)
        answers.update(more)
        labels.update({k: v for k, v in more_labels.items() if k not in labels})
    answers["generator_rerank"] = baselines.rerank_answers(generator, examples, turns + 1, config.refiner.temperature,
                                                           config.refiner.top_p, int(config.seed))
    labels["generator_rerank"] = labels["generator_rerank"].format(n=turns + 1)
    return answers, labels


def interactive_session(workdir: str, turns: int = 3, split: str = "test", use_critic: bool = True,
                        ask: Callable[[str], str] = input,
                        show: Callable[[str], None] = print) -> list[feedback_loop.Trajectory]:
    """`interactive_loop` over a trained run: its generator (REFINER, else warm-up), its critic's suggestions (when
    `use_critic` and the critic stage is trained) and the problems of `split`, one prompt at a time."""
    run = run_config.load_run(workdir)
    task = run.task()
    _, generator, suggest = load_run_models(run, task, batch_size=1, with_critic=use_critic)
    if use_critic and suggest is None:
        show(f"{os.path.join(workdir, 'critic', 'export')} not found: no critic suggestions (train the critic "
             "stage to get them)")
    examples = task.load(split, run.config.task.data_dir or None)
    return interactive_loop(task, generator, examples, suggest, turns, run.config.refiner.template, ask, show)
