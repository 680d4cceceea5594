"""harness.checks: checks before and beside the suites: GPU health, the compile check."""
