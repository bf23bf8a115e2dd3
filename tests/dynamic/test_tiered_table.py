"""Tiered dynamic tables (var_type="hybrid"): the rows in use, with their optimizer state,
within an HBM budget, the rest in host memory.

Each test drives a tiered table and a one-tier table of the same name (same initial rows)
with the same calls, its working set larger than the budget so rows move down to the host
and back, and checks both hold the same keys, rows and optimizer state: tiers change where a
row lives, never its value. On the CPU both tiers are host tables
(dynamic_variable._TIER_ON_HOST); on the GPU machine the hot tier is in GPU memory.
"""
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit import dynamic_variable, raw_ops
from conftest import ROOT, poison, subprocess_env
from keras_optimizers import keras_optimizer

UNIVERSE = 1500  # distinct keys the tests cycle through
BUDGET_ROWS = 160  # rows (value and state) the hot tier holds: about a tenth of them

# Every fused rule, with the floats of state it keeps per value float.
RULES = {
    "sgd": (lambda: keras_optimizer("SGD", 0.1), 0),
    "momentum": (lambda: keras_optimizer("SGD", 0.05, momentum=0.9), 1),
    "nesterov": (lambda: keras_optimizer("SGD", 0.05, momentum=0.9, nesterov=True), 1),
    "adagrad": (lambda: keras_optimizer("Adagrad", 0.1), 1),
    "adam": (lambda: keras_optimizer("Adam", 0.01), 2),
    "adamax": (lambda: keras_optimizer("Adamax", 0.01), 2),
    "adadelta": (lambda: keras_optimizer("Adadelta", 1.0), 2),
    "rmsprop": (lambda: keras_optimizer("RMSprop", 0.01), 1),
    "rmsprop_momentum": (lambda: keras_optimizer("RMSprop", 0.01, momentum=0.5), 2),
    "rmsprop_centered": (lambda: keras_optimizer("RMSprop", 0.01, centered=True), 2),
    "ftrl": (lambda: keras_optimizer("Ftrl", 0.1, l1_regularization_strength=0.01), 2),
    "nadam": (lambda: keras_optimizer("Nadam", 0.01), 2),
}


@pytest.fixture(autouse=True)
def tiers_on_every_device(monkeypatch):
    monkeypatch.setattr(dynamic_variable, "_TIER_ON_HOST", True)


def make_pair(device, dim, name, budget_rows=BUDGET_ROWS, state_floats=2, **kwargs):
    """(tiered, one-tier) tables of the same name on `device`."""
    poison(device)
    budget = budget_rows * dim * (1 + state_floats) * 4
    with tf.device(f"{device}:0"):
        tiered = sok.DynamicVariable(dim, name=name, var_type="hybrid", hbm_budget_bytes=budget,
                                     **kwargs)
        plain = sok.DynamicVariable(dim, name=name, **kwargs)
    return tiered, plain


def export_sorted(table):
    keys, values, state = (t.numpy() for t in raw_ops.sok_dynamic_table_export(table.handle))
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order], state[order]


def assert_equal_rows(a, b, device):
    # On the GPU the gradient of repeated ids and plain SGD's updates add by atomics, in no
    # fixed order: a table trained twice the same way is equal up to float rounding there.
    if device == "CPU" or a.dtype == np.int64:
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def assert_same(tiered, plain, device):
    for a, b in zip(export_sorted(tiered), export_sorted(plain)):
        assert_equal_rows(a, b, device)


def batches(rng, distribution, steps, size=96):
    """Ragged batches of keys: power-law (Zipf over the universe, hot keys repeat within a
    batch) or uniform; every batch has fewer distinct keys than the budget."""
    out = []
    for _ in range(steps):
        if distribution == "powerlaw":
            ids = (rng.zipf(1.05, size=size) - 1) % UNIVERSE
        else:
            ids = rng.integers(0, UNIVERSE, size=size)
        keys = ids.astype(np.int64) * 7919 - (1 << 40)  # spread over the int64 range
        out.append(tf.RaggedTensor.from_row_lengths(tf.constant(keys), [size // 16] * 16))
    return out


def train(table, optimizer, data, device):
    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse([table], [ids], combiners=["sum"])[0]
            loss = tf.reduce_sum(out * out)
        optimizer.apply_gradients([(tape.gradient(loss, table), table)])

    for ids in data:
        with tf.device(f"{device}:0"):
            step(ids)


@pytest.mark.parametrize("distribution", ["powerlaw", "uniform"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_training_gives_the_rows_and_state_of_a_one_tier_table(device, distribution, rule):
    make_optimizer, state_floats = RULES[rule]
    tiered, plain = make_pair(device, 8, f"train_{rule}_{distribution}",
                              state_floats=state_floats)
    data = batches(np.random.default_rng(5), distribution, steps=24)
    for table in (tiered, plain):
        train(table, sok.OptimizerWrapper(make_optimizer()), data, device)
    keys = export_sorted(plain)[0]
    counts = sok.tier_counts(tiered)
    assert sok.tier_counts(plain) is None
    assert counts["hot_keys"] + counts["host_keys"] == len(keys) > 2 * BUDGET_ROWS
    assert counts["hot_keys"] <= BUDGET_ROWS
    # Rows went down to the host and came back up; not every key was a hit.
    assert counts["moved_down"] >= len(keys) - BUDGET_ROWS and counts["moved_up"] > 0
    assert 0 < counts["hot_hits"] < counts["ids_looked_up"]
    assert_same(tiered, plain, device)
    # Reads (no insert) of rows in either tier, and of keys in neither.
    probe = tf.constant(np.concatenate([keys[::7], [12345, -6]]))
    with tf.device(f"{device}:0"):
        assert_equal_rows(tiered.sparse_read(probe, insert=False).numpy(),
                          plain.sparse_read(probe, insert=False).numpy(), device)


def test_thousands_of_rows_a_step_move_between_a_large_host_tier_and_the_hot_tier(device):
    # 120,000 keys, 24,000 rows of budget: each batch of 16,384 ids (repeats included)
    # brings thousands of rows up from a host table of over 90,000 keys, whose slot array
    # the take cuts into many ranges erased in parallel, and sends as many down.
    tiered, plain = make_pair(device, 4, "many_moving", budget_rows=24000, state_floats=0)
    rng = np.random.default_rng(8)
    keys = rng.choice(np.int64(1) << 50, size=120000, replace=False).astype(np.int64)
    values = rng.standard_normal((keys.size, 4)).astype(np.float32)
    for table in (tiered, plain):
        with tf.device(f"{device}:0"):
            table.assign(tf.constant(keys), values)
    data = [tf.RaggedTensor.from_row_lengths(tf.constant(keys[rng.integers(0, keys.size, 16384)]),
                                             [1] * 16384) for _ in range(4)]
    for table in (tiered, plain):
        train(table, sok.OptimizerWrapper(keras_optimizer("SGD", 0.1)), data, device)
    counts = sok.tier_counts(tiered)
    assert counts["moved_up"] > 4 * 8000 and counts["host_keys"] > 90000
    assert_same(tiered, plain, device)


def test_16_bit_rows_move_between_tiers_unchanged(device):
    tiered, plain = make_pair(device, 8, "bf16_tiers", dtype=tf.bfloat16)
    data = batches(np.random.default_rng(6), "powerlaw", steps=16)
    for table in (tiered, plain):
        train(table, sok.OptimizerWrapper(keras_optimizer("Adam", 0.01)), data, device)
    assert_same(tiered, plain, device)


def test_assign_erase_import_with_rows_in_both_tiers(device, tmp_path):
    tiered, plain = make_pair(device, 4, "edits", budget_rows=40, state_floats=0)
    rng = np.random.default_rng(7)
    for table in (tiered, plain):  # 600 keys: most on the host, the last used ones hot
        with tf.device(f"{device}:0"):
            for start in range(0, 600, 30):
                table.sparse_read(tf.constant(np.arange(start, start + 30, dtype=np.int64)))
    written = rng.permutation(700)[:200].astype(np.int64)  # hot, host and new keys
    values = rng.standard_normal((200, 4)).astype(np.float32)
    erased = tf.constant(np.arange(0, 700, 3, dtype=np.int64))
    for table in (tiered, plain):
        with tf.device(f"{device}:0"):
            table.assign(tf.constant(written), values)
            raw_ops.sok_dynamic_table_erase(table.handle, erased)
    assert_same(tiered, plain, device)
    # A checkpoint of the tiered table restores into a new tiered table (rows land on the
    # host and rise as they are used) and into a one-tier one.
    path = tf.train.Checkpoint(table=tiered).save(str(tmp_path / "tiered"))
    restored, restored_plain = make_pair(device, 4, "edits_restored", budget_rows=40,
                                         state_floats=0)
    for table in (restored, restored_plain):
        tf.train.Checkpoint(table=table).restore(path)
    assert_same(restored, plain, device)
    assert_same(restored_plain, plain, device)
    keys = tf.constant(export_sorted(plain)[0][:35])
    with tf.device(f"{device}:0"):
        np.testing.assert_array_equal(restored.sparse_read(keys).numpy(),
                                      plain.sparse_read(keys, insert=False).numpy())
    assert_same(restored, plain, device)


def test_low_frequency_filter_admits_misses_with_the_rows_of_a_one_tier_table():
    """A tiered table's misses are admitted by the filter on their way up from host memory:
    about filter_ratio of the new keys a lookup, each with the initial row a one-tier table
    gives it; the refused read zeros and are not held, and come back in later lookups."""
    tiered, plain = make_pair("CPU", 4, "filtered", budget_rows=300, state_floats=0,
                              filter_ratio=0.5)
    keys = np.arange(2000, dtype=np.int64) * 7919
    initial = plain.sparse_read(tf.constant(keys)).numpy()
    admitted = np.zeros(len(keys), bool)
    for round_ in range(3):
        for start in range(0, len(keys), 200):
            ids = tf.RaggedTensor.from_row_lengths(tf.constant(keys[start:start + 200]),
                                                   [1] * 200)
            out = sok.lookup_sparse([tiered], [ids], combiners=["sum"],
                                    use_low_frequency_filter=True)[0].numpy()
            held = (out != 0).any(axis=1)
            np.testing.assert_array_equal(out[held], initial[start:start + 200][held])
            assert (out[~held] == 0).all()
            assert held[admitted[start:start + 200]].all()  # once admitted, held
            admitted[start:start + 200] |= held
        if round_ == 0:
            assert abs(admitted.sum() - 1000) <= 5 * np.sqrt(2000 * 0.25)
    assert admitted.sum() > 1000
    held_keys = export_sorted(tiered)[0]
    np.testing.assert_array_equal(held_keys, np.sort(keys[admitted]))
    counts = sok.tier_counts(tiered)
    assert counts["host_keys"] > 0 and counts["moved_up"] > 0, counts


def test_eviction_at_max_capacity_removes_the_least_recently_used_of_both_tiers(device):
    tiered, plain = make_pair(device, 4, "evict", budget_rows=100, state_floats=0,
                              max_capacity=300, evict_strategy="lru")
    evicted = {}
    for name, table in (("tiered", tiered), ("plain", plain)):
        gone = []
        with tf.device(f"{device}:0"):
            for start in list(range(0, 300, 50)) + [1000, 1050]:
                ids = tf.constant(np.arange(start, start + 50, dtype=np.int64))
                _, keys, _ = sok.sparse_read_and_evict(table, ids)
                gone.extend(keys.numpy().tolist())
        evicted[name] = sorted(gone)
        assert table.size.numpy()[0] == 300
    assert evicted["tiered"] == evicted["plain"] == list(range(100))
    assert_same(tiered, plain, device)


def test_a_full_tiered_table_without_eviction_refuses_new_keys_and_changes_nothing(device):
    tiered, plain = make_pair(device, 4, "full", budget_rows=100, state_floats=0,
                              max_capacity=300, evict_strategy=None)
    with tf.device(f"{device}:0"):
        for table in (tiered, plain):
            for start in range(0, 300, 50):
                table.sparse_read(tf.constant(np.arange(start, start + 50, dtype=np.int64)))
        assert sok.tier_counts(tiered)["host_keys"] >= 200
        before = export_sorted(tiered)
        for table in (tiered, plain):  # keys of both tiers and new ones
            with pytest.raises(tf.errors.ResourceExhaustedError, match="dynamic table is full"):
                table.sparse_read(tf.constant(np.r_[0:20, 290:310].astype(np.int64)))
    for a, b in zip(before, export_sorted(tiered)):
        np.testing.assert_array_equal(a, b)
    assert_same(tiered, plain, device)


def test_budget_options_and_bad_budgets():
    gb = sok.DynamicVariable(4, var_type="hybrid", max_hbm_for_vectors=0.5)
    assert gb.hbm_budget_bytes == 1 << 29  # SOK's unit: GB of 2^30 bytes
    assert sok.DynamicVariable(4, var_type="hybrid").hbm_budget_bytes == 16 << 30  # SOK's default
    assert sok.DynamicVariable(4, hbm_budget_bytes=4096).hbm_budget_bytes == 4096
    assert sok.DynamicVariable(4, var_type="hbm").hbm_budget_bytes == 0
    for config, error, message in [
            ({"max_hbm_for_vectors": "4"}, TypeError, "max_hbm_for_vectors must be a number, got '4'"),
            ({"hbm_budget_bytes": -8}, ValueError, "hbm_budget_bytes must be positive, got -8"),
            ({"max_hbm_for_vectors": float("nan")}, ValueError, "must be positive, got nan"),
            ({"max_hbm_for_vectors": 1, "hbm_budget_bytes": 4096}, ValueError, "not both"),
            ({"hbm_budget_bytes": 15}, ValueError, "budget of 15 bytes holds no row of this "
                                                   "table \\(a row is 16 bytes\\)"),
            ({"var_type": "hbm", "hbm_budget_bytes": 4096}, ValueError, "var_type='hbm'")]:
        with pytest.raises(error, match=message):
            sok.DynamicVariable(4, var_type=config.pop("var_type", "hybrid"), **config)


def test_a_batch_larger_than_the_budget_fails_and_changes_nothing(device):
    tiered, _ = make_pair(device, 4, "small_budget", budget_rows=20, state_floats=0)
    with tf.device(f"{device}:0"):
        tiered.sparse_read(tf.constant(np.arange(15, dtype=np.int64)))
        before = export_sorted(tiered)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="a lookup of 30 distinct keys does not fit the tiered table's "
                                 "HBM budget of 320 bytes \\(20 rows of 16 bytes"):
            tiered.sparse_read(tf.constant(np.arange(100, 130, dtype=np.int64)))
    for a, b in zip(before, export_sorted(tiered)):
        np.testing.assert_array_equal(a, b)


def test_hybrid_on_the_cpu_is_the_host_table(monkeypatch):
    monkeypatch.setattr(dynamic_variable, "_TIER_ON_HOST", False)
    with tf.device("CPU:0"):
        table = sok.DynamicVariable(4, var_type="hybrid", max_hbm_for_vectors=1e-9 * 64)
        assert table.hbm_budget_bytes == 0
        table.sparse_read(tf.constant(np.arange(100, dtype=np.int64)))  # more rows than 64 bytes
    assert table.size.numpy()[0] == 100
    assert sok.tier_counts(table) is None


def test_a_budget_that_holds_the_whole_table_gives_the_one_tier_table(device):
    with tf.device(f"{device}:0"):
        # max_capacity rows with the widest state (3 x dim floats) fit: no host tier.
        whole = sok.DynamicVariable(4, var_type="hybrid", max_capacity=1000,
                                    hbm_budget_bytes=1000 * 16 * 4)
        tiered = sok.DynamicVariable(4, var_type="hybrid", max_capacity=1000,
                                     hbm_budget_bytes=1000 * 16 * 4 - 1)
    assert sok.tier_counts(whole) is None
    assert sok.tier_counts(tiered) == {
        "hot_keys": 0, "host_keys": 0, "ids_looked_up": 0, "hot_hits": 0, "moved_up": 0,
        "moved_down": 0, "lookup_seconds": 0.0, "take_up_seconds": 0.0,
        "move_down_seconds": 0.0, "move_up_seconds": 0.0, "write_back_seconds": 0.0,
        "write_back_wait_seconds": 0.0}


def test_dump_load_and_incremental_dump_with_rows_in_both_tiers(device, tmp_path):
    tiered, plain = make_pair(device, 8, "dumped")
    optimizers = {}
    for table in (tiered, plain):
        optimizers[id(table)] = optimizer = sok.OptimizerWrapper(keras_optimizer("Adam", 0.01))
        train(table, optimizer, batches(np.random.default_rng(9), "powerlaw", steps=12), device)
    assert sok.tier_counts(tiered)["host_keys"] > 0
    since = time.time()
    time.sleep(0.01)
    with tf.device(f"{device}:0"):  # rows written after `since`: some hot, some on the host
        for table in (tiered, plain):
            table.sparse_read(tf.constant(np.arange(5000, 5040, dtype=np.int64)))
    for table in (tiered, plain):
        keys, values = (np.concatenate([np.asarray(k) for k in part]) for part in
                        sok.incremental_model_dump([table], since))
        assert set(range(5000, 5040)) <= set(keys.tolist())  # a move counts as a write too
        read_back = table.sparse_read(tf.constant(keys), insert=False).numpy()
        np.testing.assert_array_equal(values, read_back)
    sok.dump(str(tmp_path / "tiered"), [tiered], optimizers[id(tiered)])
    # The dump of a tiered table loads into a tiered and a one-tier table (same name).
    restored, restored_plain = make_pair(device, 8, "dumped")
    for table in (restored, restored_plain):
        optimizer = sok.OptimizerWrapper(keras_optimizer("Adam", 0.01))
        sok.load(str(tmp_path / "tiered"), [table], optimizer)
        assert_same(table, plain, device)


SERVE_TIERED = """
import sys, numpy as np, tensorflow as tf
import sparse_operation_kit as sok
sok.init(comm_tool="single")
served = tf.saved_model.load(sys.argv[1])
np.save(sys.argv[2], served.serve(tf.constant(np.load(sys.argv[3]))).numpy())
"""


def test_saved_model_of_a_tiered_table_serves_rows_of_both_tiers(tmp_path):
    class Ranker(tf.Module):
        def __init__(self, table):
            super().__init__()
            self.table = table

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
        def serve(self, ids):
            return sok.lookup_sparse([self.table], [tf.RaggedTensor.from_tensor(ids[:, None])],
                                     training=False)[0]

    tiered, _ = make_pair("CPU", 4, "served_tiered", budget_rows=30, state_floats=0)
    with tf.device("CPU:0"):
        for start in range(0, 300, 25):  # 300 keys, 30 of them hot
            tiered.sparse_read(tf.constant(np.arange(start, start + 25, dtype=np.int64)))
    ids = np.arange(-5, 310, 7, dtype=np.int64)  # hot, host and missing keys
    ranker = Ranker(tiered)
    expected = ranker.serve(tf.constant(ids)).numpy()
    tf.saved_model.save(ranker, str(tmp_path / "model"))
    np.save(tmp_path / "ids.npy", ids)
    result = subprocess.run(
        [sys.executable, "-c", SERVE_TIERED, str(tmp_path / "model"), str(tmp_path / "out.npy"),
         str(tmp_path / "ids.npy")],
        env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)


GROW_UNTIL_HOST_MEMORY_RUNS_OUT = """
import resource, sys
import numpy as np, tensorflow as tf
import sparse_operation_kit as sok
from sparse_operation_kit import dynamic_variable
sok.init(comm_tool="single")
dynamic_variable._TIER_ON_HOST = True
tiered = sys.argv[1] == "tiered"
config = {"var_type": "hybrid", "hbm_budget_bytes": 64 * 4 * 70000} if tiered else {}
if not tiered:
    tf.device("CPU:0").__enter__()  # the host table in host memory, where a GPU exists too
table = sok.DynamicVariable(64, name="grows", init_capacity=1024, max_capacity=1 << 30, **config)
first = tf.constant(np.arange(60000, dtype=np.int64))
table.sparse_read(first)
size = int(table.size[0])
# The address space from here on: what the process holds and 1 GiB more.
held = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (held + (1 << 30), resource.RLIM_INFINITY))
try:
    for start in range(60000, 1 << 40, 60000):
        table.sparse_read(tf.constant(np.arange(start, start + 60000, dtype=np.int64)))
        size = int(table.size[0])
    print("no error")
except tf.errors.ResourceExhaustedError as error:
    print("ERROR", error.message.splitlines()[0])
    print("SIZE", size, int(table.size[0]))
    print("SAME", bool((table.sparse_read(first, insert=False).numpy() ==
                        table.sparse_read(first, insert=False).numpy()).all()),
          bool(np.abs(table.sparse_read(first, insert=False).numpy()).sum() > 0))
"""


@pytest.mark.parametrize("kind", ["tiered", "host"])
def test_host_memory_running_out_is_a_clear_error_and_changes_nothing(kind):
    result = subprocess.run([sys.executable, "-c", GROW_UNTIL_HOST_MEMORY_RUNS_OUT, kind],
                            env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.strip().splitlines())
    assert "host memory exhausted: the dynamic table could not grow by" in lines["ERROR"]
    before, after = lines["SIZE"].split()
    assert before == after  # the failed lookup inserted nothing
    assert lines["SAME"] == "True True"  # the rows held before are still there


def test_keras_fit_trains_a_tiered_layer_table_as_a_one_tier_one():
    """sok.layers.Embedding(table_config={"var_type": "hybrid", ...}) under model.fit."""
    rng = np.random.default_rng(12)
    x = rng.integers(0, 400, size=[256, 2])  # 400 keys, 40 rows of budget
    y = rng.normal(size=[256, 1]).astype(np.float32)

    def build(table_config):
        ids = tf.keras.Input([2], dtype="int64")
        embedding = sok.layers.Embedding(4, dynamic_table=True, name="fitted_tiers",
                                         table_config=table_config)
        rows = tf.keras.layers.Flatten()(embedding(ids))
        dense = tf.keras.layers.Dense(1, kernel_initializer="ones")
        return sok.layers.Model(ids, dense(rows)), embedding

    tiered, tiered_layer = build({"var_type": "hybrid", "hbm_budget_bytes": 40 * 4 * 3 * 4})
    plain, plain_layer = build({})
    for model in (tiered, plain):
        model.compile(keras_optimizer("Adagrad", 0.1), "mse")
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    counts = sok.tier_counts(tiered_layer.table)
    assert counts["moved_down"] > 0 and counts["host_keys"] > 0
    assert_same(tiered_layer.table, plain_layer.table, "CPU")
    np.testing.assert_array_equal(tiered.predict(x, batch_size=16, verbose=0),
                                  plain.predict(x, batch_size=16, verbose=0))


def test_a_table_within_its_budget_stays_in_the_hot_tier(device):
    # Until the hot tier fills, the hot table serves every call alone (as a one-tier table);
    # the first lookup past the budget starts moving rows.
    tiered, plain = make_pair(device, 8, "within_budget", budget_rows=400, state_floats=1)
    optimizers = {id(t): sok.OptimizerWrapper(keras_optimizer("Adagrad", 0.1))
                  for t in (tiered, plain)}
    rng = np.random.default_rng(13)
    first, more = batches(rng, "uniform", steps=3), batches(rng, "uniform", steps=20)
    for table in (tiered, plain):  # 3 x 96 ids: within 400 rows
        train(table, optimizers[id(table)], first, device)
    counts = sok.tier_counts(tiered)
    assert counts["host_keys"] == 0 and counts["moved_up"] == counts["moved_down"] == 0
    assert counts["hot_keys"] == int(plain.size[0])
    assert counts["hot_hits"] == counts["ids_looked_up"] == 3 * 96
    assert_same(tiered, plain, device)
    for table in (tiered, plain):  # 20 more: past the budget
        train(table, optimizers[id(table)], more, device)
    assert sok.tier_counts(tiered)["moved_down"] > 0
    assert_same(tiered, plain, device)


def test_t6_benchmark_movement_splits_the_counts_and_prices_the_larger_direction():
    """tf_tiered.py's per-step movement (hit rate, rows up and down, PCIe floor) from two
    sok.tier_counts readings around training lookups that move rows both ways."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "gpu"))
    import tf_tiered
    dim, batch, steps = 8, 64, 6
    tiered, _ = make_pair("CPU", dim, "t6_movement", state_floats=0)
    rng = np.random.default_rng(5)
    ids = rng.integers(0, UNIVERSE, size=(steps + 1, batch), dtype=np.int64)
    with tf.device("CPU:0"):
        tiered.assign(tf.constant(np.arange(UNIVERSE, dtype=np.int64)),
                      tf.zeros([UNIVERSE, dim]))
        tf_tiered.one_id_lookup(tiered, tf.constant(ids[0]), True)
        before = sok.tier_counts(tiered)
        for step in ids[1:]:
            tf_tiered.one_id_lookup(tiered, tf.constant(step), True)
    after = sok.tier_counts(tiered)
    up, down = (after[k] - before[k] for k in ("moved_up", "moved_down"))
    assert up > 0 and down > 0
    row_bytes, step_ms = dim * 4, 2.5
    moved = tf_tiered.movement(before, after, batch, row_bytes, step_ms)
    assert moved["rows_up_per_step"] * steps == pytest.approx(up)
    assert moved["rows_down_per_step"] * steps == pytest.approx(down)
    assert moved["rows_moved_per_step"] * steps == pytest.approx(up + down)
    hits = after["hot_hits"] - before["hot_hits"]
    assert moved["hit_rate"] == pytest.approx(hits / (steps * batch))
    larger_bytes = max(up, down) / steps * row_bytes
    assert moved["pcie_floor_ms"] == pytest.approx(larger_bytes / 64e9 * 1e3)
    assert moved["pcie_floor_fraction"] == pytest.approx(moved["pcie_floor_ms"] / step_ms)
    assert moved["host_gbps"] == pytest.approx((up + down) / steps * row_bytes / 2.5e-3 / 1e9)
    for stage in ("lookup", "take_up", "move_down", "move_up"):
        seconds = after[f"{stage}_seconds"] - before[f"{stage}_seconds"]
        assert moved[f"{stage}_ms_per_step"] == pytest.approx(seconds * 1e3 / steps)


def test_t6_benchmark_times_every_form_over_whole_passes_of_the_batches():
    """tf_tiered.py times each form (a loop of steps a call and one step a call; eval,
    forward, train) over whole passes of the batches in order, so each form meets the cycle's
    hit rate instead of batches another form has just brought up: every form whose lookups
    count looks up each batch once a round, and the forms' movement adds up to what the
    table counted over the timed passes."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "gpu"))
    import tf_tiered
    dim, batch, loop, rounds = 8, 64, 3, 2
    tiered, _ = make_pair("CPU", dim, "t6_passes", state_floats=0)
    rng = np.random.default_rng(9)
    ids = rng.integers(0, UNIVERSE, size=(7, batch), dtype=np.int64)  # passes use 6
    with tf.device("CPU:0"):
        tiered.assign(tf.constant(np.arange(UNIVERSE, dtype=np.int64)),
                      tf.zeros([UNIVERSE, dim]))
        steps = tf_tiered.steps_of(tiered, sok.OptimizerWrapper(keras_optimizer("SGD", 0.1)))
        start = sok.tier_counts(tiered)
        timings, moved = tf_tiered.timed_passes(steps, tf.constant(ids), loop, rounds, tiered,
                                                dim * 4)
    end = sok.tier_counts(tiered)
    forms = {"eval_ms", "fwd_ms", "train_ms", "eval_call_ms", "fwd_call_ms", "train_call_ms"}
    assert set(timings) == forms and all(t > 0 for t in timings.values())
    # The training lookups' forms, each over whole passes (eval finds, counting nothing).
    assert set(moved) == forms - {"eval_ms", "eval_call_ms"}
    for form in moved.values():
        assert form["steps"] == rounds * 6
    # Beyond the passes only the tracing calls: a window and a batch for forward and train.
    traced_steps = 2 * (loop + 1)
    looked_up = end["ids_looked_up"] - start["ids_looked_up"]
    assert looked_up == (4 * rounds * 6 + traced_steps) * batch
    up_in_passes = sum(form["rows_up_per_step"] * form["steps"] for form in moved.values())
    assert 0 < up_in_passes <= end["moved_up"] - start["moved_up"]


def test_stage_times_are_parts_of_the_lookups_measured_outside(device):
    """sok.tier_counts' seconds: the training lookups' time fits in the wall time around
    them, and the miss path's stages (take up, move down, move up) fit in it, each taking
    time when rows moved both ways; the host inserts of the rows moved down, and the waits
    for them, took time within the calls."""
    dim, batch = 8, 64
    tiered, _ = make_pair(device, dim, "stage_times", state_floats=0)
    rng = np.random.default_rng(8)
    with tf.device(f"{device}:0"):
        tiered.assign(tf.constant(np.arange(UNIVERSE, dtype=np.int64)),
                      tf.zeros([UNIVERSE, dim]))
        before = sok.tier_counts(tiered)
        started = time.perf_counter()
        for _ in range(5):
            ids = rng.integers(0, UNIVERSE, size=batch, dtype=np.int64)
            ragged = tf.RaggedTensor.from_uniform_row_length(tf.constant(ids), 1)
            sok.lookup_sparse([tiered], [ragged], combiners=["sum"], training=True)[0].numpy()
        wall = time.perf_counter() - started
    after = sok.tier_counts(tiered)  # waits for the last host insert
    wall_with_counts = time.perf_counter() - started
    spent = {name: after[name] - before[name] for name in after if name.endswith("_seconds")}
    assert after["moved_up"] > before["moved_up"] and after["moved_down"] > before["moved_down"]
    assert 0 < spent["lookup_seconds"] <= wall
    stages = ("take_up_seconds", "move_down_seconds", "move_up_seconds")
    assert all(spent[name] > 0 for name in stages), spent
    assert sum(spent[name] for name in stages) <= spent["lookup_seconds"]
    assert 0 < spent["write_back_seconds"] <= wall_with_counts
    assert 0 <= spent["write_back_wait_seconds"] <= wall_with_counts



def training_lookup(tables, keys, device):
    """One training lookup of `keys` (one id a sample) in each table; the tier counts'
    change it made in the first."""
    before = sok.tier_counts(tables[0])
    with tf.device(f"{device}:0"):
        ragged = tf.RaggedTensor.from_uniform_row_length(tf.constant(keys, dtype=tf.int64), 1)
        for table in tables:
            sok.lookup_sparse([table], [ragged], combiners=["sum"], training=True)[0].numpy()
    after = sok.tier_counts(tables[0])
    return {name: after[name] - before[name] for name in ("hot_hits", "moved_up", "moved_down")}


def test_often_used_rows_stay_hot_while_rows_used_once_pass_through(device):
    # 100 rows of budget. Every third batch uses 30 regular keys 16 times each; every batch
    # brings 60 keys never seen before. Between two uses of the regulars 120 new rows arrive:
    # ranked by last use, the regulars would move down each time; ranked by use count (halved
    # about every other batch here, as 100 rows move down), the rows used once go first and
    # the regulars hit.
    tiered, plain = make_pair(device, 4, "regulars", budget_rows=100, state_floats=0)
    regulars = np.repeat(np.arange(30, dtype=np.int64), 16)
    for step in range(30):
        keys = np.arange(1000 + 60 * step, 1060 + 60 * step, dtype=np.int64)
        if step % 3 == 0:
            keys = np.concatenate([regulars, keys])
        moved = training_lookup([tiered, plain], keys, device)
        assert moved["moved_up"] >= 60  # the new keys
        if step % 3 == 0 and step >= 6:
            assert moved["hot_hits"] == regulars.size, (step, moved)
    assert sok.tier_counts(tiered)["moved_down"] > 1000
    assert_same(tiered, plain, device)


def test_rows_used_often_long_ago_give_way_as_the_hot_tier_turns_over(device):
    # A key used 64 times in one batch outranks every key used once since, until the use
    # counts have halved often enough: each time as many rows as the budget holds moved down.
    tiered, plain = make_pair(device, 4, "aging", budget_rows=100, state_floats=0)
    popular = np.full(64, 7, dtype=np.int64)
    training_lookup([tiered, plain], popular, device)
    for step, turnovers in ((0, 2), (1, 10)):
        start = 1000 + 100000 * step
        while True:  # batches of 60 new keys until the rows moved down reach `turnovers` x 100
            keys = np.arange(start, start + 60, dtype=np.int64)
            start += 60
            training_lookup([tiered, plain], keys, device)
            if sok.tier_counts(tiered)["moved_down"] >= turnovers * 100:
                break
        again = training_lookup([tiered, plain], popular[:1], device)
        # After 2 turnovers its count (65, halved twice) still outranks the rest: a hit. After
        # 10 it has fallen to the others' and it moved down: it comes back up.
        assert (again["hot_hits"], again["moved_up"]) == ((1, 0) if step == 0 else (0, 1))
    assert_same(tiered, plain, device)


def test_a_lookup_never_moves_its_own_rows_down(device):
    # The batch's hot rows have the lowest use counts (used once) and room for its misses
    # must be made: rows used more, not in the batch, move down instead.
    tiered, plain = make_pair(device, 4, "own_rows", budget_rows=100, state_floats=0)
    busy = np.repeat(np.arange(100, 190, dtype=np.int64), 3)  # 90 rows used 3 times
    once = np.arange(500, 510, dtype=np.int64)  # 10 rows used once
    training_lookup([tiered, plain], np.concatenate([busy, once]), device)
    batch = np.concatenate([once, np.arange(2000, 2040, dtype=np.int64)])  # and 40 new keys
    moved = training_lookup([tiered, plain], batch, device)
    assert moved == {"hot_hits": 10, "moved_up": 40, "moved_down": 40 + 100 // 16}
    again = training_lookup([tiered, plain], batch, device)
    assert again == {"hot_hits": 50, "moved_up": 0, "moved_down": 0}
    assert_same(tiered, plain, device)


def test_of_rows_used_equally_often_the_newest_move_down_first(device):
    # 100 rows of budget: 50 keys arrive, then (later by more than the write stamps' 1 ms)
    # 50 more, each used once. Room for 10 new keys moves 16 rows down, all of equal count:
    # the later arrivals go, the earlier ones stay hot.
    tiered, plain = make_pair(device, 4, "newest_first", budget_rows=100, state_floats=0)
    earlier = np.arange(0, 50, dtype=np.int64)
    later = np.arange(50, 100, dtype=np.int64)
    training_lookup([tiered, plain], earlier, device)
    time.sleep(0.01)
    training_lookup([tiered, plain], later, device)
    moved = training_lookup([tiered, plain], np.arange(1000, 1010, dtype=np.int64), device)
    assert moved == {"hot_hits": 0, "moved_up": 10, "moved_down": 10 + 100 // 16}
    assert training_lookup([tiered, plain], earlier, device)["hot_hits"] == earlier.size
    assert training_lookup([tiered, plain], later, device)["moved_up"] == 16
    assert_same(tiered, plain, device)


def test_the_call_after_a_lookup_that_moved_rows_down_finds_them_on_the_host(device):
    # The host table inserts the rows a lookup moved down while the step goes on; whatever
    # call comes next, it sees them there, also after a lookup of hot rows only (which does
    # not wait). 60,000 rows move down: their insertion takes long enough that a call not
    # waiting for it would miss some.
    dim, budget, gone = 2, 60_000, np.arange(60_000, dtype=np.int64)
    probe = tf.constant(np.r_[gone[::97], 10**9 + 1])
    first_calls = {
        "size": lambda table: table.size.numpy(),
        "find": lambda table: table.sparse_read(probe, insert=False).numpy(),
        "export": lambda table: export_sorted(table)[0],
        "erase": lambda table: raw_ops.sok_dynamic_table_erase(table.handle, probe).numpy(),
        "counts": lambda table: sum(sok.tier_counts(table)[name]
                                    for name in ("hot_keys", "host_keys")),
        "lookup": lambda table: sok.lookup_sparse(
            [table], [tf.RaggedTensor.from_uniform_row_length(probe, 1)], combiners=["sum"],
            training=True)[0].numpy(),
    }
    for name, first_call in first_calls.items():
        tiered, plain = make_pair(device, dim, f"write_back_{name}", budget_rows=budget,
                                  state_floats=0, initializer="ones")
        results = []
        for table in (tiered, plain):
            with tf.device(f"{device}:0"):
                # Fills the budget, moves it down, then looks up hot rows only.
                for keys in (gone, gone + budget, gone[:1000] + budget):
                    ragged = tf.RaggedTensor.from_uniform_row_length(tf.constant(keys), 1)
                    sok.lookup_sparse([table], [ragged], combiners=["sum"],
                                      training=True)[0].numpy()
                results.append(first_call(table) if name != "counts" else None)
        if name == "counts":
            results = [first_call(tiered), plain.size.numpy()[0]]
        else:
            assert_equal_rows(*results, device)
        np.testing.assert_array_equal(results[0], results[1], err_msg=name)
        assert sok.tier_counts(tiered)["moved_down"] >= budget // 2, name
        assert_same(tiered, plain, device)
