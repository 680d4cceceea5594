"""Command-line tools around the compiler (``python -m compiler.tools.<name>``)."""
