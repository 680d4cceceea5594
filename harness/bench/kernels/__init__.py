"""The kernel tier: workloads, timers, the executor, whole runs, side-by-side confirmation, bisection."""
