"""Where the rows of a table live across the workers: the one placement rule of the package
(kit_src/core/embedding/row_owner.h is its C++ side, which the lookup kernels follow).

- distributed (SOK's default mode): row r of a static table on worker r % N at local row
  r // N; key k of a dynamic table on worker uint64(k) % N;
- localized:K: the whole table on worker K, nothing elsewhere.
"""
import dataclasses
import re

import numpy as np

_LOCALIZED = re.compile(r"^localized:(\d+)$")
DISTRIBUTED = -1  # `Placement.owner` of a distributed table


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the rows of a table live."""

    owner: int  # DISTRIBUTED, or the worker holding the whole table
    num_workers: int

    def mode(self):
        return "distributed" if self.owner == DISTRIBUTED else f"localized:{self.owner}"

    def owner_of(self, ids):
        """The worker holding each of `ids` (global rows of a static table, keys of a dynamic
        one), as the lookup kernels route them."""
        ids = np.asarray(ids, np.int64)
        if self.owner != DISTRIBUTED:
            return np.full(ids.shape, self.owner, np.int64)
        return (ids.astype(np.uint64) % np.uint64(self.num_workers)).astype(np.int64)

    def local_rows(self, global_rows, rank):
        """How many rows of a static table of `global_rows` worker `rank` holds."""
        if self.owner == DISTRIBUTED:
            return max(0, (global_rows - rank + self.num_workers - 1) // self.num_workers)
        return global_rows if rank == self.owner else 0

    def held_rows(self, global_rows, rank):
        """The global rows worker `rank` holds, in local row order (int64 numpy array)."""
        if self.owner == DISTRIBUTED:
            return np.arange(rank, global_rows, self.num_workers, dtype=np.int64)
        return np.arange(self.local_rows(global_rows, rank), dtype=np.int64)

    def local_shard(self, global_value, rank):
        """The rows of a whole static table (an array) that worker `rank` holds."""
        if self.owner == DISTRIBUTED:
            return global_value[rank::self.num_workers]
        return global_value if rank == self.owner else global_value[:0]


def parse_mode(mode, num_workers):
    """Parses SOK's `mode` string into a Placement; ValueError names the valid forms."""
    if mode is None or mode == "distributed":
        return Placement(DISTRIBUTED, num_workers)
    match = _LOCALIZED.match(mode) if isinstance(mode, str) else None
    if not match:
        raise ValueError(f"unknown mode {mode!r}; valid modes are None, 'distributed' and "
                         "'localized:K' with K a worker index")
    owner = int(match.group(1))
    if owner >= num_workers:
        raise ValueError(f"mode {mode!r} places the table on worker {owner}, but there are "
                         f"only {num_workers} workers")
    return Placement(owner, num_workers)
