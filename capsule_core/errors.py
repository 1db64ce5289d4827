"""Error types. Every error a user can cause names the op, the argument and the rule."""

from __future__ import annotations


class CapsuleError(Exception):
    """Base of every error this library raises on purpose."""


class InputError(CapsuleError, ValueError):
    """Bad input to an op: raised before any computation or launch."""

    def __init__(self, op: str, argument: str, rule: str):
        self.op, self.argument, self.rule = op, argument, rule
        super().__init__(f"{op}: {argument}: {rule}")


class ShapeError(InputError):
    """A rank or shape rule is broken."""


class ParamError(InputError):
    """A parameter is missing, of the wrong type, or out of its range."""


class IndexRangeError(InputError):
    """An index input holds an entry outside [0, size)."""


class UnknownNameError(CapsuleError, LookupError):
    """A capsule or op name that the registry does not hold."""

    def __init__(self, kind: str, name: str, suggestions: tuple[str, ...] = ()):
        self.kind, self.name, self.suggestions = kind, name, suggestions
        hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        super().__init__(f"unknown {kind} {name!r}{hint}")


class RegistryError(CapsuleError):
    """The registry broke one of its own invariants when it loaded."""


class EnvironmentMissing(CapsuleError):
    """This machine lacks what the command needs (nvcc, pycuda, a GPU)."""
