"""The command-line entry of train.py and eval.py: Hydra's app plus attnlab's error handling.

    @hydra.main(version_base="1.3", config_path="conf", config_name="train")
    def main(cfg): return run_job(train, cfg)

    cli.run(main, conf_dir)

Every error the user can fix (a bad override, an unknown key or option, a bad value, a missing or
corrupt file, errors raised inside `hydra.utils.instantiate`) ends as one line `error: ...` on
stderr and exit code 2; a bug keeps its traceback and exits 1; HYDRA_FULL_ERROR=1 shows the full
traceback of everything. Hydra itself prints composition errors over several lines and exits 1,
so it runs here with HYDRA_FULL_ERROR=1 (it then raises) and the message is written by us.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra

from attnlab import checkpoints, config_args
from attnlab.errors import USER_FULL_ERROR, full_error, report, user_error_message


def run(app: Callable[[], Any], conf_dir: str | Path) -> None:
    """Call a `@hydra.main` function; exits 0, 2 (the user's error) or 1 (a bug)."""
    config_args.register(Path(conf_dir))
    checkpoints.register_resolvers()  # a resumed run's dir (conf/hydra/default.yaml)
    user_full = full_error()
    saved = {name: os.environ.get(name) for name in ("HYDRA_FULL_ERROR", USER_FULL_ERROR)}
    os.environ[USER_FULL_ERROR] = "1" if user_full else "0"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        app()
    except Exception as exc:
        if user_full:
            raise
        message = user_error_message(exc, sys.argv[1:])
        if message is None:
            traceback.print_exception(exc)
            print("\nSet HYDRA_FULL_ERROR=1 for a complete stack trace.", file=sys.stderr)
            sys.exit(1)
        report(message)
        sys.exit(2)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        GlobalHydra.instance().clear()  # a later call in the same process starts afresh (tests)

