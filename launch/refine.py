"""Interactive refinement: you are the critic.

    python launch/refine.py --workdir=/tmp/refiner_mwp

Pick a test problem (or type one; MWP problems write their numbers as number0, number1, ...), read the generator's
hypothesis and the trained critic's suggested feedback, then type your own feedback, press Enter to use the
suggestion, or type "ok" (or "No hint") to accept the hypothesis. The generator revises until you accept or
--turns revisions are done. The logic lives in `refiner_jax.critic_tool.interactive_loop`.
"""
import os

from absl import app, flags

from refiner_jax import critic_tool, evaluate, refine

_WORKDIR = flags.DEFINE_string("workdir", None, "Trained run directory.")
_TURNS = flags.DEFINE_integer("turns", 3, "Most revisions per problem.")
_SPLIT = flags.DEFINE_string("split", "test", "Split whose problems are offered (train, val, test).")
_NO_CRITIC = flags.DEFINE_bool("no_critic", False, "Do not load the trained critic (no suggestions).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    workdir = _WORKDIR.value
    run = refine.RunInfo.load(workdir)
    task = run.task()
    lengths = run.lengths
    tokenizer = run.tokenizer()
    generator = refine.load_text_model(evaluate.generator_stage_dir(workdir), tokenizer,
                                       lengths["refine_input"], lengths["target"], lengths["bucket"], batch_size=1)
    suggest = None
    if not _NO_CRITIC.value and os.path.isdir(os.path.join(workdir, "critic", "export")):
        suggest = refine.ModelCritic(refine.load_text_model(os.path.join(workdir, "critic"), tokenizer,
                                                            lengths["critic_input"], lengths["feedback"],
                                                            lengths["bucket"], batch_size=1), task)
    examples = task.load(_SPLIT.value, run.config["task"].get("data_dir") or None)
    template = run.config.get("refiner", {}).get("template", critic_tool.DEFAULT_REFINE_TEMPLATE)
    critic_tool.interactive_loop(task, generator, examples, suggest, _TURNS.value, template)


if __name__ == "__main__":
    app.run(main)
