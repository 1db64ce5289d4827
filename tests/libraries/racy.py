from capsule_core.catalog.library import Capsule, CapsuleLibrary, Kernel

LIBRARY = CapsuleLibrary(
    name="racy",
    sources=("csrc/racy.cu",),
    plans="racy_plans",
    capsules=(Capsule("relu", kernels=(Kernel("racy::relu_fwd"), Kernel("racy::relu_bwd", "backward"))),),
)
