"""Dynamic (hash) tables: the table through its ops, DynamicVariable, lookups, optimizers."""
import datetime
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from conftest import run_mode, subprocess_env
from keras_optimizers import keras_optimizer, summed_duplicates

EXTREME_KEYS = [np.iinfo(np.int64).min, -1, 0, 1, np.iinfo(np.int64).max, 1 << 40]


def keys_of(values):
    return tf.constant(np.asarray(values, np.int64))


def exported(variable):
    keys, values = sok.export(variable)
    order = np.argsort(keys.numpy())
    return keys.numpy()[order], values.numpy()[order]


def test_assign_read_erase_export_round_trip_with_extreme_keys():
    table = sok.DynamicVariable(3, initializer="zeros")
    values = np.arange(len(EXTREME_KEYS) * 3, dtype=np.float32).reshape(-1, 3)
    table.assign(keys_of(EXTREME_KEYS), values)
    assert table.size.numpy()[0] == len(EXTREME_KEYS)
    np.testing.assert_array_equal(table.sparse_read(keys_of(EXTREME_KEYS)).numpy(), values)
    keys, rows = exported(table)
    order = np.argsort(EXTREME_KEYS)
    np.testing.assert_array_equal(keys, np.asarray(EXTREME_KEYS)[order])
    np.testing.assert_array_equal(rows, values[order])
    read = sok.sparse_read_and_erase(table, keys_of(EXTREME_KEYS[:2]))
    np.testing.assert_array_equal(read.numpy(), values[:2])
    assert table.size.numpy()[0] == len(EXTREME_KEYS) - 2
    np.testing.assert_array_equal(table.sparse_read(keys_of(EXTREME_KEYS[:2]), insert=False).numpy(),
                                  np.zeros([2, 3], np.float32))


def test_int32_keys():
    table = sok.DynamicVariable(2, key_type=tf.int32, initializer="ones")
    ids = tf.ragged.constant([[np.iinfo(np.int32).min, 5], [np.iinfo(np.int32).max]], tf.int32)
    out = sok.lookup_sparse([table], [ids], combiners=["sum"])[0]
    np.testing.assert_array_equal(out.numpy(), [[2.0, 2.0], [1.0, 1.0]])
    keys, _ = sok.export(table)
    assert keys.dtype == tf.int32
    assert sorted(keys.numpy().tolist()) == sorted([np.iinfo(np.int32).min, 5, np.iinfo(np.int32).max])


def test_grows_past_initial_capacity_without_losing_keys():
    table = sok.DynamicVariable(4, initializer="zeros", init_capacity=4)
    keys = np.random.default_rng(0).choice(1 << 50, size=5000, replace=False)
    values = np.random.default_rng(1).normal(size=[5000, 4]).astype(np.float32)
    for chunk in range(0, 5000, 700):
        table.assign(keys_of(keys[chunk:chunk + 700]), values[chunk:chunk + 700])
    assert table.size.numpy()[0] == 5000
    np.testing.assert_array_equal(table.sparse_read(keys_of(keys), insert=False).numpy(), values)


def test_growth_inside_a_training_lookup_keeps_every_key_and_row():
    # Lookups that insert grow the table on the op's threads (a parallel rehash): every key
    # keeps the row it was given, read back after several doublings, repeats included.
    table = sok.DynamicVariable(8, initializer="uniform", init_capacity=16)
    keys = np.random.default_rng(2).choice(1 << 62, size=400_000, replace=False) - (1 << 61)
    first_rows = []
    for chunk in range(0, len(keys), 50_000):
        batch = np.concatenate([keys[chunk:chunk + 50_000], keys[:1000]])  # repeats too
        first_rows.append(table.sparse_read(keys_of(batch)).numpy()[:50_000])
    assert table.size.numpy()[0] == len(keys)
    np.testing.assert_array_equal(table.sparse_read(keys_of(keys), insert=False).numpy(),
                                  np.concatenate(first_rows))


@pytest.mark.parametrize("tiered", [False, True])
def test_rows_freed_by_erase_and_eviction_are_reused_without_mixing_keys(tiered, monkeypatch):
    # Erased and evicted keys give their rows back for new keys: a random sequence of assigns,
    # erases and evicting lookups against a dict of what each key holds. Tiered (both tiers
    # in host memory here), most rows are in the host tier, whose rows are pooled, and rows
    # also move between the tiers.
    from sparse_operation_kit import dynamic_variable
    monkeypatch.setattr(dynamic_variable, "_TIER_ON_HOST", tiered)
    tier = {"var_type": "hybrid", "hbm_budget_bytes": 5 * 4 * 1000} if tiered else {}
    rng = np.random.default_rng(7)
    table = sok.DynamicVariable(5, initializer="zeros", init_capacity=16, max_capacity=3000,
                                evict_strategy="lru", **tier)
    model = {}
    for step in range(40):
        keys = np.unique(rng.integers(0, 6000, size=int(rng.integers(50, 900))))
        action = step % 4
        if action == 0:  # assign: new and present keys
            rows = rng.normal(size=[len(keys), 5]).astype(np.float32)
            if len(model) + len(set(keys.tolist()) - set(model)) > 3000:
                continue
            table.assign(keys_of(keys), rows)
            model.update(zip(keys.tolist(), rows))
        elif action == 1:  # erase
            sok.sparse_read_and_erase(table, keys_of(keys))
            for key in keys.tolist():
                model.pop(key, None)
        elif action == 2:  # a lookup that inserts, evicting the least recently used
            table.sparse_read(keys_of(keys))
            held, _ = exported(table)
            model = {key: model.get(key, np.zeros(5, np.float32)) for key in held.tolist()}
        else:  # rows read back in place
            present = np.array(sorted(model), np.int64)[:400]
            np.testing.assert_array_equal(table.sparse_read(keys_of(present), insert=False).numpy(),
                                          np.array([model[k] for k in present.tolist()]))
    held, rows = exported(table)
    assert held.tolist() == sorted(model)
    np.testing.assert_array_equal(rows, np.array([model[k] for k in held.tolist()]))
    if tiered:
        counts = sok.tier_counts(table)
        assert counts["host_keys"] > counts["hot_keys"] and counts["moved_up"] > 0, counts


HOST_TIER_MEMORY = """
import resource
import numpy as np, tensorflow as tf
import sparse_operation_kit as sok
from sparse_operation_kit import dynamic_variable
sok.init(comm_tool="single")
dynamic_variable._TIER_ON_HOST = True  # both tiers in host memory, as where no GPU is
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
table = sok.DynamicVariable(256, name="held", init_capacity=1024, max_capacity=1 << 30,
                            var_type="hybrid", hbm_budget_bytes=256 * 4 * 20000)
table.sparse_read(tf.constant(np.arange(-10000, 0, dtype=np.int64)))  # warm up
before = resident()
for start in range(0, 300000, 10000):
    table.sparse_read(tf.constant(np.arange(start, start + 10000, dtype=np.int64) * 7919))
print(resident() - before, int(table.size[0]), sok.tier_counts(table)["host_keys"])
"""


def test_host_tier_memory_follows_the_keys_it_holds_not_its_slots():
    """A tiered table's host tier holds most of 310,000 keys of dim 256 (about 290 MiB of
    rows) in a slot array of 2^19 slots: its rows take memory for the keys held, not a row
    per slot (512 MiB)."""
    result = subprocess.run([sys.executable, "-c", HOST_TIER_MEMORY], env=subprocess_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    grown, size, host = (int(x) for x in result.stdout.split())
    assert size == 310000 and host >= 280000, (size, host)
    rows = 300000 * 256 * 4
    assert rows * 0.9 <= grown <= 1.15 * rows + (64 << 20), (grown, rows)


def test_initial_value_depends_only_on_seed_and_key():
    a = sok.DynamicVariable(8, name="same_seed")
    b = sok.DynamicVariable(8, name="same_seed")
    c = sok.DynamicVariable(8, name="other_seed")
    keys = np.arange(-50, 50)
    rows_a = a.sparse_read(keys_of(keys)).numpy()
    rows_b = b.sparse_read(keys_of(keys[::-1])).numpy()[::-1]  # other insertion order
    np.testing.assert_array_equal(rows_a, rows_b)
    assert not np.allclose(rows_a, c.sparse_read(keys_of(keys)).numpy())
    assert abs(rows_a.mean()) < 0.01 and 0.04 < rows_a.std() < 0.06  # N(0, 0.05)


def _mix64(x):
    """SplitMix64's finaliser on a uint64 array (table_math.h's MixBits)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def normal_rows_model(seed, keys, dim, mean, stddev):
    """InitialValue's normal rows in NumPy: float64 Box-Muller with NumPy's log and cos, one
    rounding to float32."""
    stream = _mix64(np.uint64(seed) ^ _mix64(keys.astype(np.int64).view(np.uint64)))[:, None]
    with np.errstate(over="ignore"):
        bits = _mix64(stream + np.arange(dim, dtype=np.uint64) * np.uint64(0x632BE59BD9B4E019))
    u1 = ((bits >> np.uint64(40)).astype(np.float64) + 0.5) / 16777216.0
    u2 = ((_mix64(bits) >> np.uint64(40)).astype(np.float64) + 0.5) / 16777216.0
    normal = np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)
    return (np.float64(np.float32(stddev)) * normal + np.float64(np.float32(mean))).astype(np.float32)


def test_normal_rows_equal_a_float64_box_muller_model_over_many_keys():
    # The CPU table computes the radius' log and the angle's cosine from tables
    # (fast_box_muller.h), libm's cost most of an insert: its rows must still equal
    # double-precision Box-Muller rounded once (a value within a float ulp where the exact one
    # sits on a rounding boundary).
    import zlib
    keys = np.random.default_rng(4).integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max,
                                             20000)
    table = sok.DynamicVariable(16, name="box_muller")
    rows = table.sparse_read(keys_of(keys)).numpy()
    expected = normal_rows_model(zlib.crc32(b"box_muller"), keys, 16, 0.0, 0.05)
    np.testing.assert_allclose(rows, expected, rtol=1.2e-7, atol=0)
    assert np.mean(rows == expected) > 0.9999
    assert abs(rows.mean()) < 1e-3 and abs(rows.std() - 0.05) < 1e-3


@pytest.mark.parametrize("initializer, low, high", [
    ("uniform", -0.05, 0.05), ("zeros", 0.0, 0.0), ("ones", 1.0, 1.0), ("0.25", 0.25, 0.25),
    (tf.keras.initializers.RandomUniform(2.0, 3.0), 2.0, 3.0),
    (tf.keras.initializers.Constant(-4.0), -4.0, -4.0),
])
def test_initializers(initializer, low, high):
    rows = sok.DynamicVariable(16, initializer=initializer).sparse_read(keys_of(range(200))).numpy()
    assert rows.min() >= low and rows.max() <= high


def test_full_table_without_eviction_fails_and_changes_nothing():
    table = sok.DynamicVariable(2, initializer="zeros", max_capacity=10, evict_strategy=None)
    table.assign(keys_of(range(8)), np.ones([8, 2], np.float32))
    before = exported(table)
    with pytest.raises(tf.errors.ResourceExhaustedError, match="max_capacity is 10"):
        table.sparse_read(keys_of([100, 101, 102]))
    ids = tf.ragged.constant([[100, 101], [102]], tf.int64)
    with pytest.raises(tf.errors.ResourceExhaustedError, match="dynamic table is full"):
        sok.lookup_sparse([table], [ids])
    after = exported(table)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])


def test_lru_evicts_least_recently_used():
    table = sok.DynamicVariable(1, initializer="zeros", max_capacity=4, evict_strategy="lru")
    for key in [1, 2, 3, 4]:
        table.sparse_read(keys_of([key]))
    table.sparse_read(keys_of([1]))       # 2 is now the least recently used
    table.sparse_read(keys_of([5, 6]))    # evicts 2 and 3
    assert sorted(exported(table)[0].tolist()) == [1, 4, 5, 6]


def test_lfu_evicts_least_frequently_used():
    table = sok.DynamicVariable(1, initializer="zeros", max_capacity=3, evict_strategy="lfu")
    for key, uses in [(10, 3), (20, 1), (30, 2)]:
        for _ in range(uses):
            table.sparse_read(keys_of([key]))
    table.sparse_read(keys_of([40]))      # evicts 20, used once
    assert sorted(exported(table)[0].tolist()) == [10, 30, 40]


def test_concurrent_inserts_and_lookups_lose_nothing():
    table = sok.DynamicVariable(4, name="stress", init_capacity=16)
    reference = sok.DynamicVariable(4, name="stress")  # same seed: same initial rows
    rng = np.random.default_rng(3)
    batches = [rng.integers(-(1 << 40), 1 << 40, size=2000) for _ in range(8)]
    shared = rng.integers(0, 500, size=2000)           # keys every thread hits
    errors = []

    def worker(keys):
        try:
            for _ in range(3):
                table.sparse_read(keys_of(np.concatenate([keys, shared])))
        except Exception as error:  # noqa: BLE001  (reported below)
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(b,)) for b in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    everything = np.unique(np.concatenate(batches + [shared]))
    assert table.size.numpy()[0] == len(everything)
    np.testing.assert_array_equal(table.sparse_read(keys_of(everything), insert=False).numpy(),
                                  reference.sparse_read(keys_of(everything)).numpy())


@pytest.mark.parametrize("init_capacity", [1 << 20, 64])  # one insert pass / find, grow, insert
def test_one_call_with_repeated_new_keys_inserts_each_once(init_capacity):
    # The insert pass runs on several threads that claim slots concurrently; a key repeated
    # across their shards must still be stored once, with its initial row.
    table = sok.DynamicVariable(3, name="repeats", init_capacity=init_capacity)
    reference = sok.DynamicVariable(3, name="repeats")  # same seed: same initial rows
    rng = np.random.default_rng(11)
    universe = rng.integers(-(1 << 62), 1 << 62, size=5000)
    keys = rng.choice(universe, size=200_000)
    rows = table.sparse_read(keys_of(keys)).numpy()
    distinct = np.unique(keys)
    assert table.size.numpy()[0] == len(distinct)
    exported_keys, _ = sok.export(table)
    np.testing.assert_array_equal(np.sort(exported_keys.numpy()), distinct)
    expected = reference.sparse_read(keys_of(distinct)).numpy()
    np.testing.assert_array_equal(rows, expected[np.searchsorted(distinct, keys)])


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_lookup_matches_rows_read_back(combiner, mode):
    table = sok.DynamicVariable(5, name=f"lookup_{combiner}_{mode}")
    rng = np.random.default_rng(4)
    universe = rng.integers(-(1 << 60), 1 << 60, size=30)
    lengths = rng.integers(0, 4, size=9)
    flat = universe[rng.integers(0, 30, size=lengths.sum())]
    ids = tf.RaggedTensor.from_row_lengths(keys_of(flat), lengths)
    weights = tf.RaggedTensor.from_row_lengths(
        tf.constant(rng.uniform(0.5, 2, size=lengths.sum()), tf.float32), lengths)

    def step():
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse([table], [ids], [weights], [combiner])[0]
            loss = tf.reduce_sum(out * out)
        return out, tape.gradient(loss, table)

    out, grad = run_mode(mode, step)
    rows = table.sparse_read(keys_of(flat), insert=False).numpy()  # every id was inserted
    ref_table = tf.Variable(rows)
    ref_ids = tf.RaggedTensor.from_row_lengths(tf.range(len(flat), dtype=tf.int64), lengths)
    with tf.GradientTape() as tape:
        ref = tf.nn.safe_embedding_lookup_sparse(ref_table, ref_ids.to_sparse(),
                                                 weights.to_sparse(), combiner=combiner)
        ref_loss = tf.reduce_sum(ref * ref)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    # Gradient per key = sum of the reference's per-occurrence gradients of that key.
    ref_grad = tf.convert_to_tensor(tape.gradient(ref_loss, ref_table)).numpy()
    expected = {}
    for key, row in zip(flat, ref_grad):
        expected[key] = expected.get(key, 0) + row
    assert isinstance(grad, tf.IndexedSlices)
    got = {}  # IndexedSlices: repeated indices add up
    for key, row in zip(grad.indices.numpy().tolist(), grad.values.numpy()):
        got[key] = got.get(key, 0) + row
    assert set(got) == set(expected)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-6)


def test_inference_mode_does_not_insert():
    table = sok.DynamicVariable(3, initializer="ones")
    table.sparse_read(keys_of([1]))
    ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
    out = sok.lookup_sparse([table], [ids], combiners=["sum"], training=False)[0]
    np.testing.assert_array_equal(out.numpy(), [[1, 1, 1], [0, 0, 0]])
    assert table.size.numpy()[0] == 1


def test_static_and_dynamic_tables_in_one_call():
    static = sok.Variable(np.arange(20, dtype=np.float32).reshape(10, 2))
    dynamic = sok.DynamicVariable(2, initializer="ones")
    ids = tf.ragged.constant([[1, 2], [9]], tf.int64)
    out_static, out_dynamic = sok.lookup_sparse([static, dynamic], [ids, ids],
                                                combiners=["sum", "sum"])
    np.testing.assert_array_equal(out_static.numpy(), [[6, 8], [18, 19]])
    np.testing.assert_array_equal(out_dynamic.numpy(), [[2, 2], [1, 1]])


@pytest.mark.parametrize("config, error, message", [
    ({"capacity": 5}, ValueError, "unknown DynamicVariable config \\['capacity'\\]; valid keys"),
    ({"evict_strategy": "fifo"}, ValueError, "unknown evict_strategy 'fifo'"),
    ({"key_type": tf.float32}, TypeError, "key_type must be int64 or int32"),
    ({"dtype": tf.float64}, TypeError, "dtype must be one of .* got float64"),
    ({"initializer": "glorot"}, ValueError, "unknown initializer 'glorot'"),
    ({"var_type": "ssd"}, ValueError, "unknown var_type 'ssd'"),
    ({"mode": "localized:3"}, ValueError, "only 1 workers"),
    ({"filter_ratio": 2.0}, ValueError, "filter_ratio must be in \\[0, 1\\]"),
])
def test_bad_configuration(config, error, message):
    with pytest.raises(error, match=message):
        sok.DynamicVariable(4, **config)


def test_hint_configuration_is_accepted():
    table = sok.DynamicVariable(4, var_type="hybrid", max_hbm_for_vectors=1, max_load_factor=0.5,
                                max_bucket_size=128, block_size=1024, device_id=0, io_by_cpu=True)
    assert table.size.numpy()[0] == 0
    assert sok.filter_variables([table]) == ([table], [])


@pytest.mark.parametrize("ratio", [0.0, 0.3, 1.0])
def test_low_frequency_filter_admits_new_keys_with_filter_ratio(ratio):
    table = sok.DynamicVariable(2, initializer="ones", filter_ratio=ratio)
    ids = tf.RaggedTensor.from_row_lengths(keys_of(np.arange(10000) * 7919), [1] * 10000)
    out = sok.lookup_sparse([table], [ids], combiners=["sum"], use_low_frequency_filter=True)[0]
    admitted = table.size.numpy()[0]
    expected = 10000 * ratio
    assert abs(admitted - expected) <= 5 * np.sqrt(10000 * ratio * (1 - ratio)) + 1e-9
    # Admitted keys read their initial row (ones); the others read zeros and are not stored.
    assert (out.numpy()[:, 0] == 1.0).sum() == admitted
    assert ((out.numpy() == 0.0).all(axis=1) | (out.numpy() == 1.0).all(axis=1)).all()
    unfiltered = sok.DynamicVariable(2, initializer="ones", filter_ratio=ratio)
    sok.lookup_sparse([unfiltered], [ids], combiners=["sum"])
    assert unfiltered.size.numpy()[0] == 10000


def test_checkpoint_round_trip_with_optimizer_state(tmp_path):
    table = sok.DynamicVariable(3, name="ckpt")
    optimizer = sok.OptimizerWrapper(keras_optimizer("Adagrad", 0.1))
    ids = tf.ragged.constant([[1, 2], [1 << 60]], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0])
    optimizer.apply_gradients([(tape.gradient(loss, table), table)])
    checkpoint = tf.train.Checkpoint(table=table)
    path = checkpoint.save(str(tmp_path / "dyn"))
    saved = exported(table)

    def train_once():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0])
        optimizer.apply_gradients([(tape.gradient(loss, table), table)])

    train_once()
    after_one_more = exported(table)[1]
    table.sparse_read(keys_of([99, 100]))                 # keys that were not saved
    checkpoint.restore(path)
    restored = exported(table)
    np.testing.assert_array_equal(restored[0], saved[0])  # the extra keys are gone
    np.testing.assert_array_equal(restored[1], saved[1])
    train_once()                                          # Adagrad state came back too
    np.testing.assert_allclose(exported(table)[1], after_one_more, rtol=1e-6)
    other_dim = sok.DynamicVariable(4)
    with pytest.raises(Exception, match="restored values must be \\[3, 4\\]"):
        tf.train.Checkpoint(table=other_dim).restore(path).expect_partial()


def test_incremental_model_dump_returns_rows_written_after_the_threshold():
    table = sok.DynamicVariable(3, name="incremental", init_capacity=16)  # grows: times move
    other = sok.DynamicVariable(2, name="incremental_other")
    old_keys = keys_of(list(range(1, 60)) + [-(1 << 62)])
    table.sparse_read(old_keys)                                  # inserted before the mark
    table.assign(keys_of([4]), tf.fill([1, 3], 7.0))
    time.sleep(0.01)
    mark = time.time()
    time.sleep(0.01)
    assert table.sparse_read(old_keys).shape == (60, 3)         # reads are not writes
    new_keys = list(range(1000, 1100))
    table.sparse_read(keys_of(new_keys))                         # new keys: written
    table.assign(keys_of([2]), tf.fill([1, 3], 5.0))             # overwritten
    sok.OptimizerWrapper(keras_optimizer("SGD", 0.5)).apply_gradients(
        [(tf.IndexedSlices(tf.ones([1, 3]), keys_of([3])), table)])  # updated
    (keys, other_keys), (values, _) = sok.incremental_model_dump([table, other], mark)
    expected = np.array([2, 3] + new_keys)
    order = np.argsort(keys)
    np.testing.assert_array_equal(keys[order], expected)
    np.testing.assert_allclose(values[order],
                               table.sparse_read(keys_of(expected), insert=False).numpy())
    assert other_keys.shape == (0,) and isinstance(keys, np.ndarray)
    # SOK's form: a UTC datetime, or one per variable; naive datetimes are UTC.
    utc = datetime.datetime.fromtimestamp(mark, datetime.timezone.utc)
    (same, _), _ = sok.incremental_model_dump([table, other], [utc.replace(tzinfo=None), utc])
    np.testing.assert_array_equal(np.sort(same), expected)
    (everything,), _ = sok.incremental_model_dump(table, 0.0)
    assert sorted(everything) == sorted(list(range(1, 60)) + [-(1 << 62)] + new_keys)
    with pytest.raises(ValueError, match="3 time thresholds for 2 variables"):
        sok.incremental_model_dump([table, other], [mark] * 3)
    with pytest.raises(TypeError, match="variables\\[0\\] is Variable"):
        sok.incremental_model_dump([sok.Variable(np.ones([2, 2], np.float32))], mark)


HALF_TYPES = {"float16": (tf.float16, np.float16, 2.0 ** -11),
              "bfloat16": (tf.bfloat16, None, 2.0 ** -8)}


def rounded(values, dtype):
    """values rounded to a 16-bit type and widened back (TensorFlow's round to nearest even)."""
    return tf.cast(tf.cast(tf.constant(values, tf.float32), dtype), tf.float32).numpy()


@pytest.mark.parametrize("name", sorted(HALF_TYPES))
def test_16_bit_rows_store_rounded_values_and_read_float32(name):
    dtype, _, _ = HALF_TYPES[name]
    half = sok.DynamicVariable(6, name=f"half_{name}", dtype=dtype, init_capacity=16)
    full = sok.DynamicVariable(6, name=f"half_{name}")  # same name: same initial rows
    assert half.dtype == dtype
    keys = keys_of(np.arange(-50, 50) * 7919)           # grows past init_capacity
    initial = half.sparse_read(keys)
    assert initial.dtype == tf.float32
    np.testing.assert_array_equal(initial.numpy(), rounded(full.sparse_read(keys).numpy(), dtype))
    values = np.random.default_rng(1).normal(size=[100, 6]).astype(np.float32)
    half.assign(keys, values)
    np.testing.assert_array_equal(half.sparse_read(keys, insert=False).numpy(),
                                  rounded(values, dtype))
    exported_keys, exported_values = sok.export(half)
    order = np.argsort(exported_keys.numpy())
    np.testing.assert_array_equal(exported_values.numpy()[order],
                                  rounded(values, dtype)[np.argsort(keys.numpy())])


@pytest.mark.parametrize("name", sorted(HALF_TYPES))
def test_16_bit_rows_train_like_a_float32_table_rounded_after_each_update(name):
    # Reference: Keras Adagrad on a float32 tf.Variable whose rows are rounded to the 16-bit
    # type after every step (the table computes each update in float32 and rounds once).
    dtype, _, ulp = HALF_TYPES[name]
    rng = np.random.default_rng(3)
    universe = rng.integers(-(1 << 40), 1 << 40, size=20)
    table = sok.DynamicVariable(4, name=f"train_{name}", dtype=dtype)
    reference = tf.Variable(table.sparse_read(keys_of(universe)).numpy())
    wrapper = sok.OptimizerWrapper(keras_optimizer("Adagrad", 0.1))
    ref_optimizer = keras_optimizer("Adagrad", 0.1)
    for _ in range(10):
        lengths = rng.integers(0, 3, size=5)
        rows = rng.integers(0, 20, size=lengths.sum())
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse(table, tf.RaggedTensor.from_row_lengths(
                keys_of(universe[rows]), lengths), combiners="sum")
            loss = tf.reduce_sum(out * out)
        wrapper.apply_gradients([(tape.gradient(loss, table), table)])
        with tf.GradientTape() as tape:
            ragged = tf.RaggedTensor.from_row_lengths(tf.constant(rows, tf.int64), lengths)
            out = tf.reduce_sum(tf.gather(reference, ragged), axis=1)
            loss = tf.reduce_sum(out * out)
        ref_optimizer.apply_gradients([(summed_duplicates(tape.gradient(loss, reference)),
                                        reference)])
        reference.assign(rounded(reference.numpy(), dtype))
    # float32 arithmetic may land either side of a rounding boundary: one 16-bit ulp apart
    np.testing.assert_allclose(table.sparse_read(keys_of(universe), insert=False).numpy(),
                               reference.numpy(), rtol=2 * ulp, atol=1e-6)


def test_16_bit_table_checkpoint_round_trip(tmp_path):
    table = sok.DynamicVariable(3, name="half_checkpoint", dtype=tf.float16)
    keys = keys_of([5, -9, 1 << 50])
    table.sparse_read(keys)
    sok.OptimizerWrapper(keras_optimizer("Adagrad", 0.1)).apply_gradients(
        [(tf.IndexedSlices(tf.ones([3, 3]), keys), table)])
    saved = table.sparse_read(keys, insert=False).numpy()
    path = tf.train.Checkpoint(table=table).save(str(tmp_path / "half"))
    table.assign(keys, tf.zeros([3, 3]))
    tf.train.Checkpoint(table=table).restore(path)
    np.testing.assert_array_equal(table.sparse_read(keys, insert=False).numpy(), saved)
