"""Every bad input gets a clear error naming the bad value."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok


@pytest.fixture
def table():
    return sok.Variable(np.ones([10, 4], np.float32), name="user_table")


def ragged(values, dtype=tf.int64):
    return tf.ragged.constant(values, dtype=dtype, ragged_rank=1)


@pytest.mark.parametrize("bad_id", [10, 12345, -1])
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_out_of_range_id_names_table_id_and_range(table, bad_id, mode):
    ids = ragged([[1, bad_id], [2]])
    fn = lambda: sok.lookup_sparse([table], [ids])  # noqa: E731
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        fn() if mode == "eager" else tf.function(fn)()
    message = str(error.value)
    assert f"id {bad_id} of table 'user_table:0' is out of range [0, 10)" in message


def test_out_of_range_in_int32_sparse_ids(table):
    ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([3, 99], tf.int32), [2, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 99 .* out of range \[0, 10\)"):
        sok.lookup_sparse([table], [ids])


def test_out_of_range_in_all2all_dense_embedding(table):
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 10 of table 'user_table:0'"):
        sok.all2all_dense_embedding(table, tf.constant([[1, 10]], tf.int64))


def test_list_length_mismatch(table):
    with pytest.raises(ValueError, match="params has 2 tables but sp_ids has 1"):
        sok.lookup_sparse([table, table], [ragged([[1]])])


def test_combiners_length_mismatch(table):
    with pytest.raises(ValueError, match="combiners has 2 entries for 1 lookups"):
        sok.lookup_sparse([table], [ragged([[1]])], combiners=["sum", "mean"])


def test_unknown_combiner_names_valid_ones(table):
    with pytest.raises(ValueError, match=r"combiners\[0\] is 'max'; valid combiners are "
                                         r"\('sum', 'mean', 'sqrtn'\)"):
        sok.lookup_sparse([table], [ragged([[1]])], combiners=["max"])


def test_weights_list_length_mismatch(table):
    with pytest.raises(ValueError, match="sp_weights has 2 entries for 1 lookups"):
        sok.lookup_sparse([table], [ragged([[1]])], sp_weights=[None, None])


def test_float_ids_are_a_type_error(table):
    with pytest.raises(TypeError, match="sp_ids\\[0\\] has dtype float32; ids must be int32 or int64"):
        sok.lookup_sparse([table], [tf.ragged.constant([[1.0]])])


def test_dense_ids_are_a_type_error(table):
    with pytest.raises(TypeError, match="must be a tf.SparseTensor or tf.RaggedTensor, got EagerTensor"):
        sok.lookup_sparse([table], [tf.constant([[1]], tf.int64)])


def test_ids_of_rank_three_are_a_value_error(table):
    ids = tf.RaggedTensor.from_uniform_row_length(ragged([[1], [2]]), 2)
    with pytest.raises(ValueError, match="must be a 2-D RaggedTensor"):
        sok.lookup_sparse([table], [ids])
    sparse = tf.SparseTensor([[0, 0, 0]], tf.constant([1], tf.int64), [1, 1, 1])
    with pytest.raises(ValueError, match="must be a 2-D SparseTensor, got rank 3"):
        sok.lookup_sparse([table], [sparse])


def test_weights_of_wrong_dtype(table):
    with pytest.raises(TypeError, match="sp_weights\\[0\\] has dtype int32; weights must be "
                                        "float32, float16, bfloat16 or float64"):
        sok.lookup_sparse([table], [ragged([[1]])], [tf.ragged.constant([[1]], tf.int32)])


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_weights_that_do_not_match_ids(table, mode):
    ids, weights = ragged([[1, 2], [3]]), tf.ragged.constant([[1.0], [2.0]])
    fn = lambda: sok.lookup_sparse([table], [ids], [weights])  # noqa: E731
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="weights of lookup 0 have 2 values but its ids have 3"):
        fn() if mode == "eager" else tf.function(fn)()


def test_table_of_wrong_dtype_or_rank():
    with pytest.raises(TypeError, match="has dtype float64; tables must be float32, float16 or bfloat16"):
        sok.lookup_sparse([tf.Variable(np.ones([3, 2]))], [ragged([[1]])])
    with pytest.raises(ValueError, match="must be a \\[rows, dim\\] table, got shape \\(3,\\)"):
        sok.lookup_sparse([tf.Variable(np.ones([3], np.float32))], [ragged([[1]])])
    with pytest.raises(TypeError, match="params\\[0\\] must be a sok.Variable or tf.Variable"):
        sok.lookup_sparse([np.ones([3, 2], np.float32)], [ragged([[1]])])


def test_sp_ids_of_a_list_of_tables_must_be_a_list_or_a_packed_batch():
    # One RaggedTensor is a packed batch (tests/lookup/test_packed_features.py); one SparseTensor is
    # neither form.
    with pytest.raises(TypeError, match="sp_ids must be a list, got SparseTensor"):
        sok.lookup_sparse([tf.Variable(np.ones([3, 2], np.float32))],
                          ragged([[1]]).to_sparse())


def test_raw_op_rejects_bad_row_splits():
    rows = tf.ones([3, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="row_splits decrease at sample 1"):
        sok.raw_ops.sok_combine_forward(
            rows=rows, position=tf.constant([0, 1, 2], tf.uint32),
            row_splits=[tf.constant([0, 2, 1, 3], tf.int64)], weights=[tf.zeros([0])],
            combiners=["sum"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="row position 7 is out of range"):
        sok.raw_ops.sok_combine_forward(
            rows=rows, position=tf.constant([0, 7], tf.uint32),
            row_splits=[tf.constant([0, 2], tf.int64)], weights=[tf.zeros([0])],
            combiners=["sum"])


def test_raw_op_rejects_unknown_combiner():
    with pytest.raises(tf.errors.InvalidArgumentError, match="unknown combiner 'max'"):
        sok.raw_ops.sok_combine_forward(
            rows=tf.ones([1, 2]), position=tf.constant([0], tf.uint32),
            row_splits=[tf.constant([0, 1], tf.int64)], weights=[tf.zeros([0])],
            combiners=["max"])
