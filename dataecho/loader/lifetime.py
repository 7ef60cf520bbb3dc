"""Loader workers end with the training process, even when it is killed with SIGKILL.

A DataLoader worker notices a dead parent only at its next poll, and one blocked writing a
batch into a full pipe that nobody drains never gets there: after ``kill -9`` of a training
run such workers were seen alive, parented to PID 1, 8 minutes later. On Linux each worker
asks the kernel for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``), the same
guard :class:`dataecho.sources.nginx.NginxServer` gives its nginx.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

_PR_SET_PDEATHSIG = 1


class DieWithParent:
    """A ``worker_init_fn``: set the parent-death signal, then run the user's own, if any."""

    def __init__(self, user_fn: Callable[[int], Any] | None = None) -> None:
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        if sys.platform == "linux":
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() == 1:  # orphaned already: the parent died before the signal was set
                os._exit(1)
        if self.user_fn is not None:
            self.user_fn(worker_id)
