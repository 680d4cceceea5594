"""Lowering tables. Importing this package registers every lowering in ``graph.LOWERINGS``."""

from . import control_flow, indexing, misc, pointwise, pooling, reductions, scatter, views  # noqa: F401
