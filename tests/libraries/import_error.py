from capsule_core.catalog.library import Capsule, CapsuleLibrary, Kernel

KERNELS = (Kernel("tiny::relu_fwd"), Kernel("tiny::relu_bwd", "backward"))
LIBRARY = CapsuleLibrary(
    name="broken",
    sources=("csrc/tiny.cu",),
    plans="tiny_plans",
    capsules=(Capsule("relu", kernels=KERNELS, trust=TRUSTED),),  # noqa: F821 (the planted import error)
)
