"""The stable ids of the contract checks of `capsules verify` (design §4)."""

CHECKS = {
    "contract.aligned": "each descriptor states its own obligation (TorchLean's contractsAligned)",
    "ffi.symbols": "every symbol is in its source file and a PTX .entry with the declared parameters",
    "launch.plan": "grid, block, shared memory and arguments are legal for every sample shape",
    "shape.guard": "every error input is refused with a clear error before any launch",
    "value": "forward within the tolerance model of the float64 reference",
    "value.special": "NaN / ±inf / −0 inputs give what the op's policy states",
    "vjp": "backward within the tolerance model of the reference VJP",
    "vjp.reference": "the reference VJP agrees with finite differences and the adjoint identity",
    "reduction.order": "the numerical policy: fixed-left bitwise, implementation-defined within the order-free bound",
    "determinism": "two runs give the same bits",
    "rng": "the seeded stream: same seed same bits, other seed other bits, bitwise the reference generator",
    "selection.ties": "under ties each window's gradient goes to exactly one tied position",
    "bounds": "no write past any buffer (outputs, inputs, workspaces), every output element written",
    "inputs.intact": "every input buffer bitwise unchanged",
}

STATIC_CHECKS = ("contract.aligned", "ffi.symbols", "launch.plan")
"""The checks that read the sources and the plans, and launch nothing."""

SANITIZER_CHECKS = {
    "sanitize.memcheck": "no out-of-bounds or misaligned access, no undefined behaviour (AddressSanitizer, UBSan)",
    "sanitize.racecheck": "no shared- or global-memory hazard between threads that no barrier orders (ThreadSanitizer)",
    "sanitize.synccheck": "every barrier and shuffle reached by the whole block or warp",
    "sanitize.initcheck": "no value read from memory no one wrote (valgrind)",
}
"""The checks of `verify --sanitize` (design §8): run only when asked, on the emulator."""

ALL_CHECKS = {**CHECKS, **SANITIZER_CHECKS}
