"""Backends: the float64 reference, the numpy float32 provider and (later) PyCUDA."""
