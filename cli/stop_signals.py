"""SIGTERM and SIGHUP end a long command the way Ctrl-C does: the work stops, the partial report
is written (the capsules not reached marked as not run) and the exit code is 128 + the signal's
number. A CI job's timeout sends SIGTERM (then SIGKILL); a closed terminal sends SIGHUP. Kept
light at import time (capsules --help reads this module)."""

import signal
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread: every `except KeyboardInterrupt` that keeps a
    partial report (the engines, the worker pools) keeps it for these too."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_name(interruption: KeyboardInterrupt) -> str:
    """SIGTERM or SIGHUP for a Stopped, SIGINT for Ctrl-C."""
    return signal.Signals(getattr(interruption, "signum", signal.SIGINT)).name


@contextmanager
def stop_signals():
    """SIGTERM and SIGHUP raise Stopped while the block runs. After the first, both are ignored
    until the process ends, so that a second one cannot kill the writing of the partial report."""
    stopped = []

    def stop(signum, frame):
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        stopped.append(signum)
        raise Stopped(signum)

    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        if not stopped:
            for s, handler in previous.items():
                signal.signal(s, handler)
