"""Instruments for tests and benchmarks, not used by the package itself (as numpy.testing):
`alloc_counter` counts numpy and Numba allocations exactly."""
