from capsule_core.catalog.library import Capsule, CapsuleLibrary, Kernel

LIBRARY = CapsuleLibrary(
    name="tiny",
    sources=("csrc/tiny.cu",),
    plans="tiny_plans",
    capsules=(
        Capsule("relu", kernels=(Kernel("tiny::relu_fwd"), Kernel("tiny::relu_bwd", "backward"))),
        Capsule(
            "mse_loss",
            kernels=(Kernel("tiny::mse_atomic"), Kernel("tiny::mse_finish"), Kernel("tiny::mse_bwd", "backward")),
            reduction="implementation-defined",
        ),
    ),
)
