"""The bench's shared floor: the typed records, statistics and the executor skeleton both tiers use."""
