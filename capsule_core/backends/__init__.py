"""Backends: the float64 reference and the numpy float32 provider (cpu), and PyCUDA (cuda)."""
