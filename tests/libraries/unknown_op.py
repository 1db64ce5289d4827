from capsule_core.catalog.library import Capsule, CapsuleLibrary, Kernel

LIBRARY = CapsuleLibrary(
    name="typo",
    sources=("csrc/tiny.cu",),
    plans="tiny_plans",
    capsules=(
        Capsule("relu", kernels=(Kernel("tiny::relu_fwd"), Kernel("tiny::relu_bwd", "backward"))),
        Capsule("rellu", kernels=(Kernel("tiny::relu_fwd"), Kernel("tiny::relu_bwd", "backward"))),
    ),
)
