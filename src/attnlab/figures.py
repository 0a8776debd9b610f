"""Writing a matplotlib figure to a PNG: one place for every callback's and report's plot.

`save_png` makes the folder, writes the file, closes the figure, and holds SIGINT / SIGTERM while
matplotlib renders: a Ctrl-C raised inside its C renderer surfaces as an unrelated error
(`ValueError: Invalid bounding box`, seen in the SIGINT test of tests/e2e/test_cli.py) and the
run exits 1 instead of writing `last.ckpt` and exiting 130. Held, the signal reaches the run's
own handler right after the figure is written.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_held():
    """SIGINT and SIGTERM that arrive in the block reach their handlers when it ends (main
    thread; elsewhere a no-op). Python handlers, not a thread's signal mask: the process's other
    threads (torch's, the data loaders') would take a masked signal anyway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {}
    for signum in HELD:
        if signal.getsignal(signum) is not None:  # None: a handler Python cannot put back
            previous[signum] = signal.signal(signum, lambda number, frame: arrived.append(number))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in arrived:
            signal.raise_signal(signum)


def save_png(fig, path: Path, dpi: int = 100) -> Path:
    """Write `fig` to `path` (its folder made) and close it; returns the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with signals_held():
            fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
    return path
