"""The mutant backend: the numpy provider with one planted bug, and the building blocks of the catalogue."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from capsule_core.backends.execution import GUARD_ELEMENTS, BackendRun
from capsule_core.backends.numpy_f32 import NumpyBackend
from capsule_core.ops import get_spec
from capsule_core.ops.base import TINY

DYNAMIC_CHECKS = (
    "shape.guard",
    "value",
    "value.special",
    "vjp",
    "vjp.reference",
    "reduction.order",
    "determinism",
    "rng",
    "selection.ties",
    "bounds",
    "inputs.intact",
)
"""verify's dynamic checks: the static ones (contract.aligned, ffi.symbols, launch.plan) read the
capsule and the CUDA sources, never the backend, so no numpy mutant can affect them."""


# -- the mutant backend ------------------------------------------------------------------------


def _write(out, y):
    out.view[...] = y


class MutantBackend(NumpyBackend):
    """The numpy provider with one planted bug. Every hook defaults to the honest behaviour:

    spec(spec) -> the mutated OpSpec the provider runs (the engine's own spec stays correct);
    post(backend, y) -> forward values as the buggy kernel leaves them;
    write(out, y) -> how the forward result lands in its GuardedOutput;
    write_grad(name, target, value) -> how each gradient lands in its GuardedOutput;
    before(backend) -> run first in forward, before any validation (a premature launch).
    """

    def __init__(self, mutant_id: str, *, spec=None, post=None, write=None, write_grad=None, before=None):
        super().__init__()
        self.name = f"mutant:{mutant_id}"
        self.description = f"numpy provider with planted bug {mutant_id}"
        self._spec, self._post, self._before = spec, post, before
        self._write, self._write_grad = write or _write, write_grad
        self.calls = 0
        self.launch_count = 0

    def mutated(self, spec):
        return self._spec(spec) if self._spec else spec

    def forward(self, spec, inputs, params, out):
        self.calls += 1
        if self._before:
            self._before(self)
        y = self.provider.forward(self.mutated(spec), inputs, **params)
        self.launch_count += 1
        if self._post:
            y = self._post(self, y)
        self._write(out, y)
        return BackendRun(inputs, 1)

    def backward(self, spec, inputs, params, g, grads):
        self.calls += 1
        result = self.provider.vjp(self.mutated(spec), inputs, g, **params)
        self.launch_count += 1
        for name, target in grads.items():
            pairs = zip(target, result[name]) if isinstance(target, tuple) else [(target, result[name])]
            for t, r in pairs:
                if self._write_grad:
                    self._write_grad(name, t, r)
                else:
                    t.view[...] = r
        return BackendRun(inputs, 1)


@dataclass(frozen=True)
class Mutant:
    """One planted bug: `kind` is its class (the issue's list), `expect` the checks that should
    catch it for the right reason."""

    id: str
    op: str
    kind: str
    description: str
    expect: tuple[str, ...]
    hooks: dict
    gap: str = ""
    """Non-empty for a mutant verify is known to miss: why, and what would catch it."""

    @property
    def family(self) -> str:
        return get_spec(self.op).family

    @property
    def how(self) -> str:
        """What the mutant changes: the spec's formula, the output values, the buffers, the guard."""
        parts = {"spec": "formula", "post": "values", "write": "buffers", "write_grad": "buffers", "before": "guard"}
        return "+".join(sorted({parts[k] for k in self.hooks}))

    def backend(self) -> MutantBackend:
        """A fresh backend (mutants with state, like the jitter's call counter, start over)."""
        cls = SizeAware if self.hooks.get("post") is jitter_large else MutantBackend
        return cls(self.id, **self.hooks)


# -- building blocks ----------------------------------------------------------------------------


def forward_is(fn):
    """Replace the forward by fn(orig_forward, arrays, params)."""

    def mutate(spec):
        return dataclasses.replace(spec, forward=lambda a, p, f=spec.forward: fn(f, a, p))

    return mutate


def vjp_is(fn):
    """Replace the VJP by fn(orig_vjp, arrays, params, y, g)."""

    def mutate(spec):
        return dataclasses.replace(spec, vjp=lambda a, p, y, g, f=spec.vjp: fn(f, a, p, y, g))

    return mutate


def both(*mutations):
    def mutate(spec):
        for m in mutations:
            spec = m(spec)
        return spec

    return mutate


def _cast(like, value):
    return np.asarray(value).astype(np.asarray(like).dtype)


def _lenient_write(out, y):
    """Writes what fits: a kernel with no guard just runs on whatever it was given."""
    flat, values = out.view.reshape(-1), np.asarray(y).reshape(-1)
    k = min(flat.size, values.size)
    flat[:k] = values[:k]


def jitter(backend, y):
    """Up to one ulp of noise, different on every call (as a racy atomic accumulation gives)."""
    rng = np.random.default_rng(backend.calls)
    y = np.asarray(y)
    flip = (rng.random(y.shape) < 0.5) & np.isfinite(y) & (np.abs(y) >= TINY)
    return np.where(flip, np.nextafter(y, np.float32(np.inf)), y).astype(y.dtype)


def write_past_end(out, y):
    out.view[...] = y
    if out.size:
        out.full[GUARD_ELEMENTS + out.size] = np.asarray(y).reshape(-1)[-1]


def write_before_start(out, y):
    out.view[...] = y
    if out.size:
        out.full[GUARD_ELEMENTS - 1] = np.asarray(y).reshape(-1)[0]


def skip_last(out, y):
    """The last element is never written (a grid one block short): the sentinel stays."""
    flat = out.view.reshape(-1)
    flat[:-1] = np.asarray(y).reshape(-1)[:-1]


def jitter_large(backend, y):
    """Run-to-run noise only where the input is large enough for a multi-block atomic reduction."""
    return jitter(backend, y) if backend.last_input_size >= 4096 else y


class SizeAware(MutantBackend):
    def forward(self, spec, inputs, params, out):
        self.last_input_size = int(sum(np.size(v) for v in inputs.values() if not isinstance(v, tuple)))
        return super().forward(spec, inputs, params, out)
