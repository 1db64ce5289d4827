"""The one table of the C types a kernel parameter may have: adding a type is one row.

Everything that speaks C derives from it: the parser of declared parameter lists (launch), the
PTX types `check` expects of an entry point, the numpy scalar a launch argument is passed as (the
device backends), PyCUDA's prepared-call format (cuda), the emulator's packing of an argument into
its 64-bit word (emu), the element type of a plan buffer a pointer parameter may receive, and the
range a scalar argument must fit. Imports numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CType:
    spelling: str
    """As a kernel's parameter list writes it: "uint32_t", "unsigned int"."""
    numpy: type
    """The numpy scalar a launch passes (and the element type of a buffer a pointer to it receives)."""
    ptx: str
    """The PTX type nvcc gives a scalar .param of this type (a pointer is always u64; signed
    integers are declared unsigned there, as nvcc does)."""
    prepare: str
    """PyCUDA's struct code for a scalar of this type in `function.prepare`."""
    buffer: str
    """The plan buffer dtype a pointer to this type receives ("float32", "uint32", ...)."""

    @property
    def is_float(self) -> bool:
        return np.dtype(self.numpy).kind == "f"

    @property
    def range(self) -> tuple[int, int] | None:
        """The integers a scalar argument may take; None for a floating-point type."""
        if self.is_float:
            return None
        info = np.iinfo(self.numpy)
        return int(info.min), int(info.max)


C_TYPES: dict[str, CType] = {
    t.spelling: t
    for t in (
        CType("float", np.float32, "f32", "f", "float32"),
        CType("int32_t", np.int32, "u32", "i", "int32"),
        CType("int", np.int32, "u32", "i", "int32"),
        CType("uint32_t", np.uint32, "u32", "I", "uint32"),
        CType("unsigned int", np.uint32, "u32", "I", "uint32"),
        CType("int64_t", np.int64, "u64", "q", "int64"),
        CType("uint64_t", np.uint64, "u64", "Q", "uint64"),
        CType("size_t", np.uint64, "u64", "Q", "uint64"),
    )
}

BUFFER_DTYPES: dict[str, type] = {t.buffer: t.numpy for t in C_TYPES.values()}
"""What a plan buffer may hold: the element type of some pointer parameter."""


def scalar_argument(ctype: str, value) -> np.generic:
    """`value` as the exact numpy scalar a launch passes for a parameter of C type `ctype`."""
    return C_TYPES[ctype].numpy(value)


def argument_word(value: np.generic) -> int:
    """A typed launch argument as the 64-bit word the emulator reads: a floating-point value's
    bits in the low half, an integer (or a device address) modulo 2^64."""
    if np.dtype(type(value)).kind == "f":
        return int(np.asarray(value).view(np.uint32 if np.dtype(type(value)).itemsize == 4 else np.uint64))
    return int(value) & 0xFFFFFFFFFFFFFFFF
