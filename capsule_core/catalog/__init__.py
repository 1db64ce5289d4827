"""The catalogue: the registry and its planner, the 46 native CUDA capsules (the seed), their
reference twins on the CPU and the CPU providers that run the OpSpecs' own code."""
