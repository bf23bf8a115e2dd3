"""Run under `horovodrun -np 2 --gloo`: dumps the crash tables with every value 1.0 to
argv[1], then again with 2.0 while worker argv[2] dies (SIGKILL) at step argv[3] of its part
of the dump: a file-system step on rank 0 (which writes), a gather on rank 1.
tests/checkpoints/test_checkpoint_crash.py then loads the folder."""
import os
import signal
import sys

import horovod.tensorflow as hvd

import sparse_operation_kit as sok
from crash_tables import count_dump_steps, fill, make_tables
from sparse_operation_kit import checkpoint

KEYS = 2000
path, dying_rank, step_to_die = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hvd.init()
sok.init()
tables, optimizer = make_tables(KEYS)
fill(tables, optimizer, KEYS, 1.0)
sok.dump(path, tables, optimizer)
fill(tables, optimizer, KEYS, 2.0)


def die(step_name):
    print(f"DYING rank={hvd.rank()} at {step_name}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if hvd.rank() == dying_rank == 0:
    count_dump_steps(setattr, step_to_die, die)
elif hvd.rank() == dying_rank:
    gather, gathers = checkpoint._gather, [0]

    def dying_gather(array):
        gathers[0] += 1
        if gathers[0] == step_to_die:
            die(f"gather {gathers[0]}")
        return gather(array)

    checkpoint._gather = dying_gather
sok.dump(path, tables, optimizer)
print(f"DUMPED rank={hvd.rank()}", flush=True)
