"""A trained critic as a tool: feedback on hypotheses from any system (e.g. an LLM's answers).

    python launch/critic.py --workdir=RUN --input=in.jsonl --output=out.jsonl
    python launch/critic.py --workdir=RUN --input=in.jsonl --output=prompts.jsonl --render_prompt
    python launch/critic.py --workdir=RUN --reward_workdir=REWARD_RUN --input=in.jsonl --output=out.jsonl

Input: one JSON object per line, {"question": ..., "hypothesis": ...} plus an optional "id" (and "y", the gold
answer, for a task whose critic reads it: Moral Stories). The question and the hypothesis are written as the run's
task writes them; for MWP the question's numbers are masked as number0, number1, ... in order, and the hypothesis
is an equation over them, steps "#k: op ( a, b )" joined by " | " (op: add, subtract, multiply, divide; a and b:
numberK or an earlier step's result #j). An MWP record:

    {"question": "Ann has number0 pens and buys number1 more . How many ?", "hypothesis": "#0: add ( number0, number1 )"}

Output: the same records in the same order with "feedback" added; with --reward_workdir, that reward run's PRM also
scores every step and "located_step" names the first one below its threshold (-1: none; the threshold the run chose
on validation samples for the first-error study, or --step_threshold), with "step_scores" and the critic's
"located_feedback" on that step; with --render_prompt a few-shot "prompt" that asks an LLM to revise the hypothesis
given the feedback (built-in demonstrations for MWP only, other tasks get a zero-shot prompt; --demos=FILE.jsonl
with question / hypothesis / feedback / revision per line gives or replaces them).

A line the tool cannot read (not JSON, a missing field, a hypothesis the task cannot parse, such as plain text for
MWP) is not judged: its output line is {"line": N, "error": "..."} with the fields it had, and one summary line on
stderr counts them. The exit status is 0 when at least one record was judged (the errors are in the output), and 2
with one `error:` line, writing nothing, when none could be read or a flag, the run or a file is wrong.

The critic says "No hint" by the threshold calibrated for it when its run finished training
(`<workdir>/critic/calibration.json`); a critic without one is refused unless --threshold gives it. Inputs longer
than the critic's token budget are reported (raise it with --max_input). The output is written to a temp file that
replaces --output once complete. The logic lives in `refiner_jax.refiner.critic_tool`.
"""
import os

from absl import flags

from refiner_jax.runs import cli, run_config, seed_pool
from refiner_jax.runs.run_config import ConfigError
from refiner_jax.refiner import critic_tool, critics

_WORKDIR = flags.DEFINE_string("workdir", None, "Trained run directory holding critic/export.")
_INPUT = flags.DEFINE_string("input", None, "JSONL with question and hypothesis per line (see the record above).")
_OUTPUT = flags.DEFINE_string("output", None, "JSONL to write (records + feedback [+ prompt], or + error).")
_RENDER = flags.DEFINE_bool("render_prompt", False, "Also write an LLM refinement prompt per record.")
_DEMOS = flags.DEFINE_string("demos", None, "JSONL of demonstrations for the prompt (replaces the built-in ones).")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Critic batch size.")
_MAX_INPUT = flags.DEFINE_integer("max_input", None, "Token budget of a critic input (question + hypothesis); "
                                  "default: the run's lengths.critic_input.")
_THRESHOLD = flags.DEFINE_float("threshold", None, "The critic's \"No hint\" threshold, instead of the calibrated "
                                "one (required when the run has none): a feedback critic says \"No hint\" when its "
                                "log-probability of it reaches this; a solving critic when its confidence in the "
                                "hypothesis does (0: as likely as its own answer).")
_REWARD = flags.DEFINE_string("reward_workdir", None, "A reward run whose PRM locates the first doubtful step.")
_STEP_THRESHOLD = flags.DEFINE_float("step_threshold", None, "PRM step score below which a step is doubtful "
                                     "(default: the reward run's, from eval/first_error_predictions.json).")
flags.mark_flags_as_required(["workdir", "input", "output"])


def _locator(reward_workdir: str, task, threshold: float | None):
    """The PRM of a reward run as a `critic_tool.Locator`."""
    import json

    import numpy as np

    from refiner_jax.reward import first_error
    from refiner_jax.reward.scorer import load_reward_model

    reward = run_config.load_run(reward_workdir)
    if threshold is None:
        path = os.path.join(reward_workdir, seed_pool.FIRST_ERROR_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} is missing: evaluate the reward run first or pass --step_threshold")
        with open(path, encoding="utf-8") as f:
            threshold = float(json.load(f)["thresholds"]["prm"])
    prm = load_reward_model(os.path.join(reward_workdir, "prm"), reward.tokenizer(), task,
                            reward.lengths["input"], reward.lengths["target"])

    def locate(questions, hypotheses):
        steps = prm.step_scores(questions, hypotheses)
        return first_error.first_below([np.asarray(s) for s in steps], threshold).tolist(), steps

    return locate


def main(argv):
    if _BATCH.value < 1:
        raise ConfigError(f"--batch_size={_BATCH.value}: must be >= 1")
    if _MAX_INPUT.value is not None and _MAX_INPUT.value < 2:
        raise ConfigError(f"--max_input={_MAX_INPUT.value}: must be >= 2 tokens")
    out_dir = os.path.dirname(os.path.abspath(_OUTPUT.value))
    if not os.path.isdir(out_dir):
        raise ConfigError(f"--output={_OUTPUT.value}: the folder {out_dir} does not exist; create it first")
    run = run_config.load_run(_WORKDIR.value)
    threshold = critic_tool.calibrated_threshold(_WORKDIR.value, _THRESHOLD.value)
    task = run.task()
    critic_tool.readable_input(task, _INPUT.value)  # no record readable: an error before loading the model
    demos = critic_tool.read_demonstrations(_DEMOS.value) if _DEMOS.value else None
    locate = _locator(_REWARD.value, task, _STEP_THRESHOLD.value) if _REWARD.value else None
    if _RENDER.value and demos is None and not critic_tool.prompt_format(task.name).demonstrations:
        print(f"note: task {task.name!r} has no built-in demonstrations; the prompts are zero-shot (give some "
              "with --demos=FILE.jsonl)")
    critic = critics.load_critic(run, task, batch_size=_BATCH.value)
    critic.threshold = threshold
    if _MAX_INPUT.value is not None:
        critic.model.max_input = _MAX_INPUT.value
    result = critic_tool.run_tool(critic, critic.task, _INPUT.value, _OUTPUT.value, render=_RENDER.value,
                                  demonstrations=demos, locate=locate)
    print(f"wrote feedback for {result.written} records to {_OUTPUT.value}"
          + (f" and {len(result.problems)} unread lines with an \"error\" field" if result.problems else ""))


if __name__ == "__main__":
    cli.run(main)
