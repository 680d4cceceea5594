"""Judging a run: comparison with a baseline, the paired side-by-side test, a job's verdict lines."""
