"""Mutants of the spectral family: gross bugs that verify must catch."""

from __future__ import annotations

import numpy as np

from capsule_core.ops import spectral as sp
from mutants.planting import Mutant, forward_is, vjp_is

# -- spectral -----------------------------------------------------------------------------------


def _fno_nyquist_double(f, a, p):
    """irfft weight 2/G at the Nyquist bin too (only DC kept at 1/G)."""
    x, w_re, w_im = a["x"], a["w_re"], a["w_im"]
    modes, grid = w_re.shape[0], x.shape[1]
    (tw_re, tw_im), (x_re, x_im) = sp._spectrum(x, modes, False)
    z_re = sp._mix(x_re, w_re) - sp._mix(x_im, w_im)
    z_im = sp._mix(x_re, w_im) + sp._mix(x_im, w_re)
    scale = (np.where(np.arange(modes) == 0, 1.0, 2.0) / grid).astype(x.dtype)[:, None]
    return tw_re.T @ (scale * z_re) + tw_im.T @ (scale * z_im)


def _negate(name):
    def vjp(f, a, p, y, g):
        grads = f(a, p, y, g)
        grads[name] = -grads[name]
        return grads

    return vjp


SPECTRAL = [
    Mutant(
        "fft-fno-nyquist-weight-2",
        "fft_fno",
        "wrong formula",
        "the Nyquist bin weighted 2/G like the others",
        ("value",),
        {"spec": forward_is(_fno_nyquist_double)},
    ),
    Mutant(
        "fft-fno-conjugate-weights",
        "fft_fno",
        "wrong sign",
        "multiplies by conj(w): the sign of w_im flipped",
        ("value",),
        {"spec": forward_is(lambda f, a, p: f({**a, "w_im": -a["w_im"]}, p))},
    ),
    Mutant(
        "fft-fno-vjp-w-im-sign",
        "fft_fno",
        "VJP sign",
        "the w_im gradient has the wrong sign",
        ("vjp",),
        {"spec": vjp_is(_negate("w_im"))},
    ),
]
