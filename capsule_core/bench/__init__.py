"""`capsules bench`: timing (engine), the library baselines (baselines), the reference suites
(suites) and the CPU timed targets (cpu_timing)."""
