"""Bench reports: tables, Markdown, JSON and plots of a run, and what moved over the stored runs."""
