"""The rest of SOK v2's Python surface, used as SOK's scripts use it: sok.communication,
set_comm_tool, DistributedVariable / LocalizedVariable, SOK's module names, tf.Variable's
positional order, float16 weights, sok.assign's ownership check, use without sok.init()."""
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from conftest import subprocess_env



def test_communication_functions_on_one_worker():
    comm = sok.communication
    assert (comm.rank(), comm.num_ranks(), comm.local_rank(), comm.global_gpu_id(),
            comm.num_gpus()) == (0, 1, 0, 0, 1)
    x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    for op in ["sum", "average", "max", "min"]:
        np.testing.assert_array_equal(comm.allreduce(x, op=op).numpy(), x.numpy())
    np.testing.assert_array_equal(comm.allgather(x).numpy(), x.numpy())
    np.testing.assert_array_equal(comm.broadcast(x, root=0).numpy(), x.numpy())
    received, splits = comm.alltoall(x, tf.constant([2]))
    np.testing.assert_array_equal(received.numpy(), x.numpy())
    with pytest.raises(ValueError, match="unknown allreduce op 'prod'; valid ops are"):
        comm.allreduce(x, op="prod")
    with pytest.raises(RuntimeError, match=r"set_comm_tool\('horovod'\) after sok was initialised"):
        sok.set_comm_tool("horovod")


def test_variable_classes_modules_and_positional_order():
    init = np.arange(12, dtype=np.float32).reshape(6, 2)
    frozen = sok.Variable(init, False, name="positional")  # tf.Variable's order: trainable 2nd
    assert not frozen.trainable and frozen.name == "positional:0"
    distributed = sok.DistributedVariable(init, name="dist_cls")
    localized = sok.LocalizedVariable(init, target_gpu=0, name="local_cls")
    assert distributed.mode == "distributed" and localized.mode == "localized:0"
    assert isinstance(localized, sok.Variable)
    from sparse_operation_kit import distributed_variable, dump_load, utils  # noqa: PLC0415

    assert distributed_variable.Variable is sok.Variable and dump_load.dump is sok.dump
    assert utils.filter_variables([distributed, tf.Variable(1.0)])[0] == [distributed]
    assert sok.__version__ and sok.tf_version == utils.tf_version
    with pytest.raises(ValueError, match="variable_def / import_scope"):
        sok.Variable(init, variable_def=object())


def test_float16_weights_pool_in_float32():
    table = sok.Variable(np.arange(20, dtype=np.float32).reshape(10, 2), name="w16")
    ids = tf.RaggedTensor.from_row_lengths(tf.constant([1, 3, 3], tf.int64), [2, 1])
    weights = tf.RaggedTensor.from_row_lengths(tf.constant([0.5, 2.0, 1.5], tf.float16), [2, 1])
    out = sok.lookup_sparse(table, ids, weights, combiners="sum")
    expected = tf.nn.safe_embedding_lookup_sparse(
        tf.convert_to_tensor(table), ids.to_sparse(), tf.cast(weights, tf.float32).to_sparse(),
        combiner="sum")
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-6)


def test_static_assign_refuses_rows_this_worker_does_not_hold():
    table = sok.Variable(np.zeros([4, 2], np.float32), name="assign_owner")
    sok.assign(table, [1, 3], np.ones([2, 2], np.float32))
    np.testing.assert_array_equal(table.numpy()[[1, 3]], np.ones([2, 2]))
    with pytest.raises(ValueError, match="row 7 of 'assign_owner:0' is not held by worker 0 of 1"):
        sok.assign(table, [0, 7], np.full([2, 2], 5.0, np.float32))
    assert table.numpy()[0].sum() == 0  # nothing written


SCRIPT_WITHOUT_INIT = """
import numpy as np, tensorflow as tf
import sparse_operation_kit as sok
v = sok.Variable(np.ones([5, 3], np.float32))
d = sok.DynamicVariable(3, name="no_init")
out = sok.lookup_sparse([v, d], [tf.ragged.constant([[1, 2]], tf.int64)] * 2, combiners=["sum"] * 2)
print("OK", out[0].numpy().sum(), sok.communication.num_ranks())
"""


def test_variables_work_without_sok_init_as_in_sok_examples():
    env = subprocess_env()
    result = subprocess.run([sys.executable, "-c", SCRIPT_WITHOUT_INIT], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "OK 6.0 1" in result.stdout
