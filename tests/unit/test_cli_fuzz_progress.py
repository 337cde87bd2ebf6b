"""``pycni fuzz``'s progress: click's progress bar on a terminal's stderr, nothing elsewhere."""

from __future__ import annotations

import io
import os
import select
import sys
from types import SimpleNamespace

from pycni.cli.fuzz import _progress


def test_the_progress_bar_counts_examples_and_shrinking_runs_on_a_terminal(monkeypatch):
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as tty:
        monkeypatch.setattr(sys, "stderr", tty)
        with _progress(10) as update:
            assert update is not None
            update(SimpleNamespace(examples=3, after_first_violation=0), False)
            update(SimpleNamespace(examples=7, after_first_violation=4), True)
    shown = b""
    while select.select([master], [], [], 0.5)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other end is closed and everything read
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    shown = shown.decode()
    assert "examples" in shown and "7/10" in shown and "(4 shrinking runs)" in shown


def test_no_progress_bar_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with _progress(10) as update:
        assert update is None
    assert sys.stderr.getvalue() == ""
