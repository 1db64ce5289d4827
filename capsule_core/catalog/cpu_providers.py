"""CPU providers: the OpSpecs' own code run in float64 (the reference) or float32 (numpy)."""

from __future__ import annotations

import numpy as np

from capsule_core.errors import ShapeError
from capsule_core.ops import get_spec
from capsule_core.ops.base import OpSpec, validate, working_params


class CpuProvider:
    """Runs an OpSpec's dtype-generic forward and VJP in one working dtype."""

    def __init__(self, name: str, dtype):
        self.name = name
        self.dtype = np.dtype(dtype).type

    def _prepare(self, op: str | OpSpec, inputs, params):
        spec = op if isinstance(op, OpSpec) else get_spec(op)
        arrays, p, out_shape = validate(spec, inputs, params, self.dtype)
        return spec, arrays, working_params(p, self.dtype), out_shape

    def _checked(self, spec: OpSpec, what: str, value, shape):
        arr = np.asarray(value)
        if arr.dtype != self.dtype or arr.shape != tuple(shape):
            raise AssertionError(
                f"{spec.name}: {what} gave {arr.dtype}{arr.shape}, expected {np.dtype(self.dtype)}{tuple(shape)}"
            )
        return arr

    def forward(self, op, inputs, **params) -> np.ndarray:
        spec, arrays, p, out_shape = self._prepare(op, inputs, params)
        with np.errstate(all="ignore"):
            return self._checked(spec, "forward", spec.forward(arrays, p), out_shape)

    def vjp(self, op, inputs, cotangent, **params) -> dict:
        spec, arrays, p, out_shape = self._prepare(op, inputs, params)
        g = self._cotangent(spec, cotangent, out_shape)
        with np.errstate(all="ignore"):
            y = spec.forward(arrays, p)
            return self._checked_grads(spec, arrays, spec.vjp(arrays, p, y, g))

    def magnitude(self, op, inputs, **params) -> np.ndarray:
        """M of the forward error model, with the reference's float64 arithmetic."""
        return self.case(op, inputs, **params)[1]

    def vjp_magnitude(self, op, inputs, cotangent, **params) -> dict:
        spec, arrays, p, out_shape = self._prepare(op, inputs, params)
        g = np.array(cotangent, dtype=self.dtype, order="C", copy=None)
        with np.errstate(all="ignore"):
            y = spec.forward(arrays, p)
            return spec.vjp_magnitude(arrays, p, y, g)

    def case(self, op, inputs, cotangent=None, **params) -> tuple:
        """(forward, magnitude, vjp, vjp_magnitude), the four methods above, from one validation
        and one forward: verify needs all four of every case, and a float64 transcendental over
        millions of elements is most of their cost. The VJP's two are None without a cotangent."""
        spec, arrays, p, out_shape = self._prepare(op, inputs, params)
        with np.errstate(all="ignore"):
            y = self._checked(spec, "forward", spec.forward(arrays, p), out_shape)
            m = np.asarray(spec.magnitude(arrays, p, y), dtype=np.float64).reshape(out_shape)
            if cotangent is None:
                return y, m, None, None
            g = self._cotangent(spec, cotangent, out_shape)
            grads = self._checked_grads(spec, arrays, spec.vjp(arrays, p, y, g))
            return y, m, grads, spec.vjp_magnitude(arrays, p, y, g)

    def _cotangent(self, spec: OpSpec, cotangent, out_shape) -> np.ndarray:
        if not spec.has_vjp:
            raise ShapeError(spec.name, "cotangent", "this op has no VJP (VJP mode none)")
        g = np.asarray(cotangent)
        if g.shape != out_shape:
            raise ShapeError(spec.name, "cotangent", f"must have the output shape {out_shape}, got {g.shape}")
        return np.array(g, dtype=self.dtype, order="C", copy=None)

    def _checked_grads(self, spec: OpSpec, arrays, grads) -> dict:
        if set(grads) != set(spec.differentiable):
            raise AssertionError(f"{spec.name}: VJP keys {sorted(grads)} != {sorted(spec.differentiable)}")
        out = {}
        for name, grad in grads.items():
            value = arrays[name]
            if isinstance(value, tuple):
                out[name] = tuple(self._checked(spec, f"vjp[{name}]", gi, vi.shape) for gi, vi in zip(grad, value))
            else:
                out[name] = self._checked(spec, f"vjp[{name}]", grad, value.shape)
        return out


REFERENCE = CpuProvider("reference", np.float64)
NUMPY_F32 = CpuProvider("numpy", np.float32)
