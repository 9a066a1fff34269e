"""A trained critic as a tool: feedback on hypotheses from any system (e.g. an LLM's answers).

    python launch/critic.py --workdir=RUN --input=in.jsonl --output=out.jsonl
    python launch/critic.py --workdir=RUN --input=in.jsonl --output=prompts.jsonl --render_prompt

Input: one JSON object per line, {"question": ..., "hypothesis": ...} plus an optional "id". Output: the same
records with "feedback" added, and with --render_prompt a few-shot "prompt" that asks an LLM to revise the
hypothesis given the feedback (built-in demonstrations for MWP only, other tasks get a zero-shot prompt;
--demos=FILE.jsonl with question / hypothesis / feedback / revision per line gives or replaces them). Inputs longer
than the critic's token budget are reported (raise it with --max_input). The output is written to a temp file
that replaces --output once complete; bad input lines are reported one by one and skipped, and make the exit
status 1. The logic lives in
`refiner_jax.refiner.critic_tool`.
"""
import os

from absl import app, flags

from refiner_jax.runs import run_config
from refiner_jax.refiner import critic_tool, critics

_WORKDIR = flags.DEFINE_string("workdir", None, "Trained run directory holding critic/export.")
_INPUT = flags.DEFINE_string("input", None, "JSONL with question and hypothesis per line.")
_OUTPUT = flags.DEFINE_string("output", None, "JSONL to write (records + feedback [+ prompt]).")
_RENDER = flags.DEFINE_bool("render_prompt", False, "Also write an LLM refinement prompt per record.")
_DEMOS = flags.DEFINE_string("demos", None, "JSONL of demonstrations for the prompt (replaces the built-in ones).")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Critic batch size.")
_MAX_INPUT = flags.DEFINE_integer("max_input", None, "Token budget of a critic input (question + hypothesis); "
                                  "default: the run's lengths.critic_input.")
flags.mark_flags_as_required(["workdir", "input", "output"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _BATCH.value < 1:
        raise app.UsageError(f"--batch_size={_BATCH.value}: must be >= 1")
    if _MAX_INPUT.value is not None and _MAX_INPUT.value < 2:
        raise app.UsageError(f"--max_input={_MAX_INPUT.value}: must be >= 2 tokens")
    out_dir = os.path.dirname(os.path.abspath(_OUTPUT.value))
    if not os.path.isdir(out_dir):
        raise SystemExit(f"error: --output {_OUTPUT.value}: the folder {out_dir} does not exist; create it first")
    try:
        run = run_config.load_run(_WORKDIR.value)
        task = run.task()
        critic_tool.usable_records(task, _INPUT.value)  # fail when no record is usable before loading the model
        demos = critic_tool.read_demonstrations(_DEMOS.value) if _DEMOS.value else None
    except (critic_tool.CriticInputError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from e
    if _RENDER.value and demos is None and not critic_tool.prompt_format(task.name).demonstrations:
        print(f"note: task {task.name!r} has no built-in demonstrations; the prompts are zero-shot (give some "
              "with --demos=FILE.jsonl)")
    critic = critics.load_critic(run, task, batch_size=_BATCH.value)
    if _MAX_INPUT.value is not None:
        critic.model.max_input = _MAX_INPUT.value
    result = critic_tool.run_tool(critic, critic.task, _INPUT.value, _OUTPUT.value, render=_RENDER.value,
                                  demonstrations=demos)
    print(f"wrote feedback for {result.written} records to {_OUTPUT.value}")
    if result.problems:
        raise SystemExit(f"error: skipped {len(result.problems)} bad line(s) of {_INPUT.value} (listed above); "
                         "fix them and rerun for those records")


if __name__ == "__main__":
    app.run(main)
