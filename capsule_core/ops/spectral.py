"""Spectral ops: fft_fno, one FNO-1D block (rfft along the grid, a per-mode complex channel mix,
irfft back).

The reference is a direct DFT restricted to the M kept modes, with explicit twiddle matrices
(O(G·M) per channel, as the CUDA kernel does), never numpy.fft: numpy.fft is the tests'
independent implementation. Every transform is a matmul against the twiddles, so the same code
runs in float64 (the reference), in float32 (the numpy provider) and on absolute values (the
magnitude M of the error model, with |cos| and |sin| as twiddle magnitudes).
"""

from __future__ import annotations

import numpy as np

from capsule_core.errors import ShapeError
from capsule_core.ops import base


def _twiddles(grid: int, modes: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Real and imaginary parts of e^(−2πi·k·t/G), shape (M, G), in `dtype`.

    k·t is reduced mod G in integers (so the angle stays in [0, 2π) however large k·t is), and
    quarter turns are exact, so DC and Nyquist twiddles are exactly ±1 with a zero sine.
    """
    turn = (np.arange(modes)[:, None] * np.arange(grid)[None, :]) % grid
    angle = 2.0 * np.pi * turn / grid
    cos, sin = np.cos(angle), np.sin(angle)
    quarter = (4 * turn) % grid == 0
    step = (4 * turn) // grid % 4
    cos = np.where(quarter, np.array([1.0, 0.0, -1.0, 0.0])[step], cos)
    sin = np.where(quarter, np.array([0.0, 1.0, 0.0, -1.0])[step], sin)
    return cos.astype(dtype), (0.0 - sin).astype(dtype)


def _bin_scale(grid: int, modes: int, dtype) -> np.ndarray:
    """irfft's weight per kept bin over G, shape (M, 1): 1/G at DC and (even G) Nyquist, 2/G
    elsewhere (the conjugate half the real output never stores)."""
    k = np.arange(modes)
    weight = np.where((k == 0) | (2 * k == grid), 1.0, 2.0)
    return (weight / grid).astype(dtype)[:, None]


def rfft_modes(x, modes: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `modes` bins of the unnormalised rfft along axis −2 of x (…, G, C), as
    (real, imag) arrays (…, M, C) in x's dtype: the transform fft_fno's reference uses.

    >>> re, im = rfft_modes(np.array([[1.0], [2.0], [3.0], [4.0]]), 3)
    >>> re.ravel().tolist(), im.ravel().tolist()
    ([10.0, -2.0, -2.0], [0.0, 2.0, 0.0])
    """
    x = np.asarray(x)
    re, im = _twiddles(x.shape[-2], modes, x.dtype)
    return re @ x, im @ x


def _mix(xs, w):
    """Σ_c xs[b, k, c]·w[k, c, o] → (B, M, O): the per-mode channel mix, batched over modes."""
    return np.matmul(xs.swapaxes(0, 1), w).swapaxes(0, 1)


def _mix_adjoint(gs, w):
    """Σ_o gs[b, k, o]·w[k, c, o] → (B, M, C)."""
    return np.matmul(gs.swapaxes(0, 1), w.swapaxes(1, 2)).swapaxes(0, 1)


def _outer(xs, gs):
    """Σ_b xs[b, k, c]·gs[b, k, o] → (M, C, O): a weight cotangent."""
    return np.matmul(xs.transpose(1, 2, 0), gs.swapaxes(0, 1))


def _spectrum(x, modes: int, absolute: bool):
    """Twiddles (M, G) and the kept spectrum X of x, each as a (real, imag) pair; with
    `absolute`, the twiddles' magnitudes |cos| and |sin| (x is then already |x|)."""
    tw_re, tw_im = _twiddles(x.shape[1], modes, x.dtype)
    if absolute:
        tw_re, tw_im = np.abs(tw_re), np.abs(tw_im)
    return (tw_re, tw_im), (tw_re @ x, tw_im @ x)


def _forward(a, p, absolute=False):
    """Z = X·(w_re + i·w_im) per mode, then y = irfft(Z, n = G) = Σ_k (α_k/G)·(Z_re·cos − Z_im·sin),
    i.e. the transposed twiddles. `absolute` evaluates the same tree on absolute values (M)."""
    x, w_re, w_im = a["x"], a["w_re"], a["w_im"]
    minus = np.add if absolute else np.subtract
    (tw_re, tw_im), (x_re, x_im) = _spectrum(x, w_re.shape[0], absolute)
    z_re = minus(_mix(x_re, w_re), _mix(x_im, w_im))
    z_im = _mix(x_re, w_im) + _mix(x_im, w_re)
    scale = _bin_scale(x.shape[1], w_re.shape[0], x.dtype)
    return tw_re.T @ (scale * z_re) + tw_im.T @ (scale * z_im)


def _vjp(a, p, y, g, absolute=False):
    """Real-linear adjoints, innermost last: the adjoint of irfft is (α_k/G)·rfft(g) (imaginary
    part exactly 0 at DC and Nyquist, whose sines are 0); the mix's adjoint is the conjugate
    weights; the adjoint of rfft is the transposed twiddles."""
    x, w_re, w_im = a["x"], a["w_re"], a["w_im"]
    minus = np.add if absolute else np.subtract
    (tw_re, tw_im), (x_re, x_im) = _spectrum(x, w_re.shape[0], absolute)
    scale = _bin_scale(x.shape[1], w_re.shape[0], x.dtype)
    g_re, g_im = scale * (tw_re @ g), scale * (tw_im @ g)
    gx_re = _mix_adjoint(g_re, w_re) + _mix_adjoint(g_im, w_im)
    gx_im = minus(_mix_adjoint(g_im, w_re), _mix_adjoint(g_re, w_im))
    return {
        "x": tw_re.T @ gx_re + tw_im.T @ gx_im,
        "w_re": _outer(x_re, g_re) + _outer(x_im, g_im),
        "w_im": minus(_outer(x_re, g_im), _outer(x_im, g_re)),
    }


def _shape(shapes, p):
    base.require_rank("fft_fno", "x", shapes["x"], 3, 3)
    batch, grid, c_in = shapes["x"]
    if grid < 1:
        raise ShapeError("fft_fno", "x", f"grid length G = x.shape[1] must be >= 1, got shape {shapes['x']}")
    base.require_rank("fft_fno", "w_re", shapes["w_re"], 3, 3)
    modes, w_in, c_out = shapes["w_re"]
    if not 1 <= modes <= grid // 2 + 1:
        raise ShapeError(
            "fft_fno",
            "w_re",
            f"modes M = w_re.shape[0] must be in [1, G//2 + 1] = [1, {grid // 2 + 1}] for G = {grid}, got {modes}",
        )
    if w_in != c_in:
        raise ShapeError(
            "fft_fno", "w_re", f"w_re.shape[1] must equal x's channels Ci = {c_in}, got shape {shapes['w_re']}"
        )
    if tuple(shapes["w_im"]) != tuple(shapes["w_re"]):
        raise ShapeError(
            "fft_fno", "w_im", f"must have the shape of w_re {tuple(shapes['w_re'])}, got {tuple(shapes['w_im'])}"
        )
    return (batch, grid, c_out)


def _cost(shapes, p):
    """flops: rfft 4·B·M·G·Ci (two real multiply-adds per grid point, mode and channel), mix
    8·B·M·Ci·Co (a complex multiply-add), irfft 4·B·G·M·Co, scale B·M·Co."""
    batch, grid, c_in = shapes["x"]
    modes, _, c_out = shapes["w_re"]
    flops = 4 * batch * modes * grid * c_in + 8 * batch * modes * c_in * c_out + 4 * batch * grid * modes * c_out
    return base.Cost(
        bytes_read=4 * (base.numel(shapes["x"]) + 2 * base.numel(shapes["w_re"])),
        bytes_written=4 * batch * grid * c_out,
        flops=flops + batch * modes * c_out,
    )


def _case(rng, batch, grid, c_in, c_out, modes, case, worst_case=False) -> base.Sample:
    """x ~ N(0, 1), weights ~ N(0, 1/Ci) so y stays O(1) whatever the channel count."""
    w_scale = 1.0 / np.sqrt(max(c_in, 1))
    inputs = {
        "x": base.f32(rng.standard_normal((batch, grid, c_in))),
        "w_re": base.f32(w_scale * rng.standard_normal((modes, c_in, c_out))),
        "w_im": base.f32(w_scale * rng.standard_normal((modes, c_in, c_out))),
    }
    return base.Sample(inputs, {}, case, worst_case)


SIZES = {
    # (B, G, Ci, Co, M): an even grid with a few modes, an odd one with all, an even one with Nyquist
    "small": ((2, 8, 3, 2, 3), (1, 7, 2, 3, 4), (2, 6, 2, 2, 4)),
    "medium": ((4, 256, 16, 24, 32), (3, 243, 20, 12, 122)),
    "large": ((16, 2048, 64, 64, 64),),
}


def _samples(size, rng):
    return [_case(rng, *dims, f"{size}-{i}") for i, dims in enumerate(SIZES[size])]


EDGES = (
    # (B, G, Ci, Co, M, case)
    (0, 8, 2, 3, 5, "edge-empty-batch"),
    (2, 5, 0, 3, 2, "edge-no-input-channels"),
    (2, 1, 2, 3, 1, "edge-grid-1"),
    (2, 9, 3, 2, 1, "edge-one-mode"),
    (2, 16, 3, 3, 9, "edge-all-modes-even"),
    (2, 15, 3, 3, 8, "edge-all-modes-odd"),
    (1, 12, 5, 1, 4, "edge-batch-1-ci-ne-co"),
    (3, 100, 7, 5, 51, "edge-non-power-of-two"),
    # the kernels split the analysis over the grid axis: 5 parts of 33 points, the last one of 29
    (2, 161, 3, 2, 7, "edge-split-short-last-part"),
)


def _edges():
    cases = [_case(base.seeded_rng("fft_fno", case), b, g, ci, co, m, case, True) for b, g, ci, co, m, case in EDGES]
    for grid in (10, 11):
        modes = grid // 2 + 1
        identity = np.broadcast_to(np.eye(3, dtype=np.float32), (modes, 3, 3)).copy()
        x = base.f32(base.seeded_rng("fft_fno", f"edge-identity-{grid}").standard_normal((2, grid, 3)))
        cases.append(
            base.Sample({"x": x, "w_re": identity, "w_im": np.zeros_like(identity)}, {}, f"edge-identity-{grid}", True)
        )
    return cases


def _order_inputs() -> list[base.Sample]:
    """The orders of order_terms along the grid (one batch element each), the DC mode alone with
    unit weights: the DC bin is the plain sum of the grid."""
    x = np.stack(list(base.order_terms().values()))[:, :, None]
    inputs = {"x": x, "w_re": np.ones((1, 1, 1), np.float32), "w_im": np.zeros((1, 1, 1), np.float32)}
    return [base.Sample(inputs, {}, "order-grid", True)]


def _error(case, x_shape, w_re_shape, w_im_shape, argument, pattern) -> base.ErrorCase:
    shapes = {"x": x_shape, "w_re": w_re_shape, "w_im": w_im_shape}
    return base.zeros_error_case(case, shapes, ShapeError, rf"{argument}: .*{pattern}")


def _errors():
    return [
        _error("error-x-rank", (8, 3), (3, 3, 2), (3, 3, 2), "x", "must have rank 3"),
        _error("error-x-empty-grid", (1, 0, 3), (1, 3, 2), (1, 3, 2), "x", "grid length G"),
        _error("error-w_re-rank", (1, 8, 3), (3, 3), (3, 3), "w_re", "must have rank 3"),
        _error("error-too-many-modes", (1, 8, 3), (6, 3, 2), (6, 3, 2), "w_re", r"modes M .* \[1, 5\]"),
        _error("error-no-modes", (1, 8, 3), (0, 3, 2), (0, 3, 2), "w_re", r"modes M .* got 0"),
        _error("error-channel-mismatch", (1, 8, 3), (3, 4, 2), (3, 4, 2), "w_re", "Ci = 3"),
        _error("error-w_im-shape", (1, 8, 3), (3, 3, 2), (3, 3, 3), "w_im", "must have the shape of w_re"),
    ]


def _fused_transform_length(channels_of):
    """2·G·C + 4·M·C for the channel count C = channels_of(shapes): the longer of the two fusions
    of the channel mix into a transform (2·G·C terms into a mode, 4·M·C into a grid point)."""

    def n(shapes, p):
        channels = channels_of(shapes)
        return 2 * shapes["x"][1] * channels + 4 * shapes["w_re"][0] * channels

    return n


def _weight_grad_length(shapes, p):
    """G terms for the spectrum of x (or g), then 2·B·G if the batch sum is fused over (b, t)."""
    return shapes["x"][1] * (2 * shapes["x"][0] + 1)


FFT_FNO = base.OpSpec(
    name="fft_fno",
    family="spectral",
    inputs=(base.Tensor("x", "(B, G, Ci)"), base.Tensor("w_re", "(M, Ci, Co)"), base.Tensor("w_im", "(M, Ci, Co)")),
    params=(),
    shape_rule="(B, G, Co)",
    shape=_shape,
    forward=_forward,
    vjp=_vjp,
    magnitude=lambda a, p, y: _forward(base.absolute_inputs(a), p, absolute=True),
    vjp_magnitude=lambda a, p, y, g: _vjp(
        base.absolute_inputs(a), p, y, np.abs(np.asarray(g, dtype=np.float64)), absolute=True
    ),
    error=base.Accumulation(
        16,
        "3 products, 2 twiddles (sinf/cosf 2 ulp + 2 argument roundings each), 1/G scale 2 -> 13, "
        "rounded up; n = 2·G·Ci + 4·M·Ci covers a kernel that fuses the mix into either transform "
        "(2·G·Ci terms into a mode, or 4·M·Ci into a grid point); unfused G + 2Ci + 2M is shorter",
        n=_fused_transform_length(lambda s: s["x"][2]),
    ),
    vjp_error={
        "x": base.Accumulation(
            16,
            "the adjoint chain of the forward with Co for Ci: n = 2·G·Co + 4·M·Co",
            n=_fused_transform_length(lambda s: s["w_re"][2]),
        ),
        "w_re": base.Accumulation(
            16,
            "two G-term spectra (x's and g's), then a sum over batch, possibly fused over (b, t): n = 2·B·G + G",
            n=_weight_grad_length,
        ),
        "w_im": base.Accumulation(16, "as w_re: n = 2·B·G + G", n=_weight_grad_length),
    },
    cost=_cost,
    samples=_samples,
    edges=_edges,
    errors=_errors,
    order_inputs=_order_inputs,
    doc="fft_fno(x, w_re, w_im) = irfft(rfft(x)[:M]·(w_re + i·w_im), n = G) along the grid axis; "
    "modes k >= M are zero, imaginary parts at DC and (even G) Nyquist ignored.",
)

SPECS = (FFT_FNO,)
