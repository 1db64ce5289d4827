"""What this process is doing, in a form that survives its death: the capsule, check and case it
works on and the launch it last started.

A worker process (capsule_core.drivers.parallel) records here into a block of memory it shares with the
parent; when a kernel kills the worker (a wild store into the emulator's own state, the OOM
killer, a hang past the watchdog), the parent reads the last record and names the check, case
and launch in the ERROR it reports, so that nothing is lost but the dead capsule's own results.
In a process without a sink (a serial run) recording costs a few attribute stores.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

FIELDS = ("capsule", "check", "case", "launch", "started")
SEPARATOR = "\x1f"


@dataclass
class Activity:
    capsule: str = ""
    check: str = ""
    case: str = ""
    launch: str = ""
    """The launch last started: kernel, grid and block, and its place in the plan."""
    started: float = 0.0
    """time.monotonic() when that launch started; 0 once it returned."""

    def encode(self) -> bytes:
        return SEPARATOR.join((self.capsule, self.check, self.case, self.launch, repr(self.started))).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Activity":
        parts = raw.decode(errors="replace").split(SEPARATOR)
        if len(parts) != len(FIELDS):
            return cls()
        try:
            started = float(parts[4])
        except ValueError:
            started = 0.0
        return cls(*parts[:4], started)

    def describe(self) -> str:
        """ "during case small-0 of check vjp, in launch 2/3 of the plan: capsule_x (grid ...)"."""
        where = []
        if self.case:
            where.append(f"case {self.case}")
        if self.check:
            where.append(f"check {self.check}")
        text = ("during " + " of ".join(where)) if where else ""
        if self.launch:
            text += (", " if text else "") + (
                f"in launch {self.launch}" if self.started else f"after launch {self.launch}"
            )
        return text


current = Activity()
_sink = None


def record_into(buffer) -> None:
    """Mirror every change into `buffer` (a shared ctypes char array), for a parent to read."""
    global _sink
    _sink = buffer


def _publish() -> None:
    if _sink is not None:
        raw = current.encode()[: len(_sink) - 1]
        _sink.value = raw


def working_on(capsule: str | None = None, check: str | None = None, case: str | None = None) -> None:
    """Note a new capsule, check or case (a new capsule clears the rest)."""
    if capsule is not None:
        current.capsule, current.check, current.case, current.launch, current.started = capsule, "", "", "", 0.0
    if check is not None:
        current.check = check
    if case is not None:
        current.case = case
    _publish()


def launch_started(text: str) -> None:
    current.launch, current.started = text, time.monotonic()
    _publish()


def launch_ended() -> None:
    current.started = 0.0
    _publish()


def read(buffer) -> Activity:
    """The last record a (possibly dead) process left in `buffer`."""
    return Activity.decode(bytes(buffer.value))
