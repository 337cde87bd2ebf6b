"""kernel.batch's kept encodings across a fork (tests/kernel/test_batch.py pins their bytes)."""

from __future__ import annotations

import os
import signal

from pycni_plugins.kernel import batch


def test_a_forked_child_builds_requests_even_when_the_fork_caught_the_kept_encodings_lock_held() -> None:
    with batch._encoded_lock:  # held, as another thread of the parent may hold it at the fork
        pid = os.fork()
        if pid == 0:  # the child: a deadlock here ends by SIGALRM, a failure by its exit code
            signal.alarm(5)
            try:
                batch.Requests().link_get(7)
            except BaseException:
                os._exit(1)
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
