"""Runtime layer: load generated kernel sources (cache) and launch them (launcher)."""
