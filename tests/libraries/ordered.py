from capsule_core.catalog.library import Capsule, CapsuleLibrary, Kernel

LIBRARY = CapsuleLibrary(
    name="ordered",
    sources=("csrc/tiny.cu",),
    plans="ordered_plans",
    capsules=(
        Capsule(
            "mse_loss",
            kernels=(Kernel("tiny::mse_ordered"), Kernel("tiny::mse_bwd", "backward")),
            reduction="implementation-defined",
        ),
    ),
)
