"""Run under `horovodrun -np 2 --gloo`: each worker holds its shard of a distributed static
table and the keys it owns of a dynamic table; sok.dump gathers them into one set of files
(argv[1]). tests/checkpoints/test_checkpoint_files.py loads them into one worker."""
import sys

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok

hvd.init()
sok.init()
static = sok.Variable(np.arange(7 * 3, dtype=np.float32).reshape(7, 3), name="static_mw")
dynamic = sok.DynamicVariable(3, name="dynamic_mw", initializer="zeros")
keys = np.array([-9, 4, 1 << 50, 17, 23], np.int64)
mine = keys[dynamic.owns(keys)]
dynamic.assign(tf.constant(mine), np.repeat(mine[:, None].astype(np.float32) % 1000, 3, axis=1))
sok.dump(sys.argv[1], [static, dynamic])
print(f"DUMPED rank={hvd.rank()} keys={len(mine)}", flush=True)
(written,), (rows,) = sok.incremental_model_dump([dynamic], 0.0)  # gathered over workers
print(f"INCREMENTAL rank={hvd.rank()} keys={sorted(written.tolist())} rows={rows.shape}",
      flush=True)

# SOK's sok.communication on 2 workers, and sok.assign refusing a row the other one holds.
comm, rank = sok.communication, hvd.rank()
checks = [comm.num_ranks() == 2, comm.global_gpu_id() == rank,
          float(comm.allreduce(tf.constant(rank + 1.0), op="sum")) == 3.0,
          float(comm.allreduce(tf.constant(rank + 1.0), op="max")) == 2.0,
          comm.allgather(tf.constant([rank])).numpy().tolist() == [0, 1],
          int(comm.broadcast(tf.constant(rank + 10), root=1)) == 11]
print(f"COMM {'OK' if all(checks) else checks} rank={rank}", flush=True)
other_row = 1 - rank  # distributed: row r lives on worker r % 2
try:
    sok.assign(static, [other_row], np.zeros([1, 3], np.float32))
except ValueError as error:
    print(f"ASSIGN_REFUSED rank={rank}: {error}", flush=True)
