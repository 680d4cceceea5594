"""Column types that mean the same on both engines (used by tables.py and the migrations).

REAL8   an 8-byte float: SQLite's REAL, PostgreSQL's `double precision` (its own REAL is 4 bytes, which would
        round stored nanoseconds)
INT8    an 8-byte integer: SQLite's INTEGER, PostgreSQL's `bigint` (byte and flop counts pass 2**31)
"""

from sqlalchemy import REAL, BigInteger, Integer
from sqlalchemy.dialects.postgresql import DOUBLE_PRECISION
from sqlalchemy.types import TypeEngine

REAL8: TypeEngine[float] = REAL().with_variant(DOUBLE_PRECISION(), "postgresql")
INT8 = Integer().with_variant(BigInteger(), "postgresql")
