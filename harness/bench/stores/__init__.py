"""The bench store (runs, results, samples, verdicts) and the environment a run records."""
