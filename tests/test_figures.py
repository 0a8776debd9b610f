"""attnlab.figures: a PNG written whole, its figure closed, and Ctrl-C held while it renders."""

import os
import signal
import time

import pytest

from attnlab.figures import save_png, signals_held


def test_a_signal_during_the_write_arrives_after_it():
    """SIGINT sent inside the block reaches its handler only when the block ends (a Ctrl-C in
    matplotlib's renderer would otherwise surface as 'Invalid bounding box', exit 1)."""
    if not hasattr(signal, "pthread_sigmask"):
        pytest.skip("no POSIX signal masks here")
    seen = []

    def arrived(n):  # Python runs a handler at its next check, not at the very instruction
        for _ in range(200):
            if len(seen) >= n:
                break
            time.sleep(0.005)
        return seen

    previous = signal.signal(signal.SIGINT, lambda *_: seen.append("SIGINT"))
    try:
        with signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert seen == []
        assert arrived(1) == ["SIGINT"]
        os.kill(os.getpid(), signal.SIGINT)  # and the mask is as it was: delivered at once
        assert arrived(2) == ["SIGINT", "SIGINT"]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_save_png_makes_the_folder_writes_a_png_and_closes_the_figure(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = save_png(fig, tmp_path / "a" / "b.png", dpi=50)
    assert path == tmp_path / "a" / "b.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fig.number not in plt.get_fignums()
