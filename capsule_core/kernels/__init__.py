"""The kernel layer: nvcc and its content-hash cache (nvcc), the one table of C types (c_types),
launch plans and their validation (launch, plans/), and the occupancy calculator."""
