"""The paper-scale configs on CPU at their real model shapes, from random-weight checkpoints written here with
transformers (no network): `configs/refiner_mwp.py:paper` (a UnifiedQA-T5-base-shaped generator) and
`configs/rm_gsm8k.py:paper` with a Qwen3-0.6B-shaped decoder as the policy, fully fine-tuned and with LoRA adapters.
Each builds the train state from the checkpoint, trains 2 updates, samples (its validation; the reward run also the
policy's samples the PRM learns from), exports, and resumes an interrupted stage from its checkpoint. Batch sizes and
example counts are cut to fit a CPU, and the reward run's target budget (a random policy samples to the end of it);
the rest of both configs, token budgets included, is the paper's. The T5 test takes about 25 minutes on 2 busy CPU
cores; the fully fine-tuned Qwen3 run needs about 32 GiB of memory and its LoRA run about 26 GiB (measured past 20 GiB
resident); each skips with less.

    python tests/test_paper_scale.py t5-base      (or qwen3-0.6b, or qwen3-0.6b-lora)

prints, as JSON, for one model (one process each, so that the peak resident memory is that model's): checkpoint
load, train-state build, train-step compile and step times and the peak memory after each.
"""
import importlib.util
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
T5_BASE = dict(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12,
               feed_forward_proj="relu", tie_word_embeddings=True)  # UnifiedQA-T5-base (T5 v1.0)
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                 rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643,
                 eos_token_id=151645)  # Qwen/Qwen3-0.6B
LORA_RANK = 16
TEXTS = ["What is 12 plus 30 ? The answer is 42 .", "number0 + number1 - ( number2 * number3 ) / 4",
         "Natalia sold clips to 48 of her friends in April , and then she sold half as many clips in May .",
         "#0 : 48 / 2 = 24 <<48/2=24>> #1 : 48 + 24 = 72 #### 72 No hint The operator in #0 is incorrect ."]


def write_tokenizer(directory: pathlib.Path) -> pathlib.Path:
    """A small byte-level BPE tokenizer (any text encodes) with T5's special ids: pad 0, EOS 1, unk 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<pad>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(TEXTS * 4, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    tok.save_pretrained(directory)
    return directory


def _random_checkpoint(model, directory: pathlib.Path) -> pathlib.Path:
    """`model` with every weight random at the scale of a trained one, saved with transformers."""
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if p.ndim == 1 and "norm" in name
                    else 0.05 * torch.randn_like(p))
    model.save_pretrained(directory)
    return directory


def write_t5_base(directory: pathlib.Path) -> pathlib.Path:
    import transformers

    config = transformers.T5Config(**T5_BASE, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return _random_checkpoint(transformers.T5ForConditionalGeneration(config), directory)


def write_qwen3(directory: pathlib.Path) -> pathlib.Path:
    import transformers

    return _random_checkpoint(transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**QWEN3_06B)), directory)


def write_in_child(name: str, directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """(checkpoint, tokenizer) directories under `directory`, written by a child process (`write_t5_base` or
    `write_qwen3`, and `write_tokenizer`), so that torch's copy of the model never adds to this process's memory."""
    subprocess.run([sys.executable, __file__, "--write", name, str(directory)], check=True)
    return directory / name, directory / "tok"


def _config(name: str, variant: str):
    spec = importlib.util.spec_from_file_location(f"config_{name}", REPO / "configs" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant)


def refiner_paper_config(checkpoint: pathlib.Path, tokenizer: pathlib.Path):
    """refiner_mwp.py:paper from local files, its budgets and model as they are, 2 updates of 4 rows."""
    c = _config("refiner_mwp.py", "paper")
    c.model.checkpoint, c.tokenizer.path = str(checkpoint), str(tokenizer)
    for stage in (c.critic, c.warmup, c.refiner):
        stage.steps, stage.batch_size, stage.microbatches, stage.eval_every, stage.eval_examples = 2, 4, 2, 2, 2
    c.eval.batch_size = 2
    c.checkpoint.every = 1
    c.log_every = 1
    return c


def reward_paper_config(checkpoint: pathlib.Path, tokenizer: pathlib.Path, lora_rank: int = 0):
    """rm_gsm8k.py:paper with a Qwen3-0.6B-shaped policy from local files, its budgets as they are, 2 updates of
    2 rows and 2 samples of 2 problems; with `lora_rank` > 0 every model trains rank-`lora_rank` adapters on every
    linear layer instead of all its weights."""
    c = _config("rm_gsm8k.py", "paper")
    c.model.family, c.model.preset = "decoder", "qwen3-0.6b"
    c.model.lora.rank = lora_rank
    c.model.checkpoint, c.tokenizer.path = str(checkpoint), str(tokenizer)
    c.model.dtype = "float32"
    for stage in (c.warmup, c.reward):
        stage.steps, stage.batch_size, stage.microbatches, stage.eval_every, stage.eval_examples = 2, 2, 1, 2, 2
        stage.optimizer.warmup_steps = 1
    c.reward.samples = c.reward.test_samples = 2
    c.reward.sample_rows = 4  # rows per sampler call (the default, 1024, is sized for an accelerator)
    c.reward.train_problems, c.reward.val_problems = 2, 2
    c.reward.mixed_only = False  # a random policy solves nothing: no problem has both right and wrong samples
    c.eval.examples, c.eval.batch_size = 2, 2
    c.checkpoint.every = 1
    c.log_every = 1
    return c


def _interrupt(stage_dir: str) -> int:
    """Makes a finished stage look interrupted after its first update: its last checkpoint, export and DONE
    removed. Returns the step it should resume from."""
    steps = sorted(int(d) for d in os.listdir(os.path.join(stage_dir, "ckpt")) if d.isdigit())
    assert steps[-1] == 2, steps
    shutil.rmtree(os.path.join(stage_dir, "ckpt", "2"))
    shutil.rmtree(os.path.join(stage_dir, "export"))
    os.remove(os.path.join(stage_dir, "DONE"))
    return steps[-2]


@pytest.mark.slow
def test_refiner_paper_config_trains_samples_saves_and_resumes(tmp_path, capsys):
    from refiner_jax.runs import refiner_run

    pytest.importorskip("torch")
    c = refiner_paper_config(*write_in_child("t5-base", tmp_path))
    workdir = str(tmp_path / "run")
    first = refiner_run.run(c, workdir, stages=("warmup",))["warmup"]
    assert os.path.isdir(os.path.join(workdir, "warmup", "export", "params"))
    resume_from = _interrupt(os.path.join(workdir, "warmup"))
    capsys.readouterr()
    again = refiner_run.run(c, workdir, stages=("warmup",))["warmup"]
    assert f"[warmup] resumed from step {resume_from}" in capsys.readouterr().out
    assert again == first


# The Qwen3-0.6B policy's SFT update at 2 rows of 256 + 64 tokens: its float32 parameters, gradients and Adam moments
# alone are 9.6 GB, and the 151936-token vocabulary's logits come on top (a 0.5B decoder's update went past 21 GiB of
# resident memory on CPU). With adapters the frozen weights are held once, without gradients or moments: the SFT
# update peaks at 14.6 GiB, but the run's PRM stage (the policy's samples, the reward model and its update) went past
# 20 GiB and was killed on a 23 GiB machine shared with other jobs.
FULL_FINE_TUNING_MEMORY_GIB = 32
LORA_MEMORY_GIB = 26


def _need_memory(gib: int, what: str) -> None:
    psutil = pytest.importorskip("psutil")
    available = psutil.virtual_memory().available / 2 ** 30
    if available < gib:
        pytest.skip(f"{available:.0f} GiB of memory available; {what} on CPU needs about {gib}")


def _reward_run_trains_samples_saves_and_resumes(tmp_path, capsys, lora_rank: int) -> None:
    from refiner_jax.runs import reward_run

    c = reward_paper_config(*write_in_child("qwen3-0.6b", tmp_path), lora_rank=lora_rank)
    # A random policy never ends a solution: every sample runs to the target budget, and 384 tokens of a 0.6B model
    # per sample call take many minutes on a CPU, so the samples stop at 64 (the paper budgets' train step is
    # measured by this file's script).
    c.lengths.target = 64
    workdir = str(tmp_path / "run")
    first = reward_run.run(c, workdir, stages=("sft", "prm"))
    for stage in ("sft", "prm"):
        assert os.path.isdir(os.path.join(workdir, stage, "export", "params"))
    resume_from = _interrupt(os.path.join(workdir, "prm"))
    capsys.readouterr()
    again = reward_run.run(c, workdir, stages=("sft", "prm"))
    assert f"[prm] resumed from step {resume_from}" in capsys.readouterr().out
    assert again["prm"] == first["prm"]


@pytest.mark.slow
def test_reward_paper_config_with_a_qwen3_policy_trains_samples_saves_and_resumes(tmp_path, capsys):
    pytest.importorskip("torch")
    _need_memory(FULL_FINE_TUNING_MEMORY_GIB, "the fully fine-tuned Qwen3-0.6B reward run")
    _reward_run_trains_samples_saves_and_resumes(tmp_path, capsys, lora_rank=0)


@pytest.mark.slow
def test_reward_paper_config_with_qwen3_lora_adapters_trains_samples_saves_and_resumes(tmp_path, capsys):
    pytest.importorskip("torch")
    _need_memory(LORA_MEMORY_GIB, "the Qwen3-0.6B reward run with LoRA adapters")
    _reward_run_trains_samples_saves_and_resumes(tmp_path, capsys, lora_rank=LORA_RANK)


# ---------------------------------------------------------------------------------------------------- measuring


def _peak_gib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2)  # ru_maxrss is in KiB


class _Timer:
    """Wall and process CPU seconds of a block (on a shared machine the CPU time is the steadier of the two)."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *_):
        self.wall, self.cpu = (round(time.perf_counter() - self.wall, 1), round(time.process_time() - self.cpu, 1))


def measure(name: str, workdir: pathlib.Path) -> dict:
    """Times one model's path from a transformers checkpoint to trained updates of its warm-up (SFT) stage, as the
    stage takes it (the paper config's optimizer, dtype and token budgets; the tests' rows and microbatches):
    load, train state, compile, step. `name` is t5-base, qwen3-0.6b or qwen3-0.6b-lora (rank-16 adapters on every
    linear layer of the frozen Qwen3)."""
    import jax
    import numpy as np

    from refiner_jax.models import lora as lora_lib
    from refiner_jax.models.language_model import LanguageModel
    from refiner_jax.runs import run_config, run_setup
    from refiner_jax import sharding as shd
    from refiner_jax.tokenizers import load_tokenizer
    from refiner_jax.training.optim import make_optimizer
    from refiner_jax.training.state import create_lora_train_state, train_state_from_params
    from refiner_jax.training.steps import make_train_step, pair_loss

    out = {"model": name}
    model_name = name.removesuffix("-lora")
    with _Timer() as t:
        directory, tokenizer_dir = write_in_child(model_name, workdir)
    out["write_checkpoint_s"] = t.wall
    tokenizer = load_tokenizer(str(tokenizer_dir))
    c = (refiner_paper_config(directory, tokenizer_dir) if name == "t5-base" else
         reward_paper_config(directory, tokenizer_dir, lora_rank=LORA_RANK if name.endswith("-lora") else 0))
    stage = c.warmup
    with _Timer() as t:
        model_config, params = run_setup.model_setup(c, tokenizer)
    out.update(load_s=t.wall, load_cpu_s=t.cpu, load_peak_gib=_peak_gib())
    lm = LanguageModel(model_config)
    model = lm.module()
    tx, schedule = make_optimizer(dict(stage.optimizer, total_steps=stage.steps))
    mesh, rules = shd.make_mesh([1, -1, 1]), shd.DEFAULT_RULES
    init_args = lm.init_args()

    def init_fn(key):
        return model.init(key, *init_args)["params"]

    lora = run_config.lora_config(c)
    with _Timer() as t:
        if lora is None:
            state, shardings = train_state_from_params(params, init_fn, tx, mesh, rules)
            frozen = None
        else:
            state, shardings, frozen = create_lora_train_state(init_fn, lora_lib.bind(model_config, lora), tx, mesh,
                                                               rules, params=params)
        jax.block_until_ready(state)
    out.update(train_state_s=t.wall, train_state_cpu_s=t.cpu, train_state_peak_gib=_peak_gib())
    del params
    step = make_train_step(pair_loss(lm, model), tx, mesh, shardings, rules=rules,
                           num_microbatches=stage.microbatches, schedule=schedule, frozen=frozen)
    input_len, target_len = c.lengths.input, c.lengths.target
    pairs = [(TEXTS[i % 4] * 6, TEXTS[(i + 1) % 4] * 3) for i in range(stage.batch_size)]
    batch = shd.make_global_batch(lm.text_pair_batch(tokenizer, pairs, input_len, target_len), mesh, rules)
    for key in ("first_step", "second_step"):
        with _Timer() as t:
            state, metrics = step(state, batch)
            jax.block_until_ready(metrics)
        out.update({f"{key}_s": t.wall, f"{key}_cpu_s": t.cpu})
    trained = int(sum(np.prod(x.shape) for x in jax.tree.leaves(state.params)))
    out.update(compile_s=round(out["first_step_s"] - out["second_step_s"], 1),
               compile_cpu_s=round(out["first_step_cpu_s"] - out["second_step_cpu_s"], 1), peak_gib=_peak_gib(),
               loss=float(np.asarray(metrics["loss"])), rows=stage.batch_size, microbatches=stage.microbatches,
               input_len=input_len, target_len=target_len, dtype=model_config.dtype, trained_parameters=trained,
               frozen_parameters=0 if frozen is None else
               int(sum(np.prod(x.shape) for x in jax.tree.leaves(frozen.params))))
    return out


if __name__ == "__main__":
    import tempfile

    if sys.argv[1] == "--write":  # measure's child: python tests/test_paper_scale.py --write NAME DIR
        target = pathlib.Path(sys.argv[3])
        (write_t5_base if sys.argv[2] == "t5-base" else write_qwen3)(target / sys.argv[2])
        write_tokenizer(target / "tok")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure(sys.argv[1], pathlib.Path(tmp))), flush=True)
