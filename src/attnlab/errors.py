"""Errors the user can fix, and how every entry point reports them.

`ConfigError` / `DataError` carry a message that names the problem *and* the fix. `train.py` and
`eval.py` (through `attnlab.cli`) print such a message as one line and exit with code 2, with no
traceback unless HYDRA_FULL_ERROR=1; a `python -m` command's `main` decorated with `command`
prints them the same way. `user_error_message` decides what counts as the user's
error: our own errors, Lightning's `MisconfigurationException`, Hydra's composition errors,
OmegaConf errors about a key, and missing / wrong-kind files; anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import difflib
import errno
import functools
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path


class ConfigError(ValueError):
    """Bad configuration or input: the message says what is wrong and how to fix it."""


class DataError(ConfigError):
    """Missing, corrupt or malformed data files: the message names the file and what to do."""


# ----------------------------------------------------------------------------- files
def require_file(path, key: str, example: str = "") -> Path:
    """`path` must be an existing file: one clear error for a missing path or a directory."""
    path = Path(path)
    if path.is_dir():
        hint = f", e.g. {example}" if example else ""
        raise DataError(f"{key}={path} is a directory, not a file; give a file{hint}")
    if not path.is_file():
        hint = f", e.g. {example}" if example else ""
        raise DataError(f"{key}={path} does not exist; give an existing file{hint}")
    return path


def require_dir(path, key: str, example: str = "", missing_ok: bool = False) -> Path:
    """`path` must be an existing directory: one clear error for a missing path or a file.

    `missing_ok`: a folder the caller creates (a data dir to fetch into) may be missing, but be
    neither a file nor under one, which would otherwise surface as a traceback from mkdir.
    """
    path = Path(path)
    hint = f", e.g. {example}" if example else ""
    if path.is_file():
        new = " (or a new path: it is created)" if missing_ok else ""
        raise DataError(f"{key}={path} is a file, not a directory; give a directory{new}{hint}")
    if not path.is_dir() and not missing_ok:
        raise DataError(f"{key}={path} does not exist; give an existing directory{hint}")
    if not path.exists():  # missing_ok: mkdir(parents=True) fails if what exists above is a file
        above = next(parent for parent in path.absolute().parents if parent.exists())
        if not above.is_dir():
            raise DataError(f"{key}={path}: {above} is a file, not a directory; give a path under "
                            f"a directory{hint}")
    return path


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


# ----------------------------------------------------------------------------- classification
def user_error_message(exc: BaseException, argv: Iterable[str] = ()) -> str | None:
    """One line for an error the user can fix, None for a bug (which keeps its traceback).

    `argv`: the command-line overrides, to quote the value of a key Hydra refused.
    """
    from hydra.errors import (
        CompactHydraException,
        InstantiationException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    if isinstance(exc, InstantiationException) and exc.__cause__ is not None:
        # errors raised inside a constructor reach us wrapped in "Error in call to target ..."
        inner = user_error_message(exc.__cause__, argv)
        if inner is not None:
            return inner
        if isinstance(exc.__cause__, TypeError) and "argument" in str(exc.__cause__):
            return _one_line(f"{_target_name(exc)}: {exc.__cause__}; check the config keys of that node")
        return None
    if isinstance(exc, ConfigError):
        return _one_line(str(exc))
    if _is_lightning_misconfiguration(exc):
        return _one_line(f"{trainer_key(str(exc), argv)}: {exc}")
    if isinstance(exc, MissingConfigException):
        return _missing_option(exc)
    if isinstance(exc, OverrideParseException):
        reason = str(exc).split("\nSee https")[0]
        return _one_line(f"cannot parse the override {exc.override!r}: {reason}; quote values with "
                         f"brackets, commas or spaces, e.g. 'task.data.fractions=[0.8,0.1,0.1]'")
    if isinstance(exc, CompactHydraException) and isinstance(exc.__cause__, OmegaConfBaseException):
        return _unknown_key(exc, exc.__cause__, argv)
    if isinstance(exc, CompactHydraException):
        return _one_line(str(exc))
    if isinstance(exc, MissingMandatoryValue):
        key = getattr(exc, "full_key", None) or "a key"
        return f"{key} has no value (??? in the config): give it on the command line, e.g. {key}=..."
    if isinstance(exc, OmegaConfBaseException):
        key = getattr(exc, "full_key", None)
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return _one_line(f"{key}: {first}" if key else first)
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:
        # a full or read-only disk, wherever the write was (a checkpoint, a log, a cache): the
        # fix is room, or another folder for the run
        where = f"{exc.filename}: " if exc.filename else "writing the run's files: "
        room = "a folder with room" if exc.errno != errno.EROFS else "a writable folder"
        fix = (f"{'free space there, or ' if exc.errno != errno.EROFS else ''}write the run "
               f"elsewhere: paths.output_dir=<{room}> (every run: paths.log_dir=<{room}>)")
        return _one_line(f"{where}{exc.strerror or os.strerror(exc.errno)}; {fix}")
    if isinstance(exc, OSError) and exc.errno in _PERMISSION_ERRNOS and exc.filename:
        return _one_line(f"{exc.filename}: {exc.strerror}; check its permissions, or use another "
                         f"folder (the run's files: paths.output_dir=<folder>, every run's: "
                         f"paths.log_dir=<folder>)")
    if isinstance(exc, OSError) and exc.errno in _PATH_ERRNOS and exc.filename:
        return _one_line(f"{exc.filename}: {exc.strerror}; fix the path in the config")
    return None


_PATH_ERRNOS = {errno.ENOENT, errno.EISDIR, errno.ENOTDIR}
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
_PERMISSION_ERRNOS = {errno.EACCES, errno.EPERM}


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return "; ".join(lines)


def _target_name(exc: BaseException) -> str:
    match = re.search(r"target '([^']+)'", str(exc))
    return match.group(1) if match else "instantiation"


def trainer_key(message: str, argv: Iterable[str]) -> str:
    """`trainer.<name>=<value>` for the trainer override a Lightning message is about."""
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        name = key.removeprefix("trainer.")
        if key.startswith("trainer.") and re.search(rf"\b{re.escape(name)}\b", message):
            return f"{key}={value}"
    return "trainer"


def _is_lightning_misconfiguration(exc: BaseException) -> bool:
    try:
        from lightning_fabric.utilities.exceptions import MisconfigurationException
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, MisconfigurationException)


def _missing_option(exc) -> str:
    missing = str(getattr(exc, "missing_cfg_file", "") or "")
    options = list(getattr(exc, "options", None) or [])
    group, _, option = missing.rpartition("/")
    if options and group:
        return (f"{group}={option}: no such option; choose one of {', '.join(options)}"
                f"{did_you_mean(option, options)}, e.g. {group}={options[0]}")
    return _one_line(str(exc).split("Config search path")[0])


def _unknown_key(exc, cause, argv: Iterable[str]) -> str:
    full_key = getattr(cause, "full_key", None) or ""
    parent = getattr(cause, "parent_node", None)
    if not full_key or "not in struct" not in str(cause) or parent is None:
        return _one_line(f"{exc}: {str(cause).splitlines()[0]}")
    value = next((a.split("=", 1)[1] for a in argv if a.split("=", 1)[0] == full_key), "...")
    known = [str(k) for k in parent if not str(k).startswith("_")]
    node, _, key = full_key.rpartition(".")
    where = node or "the top level"
    keys = ", ".join(known) if len(known) <= 20 else f"{len(known)} keys (--help lists them)"
    return (f"{full_key}={value}: no such key{did_you_mean(key, known)}; {where} has {keys} "
            f"(a new key on purpose: +{full_key}={value})")


# ----------------------------------------------------------------------------- reporting
# attnlab.cli sets HYDRA_FULL_ERROR=1 for Hydra itself (so that Hydra raises instead of printing
# and exiting 1); the user's own choice travels in this variable, to child processes too.
USER_FULL_ERROR = "ATTNLAB_USER_FULL_ERROR"


def full_error() -> bool:
    """True when the user asked for tracebacks with HYDRA_FULL_ERROR=1."""
    if USER_FULL_ERROR in os.environ:
        return os.environ[USER_FULL_ERROR] == "1"
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def report(message: str) -> None:
    """The one line a user error gets on stderr (the caller then exits with code 2)."""
    print(f"error: {message}", file=sys.stderr, flush=True)


def command(main: Callable[[Sequence[str] | None], int | None]) -> Callable[[Sequence[str] | None], int]:
    """Decorates the `main(argv)` of a `python -m` command: a ConfigError / DataError ends as one
    `error:` line and 2 returned (`sys.exit(main())` passes it to the shell; tests call main(argv)
    in process); a body that returns nothing returns 0. Any other exception is a bug and keeps its
    traceback; argparse's own errors already exit 2."""

    @functools.wraps(main)
    def run(argv: Sequence[str] | None = None) -> int:
        try:
            return main(argv) or 0
        except ConfigError as exc:
            report(_one_line(str(exc)))
            return 2

    return run
