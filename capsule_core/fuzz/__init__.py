"""`capsules fuzz`: Hypothesis strategies from the OpSpecs, shrinking, replay files."""
