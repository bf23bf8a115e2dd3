"""sok.dump / sok.load: SOK's file format, round trips, all-or-nothing loads."""
import json
import os
import struct
import zlib

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from conftest import horovodrun
from keras_optimizers import KERAS_3, keras_optimizer


def trained_tables():
    static = sok.Variable(np.arange(24, dtype=np.float32).reshape(6, 4), name="static/table")
    dynamic = sok.DynamicVariable(4, name="dyn.table")
    optimizer = sok.OptimizerWrapper(keras_optimizer("Adagrad", 0.1))
    ids = tf.ragged.constant([[1, 2], [5], [1 << 40]], tf.int64)
    with tf.GradientTape() as tape:
        outs = sok.lookup_sparse([static, dynamic], [tf.ragged.constant([[1, 2], [5], [0]],
                                                                         tf.int64), ids],
                                 combiners=["sum", "sum"])
        loss = tf.reduce_sum(outs[0] ** 2) + tf.reduce_sum(outs[1] ** 2)
    tables = [static, dynamic]
    optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
    return static, dynamic, optimizer


def snapshot(static, dynamic):
    keys, values = sok.export(dynamic)
    order = np.argsort(keys.numpy())
    return static.numpy().copy(), keys.numpy()[order], values.numpy()[order]


def test_files_follow_sok_format(tmp_path):
    static, dynamic, optimizer = trained_tables()
    sok.dump(str(tmp_path), [static, dynamic], optimizer)
    names = sorted(os.listdir(tmp_path))
    files = ["static_table_0-key", "static_table_0-weight", "static_table_0-Adagrad-accumulator",
             "dyn_table_0-key", "dyn_table_0-weight", "dyn_table_0-Adagrad-accumulator"]
    assert names == sorted(files + ["sok_checkpoint.json"])
    manifest = json.loads((tmp_path / "sok_checkpoint.json").read_text())
    recorded = {file: facts for entry in manifest["tables"].values()
                for file, facts in entry["files"].items()}
    assert sorted(recorded) == sorted(files)
    for file in files:  # sizes and CRCs as zlib computes them over the bytes on disk
        data = (tmp_path / file).read_bytes()
        assert recorded[file] == {"bytes": len(data), "crc32": zlib.crc32(data)}
    data = (tmp_path / "static_table_0-weight").read_bytes()
    assert data[:256].decode().strip() == "static/table:0" and data[:256].startswith(b" ")
    assert struct.unpack(">I", data[256:260])[0] == 1           # weight
    assert struct.unpack(">I", data[292:296])[0] == 5           # float32
    np.testing.assert_array_equal(np.frombuffer(data[296:], "<f4").reshape(6, 4), static.numpy())
    keys = (tmp_path / "static_table_0-key").read_bytes()
    assert struct.unpack(">I", keys[256:260])[0] == 0 and struct.unpack(">I", keys[292:296])[0] == 1
    np.testing.assert_array_equal(np.frombuffer(keys[296:], "<i8"), np.arange(6))


def test_round_trip_restores_rows_and_optimizer_state(tmp_path):
    static, dynamic, optimizer = trained_tables()
    sok.dump(str(tmp_path), [static, dynamic], optimizer)
    saved = snapshot(static, dynamic)
    accumulator = optimizer.get_slot(static, "accumulator").numpy().copy()
    static.assign(np.zeros([6, 4], np.float32))
    dynamic.sparse_read(tf.constant([777], tf.int64))
    optimizer.get_slot(static, "accumulator").assign(np.zeros([6, 4], np.float32))
    sok.load(str(tmp_path), [static, dynamic], optimizer)
    restored = snapshot(static, dynamic)
    for a, b in zip(saved, restored):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(optimizer.get_slot(static, "accumulator").numpy(),
                                  accumulator)


@pytest.mark.parametrize("dtype, code", [(tf.float16, 4), (tf.bfloat16, 5)])
def test_16bit_static_tables_round_trip(tmp_path, dtype, code):
    """float16 rows are written as float16 (SOK's code 4); bfloat16, which SOK's format has
    no code for, as float32, which holds them exactly. Rows and Adagrad state come back."""
    table = sok.Variable(tf.cast(np.linspace(-3, 3, 24).reshape(6, 4), dtype), name="half")
    optimizer = sok.OptimizerWrapper(keras_optimizer("Adagrad", 0.1))
    with tf.GradientTape() as tape:
        out = sok.lookup_sparse([table], [tf.ragged.constant([[1, 2], [5]], tf.int64)])[0]
        loss = tf.reduce_sum(tf.cast(out, tf.float32) ** 2)
    optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
    sok.dump(str(tmp_path), [table], optimizer)
    data = (tmp_path / "half_0-weight").read_bytes()
    assert struct.unpack(">I", data[292:296])[0] == code
    rows = table.numpy().copy()
    accumulator = optimizer.get_slot(table, "accumulator").numpy().copy()
    table.assign(tf.zeros([6, 4], dtype))
    optimizer.get_slot(table, "accumulator").assign(tf.zeros([6, 4], dtype))
    sok.load(str(tmp_path), [table], optimizer)
    assert table.dtype == dtype
    np.testing.assert_array_equal(table.numpy().view(np.uint16), rows.view(np.uint16))
    np.testing.assert_array_equal(
        optimizer.get_slot(table, "accumulator").numpy().view(np.uint16),
        accumulator.view(np.uint16))


def test_truncated_or_mismatched_files_change_nothing(tmp_path):
    static, dynamic, optimizer = trained_tables()
    sok.dump(str(tmp_path), [static, dynamic])
    before = snapshot(static, dynamic)
    weight = tmp_path / "dyn_table_0-weight"
    weight.write_bytes(weight.read_bytes()[:-3])
    with pytest.raises(ValueError, match="dyn_table_0-weight is not the file its dump wrote"):
        sok.load(str(tmp_path), [static, dynamic])
    os.remove(tmp_path / "sok_checkpoint.json")  # as SOK writes them: the files' own checks
    with pytest.raises(ValueError, match="dyn_table_0-weight is truncated or has the wrong width"):
        sok.load(str(tmp_path), [static, dynamic])
    for a, b in zip(before, snapshot(static, dynamic)):
        np.testing.assert_array_equal(a, b)
    other = sok.Variable(np.zeros([6, 4], np.float32), name="other")
    os.rename(tmp_path / "static_table_0-key", tmp_path / "other_0-key")
    os.rename(tmp_path / "static_table_0-weight", tmp_path / "other_0-weight")
    with pytest.raises(ValueError, match="holds table 'static/table:0', expected 'other:0'"):
        sok.load(str(tmp_path), [other])
    with pytest.raises(ValueError, match="checkpoint file .*missing_0-key is missing"):
        sok.load(str(tmp_path), [sok.Variable(np.zeros([2, 4], np.float32), name="missing")])


def test_dump_from_two_workers_loads_into_one(tmp_path):

    output = horovodrun("dump_tables.py", str(tmp_path))
    assert output.count("DUMPED rank=") == 2
    assert output.count("COMM OK rank=") == 2, output[-3000:]
    # incremental_model_dump gathers every worker's keys for each worker, as in SOK
    for rank in (0, 1):
        assert (f"INCREMENTAL rank={rank} keys={sorted([-9, 4, 1 << 50, 17, 23])} rows=(5, 3)"
                in output), output[-3000:]
    assert "ASSIGN_REFUSED rank=0: sok.assign: row 1 of 'static_mw:0' is not held by worker 0 of 2" \
        in output
    static = sok.Variable(np.zeros([7, 3], np.float32), name="static_mw")
    dynamic = sok.DynamicVariable(3, name="dynamic_mw")
    sok.load(str(tmp_path), [static, dynamic])
    np.testing.assert_array_equal(static.numpy(), np.arange(21, dtype=np.float32).reshape(7, 3))
    keys = np.array([-9, 4, 1 << 50, 17, 23], np.int64)
    np.testing.assert_array_equal(
        dynamic.sparse_read(tf.constant(keys), insert=False).numpy(),
        np.repeat(keys[:, None].astype(np.float32) % 1000, 3, axis=1))
    assert dynamic.size.numpy()[0] == 5


def test_loads_sok_headers_with_blank_names_and_older_dynamic_file_names(tmp_path):
    # SOK leaves the header's table name blank; dumps made before a DynamicVariable's name
    # carried ":0" named its files from the bare name ("dyn_table-key").
    static, dynamic, optimizer = trained_tables()
    sok.dump(str(tmp_path), [static, dynamic], optimizer)
    saved = snapshot(static, dynamic)
    os.remove(tmp_path / "sok_checkpoint.json")  # SOK writes none
    for path in tmp_path.iterdir():
        data = path.read_bytes()
        path.write_bytes(b" " * 256 + data[256:])
        if path.name.startswith("dyn_table_0-"):
            path.rename(tmp_path / path.name.replace("dyn_table_0-", "dyn_table-"))
    static.assign(np.zeros([6, 4], np.float32))
    dynamic.sparse_read(tf.constant([777], tf.int64))
    sok.load(str(tmp_path), [static, dynamic], optimizer)
    for a, b in zip(saved, snapshot(static, dynamic)):
        np.testing.assert_array_equal(a, b)


def unnamed_static_tables_trained(rng):
    """As SOK's dump/load tests make them: unnamed sok.Variables (all "Variable:0" in eager
    mode), trained one step under a legacy Keras optimizer with slots."""
    tables = [sok.Variable(rng.random([40, 8]).astype(np.float32)),
              sok.Variable(rng.random([12, 8]).astype(np.float32)),
              sok.Variable(rng.random([12, 3]).astype(np.float32))]
    assert {t.name for t in tables} == {"Variable:0"}
    optimizer = keras_optimizer("SGD", 0.5, momentum=0.9)
    ids = [tf.ragged.constant([[1, 7], [3]], tf.int64), tf.ragged.constant([[0], [11, 2]], tf.int64),
           tf.ragged.constant([[4, 4], [5]], tf.int64)]
    with tf.GradientTape() as tape:
        outs = sok.lookup_sparse(tables, ids, combiners=["sum", "mean", "sum"])
        loss = sum(tf.reduce_sum(o * o) for o in outs)
    optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
    return tables, optimizer


def test_unnamed_tables_round_trip_told_apart_by_position(tmp_path):
    tables, optimizer = unnamed_static_tables_trained(np.random.default_rng(5))
    saved = [t.numpy().copy() for t in tables]
    slots = sok.OptimizerWrapper(optimizer)  # get_slot under either Keras generation
    momenta = [slots.get_slot(t, "momentum").numpy().copy() for t in tables]
    sok.dump(str(tmp_path), tables, optimizer)
    assert {f"Variable_0.{k}-weight" for k in range(3)} <= set(os.listdir(tmp_path))
    header = (tmp_path / "Variable_0.1-weight").read_bytes()[:256].decode().strip()
    assert header == "Variable:0#1"
    for t in tables:
        t.assign(tf.zeros_like(t))
        slots.get_slot(t, "momentum").assign(tf.zeros_like(t))
    sok.load(str(tmp_path), tables, optimizer)
    for t, rows, momentum in zip(tables, saved, momenta):
        np.testing.assert_array_equal(t.numpy(), rows)
        np.testing.assert_array_equal(slots.get_slot(t, "momentum").numpy(), momentum)


@pytest.mark.skipif(not KERAS_3, reason="a Keras 3 optimizer makes its state only when built")
def test_loading_state_into_an_unbuilt_keras_3_optimizer_is_refused(tmp_path):
    tables, optimizer = unnamed_static_tables_trained(np.random.default_rng(7))
    sok.dump(str(tmp_path), tables, optimizer)
    saved = [t.numpy().copy() for t in tables]
    for t in tables:
        t.assign(tf.zeros_like(t))
    with pytest.raises(ValueError, match="SGD is not built yet.*build it first"):
        sok.load(str(tmp_path), tables, keras_optimizer("SGD", 0.5, momentum=0.9))
    for t in tables:  # nothing was written
        np.testing.assert_array_equal(t.numpy(), np.zeros_like(t.numpy()))
    sok.load(str(tmp_path), tables)  # the rows alone load without the optimizer
    for t, rows in zip(tables, saved):
        np.testing.assert_array_equal(t.numpy(), rows)


def test_unnamed_tables_load_into_a_different_list_is_refused(tmp_path):
    tables, _ = unnamed_static_tables_trained(np.random.default_rng(6))
    sok.dump(str(tmp_path), tables)
    before = [t.numpy().copy() for t in tables]
    with pytest.raises(ValueError, match="holds 3 table\\(s\\) named 'Variable:0', told apart "
                                         "by their position in the dumped list, and 2 are given"):
        sok.load(str(tmp_path), tables[:2])
    with pytest.raises(ValueError, match="'Variable:0' \\(Variable_0.1\\) is a static table of "
                                         "dimension 8; it is loaded into a static table of "
                                         "dimension 3"):
        sok.load(str(tmp_path), [tables[0], tables[2], tables[1]])
    with pytest.raises(ValueError, match="Variable_0.0-key has row ids outside \\[0, 12\\)"):
        sok.load(str(tmp_path), [tables[1], tables[0], tables[2]])
    for t, rows in zip(tables, before):  # nothing changed by the refused loads
        np.testing.assert_array_equal(t.numpy(), rows)


def test_rmsprop_without_momentum_dumps_no_momentum_slot_and_restores_rms(tmp_path):
    # Keras (and SOK) make no momentum slot when RMSprop's momentum is 0.
    table = sok.DynamicVariable(4, name="rms_table", initializer="0.5")
    wrapper = sok.OptimizerWrapper(keras_optimizer("RMSprop", 0.01))
    ids = tf.constant([3, 8, 3], tf.int64)
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids) ** 2)
        wrapper.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
    assert wrapper.get_slot_names() == ["rms"]
    rms = wrapper.get_slot(table, "rms").sparse_read(ids).numpy()
    rows = table.sparse_read(ids, insert=False).numpy()
    sok.dump(str(tmp_path), [table], wrapper)
    assert sorted(n for n in os.listdir(tmp_path) if "RMSprop" in n) == ["rms_table_0-RMSprop-rms"]
    wrapper.get_slot(table, "rms").assign([3, 8], np.zeros([2, 4], np.float32))
    table.assign([3, 8], np.zeros([2, 4], np.float32))
    sok.load(str(tmp_path), [table], wrapper)
    np.testing.assert_array_equal(wrapper.get_slot(table, "rms").sparse_read(ids).numpy(), rms)
    np.testing.assert_array_equal(table.sparse_read(ids, insert=False).numpy(), rows)
