"""The REFINER run pipeline: config validation before any compile, the stages end to end on a tiny model,
skip-finished-stages, resume of an interrupted stage, and the REFINER turn construction against a hand-traced
example."""
import json
import os
import re
import shutil

import jax
import numpy as np
import pytest

from refiner_jax import checkpoint as ckpt_lib
from refiner_jax.tasks import get_task
from refiner_jax.tasks.base import Example, feedback_matches
from refiner_jax.refiner import stage_data
from refiner_jax.runs import refiner_run, run_setup
from refiner_jax.runs import run_config as config_lib


def tiny_config():
    c = config_lib.base_config()
    c.task.options = {"synthetic_sizes": {"train": 256, "val": 32, "test": 32}}
    c.tokenizer.vocab_size = 512
    c.lengths.input, c.lengths.target, c.lengths.refine_input = 48, 24, 64
    c.lengths.critic_input, c.lengths.feedback = 64, 16
    for stage in (c.critic, c.warmup, c.refiner):
        stage.steps, stage.eval_every, stage.batch_size, stage.eval_examples = 4, 2, 8, 8
        stage.optimizer.warmup_steps = 1
    c.refiner.batch_size = 4
    c.checkpoint.every = 2
    c.eval.batch_size = 16
    c.log_every = 2
    return c


@pytest.mark.parametrize("field,value,message", [
    ("model.preset", "t5-huge", "config.model.preset: unknown preset 't5-huge'"),
    ("refiner.template", "{x} {z}", r"config.refiner.template: must contain \{f\}"),
    ("refiner.top_p", 0.0, "config.refiner.top_p"),
    ("critic.optimizer.name", "sgd", "config.critic.optimizer.name: 'sgd' is not supported"),
    ("tokenizer.kind", "hf", "config.tokenizer.path: an hf tokenizer needs"),
    ("warmup.microbatches", 3, "config.warmup.microbatches"),
    ("refiner.template", "{x} {z} {f} {answer}", r"config.refiner.template: unknown fields \['answer'\]"),
    ("refiner.template", "{x} {z} {f} }", "config.refiner.template: Single '}'"),
    ("eval.examples", 0, "config.eval.examples: must be >= 1"),
    ("eval.bootstrap_samples", 0, "config.eval.bootstrap_samples"),
    ("checkpoint.every", 0, "config.checkpoint.every: must be >= 1"),
    ("checkpoint.keep", 0, "config.checkpoint.keep: must be >= 1"),
    ("log_every", 0, "config.log_every: must be >= 1"),
    ("model.dtype", "bf16", "config.model.dtype: 'bf16' is not a dtype"),
    ("model.share_prompt_cache", True, "config.model.share_prompt_cache: applies to decoder-only models"),
    ("model.param_dtype", "bf16", "config.model.param_dtype: 'bf16' is not a dtype"),
    ("model.param_dtype", "checkpoint", "config.model.param_dtype: 'checkpoint' keeps .* model.checkpoint is empty"),
    ("critic.eval_examples", 0, "config.critic.eval_examples: must be >= 1"),
    ("critic.mode", "judge", "config.critic.mode: 'judge' is not a critic mode"),
    ("critic.fresh_problems", 60000, "config.critic.fresh_problems: was replaced by task.extra_problems"),
    ("task.extra_problems", -1, "config.task.extra_problems: must be >= 0"),
    ("critic.optimizer.grad_clip_norm", -1.0, "config.critic.optimizer.grad_clip_norm: must be >= 0"),
    ("warmup.optimizer.weight_decay", -0.1, "config.warmup.optimizer.weight_decay: must be >= 0"),
    ("refiner.optimizer.warmup_steps", -1, "config.refiner.optimizer.warmup_steps: must be >= 0"),
    ("refiner.optimizer.warmup_steps", 10, "config.refiner.steps: 4 must exceed refiner.optimizer.warmup_steps"),
    ("logical_axis_rules", (("embed", "model"),), r"config.logical_axis_rules: .*'embed' names mesh axes \['model'\]"),
])
def test_bad_config_is_rejected_before_anything_runs(tmp_path, field, value, message):
    c = tiny_config()
    *sections, name = field.split(".")
    node = c
    for part in sections:
        node = node[part]
    node[name] = value
    with pytest.raises(config_lib.ConfigError, match=message):
        refiner_run.run(c, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # nothing was created, let alone trained


def test_batch_sizes_are_checked_against_the_mesh():
    c = tiny_config()  # critic and warm-up 8 rows, REFINER 4 problems x 3 turns = 12 rows per update
    config_lib.validate_for_mesh(c, batch_shards=4)
    with pytest.raises(config_lib.ConfigError, match=r"config.critic.batch_size: 8 = 8 rows .* multiple of 16"):
        config_lib.validate_for_mesh(c, batch_shards=16)
    c.critic.batch_size = c.warmup.batch_size = 16
    with pytest.raises(config_lib.ConfigError,
                       match=r"config.refiner.batch_size: 4 x refiner.turns 3 = 12 rows .* multiple of 8"):
        config_lib.validate_for_mesh(c, batch_shards=8)
    c.refiner.batch_size = 8
    config_lib.validate_for_mesh(c, batch_shards=8)
    c.warmup.microbatches = 4
    with pytest.raises(config_lib.ConfigError, match=r"config.warmup.batch_size: .*multiple of 32"):
        config_lib.validate_for_mesh(c, batch_shards=8)
    with pytest.raises(config_lib.ConfigError, match="config.critic.batch_size: 8 does not split over the 3 proc"):
        config_lib.validate_for_mesh(tiny_config(), batch_shards=1, processes=3)


def test_missing_prerequisites_and_data_name_the_fix(tmp_path):
    with pytest.raises(config_lib.ConfigError, match=r"refiner stage starts from the warmed-up generator, so run "
                                                     r"the warmup stage first \(--stages=warmup,refiner"):
        refiner_run.run(tiny_config(), str(tmp_path / "a"), stages=("refiner",))
    assert not (tmp_path / "a").exists()
    with pytest.raises(config_lib.ConfigError, match="gs://B/run is a URL"):
        refiner_run.run(tiny_config(), "gs://B/run")
    c = tiny_config()
    c.task.options = {"synthetic_sizes": {"train": 6, "val": 4, "test": 4}}
    with pytest.raises(config_lib.ConfigError, match="config.critic.batch_size: 8 is more than the 6 training"):
        refiner_run.run(c, str(tmp_path / "b"))
    # A setup that failed records no config, so the corrected rerun is not refused as a "different config.task".
    assert not (tmp_path / "b" / "config.json").exists()
    c.task.options = {"synthetic_sizes": {"train": 7, "val": 4, "test": 4}}
    with pytest.raises(config_lib.ConfigError, match="config.critic.batch_size: 8 is more than the 7 training"):
        refiner_run.run(c, str(tmp_path / "b"))


def test_a_relative_data_dir_is_recorded_absolute(tmp_path, monkeypatch):
    """Evaluation and the tools read the saved config from any directory, so the data folder is saved absolute;
    a run recorded with a relative path still resumes from the directory it was started in."""
    monkeypatch.chdir(tmp_path)
    c = tiny_config()
    c.task.data_dir = "svamp_csvs"  # relative, and missing
    with pytest.raises(Exception, match=re.escape(str(tmp_path / "svamp_csvs"))):
        refiner_run.run(c, str(tmp_path / "run"))
    assert c.task.data_dir == str(tmp_path / "svamp_csvs")
    old = json.loads(c.to_json())
    old["task"]["data_dir"] = "svamp_csvs"
    assert not (tmp_path / "run").exists()  # the missing data stopped the run before its workdir was made
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps(old))
    assert run_setup._check_workdir_config(str(tmp_path / "run"), c) is True


def test_refiner_turns_follow_the_oracle(monkeypatch):
    """One REFINER batch traced by hand: turn 1 is (x -> z*); the next turns carry a sampled hypothesis and the
    oracle's feedback on it in the template, always with the gold z* as target."""
    task = get_task("mwp")
    ex = Example("p0", "Tom has number0 apples and buys number1 more . How many apples ?",
                 "#0: add ( number0, number1 )", "7", {"numbers": [3.0, 4.0]})

    class FakeGenerator:  # the current generator as seen by the stage: always proposes these samples
        config, tokenizer, max_input, max_output, bucket, mesh = None, None, 8, 8, 8, None

    proposals = ["#0: subtract ( number0, number1 )", "#0: add ( number1, number0 )"]

    def fake_generate(self, texts, *, num_samples, top_p, temperature, rng):
        assert top_p == 0.5 and num_samples == 2
        return [list(proposals) for _ in texts]

    monkeypatch.setattr(stage_data.TextModel, "generate", fake_generate)
    cfg = config_lib.base_config().refiner
    cfg.turns, cfg.samples, cfg.selection = 3, 2, "worst"
    make = stage_data.refiner_pairs(task, [ex], FakeGenerator(), cfg, seed=0)
    pairs = make(None, np.array([0]), step=0)
    assert [t for _, t in pairs] == [ex.z] * 3
    assert pairs[0][0] == ex.x
    # "worst" picks the subtraction; its oracle feedback names the wrong operator of step #0.
    expected = f"{ex.x} Previous Answer: #0: subtract ( number0, number1 ) Feedback: The operator in #0 is incorrect."
    assert pairs[1][0] == expected and pairs[2][0] == expected


def test_feedback_match_ignores_sentence_order():
    assert feedback_matches("The operator in #1 is incorrect. The first number in #0 is incorrect.",
                            "The first number in #0 is incorrect.  The operator in #1 is incorrect.")
    assert not feedback_matches("The operator in #1 is incorrect.", "The operator in #0 is incorrect.")


def test_critic_pairs_are_resumable():
    task = get_task("mwp", synthetic_sizes={"train": 32, "val": 8, "test": 8})
    train = task.load("train")
    make = stage_data.critic_pairs(task, train, seed=3)
    a = make(None, np.arange(16), step=5)
    b = make(None, np.arange(16), step=5)
    assert a == b  # the same step draws the same perturbations after a restart
    assert a != make(None, np.arange(16), step=6)
    for ex, (critic_input, feedback) in zip(train[:16], a):
        prefix = task.critic_input(ex, "")
        assert critic_input.startswith(prefix)
        assert feedback == task.oracle_feedback(ex, critic_input[len(prefix):]).text  # the target is the oracle's
    assert {f for _, f in a} - {"No hint"}  # some of them are perturbed


def test_balanced_critic_pairs_give_each_problem_a_right_and_a_wrong_hypothesis():
    task = get_task("mwp", synthetic_sizes={"train": 32, "val": 8, "test": 8})
    train = task.load("train")
    pairs = stage_data.critic_pairs(task, train, seed=1, balanced=True)(None, np.arange(10), step=3)
    assert len(pairs) == 10
    for k, ex in enumerate(train[:5]):  # problems 0-4, two rows each
        prefix = task.critic_input(ex, "")
        rows = pairs[2 * k:2 * k + 2]
        assert all(x.startswith(prefix) for x, _ in rows)
        assert sorted(f == "No hint" for _, f in rows) == [False, True]
        for x, f in rows:
            assert f == task.oracle_feedback(ex, x[len(prefix):]).text

    class FakeGenerator:  # right for the first problem, wrong for the second
        def generate(self, texts, *, top_p, temperature, rng):
            return [["#0: add ( number1, number0 )"], ["#0: subtract ( number0, number1 )"]][:len(texts)]

    ex = Example("p0", "Tom has number0 apples and buys number1 more . How many apples ?",
                 "#0: add ( number0, number1 )", "7", {"numbers": [3.0, 4.0]})
    pairs = stage_data.critic_pairs(task, [ex] * 4, 0, FakeGenerator(), generator_fraction=1.0,
                                    balanced=True)(None, np.arange(4), step=0)
    assert [f == "No hint" for _, f in pairs] == [True, False, False, True]
    assert pairs[0][0].endswith("#0: add ( number1, number0 )")
    assert pairs[2][0].endswith("#0: subtract ( number0, number1 )")


def test_critic_pairs_from_the_generator_carry_the_oracle_feedback():
    task = get_task("mwp")
    ex = Example("p0", "Tom has number0 apples and buys number1 more . How many apples ?",
                 "#0: add ( number0, number1 )", "7", {"numbers": [3.0, 4.0]})
    seen = []

    class FakeGenerator:  # the warmed-up generator: a wrong answer, then the right one (commuted)
        def generate(self, texts, *, top_p, temperature, rng):
            seen.append((list(texts), top_p, temperature))
            return [["#0: subtract ( number0, number1 )"], ["#0: add ( number1, number0 )"]][:len(texts)]

    make = stage_data.critic_pairs(task, [ex] * 4, 0, FakeGenerator(), generator_fraction=0.5, top_p=0.9)
    pairs = make(None, np.arange(4), step=2)
    assert seen == [([ex.x, ex.x], 0.9, 1.0)]  # half of the batch is sampled, in one call
    assert pairs[0] == (f"{ex.x} #0: subtract ( number0, number1 )", "The operator in #0 is incorrect.")
    assert pairs[1] == (f"{ex.x} #0: add ( number1, number0 )", "No hint")
    assert pairs[2:] == stage_data.critic_pairs(task, [ex] * 4, 0)(None, np.arange(4), step=2)[:2]
    with pytest.raises(ValueError, match="needs the generator"):
        stage_data.critic_pairs(task, [ex], 0, None, generator_fraction=0.5)


def test_warmup_mixes_in_revision_instances_from_perturbations():
    task = get_task("mwp", synthetic_sizes={"train": 32, "val": 8, "test": 8})
    train = task.load("train")
    make = stage_data.warmup_pairs(train, task, feedback_fraction=0.25, template="{x} @@ {z} @@ {f}", seed=1)
    pairs = make(None, np.arange(8), step=4)
    assert pairs == make(None, np.arange(8), step=4)  # resumable: the step fixes the perturbations
    assert [t for _, t in pairs] == [ex.z for ex in train[:8]]  # always the gold as target
    assert [x for x, _ in pairs[2:]] == [ex.x for ex in train[2:8]]
    for (x, _), ex in zip(pairs[:2], train):
        problem, hypothesis, feedback = x.split(" @@ ")
        assert problem == ex.x and feedback == task.oracle_feedback(ex, hypothesis).text
    assert stage_data.warmup_pairs(train, task)(None, np.arange(3), 0) == [(ex.x, ex.z) for ex in train[:3]]


def test_critic_from_generator_samples_needs_the_warmup_first(tmp_path):
    c = tiny_config()
    c.critic.generator_fraction = 0.5
    with pytest.raises(config_lib.ConfigError, match="run the warmup stage first"):
        refiner_run.run(c, str(tmp_path / "run"), stages=("critic",))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_all_stages_run_skip_and_resume(tmp_path, capsys):
    c = tiny_config()
    assert c.critic.generator_fraction > 0 and c.warmup.feedback_fraction > 0  # both paths run end to end
    workdir = str(tmp_path / "run")
    results = refiner_run.run(c, workdir, stages=("critic", "warmup", "refiner"))
    for stage in ("critic", "warmup", "refiner"):
        assert os.path.exists(os.path.join(workdir, stage, "DONE"))
        assert os.path.isdir(os.path.join(workdir, stage, "export", "params"))
    assert 0.0 <= results["critic"]["feedback_em"] <= 1.0
    assert "equation_em_canonical" in results["warmup"]
    lines = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
    assert {l["stage"] for l in lines} == {"critic", "warmup", "refiner"}
    assert any("loss" in l and np.isfinite(l["loss"]) for l in lines)
    # A second run skips every finished stage (nothing is retrained) ...
    mtime = os.path.getmtime(os.path.join(workdir, "critic", "DONE"))
    again = refiner_run.run(c, workdir, stages=("critic", "warmup", "refiner"))
    assert again["critic"] == results["critic"]
    assert os.path.getmtime(os.path.join(workdir, "critic", "DONE")) == mtime
    # ... an interrupted stage resumes from its last checkpoint and ends where the uninterrupted run ended ...
    refiner_dir = os.path.join(workdir, "refiner")
    exported, _ = ckpt_lib.load_params(os.path.join(refiner_dir, "export"))
    steps = sorted(int(d) for d in os.listdir(os.path.join(refiner_dir, "ckpt")) if d.isdigit())
    assert steps[-2:] == [2, 4]
    shutil.rmtree(os.path.join(refiner_dir, "ckpt", "4"))
    shutil.rmtree(os.path.join(refiner_dir, "export"))
    os.remove(os.path.join(refiner_dir, "DONE"))
    capsys.readouterr()
    resumed = refiner_run.run(c, workdir, stages=("critic", "warmup", "refiner"))
    assert "[refiner] resumed from step 2" in capsys.readouterr().out
    assert resumed["refiner"] == results["refiner"]
    jax.tree.map(np.testing.assert_array_equal, ckpt_lib.load_params(os.path.join(refiner_dir, "export"))[0],
                 exported)
    # ... and refuses a config that would make them meaningless.
    c2 = tiny_config()
    c2.model.preset = "t5-small"
    with pytest.raises(config_lib.ConfigError, match="different config.model"):
        refiner_run.run(c2, workdir, stages=("critic",))


@pytest.mark.slow
def test_solve_mode_critic_trains_on_fresh_problems_and_is_calibrated(tmp_path):
    from refiner_jax.refiner import critics

    c = tiny_config()
    c.critic.mode, c.task.extra_problems, c.critic.calibration_examples = "solve", 64, 12
    workdir = str(tmp_path / "run")
    results = refiner_run.run(c, workdir, stages=("warmup", "critic"))
    assert 0.0 <= results["critic"]["paired_auroc"] <= 1.0 and "feedback_em/any_error" in results["critic"]
    calibration = json.load(open(os.path.join(workdir, "critic", critics.CALIBRATION_FILE)))
    assert calibration["generator"] == "warmup" and calibration["n"] == 12
    assert calibration["after"] >= calibration["before"]  # "never intervene" is one of the candidate thresholds
    critic = critics.load_critic(config_lib.load_run(workdir))
    assert isinstance(critic, critics.SolverCritic) and critic.threshold == calibration["threshold"]
    assert critic.model.max_input == c.lengths.input and critic.model.max_output == c.lengths.target
    # The critic learned x -> z* on train plus the extra problems: one epoch is (256 + 64) / 8 = 40 steps.
    task = config_lib.load_run(workdir).task()
    assert len(task.fresh_problems(64)) == 64
    feedback = critic.feedback(task.load("val")[:4], ["#0: add ( number0, number1 )"] * 4)
    assert len(feedback) == 4 and all(isinstance(f, str) and f for f in feedback)


def test_extra_problems_feed_every_model_and_the_matched_generator_gets_their_steps(tmp_path, monkeypatch):
    """Every stage learns from train + `task.extra_problems`; the matched generator trains like the warm-up for
    warmup + critic + refiner steps (stages recorded, not trained)."""
    specs = {}

    def record(spec, init_params, **_):
        specs[spec.name] = spec
        return {}

    monkeypatch.setattr(refiner_run, "train_stage", record)
    c = tiny_config()
    c.critic.mode, c.task.extra_problems = "solve", 16
    c.warmup.steps, c.critic.steps, c.refiner.steps = 6, 5, 4
    refiner_run.run(c, str(tmp_path / "run"), stages=("warmup", "critic", "matched"))
    assert sorted(specs) == ["critic", "matched", "warmup"]
    assert {name: spec.num_examples for name, spec in specs.items()} == {"warmup": 272, "critic": 272,
                                                                         "matched": 272}
    matched, warmup = specs["matched"].stage, specs["warmup"].stage
    assert matched.steps == 6 + 5 + 4 and warmup.steps == 6
    assert (matched.batch_size, matched.optimizer) == (warmup.batch_size, warmup.optimizer)
    task = get_task("mwp", **c.task.options)
    splits = {ex.x for split in ("train", "val", "test") for ex in task.load(split)}
    pairs = specs["matched"].make_pairs(None, np.arange(256, 272), 0)
    assert len(pairs) == 16 and all(t and x not in splits for x, t in pairs[8:])  # the extra problems, unseen


def test_extra_problems_without_a_generator_stop_before_anything_is_recorded(tmp_path, shared_data):
    """SVAMP read from its files has no problem generator: asking for extra problems is a config error raised
    before the workdir records a config, so the same workdir then runs with the field fixed."""
    c = tiny_config()
    c.task.options = {"lowercase": True}
    c.task.data_dir = str(shared_data / "svamp" / "mawps-asdiv-a_svamp")
    c.task.extra_problems = 5
    workdir = tmp_path / "run"
    with pytest.raises(config_lib.ConfigError, match=r"config.task.extra_problems: 5 .* task.data_dir has no problem"):
        refiner_run.run(c, str(workdir), stages=("warmup",))
    assert not (workdir / config_lib.CONFIG_FILE).exists()
    c.task.extra_problems, c.warmup.steps = 0, 2
    refiner_run.run(c, str(workdir), stages=("warmup",))
    assert (workdir / "warmup" / "DONE").exists()

def test_a_workdir_whose_critic_alone_had_extra_problems_loads_but_does_not_resume(tmp_path):
    old = json.loads(tiny_config().to_json())
    old["critic"]["fresh_problems"] = 60000
    del old["task"]["extra_problems"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert config_lib.load(str(tmp_path)).critic.fresh_problems == 60000  # evaluation reads it
    with pytest.raises(config_lib.ConfigError, match="critic.fresh_problems=60000: .* train in a fresh --workdir"):
        refiner_run.run(tiny_config(), str(tmp_path))


def test_model_critic_prefers_no_hint_when_it_is_the_more_likely_sequence():
    """Greedy commits to the shared first token of the error sentences; the critic compares whole sequences."""
    from refiner_jax.refiner.critics import ModelCritic

    table = {("a", "No hint"): -0.5, ("a", "The operator in #0 is incorrect."): -0.9,
             ("b", "No hint"): -2.0, ("b", "The operator in #0 is incorrect."): -0.3}

    class FakeModel:  # log-probs: problem 0 favours "No hint", problem 1 the error sentence
        def generate_with_log_probs(self, texts):
            out = "The operator in #0 is incorrect."
            return [[out] for _ in texts], np.array([[table[(t[0], out)]] for t in texts])

        def score(self, texts, targets):
            return np.array([table[(t[0], y)] for t, y in zip(texts, targets)])

    class Task:
        def critic_input(self, ex, h):
            return ex.x + " " + h

    examples = [Example("0", "a", "", ""), Example("1", "b", "", "")]
    critic = ModelCritic(FakeModel(), Task())
    assert critic.feedback(examples, ["z", "z"]) == ["No hint", "The operator in #0 is incorrect."]
    critic.prefer_no_hint = False
    assert critic.feedback(examples, ["z", "z"]) == ["The operator in #0 is incorrect."] * 2


@pytest.mark.parametrize("path,variant,data", [
    ("refiner_mwp.py", None, ""), ("refiner_mwp.py", "svamp", "svamp/mawps-asdiv-a_svamp"),
    ("refiner_mwp.py", "paper", "svamp/mawps-asdiv-a_svamp"), ("refiner_snlr.py", None, ""),
    ("refiner_snlr.py", "released", "refiner/srn"), ("refiner_snlr.py", "t5", ""),
    ("refiner_moral.py", None, "refiner/moral_stories"), ("refiner_moral.py", "t5", "refiner/moral_stories"),
    ("refiner_mwp.py", "t5", ""), ("rm_mwp.py", None, ""), ("rm_mwp.py", "t5", ""), ("rm_mwp.py", "small", ""),
    ("rm_gsm8k.py", None, "gsm8k"),
    ("rm_gsm8k.py", "paper", "gsm8k")])
def test_shipped_configs_are_valid(monkeypatch, path, variant, data):
    import importlib.util
    import pathlib

    monkeypatch.delenv("REFINER_DATA", raising=False)
    repo = pathlib.Path(__file__).resolve().parents[1]
    file = repo / "configs" / path
    spec = importlib.util.spec_from_file_location(f"config_{path}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(variant)
    config_lib.validate(config)
    # Data folders are absolute, the shared datasets beside the checkout: a saved config works from any directory.
    assert config.task.data_dir == (str(repo.parent / "shared" / "data" / data) if data else "")
    with pytest.raises(ValueError, match="variant"):
        module.get_config("no-such-variant")


def test_paper_settings_name_a_real_tokenizer_repository():
    config = config_lib.base_config()
    config_lib.use_paper_settings(config, "unifiedqa-t5-base")
    assert config.tokenizer.path == "allenai/unifiedqa-t5-base"  # the preset name itself is no hub repository


def test_generator_targets_carry_the_moral_action():
    """Moral Stories' generator writes the norm and then the moral action; the training pairs must teach both,
    in the format that the task's own metrics read."""
    task = get_task("moral_stories")
    ex = Example("m0", "<|SIT|> Ann found a wallet. <|INT|> Ann wants money. <|NRM|>", "It's good to return "
                 "lost things.", "Ann returns the wallet to its owner.", {})
    target = "It's good to return lost things. <|M_ACT|> Ann returns the wallet to its owner."
    assert task.target(ex) == target
    pairs = stage_data.warmup_pairs([ex] * 4, task, feedback_fraction=0.5, seed=0)(None, np.arange(4), 0)
    assert [t for _, t in pairs] == [target] * 4
    scores = task.score([target], [ex])
    assert scores["norm_rougeL"] == scores["action_rougeL"] == 1.0
    assert task.score([ex.z], [ex])["action_rougeL"] == 0.0  # the norm alone earns no action credit


def test_texts_over_the_token_budget_are_reported():
    from refiner_jax.tokenizers import ByteTokenizer
    from refiner_jax.training.loop import truncation_warning

    tok = ByteTokenizer()  # one id per byte, then EOS
    pairs = [("abcdef", "xy"), ("ab", "xyz")]
    assert truncation_warning("critic", tok, pairs, input_len=7, target_len=4) is None  # 6 + EOS fits 7
    assert truncation_warning("critic", tok, pairs, input_len=4, target_len=3) == (
        "[critic] 1 of 2 inputs are longer than 4 tokens (up to 7); 1 of 2 targets are longer than 3 tokens (up to 4) "
        "and are cut to fit; raise the budgets in config.lengths")
