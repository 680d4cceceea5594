"""harness.suites: the suites pipeline: the `run` verb as named steps, pytest processes with crash isolation, shards, results, retries, history, flakes."""
