"""How the launchers meet their users: a mistake in the command line, the config or the input files ends as one
line `error: ...` on stderr that names the flag, field or file and the fix, with exit status 2; a bug still ends
with its traceback.

`run(main)` replaces `absl.app.run`: it parses the flags itself (`parse_flags`), so that a config override naming
no field (`--config.warmup.stepz=3`), a value of the wrong type, an unknown variant (`--config=FILE:variant`) or a
missing config file is reported in one line with "did you mean" where a close name exists, and turns the user
errors of `USER_ERRORS` raised by `main` into that line too.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Callable, NoReturn, Sequence

from absl import app, flags, logging

from refiner_jax.runs.run_config import ConfigError, suggestion
from refiner_jax.runs.run_lock import WorkdirLockedError
from refiner_jax.tasks.base import DataError

# What users can act on: a config value or flag (`ConfigError`), input data (`DataError`, which the critic tool's
# `CriticInputError` extends), a workdir held by another run. A `FileNotFoundError` raised with a message of this
# project (no errno: "<path> does not exist: train the stage first") is one too; one raised by the OS is not.
USER_ERRORS = (ConfigError, DataError, WorkdirLockedError, FileNotFoundError)
EXIT_STATUS = 2


def fail(message: str) -> NoReturn:
    """Ends the program with `error: message` (one line) on stderr and exit status 2."""
    sys.stderr.write(f"error: {one_line(message)}\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_STATUS)


def one_line(message: str) -> str:
    """`message` on one line: a message that lists several problems (one per line, as a file with several bad
    lines) keeps its head and first problem and counts the rest."""
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    if len(lines) <= 2:
        return " ".join(lines)
    return f"{lines[0]} {lines[1]} (and {len(lines) - 2} more lines of the same report)"


def is_user_error(error: BaseException) -> bool:
    if isinstance(error, FileNotFoundError) and error.errno is not None:
        return False  # the OS's own "[Errno 2] No such file": a path this project should have checked
    return isinstance(error, USER_ERRORS)


def run(main: Callable[[list[str]], None]) -> None:
    """`absl.app.run(main)` with the flags parsed by `parse_flags`, absl logging at WARNING, and `main`'s user
    errors as one line."""

    def guarded(argv: list[str]) -> None:
        if len(argv) > 1:
            fail(f"unexpected arguments {argv[1:]}: every input is a flag (--name=value); see --help")
        logging.set_verbosity(logging.WARNING)  # keep the libraries' chatter (checkpointing) out of the output
        try:
            main(argv)
        except Exception as e:  # noqa: BLE001 (only user errors are caught below; the rest is raised again)
            if not is_user_error(e):
                raise
            fail(str(e))

    if any(arg in ("--help", "-h", "-?", "--helpshort", "--helpfull") for arg in sys.argv[1:]):
        # Asking for help is not an error: the usage on stdout, exit status 0 (absl's own --help exits with 1).
        app.usage(shorthelp="--helpfull" not in sys.argv, writeto_stdout=True, exitcode=0)
    app.run(guarded, flags_parser=parse_flags)


def parse_flags(argv: Sequence[str]) -> list[str]:
    """`absl.flags.FLAGS(argv)`, its errors as one line (`fail`)."""
    config_flag = _config_flag()
    if config_flag is not None:
        _check_config_file(argv, config_flag)
    try:
        return flags.FLAGS(list(argv))
    except flags.UnrecognizedFlagError as e:
        known = [name for name in flags.FLAGS if not name.startswith(("help", "only_check"))]
        fail(f"--{e.flagname}: no such flag{suggestion(e.flagname, known)}; see --help for the flags")
    except flags.Error as e:
        fail(_flag_error(str(e)))
    except (AttributeError, KeyError):  # ml_collections: an override naming no field of the config
        problem = _unknown_override(argv, config_flag) if config_flag is not None else None
        if problem is None:
            raise
        fail(problem)


def config_overrides(flag_name: str = "config") -> dict:
    """The config fields given on the command line (`--config.task.data_dir=...`): dotted path -> value."""
    from ml_collections import config_flags

    return dict(config_flags.get_override_values(flags.FLAGS[flag_name]))


# ----------------------------------------------------------------------------------------------- diagnosis


def _config_flag() -> str | None:
    """The name of the launcher's config-file flag (`--config`), None when it has none."""
    return "config" if "config" in flags.FLAGS and flags.FLAGS["config"].flag_type() == "config object" else None


def _given(argv: Sequence[str], name: str) -> str | None:
    """The value of `--name=VALUE` (or `--name VALUE`) in `argv`, the last one wins."""
    value = None
    for i, arg in enumerate(argv):
        for prefix in (f"--{name}=", f"-{name}="):
            if arg.startswith(prefix):
                value = arg[len(prefix):]
        if arg in (f"--{name}", f"-{name}") and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def _check_config_file(argv: Sequence[str], name: str) -> None:
    """A --config naming no file fails here: ml_collections would only raise once the config is read."""
    given = _given(argv, name)
    if given is None:
        return
    path = given.split(":", 1)[0]
    if os.path.isfile(path):
        return
    folder = os.path.dirname(path) or "."
    here = sorted(f for f in os.listdir(folder) if f.endswith(".py")) if os.path.isdir(folder) else []
    hint = suggestion(os.path.basename(path), here)
    choices = (f"; the configs in {folder}: {', '.join(here)}" if here else
               f"; give a configs/*.py file (a relative path starts from the current folder, {os.getcwd()})")
    fail(f"--{name}={given}: config file {path} not found{hint}{choices}")


def _flag_error(message: str) -> str:
    """absl's flag-parsing message as the one line of `fail`."""
    lines = [line for line in message.splitlines() if line.strip()]
    head = lines[0].strip()
    head = re.sub(r"^flag (--\S+?):", r"\1:", head)
    if "Error whilst parsing config file" in message:  # get_config raised: its last line says why
        reason = re.sub(r"^\w+(Error|Exception): ", "", lines[-1].strip())
        variant = re.search(r"unknown variant '([^']*)'.*?; use (?:one of:? ?)?(.+)$", reason)
        if variant:
            choices = re.split(r",\s*|\s+or\s+", variant.group(2).strip().rstrip("."))
            reason += suggestion(variant.group(1), choices)
        return f"{head.split(': Error whilst', 1)[0]}: {reason}"
    required = re.search(r"Flag (--\S+) must have a value other than None", message)
    if required:
        return f"{required.group(1)} is required; see --help for an example command"
    if re.match(r"--\S+=.*: (invalid literal|could not convert)", head):
        head += "; give a value of the field's type (--dry_run lists every field's current value)"
    return " ".join([head] + [line.strip() for line in lines[1:]])


def _unknown_override(argv: Sequence[str], name: str) -> str | None:
    """The first `--config.a.b=...` of `argv` that names no field of the config, with the fields beside it."""
    given = _given(argv, name)
    if given is None:
        return None
    config = flags.FLAGS[name].parser.parse(given)
    for arg in argv:
        match = re.match(rf"^--?{re.escape(name)}\.([^=]+)", arg)
        if not match:
            continue
        node, path = config, match.group(1).split(".")
        for depth, key in enumerate(path):
            keys = list(node.keys()) if hasattr(node, "keys") else []
            where = ".".join([name, *path[:depth]])
            if key not in keys:
                fields = f"its fields: {', '.join(sorted(map(str, keys)))}" if keys else "it has no fields"
                kind = "" if hasattr(node, "keys") else f" (a value of type {type(node).__name__}, not a section)"
                return (f"--{name}.{match.group(1)}: {where}{kind} has no field {key!r}{suggestion(key, keys)}; "
                        f"{fields}")
            node = node[key]
    return None
