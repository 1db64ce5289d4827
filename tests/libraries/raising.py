from capsule_core.catalog.library import Capsule, CapsuleLibrary, Kernel

LIBRARY = CapsuleLibrary(
    name="raising",
    sources=("csrc/tiny.cu",),
    plans="raising_plans",
    capsules=(Capsule("relu", kernels=(Kernel("tiny::relu_fwd"), Kernel("tiny::relu_bwd", "backward"))),),
)
