"""Child processes that never outlive their parent: worker processes and sanitized runs end when
the verify that started them ends, even by SIGKILL (a CI job's timeout), instead of running on."""

from __future__ import annotations

import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the thread that started it ends; elsewhere nothing
    (the pools still end their workers on every exit they see). Safe in a preexec_fn."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
