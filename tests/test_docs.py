"""Every code block of the README and docs runs, and the documentation site builds with warnings as errors.

Python blocks run in order, one interpreter per document (a later block may use an earlier one's names), in an
empty working directory. Shell blocks are checked command by command: `launch/train.py` with `--dry_run` (the
config, its overrides and its data resolve, nothing is trained or written), every other launcher and benchmark
with `--help` (the script imports and its flags parse), `pip install` extras against setup.py; a test
module run as a script is run by the suite itself. A command that
names a machine or service of the reader's own (a TPU VM, a bucket, a coordinator host) cannot run here and is
listed in `_ELSEWHERE` by its program.
"""
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = sorted([ROOT / "README.md", ROOT / "launch" / "tpu" / "README.md", *(ROOT / "docs").rglob("*.md")])
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_ELSEWHERE = ("gcloud", "gcsfuse", "srun", "sbatch", "mkdocs")  # programs of the reader's own machines
_TIMEOUT = 600


def _blocks(path: pathlib.Path, language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(path.read_text(encoding="utf-8")) if lang == language]


def _commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments dropped, `a && b` split; a command of a program in
    `_ELSEWHERE` is dropped whole, with any quoted argument that spans lines (commands it runs on those machines)."""
    joined = re.sub(r"\\\n\s*", " ", block)
    kept, inside = [], False
    for line in joined.splitlines():
        if not inside and line.split()[:1] and line.split()[0] in _ELSEWHERE:
            inside = line.count('"') % 2 == 1
        elif inside:
            inside = line.count('"') % 2 == 0
        else:
            kept.append(line)
    commands = []
    for line in kept:
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            commands += [part.strip() for part in line.split("&&") if part.strip()]
    return commands


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def _run(argv: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=_TIMEOUT)


def _extras() -> set[str]:
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    block = setup.split("extras_require=", 1)[1]
    return set(re.findall(r'^\s*"(\w+)":', block, re.M))


def _check_command(command: str, tmp_path) -> None:
    argv = shlex.split(command)
    program = argv[0]
    if program in _ELSEWHERE:
        return
    if program == "pip":
        assert argv[1] == "install", command
        for extra in re.findall(r"\[([\w,]+)\]", command):
            assert set(extra.split(",")) <= _extras(), f"{command}: no such extra in setup.py"
        return
    assert program == "python", f"a command the docs test does not know how to check: {command}"
    if argv[1:3] == ["-m", "pytest"]:
        return  # this suite
    script = argv[1]
    assert (ROOT / script).exists(), f"{command}: {script} does not exist"
    if script == "launch/train.py" and not any(a.startswith("--multihost") or a.startswith("--coordinator")
                                                for a in argv):
        args = [re.sub(r"--workdir=\S+", f"--workdir={tmp_path / 'run'}", a) for a in argv[2:]]
        result = _run([sys.executable, str(ROOT / script), *args, "--dry_run"], ROOT)
        assert result.returncode == 0, f"{command} --dry_run failed:\n{result.stdout}\n{result.stderr}"
        assert not (tmp_path / "run").exists(), f"{command} --dry_run created its workdir"
    elif script.startswith(("launch/", "benchmarks/")):
        result = _run([sys.executable, str(ROOT / script), "--help"], ROOT)
        assert result.returncode == 0, f"{script} --help failed:\n{result.stderr}"
    else:  # a test module run as a script: it is run by the suite itself
        assert script.startswith("tests/test_"), f"{command}: not a launcher, benchmark or test module"


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if _blocks(d, "python")],
                         ids=lambda d: str(d.relative_to(ROOT)))
def test_python_blocks_run(document, tmp_path):
    program = "\n\n".join(_blocks(document, "python"))
    result = _run([sys.executable, "-c", program], tmp_path)
    assert result.returncode == 0, f"{document.name}'s python blocks failed:\n{result.stderr[-4000:]}"


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if _blocks(d, "bash")],
                         ids=lambda d: str(d.relative_to(ROOT)))
def test_shell_blocks_run(document, tmp_path):
    for block in _blocks(document, "bash"):
        for command in _commands(block):
            _check_command(command, tmp_path)


def test_every_code_block_names_its_language():
    """A fence without a language would escape both tests above."""
    for document in DOCUMENTS:
        languages = [lang for lang, _ in _FENCE.findall(document.read_text(encoding="utf-8"))]
        assert all(lang in ("python", "bash", "text", "json") for lang in languages), (document, languages)


def test_documentation_site_builds_strict(tmp_path):
    """mkdocs with the API reference generated from the docstrings (the test extra installs both)."""
    result = _run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")], ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
