"""The launchers' user errors: each bad input ends as one `error:` line on stderr naming the flag, field or file and
the fix (with "did you mean" where a close name exists), exit status 2, and no workdir or output file; `--dry_run`
checks and prints the plan and writes nothing. Every case fails before any model is built or compiled."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from refiner_jax.refiner import critic_tool, critics

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "refiner_mwp.py")


def _launch(script: str, *args: str, env: dict | None = None, cwd=REPO) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", "REFINER_JAX_MALLOC": "system", **(env or {})}
    return subprocess.run([sys.executable, str(REPO / "launch" / script), *args], env=full_env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def _one_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """The single `error:` line of a refused command, holding every fragment."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.mark.parametrize("args, fragments", [
    (["--config.warmup.stepz=3"], ["--config.warmup.stepz", "config.warmup has no field 'stepz'",
                                   "did you mean 'steps'?"]),
    (["--config.model.size=3"], ["--config.model.size", "config.model has no field 'size'", "preset"]),
    (["--config.model.preset=llama-mimi"], ["config.model.preset", "did you mean 'llama-mini'?"]),
    (["--config.warmup.steps=abc"], ["--config.warmup.steps=abc", "invalid literal for int()"]),
    pytest.param(["--config.warmup.steps=-1"], ["config.warmup.steps", "must be >= 0"], marks=pytest.mark.slow),
    pytest.param(["--config.task.name=mwq"], ["config.task.name", "did you mean 'mwp'?"], marks=pytest.mark.slow),
    (["--stages=warmpu"], ["--stages", "did you mean 'warmup'?"]),
    (["--workdr=x"], ["--workdr: no such flag", "did you mean 'workdir'?"]),
    (["--config.task.data_dir=/nonexistent/svamp"], ["config.task.data_dir: /nonexistent/svamp does not exist",
                                                     "from --config.task.data_dir"]),
])
def test_bad_config_or_flag_is_one_line(tmp_path, args, fragments):
    workdir = tmp_path / "run"
    _one_error(_launch("train.py", f"--config={CONFIG}", f"--workdir={workdir}", *args), *fragments)
    assert not workdir.exists()


def test_unknown_variant_and_missing_config_file(tmp_path):
    workdir = tmp_path / "run"
    _one_error(_launch("train.py", f"--config={CONFIG}:svamb", f"--workdir={workdir}"),
               "unknown variant 'svamb'", "did you mean 'svamp'?")
    _one_error(_launch("train.py", "--config=configs/refiner_mpw.py", f"--workdir={workdir}"),
               "--config=configs/refiner_mpw.py", "not found", "did you mean 'refiner_mwp.py'?")
    _one_error(_launch("train.py", f"--workdir={workdir}"), "--config is required")
    assert not workdir.exists()


def test_missing_dataset_names_its_origin_and_the_fix(tmp_path):
    """The :svamp variant reads a folder under $REFINER_DATA: a wrong root is refused before the workdir exists."""
    workdir, root = tmp_path / "a" / "run", tmp_path / "no_data"
    proc = _launch("train.py", f"--config={CONFIG}:svamp", f"--workdir={workdir}", env={"REFINER_DATA": str(root)})
    _one_error(proc, f"config.task.data_dir: {root}/svamp/mawps-asdiv-a_svamp does not exist",
               f"$REFINER_DATA={root}", "--config.task.data_dir=PATH", "set $REFINER_DATA")
    assert proc.stdout.splitlines()[0].startswith(f"[data] source: {root}/svamp")  # printed first
    assert not (tmp_path / "a").exists()


def test_a_busy_workdir_is_refused(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        (workdir / "LOCK").write_text(json.dumps({"host": os.uname().nodename, "pid": owner.pid, "token": "t",
                                                  "since": "earlier", "command": "train.py (another run)"}))
        proc = _launch("train.py", f"--config={CONFIG}", f"--workdir={workdir}", "--config.task.extra_problems=0")
        _one_error(proc, f"{workdir} is in use by another run", f"process {owner.pid}", "another --workdir")
    finally:
        owner.kill()
        owner.wait()
    assert sorted(p.name for p in workdir.iterdir()) == ["LOCK"]


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    proc = _launch("train.py", f"--config={CONFIG}", f"--workdir={workdir}", "--dry_run",
                   "--config.critic.steps=70")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert out[0] == "[data] source: embedded; from the task's embedded default, as config.task.data_dir is empty"
    assert out[1].startswith("[data] mwp: train ")
    assert "  critic.steps = 70" in out and "  model.preset = 'llama-mini'" in out
    assert any(line.split() == ["critic", "70", "updates", "(config.critic.steps)"] for line in out)
    assert any(line.split()[:2] == ["matched", "1020"] for line in out)  # 500 + 70 + 450
    assert any(line.split()[:2] == ["eval", "evaluation"] for line in out)
    assert out[-1] == f"Dry run: the config and the data are valid; {workdir} was not created."
    assert not workdir.exists()


@pytest.mark.slow
def test_dry_run_names_the_data_root(tmp_path, shared_data):
    proc = _launch("train.py", f"--config={CONFIG}:svamp", f"--workdir={tmp_path / 'run'}", "--dry_run",
                   env={"REFINER_DATA": str(shared_data)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == (f"[data] source: {shared_data}/svamp/mawps-asdiv-a_svamp; from the config "
                                           f"file, a dataset folder under $REFINER_DATA={shared_data}")
    assert any(line.split()[:2] == ["warmup", "3000"] for line in proc.stdout.splitlines())
    assert not (tmp_path / "run").exists()


def test_dry_run_help_documents_the_data_default():
    proc = _launch("train.py", "--help")
    assert proc.returncode == 0  # asking for help is not an error
    assert "--dry_run" in proc.stdout and "$REFINER_DATA" in proc.stdout and "../shared/data" in proc.stdout


# ----------------------------------------------------------------------------------------------- other launchers


@pytest.fixture
def critic_run(tmp_path):
    """A run directory whose critic stage is finished (an export folder) but not calibrated."""
    sys.path.insert(0, str(REPO / "configs"))
    try:
        import refiner_mwp
    finally:
        sys.path.pop(0)
    workdir = tmp_path / "run"
    (workdir / "critic" / "export").mkdir(parents=True)
    (workdir / "config.json").write_text(refiner_mwp.get_config().to_json())
    return workdir


def test_critic_without_calibration_is_refused(tmp_path, critic_run):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps(critic_tool.record_format("mwp").example) + "\n")
    _one_error(_launch("critic.py", f"--workdir={critic_run}", f"--input={src}", f"--output={out}"),
               "calibration.json is missing", "--stages=eval", "--threshold")
    assert not out.exists()


def test_critic_input_with_no_readable_record(tmp_path, critic_run):
    (critic_run / "critic" / critics.CALIBRATION_FILE).write_text(json.dumps({"threshold": -1.0}))
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"question": "5 + 3", "hypothesis": "5 + 3 = 8"}) + "\n{not json\n")
    _one_error(_launch("critic.py", f"--workdir={critic_run}", f"--input={src}", f"--output={out}"),
               f"{src}: 2 bad lines", "not an equation of the mwp task", "(and 1 more lines")
    _one_error(_launch("critic.py", f"--workdir={critic_run}", f"--input={tmp_path / 'none.jsonl'}",
                       f"--output={out}"), "none.jsonl: input file not found")
    _one_error(_launch("critic.py", f"--workdir={critic_run}", f"--input={src}", f"--output={tmp_path}/no/o.jsonl"),
               "--output=", "does not exist; create it first")
    assert not out.exists()


def test_critic_help_shows_a_readable_example_record():
    proc = _launch("critic.py", "--help")
    shown = [json.loads(line) for line in proc.stdout.splitlines() if line.strip().startswith('{"question"')]
    assert shown == [critic_tool.record_format("mwp").example]
    assert '"error"' in proc.stdout and "--threshold" in proc.stdout


@pytest.mark.parametrize("script, args, fragments", [
    ("evaluate.py", ["--workdir=/nonexistent/run"], ["/nonexistent/run/config.json is missing", "launch/train.py"]),
    pytest.param("evaluate.py", ["--workdir=/nonexistent/run", "--turns=0"], ["--turns=0: must be >= 1"],
                 marks=pytest.mark.slow),
    ("refine.py", ["--workdir=/nonexistent/run", "--split=tset"], ["--split=tset", "did you mean 'test'?"]),
    ("pool_seeds.py", ["/nonexistent/a", "/nonexistent/b"], ["/nonexistent/a: no such run directory"]),
    pytest.param("pool_seeds.py", [], ["the following arguments are required: workdirs"], marks=pytest.mark.slow),
])
def test_other_launchers(script, args, fragments):
    _one_error(_launch(script, *args), *fragments)


def test_a_setup_that_fails_after_creating_the_workdir_removes_it(tmp_path):
    """A checkpoint that does not exist is found only once the tokenizer is made in the new workdir: the folders
    the setup created go again, the lock with them; an existing workdir stays."""
    from refiner_jax.runs import run_setup
    from test_pipeline import tiny_config

    config = tiny_config()
    config.tokenizer.kind, config.model.checkpoint = "byte", str(tmp_path / "no_checkpoint")
    workdir = tmp_path / "new" / "run"
    with pytest.raises(FileNotFoundError, match="no_checkpoint"):
        run_setup.setup(config, str(workdir), ("warmup",), ("warmup",), ("warmup",))
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(FileNotFoundError, match="no_checkpoint"):
        run_setup.setup(config, str(tmp_path / "kept"), ("warmup",), ("warmup",), ("warmup",))
    assert sorted(os.listdir(tmp_path / "kept")) == ["tokenizer"]  # no lock and no config left behind
