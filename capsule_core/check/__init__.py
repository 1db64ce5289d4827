"""`capsules check` and what `show` reports of a kernel: compiled PTX against the declared
signatures, ptxas resources against budgets, launch plans over the samples."""
