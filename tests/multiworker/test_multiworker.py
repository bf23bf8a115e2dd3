"""Multi-worker tests: real Horovod workers (horovodrun --gloo) launched from the suite."""
import pytest
import tensorflow as tf

from conftest import horovodrun
from keras_optimizers import keras_2_only

NUM_GPUS = len(tf.config.list_physical_devices("GPU"))


def assert_both_workers_pass(script, *args):
    """Runs `script` on two workers; each must print its PASS line."""
    output = horovodrun(script, *args)
    assert output.count("PASS rank=") == 2, output[-3000:]


def training_args(optimizer, function):
    return ["--optimizer", optimizer] + (["--function"] if function else [])


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adagrad"])
@pytest.mark.parametrize("function", [False, True])
def test_static_tables_match_single_worker_reference(optimizer, function):
    assert_both_workers_pass("train_static.py", *training_args(optimizer, function))


@keras_2_only  # the lazy static update is the legacy Adam's
def test_static_tables_under_adam_are_updated_lazily_like_the_reference():
    # Through sok.OptimizerWrapper each worker's shard rows touched in the global batch, and
    # only those, take Adam steps (Sok>StaticApply), like a lazy NumPy Adam on one worker.
    assert_both_workers_pass("train_static.py", "--optimizer", "adam", "--function")


def test_float16_compressed_exchange_matches_reference_within_float16_rounding():
    assert_both_workers_pass("train_static.py", "--optimizer", "adagrad", "--function",
                             "--compress")


@pytest.mark.parametrize("table_dtype", ["float16", "bfloat16"])
def test_16bit_static_tables_match_reference_within_their_rounding(table_dtype):
    if table_dtype == "bfloat16" and NUM_GPUS:
        pytest.skip("TensorFlow has no GPU kernel of ResourceSparseApplyKerasMomentum for "
                    "bfloat16, the update Keras' momentum SGD gives a bfloat16 table")
    # Their rows cross the exchange as stored and pool in float32 (sok.lookup_sparse).
    assert_both_workers_pass("train_static.py", "--optimizer", "sgd_momentum", "--function",
                             "--table_dtype", table_dtype)


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adagrad"])
@pytest.mark.parametrize("function", [False, True])
def test_dynamic_tables_match_single_worker_reference(optimizer, function):
    assert_both_workers_pass("train_dynamic.py", *training_args(optimizer, function))


def test_unnamed_localized_dynamic_tables_dump_and_load_on_two_workers(tmp_path):
    # SOK's localized dump/load test: the workers' automatic table names differ, files are
    # named as rank 0 names the tables, and no load reads another table's files.
    assert_both_workers_pass("dump_localized.py", str(tmp_path / "weight"))


def test_plan_with_dp_localized_and_distributed_groups_matches_single_worker():
    assert_both_workers_pass("train_plan.py")


@pytest.mark.skipif(NUM_GPUS < 2, reason="the NCCL exchange needs a GPU per worker")
def test_nccl_exchange_equals_horovod_alltoall_and_routes_gradients_back():
    assert_both_workers_pass("exchange.py")


@pytest.mark.skipif(NUM_GPUS > 0, reason="checks the refusal where there is no GPU")
def test_insisting_on_the_nccl_exchange_without_gpus_is_a_clear_error():
    output = horovodrun("train_plan.py", expect_success=False, SOK_EXCHANGE="nccl")
    assert "SOK_EXCHANGE=nccl but the GPU exchange is unavailable: TensorFlow sees no GPU" in output


def test_unknown_exchange_name_is_rejected():
    output = horovodrun("train_plan.py", expect_success=False, SOK_EXCHANGE="mpi")
    assert "SOK_EXCHANGE is 'mpi'; valid values are ('auto', 'nccl', 'horovod')" in output
