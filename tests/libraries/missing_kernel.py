from capsule_core.catalog.library import Capsule, CapsuleLibrary, Kernel

LIBRARY = CapsuleLibrary(
    name="missing",
    sources=("csrc/tiny.cu",),
    plans="tiny_plans",
    capsules=(
        Capsule(
            "relu",
            kernels=(
                Kernel("tiny::relu_forward"),
                Kernel("tiny::relu_bwd", "backward"),
            ),
        ),
    ),
)
