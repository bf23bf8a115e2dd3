"""sok.init, sok.Variable placement, filter_variables, training with TF optimizers."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from keras_optimizers import keras_optimizer, summed_duplicates


def test_init_rejects_unknown_tool_and_second_call():
    with pytest.raises(ValueError, match="unknown comm_tool 'mpi'; valid tools are"):
        sok.init(comm_tool="mpi")
    with pytest.raises(RuntimeError, match="already called"):
        sok.init(comm_tool="single")


def test_single_worker_variable_is_the_whole_table():
    init = np.arange(12, dtype=np.float32).reshape(6, 2)
    for mode in [None, "distributed", "localized:0"]:
        v = sok.Variable(init, mode=mode)
        np.testing.assert_array_equal(v.numpy(), init)
        assert v.global_rows == 6 and v.dimension == 2 and v.num_gpus == 1
        np.testing.assert_array_equal(v.global_row_ids(), np.arange(6))
    assert sok.Variable(init).mode == "distributed" and sok.Variable(init).target_gpu == -1
    assert sok.Variable(init, mode="localized:0").target_gpu == 0


def test_placement_shards_rows_round_robin():
    """The local shard of worker `rank` among N: rows r with r % N == rank, increasing r."""
    from sparse_operation_kit.placement import DISTRIBUTED, Placement

    table = np.arange(7 * 2).reshape(7, 2)
    placement = Placement(DISTRIBUTED, 3)
    shards = [np.asarray(placement.local_shard(table, r)) for r in range(3)]
    assert [s.shape[0] for s in shards] == [placement.local_rows(7, r) for r in range(3)] == [3, 2, 2]
    np.testing.assert_array_equal(shards[1], table[[1, 4]])
    localized = Placement(2, 3)
    assert [localized.local_rows(7, r) for r in range(3)] == [0, 0, 7]
    # the owner of each row is the worker whose shard holds it; keys as uint64 (negative too)
    for r in range(3):
        np.testing.assert_array_equal(table[placement.owner_of(np.arange(7)) == r], shards[r])
    keys = np.array([-1, -7, 5, 2**62 + 1], np.int64)
    np.testing.assert_array_equal(placement.owner_of(keys), keys.astype(np.uint64) % np.uint64(3))
    np.testing.assert_array_equal(localized.owner_of(keys), [2, 2, 2, 2])
    # the global rows a worker holds are its shard's rows, in local order
    for p in (placement, localized):
        for r in range(3):
            np.testing.assert_array_equal(table[p.held_rows(7, r)], np.asarray(p.local_shard(table, r)))


def test_variable_from_shape_and_initializer():
    v = sok.Variable(shape=[5, 3], initializer="ones")
    np.testing.assert_array_equal(v.numpy(), np.ones([5, 3], np.float32))
    with pytest.raises(ValueError, match="shape=\\[rows, dim\\]"):
        sok.Variable(shape=[5])


@pytest.mark.parametrize("mode", ["localized:1", "replicated", "localized:x"])
def test_bad_mode(mode):
    with pytest.raises(ValueError, match="mode"):
        sok.Variable(np.ones([2, 2], np.float32), mode=mode)


def test_filter_variables():
    a, b = sok.Variable(np.ones([2, 2], np.float32)), tf.Variable(1.0)
    assert sok.filter_variables([b, a]) == ([a], [b])


def test_tf_version_and_raw_ops():
    assert sok.tf_version in [(2, minor) for minor in range(15, 22)]
    assert sok.tf_version == tuple(int(p) for p in tf.__version__.split(".")[:2])
    assert "sok_partition_keys" in dir(sok.raw_ops)


@pytest.mark.parametrize("make_optimizer", [
    lambda: keras_optimizer("SGD", 0.1, momentum=0.9),
    lambda: keras_optimizer("Adagrad", 0.1),
    lambda: tf.keras.optimizers.SGD(0.1),
])
def test_trains_like_tf_variable(make_optimizer):
    """Ten steps with a TF optimizer equal the same steps on a tf.Variable reference; rows no
    sample used stay untouched (lazy), momentum included under Keras 2 (Keras 3's momentum moves
    them, the reference's alike)."""
    rng = np.random.default_rng(1)
    init = rng.normal(size=[20, 4]).astype(np.float32)
    table, ref = sok.Variable(init), tf.Variable(init)
    opt, ref_opt = make_optimizer(), make_optimizer()

    @tf.function
    def step(ids):
        with tf.GradientTape(persistent=True) as tape:
            out = sok.lookup_sparse([table], [ids], combiners=["sum"])[0]
            # Not safe_embedding_lookup_sparse: it routes empty samples through row 0 with a zero
            # gradient, which makes momentum move row 0 when no sample used it.
            ref_out = tf.reduce_sum(tf.gather(ref, ids), axis=1)
            loss, ref_loss = tf.reduce_sum(out ** 2), tf.reduce_sum(ref_out ** 2)
        opt.apply_gradients([(tape.gradient(loss, table), table)])
        ref_opt.apply_gradients([(summed_duplicates(tape.gradient(ref_loss, ref)), ref)])

    for _ in range(10):
        lengths = rng.integers(0, 4, size=8)
        ids = tf.RaggedTensor.from_row_lengths(
            tf.constant(rng.integers(0, 20, size=lengths.sum()), tf.int64), lengths)
        step(ids)
    np.testing.assert_allclose(table.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)


def test_checkpoint_round_trip(tmp_path):
    table = sok.Variable(np.ones([4, 2], np.float32))
    checkpoint = tf.train.Checkpoint(table=table)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    table.assign(np.zeros([4, 2], np.float32))
    checkpoint.restore(path)
    np.testing.assert_array_equal(table.numpy(), np.ones([4, 2], np.float32))
