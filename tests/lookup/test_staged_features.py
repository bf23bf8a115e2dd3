"""sok.stage_features: a packed batch staged by the input pipeline (Sok>StageFeatures) and read
back by the lookup (Sok>UnpackStagedFeatures), against the packed RaggedTensor it was made
from, NumPy and tf.nn.safe_embedding_lookup_sparse."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit._ops import raw_ops
from conftest import DEVICES, run_mode
from keras_optimizers import keras_optimizer

@pytest.fixture(params=DEVICES)
def device(request):
    """The suite's device, named as tf.device takes it here ("CPU:0", "GPU:0"): the read-back
    runs on each, the CPU widening in host memory, a GPU after one copy."""
    return f"{request.param}:0"


def packed_ids(rng, vocabs, batch, max_len=4):
    """(one packed RaggedTensor, its features as one RaggedTensor each)."""
    lengths = [rng.integers(0, max_len + 1, size=batch) for _ in vocabs]
    ids = [rng.integers(0, v, size=l.sum()).astype(np.int64) for v, l in zip(vocabs, lengths)]
    packed = tf.RaggedTensor.from_row_lengths(np.concatenate(ids), np.concatenate(lengths))
    return packed, [tf.RaggedTensor.from_row_lengths(i, l) for i, l in zip(ids, lengths)]


def unstaged(values, splits, num_features, dtype=tf.int64, device="CPU:0"):
    """The staged batch read back on `device`: (values, row splits) a feature, as NumPy."""
    staged = sok.stage_features(tf.RaggedTensor.from_row_splits(values, splits), num_features)
    with tf.device(device):
        made_values, made_splits = raw_ops.sok_unpack_staged_features(
            staged=staged.staged, plan=staged.plan, num_features=num_features, T=dtype)
    return [v.numpy() for v in made_values], [s.numpy() for s in made_splits]


def expected_features(values, splits, num_features):
    batch = (len(splits) - 1) // num_features
    for f in range(num_features):
        first, last = splits[batch * f], splits[batch * (f + 1)]
        yield values[first:last], splits[batch * f:batch * (f + 1) + 1] - first


@pytest.mark.parametrize("case", ["small ids, short rows", "ids beyond int32",
                                  "rows of 256 ids and more", "int32 ids", "int32 row splits"])
def test_staged_batch_reads_back_as_its_features(case, device):
    """Every coding (int64 ids narrowed or not, lengths as bytes or rebased splits) against
    NumPy's slicing of the packed batch, empty samples and an empty feature included."""
    rng = np.random.default_rng(11)
    features, batch = 4, 300
    lengths = rng.integers(0, 6, size=features * batch)
    lengths[batch:2 * batch] = 0  # feature 1 holds no ids
    if case == "rows of 256 ids and more":
        lengths[2 * batch + 7] = 300
    values = rng.integers(0, 1000, size=lengths.sum()).astype(np.int64)
    if case == "ids beyond int32":
        values[-1] = 1 << 40
    dtype = tf.int32 if case == "int32 ids" else tf.int64
    values = values.astype(dtype.as_numpy_dtype)
    splits = np.concatenate([[0], np.cumsum(lengths)])
    if case == "int32 row splits":
        splits = splits.astype(np.int32)
    made_values, made_splits = unstaged(values, splits, features, dtype, device)
    for f, (want_values, want_splits) in enumerate(expected_features(values, splits, features)):
        np.testing.assert_array_equal(made_values[f], want_values)
        assert made_values[f].dtype == values.dtype
        np.testing.assert_array_equal(made_splits[f], want_splits)


def test_staged_batch_of_several_megabytes(device):
    """Features of small ids cross as int32 and lengths as bytes; one of large ids as it is."""
    rng = np.random.default_rng(12)
    features, batch = 6, 70_000
    lengths = rng.integers(0, 4, size=features * batch)
    values = rng.integers(-3, 1 << 20, size=lengths.sum())
    last = np.concatenate([[0], np.cumsum(lengths)])[(features - 1) * batch]
    values[last:] += 1 << 33
    splits = np.concatenate([[0], np.cumsum(lengths)])
    staged = sok.stage_features(tf.RaggedTensor.from_row_splits(values, splits), features)
    narrow_ids = last * 4 + (len(values) - last) * 8
    assert staged.staged.shape[0] <= narrow_ids + features * (batch + 2 * 16)
    made_values, made_splits = unstaged(values, splits, features, device=device)
    for f, (want_values, want_splits) in enumerate(expected_features(values, splits, features)):
        np.testing.assert_array_equal(made_values[f], want_values)
        np.testing.assert_array_equal(made_splits[f], want_splits)


@pytest.mark.parametrize("features, batch", [(2, 600_000), (40, 3_000)])
def test_staged_batch_of_many_samples_or_many_features(device, features, batch):
    """Row splits summed from length bytes across hundreds of tiles of one feature (a GPU scans
    every tile of every feature at once), and over more features than one launch widens, beside
    a feature whose splits cross as they are (a sample of 300 ids): NumPy's slicing."""
    rng = np.random.default_rng(13)
    lengths = rng.integers(0, 3, size=features * batch)
    lengths[batch + 5] = 300
    values = rng.integers(0, 1 << 20, size=lengths.sum())
    splits = np.concatenate([[0], np.cumsum(lengths)])
    made_values, made_splits = unstaged(values, splits, features, device=device)
    for f, (want_values, want_splits) in enumerate(expected_features(values, splits, features)):
        np.testing.assert_array_equal(made_values[f], want_values)
        np.testing.assert_array_equal(made_splits[f], want_splits)


def test_staged_batches_read_back_in_turn_behind_busy_work(device):
    """Batches of growing and shrinking size read back one after another in one function,
    each behind a long computation on the device: each equals its own batch. (On a GPU the
    copies run ahead on a stream of their own into two buffers used in turn; a copy that
    overtook the widening of the batch before it in the same buffer would show here.)"""
    rng = np.random.default_rng(15)
    features = 3
    batches = []
    for batch in [500, 20_000, 300, 60_000, 60_000, 1_000, 90_000, 10, 40_000]:
        lengths = rng.integers(0, 5, size=features * batch)
        values = rng.integers(0, 1 << 20, size=lengths.sum())
        batches.append((values, np.concatenate([[0], np.cumsum(lengths)])))
    staged = [sok.stage_features(tf.RaggedTensor.from_row_splits(v, s), features)
              for v, s in batches]
    side = 4096 if device.startswith("GPU") else 128
    with tf.device(device):
        square = tf.random.normal([side, side]) / side

    @tf.function
    def read_all():
        outputs, busy = [], square
        for batch in staged:
            with tf.device(device):
                for _ in range(3):
                    busy = tf.matmul(busy, square)
                with tf.control_dependencies([busy]):  # enqueued behind the matmuls
                    values, splits = raw_ops.sok_unpack_staged_features(
                        staged=batch.staged, plan=batch.plan, num_features=features,
                        T=tf.int64)
                outputs.append(([v + 0 for v in values], [s + 0 for s in splits]))
        return outputs, busy

    outputs, _ = read_all()
    for (values, splits), (made_values, made_splits) in zip(batches, outputs):
        expected = expected_features(values, splits, features)
        for f, (want_values, want_splits) in enumerate(expected):
            np.testing.assert_array_equal(made_values[f].numpy(), want_values)
            np.testing.assert_array_equal(made_splits[f].numpy(), want_splits)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_staged_lookup_matches_safe_embedding_lookup_sparse(mode):
    """Outputs and gradients of a staged batch equal those of the packed RaggedTensor and
    tf.nn.safe_embedding_lookup_sparse per table (a dynamic table among the static ones)."""
    rng = np.random.default_rng(13)
    vocabs, dim, batch = [30, 7, 50, 12], 5, 9
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    tables = [sok.Variable(i) for i in inits[:3]] + [
        sok.DynamicVariable(dimension=dim, initializer="zeros")]
    refs = [tf.Variable(i) for i in inits]
    packed, per_ids = packed_ids(rng, vocabs, batch)
    staged = sok.stage_features(packed, len(vocabs))
    combiners = ["sum", "mean", "sqrtn", "mean"]
    cotangent = tf.constant(rng.normal(size=[batch, len(vocabs), dim]).astype(np.float32))

    def step():
        with tf.GradientTape(persistent=True) as tape:
            out = sok.lookup_sparse(tables, staged, combiners=combiners)
            from_packed = sok.lookup_sparse(tables, packed, combiners=combiners)
            loss = tf.reduce_sum(out * cotangent)
            refs_out = tf.stack([tf.nn.safe_embedding_lookup_sparse(r, i.to_sparse(), None, c)
                                 for r, i, c in zip(refs, per_ids, combiners)], 1)
            ref_loss = tf.reduce_sum(refs_out * cotangent)
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, tables[:3])]
        ref_grads = [tf.convert_to_tensor(g) for g in tape.gradient(ref_loss, refs[:3])]
        return out, from_packed, refs_out, grads, ref_grads

    out, from_packed, ref, grads, ref_grads = run_mode(mode, step)
    np.testing.assert_array_equal(out.numpy(), from_packed.numpy())
    ref = ref.numpy()
    ref[:, 3] = 0.0  # the dynamic table's rows start at zeros
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)
    for grad, ref_grad in zip(grads, ref_grads):
        np.testing.assert_allclose(grad.numpy(), ref_grad.numpy(), rtol=1e-5, atol=1e-6)


def squares_step(tables, optimizer, combiner):
    """A train step on sum(lookup ** 2) of a packed or staged batch, through OptimizerWrapper."""
    wrapped = sok.OptimizerWrapper(optimizer)

    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse(tables, ids, combiners=combiner) ** 2)
        wrapped.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return loss
    return step


def train_from_iterator(step, dataset, steps):
    """`steps` steps over `dataset`'s batches read inside tf.functions: one step a call twice,
    then the rest in one call's loop (as Keras' steps_per_execution)."""
    iterator = iter(dataset)

    @tf.function
    def one_step():
        return step(next(iterator))

    @tf.function
    def loop_of_steps():
        for _ in tf.range(steps - 2):
            step(next(iterator))

    one_step()
    one_step()
    loop_of_steps()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_staged_batches_from_a_pipeline_train_as_the_packed_form(optimizer):
    """Batches staged by a tf.data map and read inside the step (one step a call and a loop of
    steps a call) train the tables exactly as the same packed RaggedTensors passed in."""
    rng = np.random.default_rng(14)
    vocabs, dim, batch, steps = [40, 25, 60], 4, 16, 6
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    batches = [packed_ids(rng, vocabs, batch)[0] for _ in range(steps)]
    with tf.device("CPU:0"):
        per_batch = tf.RaggedTensor.from_uniform_row_length(tf.concat(batches, 0),
                                                            batch * len(vocabs))
    dataset = (tf.data.Dataset.from_tensor_slices(per_batch)
               .map(lambda ids: sok.stage_features(ids, len(vocabs))).prefetch(2))

    def make():
        tables = [sok.Variable(i) for i in inits]
        name = "Adam" if optimizer == "adam" else "SGD"
        return tables, squares_step(tables, keras_optimizer(name, 0.05), "mean")

    reference, by_argument = make()
    by_argument = tf.function(by_argument)
    for packed in batches:
        by_argument(packed)
    staged_tables, staged_step = make()
    train_from_iterator(staged_step, dataset, steps)
    for a, b in zip(staged_tables, reference):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


def test_stage_features_bad_input():
    tables = [sok.Variable(np.ones([5, 2], np.float32)) for _ in range(3)]
    three = tf.ragged.constant([[1], [2], [3]], dtype=tf.int64)
    with pytest.raises(TypeError, match="one tf.RaggedTensor"):
        sok.stage_features(tf.constant([[1], [2], [3]]), 3)
    with pytest.raises(TypeError, match="ids must be int32 or int64"):
        sok.stage_features(tf.ragged.constant([[1.0], [2.0], [3.0]]), 3)
    with pytest.raises(ValueError, match="2-D RaggedTensor"):
        sok.stage_features(tf.ragged.constant([[[1]], [[2]], [[3]]], dtype=tf.int64), 3)
    for bad in (0, -2, 1.5, True, "3"):
        with pytest.raises(ValueError, match="num_features must be a positive int"):
            sok.stage_features(three, bad)
    with pytest.raises(ValueError, match="holds 3 rows, which do not split into 2 features"):
        sok.stage_features(three, 2)
    stage = tf.function(lambda r: sok.stage_features(r, 2),
                        input_signature=[tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="3 rows, which do not split into 2"):
        stage(three)
    staged = sok.stage_features(three, 3)
    with pytest.raises(ValueError, match="holds 3 features but 2 tables were given"):
        sok.lookup_sparse(tables[:2], staged)
    with pytest.raises(ValueError, match="takes no sp_weights"):
        sok.lookup_sparse(tables, staged, tf.ragged.constant([[1.0], [1.0], [1.0]]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="id 7 of table .* is out of range \\[0, 5\\)"):
        sok.lookup_sparse(tables, sok.stage_features(
            tf.ragged.constant([[1], [7], [3]], dtype=tf.int64), 3))


def _unstage_raw(staged, plan, num_features=2, dtype=tf.int64, device="CPU:0"):
    with tf.device(device):
        return raw_ops.sok_unpack_staged_features(staged=staged, plan=plan,
                                                  num_features=num_features, T=dtype)


def test_unpack_staged_features_refuses_a_bad_plan(device):
    """A staged batch made by hand, or for other tables, is refused before anything is read
    outside its bytes; the tables' count and the bad entry are named."""
    good = sok.stage_features(tf.ragged.constant([[1, 2], [3], [], [4]], dtype=tf.int64), 2)
    staged, plan = good.staged, good.plan.numpy()

    def with_entry(feature, entry, value):  # entries: count, codings, offsets, id range
        changed = plan.copy()
        changed[2 + 7 * feature + entry] = value
        return changed
    cases = {
        "holds 2 features, but it is looked up in 3 tables": (plan, 3),
        "has 15 entries, not 2 \\+ 7 per feature": (plan[:-1], 2),
        "unknown codings 7, 1": (with_entry(0, 1, 7), 2),
        "places feature 1 .* outside its": (with_entry(1, 3, 1 << 20), 2),
        "places feature 0 \\(-1 values": (with_entry(0, 0, -1), 2),
    }
    for message, (bad_plan, features) in cases.items():
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            _unstage_raw(staged, bad_plan, features, device=device)
    # int32 narrowing claimed for int32 ids is not a coding of theirs
    with pytest.raises(tf.errors.InvalidArgumentError, match="unknown codings 1, 1"):
        _unstage_raw(staged, plan, 2, tf.int32, device)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be vectors"):
        _unstage_raw(tf.reshape(staged, [1, -1]), plan, device=device)


def test_unpack_staged_features_checks_row_splits_on_the_cpu():
    """Lengths that do not add up to a feature's ids are refused by the CPU, naming the
    feature (a GPU keeps them within the feature's ids instead of waiting to check)."""
    good = sok.stage_features(tf.ragged.constant([[1, 2], [3], [], [4]], dtype=tf.int64), 2)
    plan = good.plan.numpy()
    lengths_at = plan[2 + 4]
    forged = good.staged.numpy().copy()
    forged[lengths_at] += 1
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="feature 0 of the staged batch: row_splits must start at 0 and end "
                             "at the 3 ids"):
        _unstage_raw(forged, plan)


def test_unpack_staged_features_checks_row_splits_that_cross_as_they_are(device):
    """A feature with a sample of 256 ids or more crosses its row splits as int64; splits
    that no longer end at the feature's ids are refused on every device, naming the feature."""
    lengths = np.array([1, 300, 2, 0])  # 2 features x batch 2; feature 0's splits as int64
    packed = tf.RaggedTensor.from_row_lengths(np.arange(lengths.sum(), dtype=np.int64), lengths)
    staged = sok.stage_features(packed, 2)
    plan = staged.plan.numpy()
    assert plan[2 + 2] == 0  # feature 0: row splits rebased, not lengths
    forged = staged.staged.numpy().copy()
    last_split = plan[2 + 4] + 2 * 8  # splits [0, 1, 301]: the last one's bytes
    forged[last_split:last_split + 8] = np.frombuffer(np.int64(299).tobytes(), np.int8)
    made_values, made_splits = _unstage_raw(staged.staged, plan, device=device)
    np.testing.assert_array_equal(made_splits[0].numpy(), [0, 1, 301])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="feature 0 of the staged batch: row_splits must start at 0 and end "
                             "at the 301 ids"):
        _unstage_raw(forged, plan, device=device)


@pytest.mark.parametrize("dtype", [tf.int64, tf.int32])
def test_staged_plan_carries_each_features_id_range(dtype):
    """The plan's id range of each feature equals NumPy's min and max of its ids (ids that
    narrow to int32, ids that do not, int32 ids); a feature without ids gives an empty
    range."""
    rng = np.random.default_rng(16)
    features, batch = 4, 5_000
    lengths = rng.integers(0, 4, size=features * batch)
    lengths[2 * batch:3 * batch] = 0  # feature 2 holds no ids
    values = rng.integers(-50, 1 << 30, size=lengths.sum())
    if dtype == tf.int64:
        values[-1] = 1 << 40  # feature 3 crosses as int64
    values = values.astype(dtype.as_numpy_dtype)
    splits = np.concatenate([[0], np.cumsum(lengths)])
    plan = sok.stage_features(tf.RaggedTensor.from_row_splits(values, splits), features).plan
    ranges = plan.numpy()[2:].reshape(features, 7)[:, 5:]
    for f, (ids, _) in enumerate(expected_features(values, splits, features)):
        want = [ids.min(), ids.max()] if ids.size else [0, -1]
        np.testing.assert_array_equal(ranges[f], want)


def staged_training(device, init, rows_of_dynamic=None):
    """(tables, step): an SGD step of sum(out ** 2) over a staged batch of 2 features, the
    second table dynamic when rows_of_dynamic is given."""
    with tf.device(device):
        tables = [sok.Variable(init, name="staged_a"),
                  sok.Variable(init, name="staged_b") if rows_of_dynamic is None else
                  sok.DynamicVariable(dimension=init.shape[1], initializer="ones")]
    return tables, tf.function(squares_step(tables, keras_optimizer("SGD", 0.1), "sum"))


@pytest.mark.parametrize("bad_id", [10, 1 << 40, -3])
def test_staged_id_out_of_range_fails_its_step_at_once_and_updates_nothing(device, bad_id):
    """An id outside its static table in a staged batch fails the step itself (checked on the
    host from the plan's id ranges: no wait for the device), naming the table, the id and the
    range, and no table changes; a dynamic table takes any key."""
    init = np.arange(40, dtype=np.float32).reshape(10, 4)
    tables, step = staged_training(device, init)
    bad = sok.stage_features(tf.ragged.constant([[1], [2, 3], [4], [bad_id]], tf.int64), 2)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"id {bad_id} of table 'staged_b:0' is out of range \[0, 10\)"):
        step(bad)
    for table in tables:
        np.testing.assert_array_equal(table.numpy(), init)
    good = sok.stage_features(tf.ragged.constant([[1], [2, 3], [4], [9]], tf.int64), 2)
    step(good)  # the next step trains
    assert not np.array_equal(tables[1].numpy(), init)
    tables, step = staged_training(device, init, rows_of_dynamic=10)
    step(bad)  # a key of a dynamic table, whatever its value
    assert int(tables[1].size[0]) == 2  # keys 4 and bad_id


@pytest.mark.skipif("GPU:0" not in DEVICES, reason="the device's own check is the GPU's")
def test_staged_plan_with_a_false_id_range_is_caught_by_the_device():
    """A plan whose id range is forged to lie inside the table does not let the GPU read or
    write outside it: the device's check finds the id, the step's update lands nowhere, and
    the error (naming the table and the id) is raised by a later staged step."""
    import time
    init = np.arange(40, dtype=np.float32).reshape(10, 4)
    tables, step = staged_training("GPU:0", init)
    bad = sok.stage_features(tf.ragged.constant([[1], [2], [4], [12]], tf.int64), 2)
    plan = bad.plan.numpy()
    plan[2 + 7 * 1 + 6] = 9  # feature 1's max_id, forged
    forged = type(bad)(staged=bad.staged, plan=tf.constant(plan), num_features=2,
                       id_dtype=tf.int64)
    with tf.device("GPU:0"):
        step(forged)
        for table in tables:
            np.testing.assert_array_equal(table.numpy(), init)
        time.sleep(0.5)  # the record is read once the stream has passed it
        good = sok.stage_features(tf.ragged.constant([[1], [2], [4], [5]], tf.int64), 2)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"id 12 of table 'staged_b:0' is out of range \[0, 10\)"):
            step(good).numpy()


# ------------------------------------------------------------ sequence lookups of packed batches

def sequence_tables(device, inits, dynamic_rows=None):
    """Static tables from inits, on `device`, and (with dynamic_rows: {key: row}) a dynamic one
    of the same dimension holding those rows."""
    with tf.device(device):
        tables = [sok.Variable(init, name=f"seq_{t}") for t, init in enumerate(inits)]
        if dynamic_rows is not None:
            dynamic = sok.DynamicVariable(dimension=inits[0].shape[1], initializer="zeros")
            keys = np.array(sorted(dynamic_rows), np.int64)
            sok.assign(dynamic, keys, np.stack([dynamic_rows[k] for k in keys]))
            tables.append(dynamic)
    return tables


@pytest.mark.parametrize("form", ["packed", "staged"])
def test_sequence_lookup_of_a_packed_batch_matches_embedding_lookup(device, form):
    """all2all_dense_embedding of a packed or staged batch: one RaggedTensor [batch, None, dim]
    a table, equal to tf.nn.embedding_lookup of that feature's ids (a dynamic table's to the
    rows it holds), with the features' row lengths; static tables' gradients equal
    tf.nn.embedding_lookup's, repeated ids summed."""
    rng = np.random.default_rng(21)
    vocabs, dim, batch = [30, 9, 50], 5, 12
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    held = {int(k): rng.normal(size=dim).astype(np.float32) for k in rng.integers(0, 1 << 40, 20)}
    tables = sequence_tables(device, inits, held)
    refs = [tf.Variable(i) for i in inits]
    packed, per_ids = packed_ids(rng, vocabs, batch, max_len=5)
    keys = np.array(list(held), np.int64)
    dynamic_ids = tf.RaggedTensor.from_row_lengths(
        rng.choice(keys, size=int(per_ids[0].row_lengths().numpy().sum())),
        per_ids[0].row_lengths())
    packed = tf.concat([packed, dynamic_ids], 0)
    per_ids.append(dynamic_ids)
    batch_in = sok.stage_features(packed, 4) if form == "staged" else packed
    cotangents = [tf.constant(rng.normal(size=[int(i.values.shape[0]), dim]).astype(np.float32))
                  for i in per_ids]

    @tf.function
    def step():
        with tf.GradientTape(persistent=True) as tape:
            outs = sok.all2all_dense_embedding(tables, batch_in)
            loss = tf.add_n([tf.reduce_sum(o.flat_values * c) for o, c in zip(outs, cotangents)])
            ref_outs = [tf.nn.embedding_lookup(r, i.values) for r, i in zip(refs, per_ids)]
            ref_loss = tf.add_n([tf.reduce_sum(o * c) for o, c in zip(ref_outs, cotangents)])
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, tables[:3])]
        ref_grads = [tf.convert_to_tensor(g) for g in tape.gradient(ref_loss, refs)]
        return outs, ref_outs, grads, ref_grads

    outs, ref_outs, grads, ref_grads = step()
    assert len(outs) == 4
    for out, ids, ref in zip(outs[:3], per_ids, ref_outs):
        assert isinstance(out, tf.RaggedTensor) and out.shape.as_list() == [batch, None, dim]
        np.testing.assert_array_equal(out.row_lengths().numpy(), ids.row_lengths().numpy())
        np.testing.assert_array_equal(out.flat_values.numpy(), ref.numpy())
    np.testing.assert_array_equal(outs[3].flat_values.numpy(),
                                  np.stack([held[int(k)] for k in dynamic_ids.values.numpy()]))
    for grad, ref_grad in zip(grads, ref_grads):
        np.testing.assert_allclose(grad.numpy(), ref_grad.numpy(), rtol=1e-5, atol=1e-6)


def sequence_step(tables, optimizer):
    """A train step on the sum of squares of a packed or staged batch's sequence lookup."""
    wrapped = sok.OptimizerWrapper(optimizer)

    def step(ids):
        with tf.GradientTape() as tape:
            outs = sok.all2all_dense_embedding(tables, ids)
            loss = tf.add_n([tf.reduce_sum(tf.square(
                o.flat_values if isinstance(o, tf.RaggedTensor) else o)) for o in outs])
        wrapped.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return loss
    return step


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_staged_sequence_batches_from_a_pipeline_train_as_the_list_form(device, optimizer):
    """Staged batches read inside the step (one a call, then a loop of steps a call) train a
    sequence lookup exactly as the same ids passed one dense tensor a table."""
    rng = np.random.default_rng(22)
    vocabs, dim, batch, steps = [40, 25, 60], 4, 16, 6
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    ids = [[rng.integers(0, v, size=batch) for v in vocabs] for _ in range(steps)]
    with tf.device("CPU:0"):
        per_batch = tf.RaggedTensor.from_uniform_row_length(
            tf.RaggedTensor.from_uniform_row_length(np.concatenate(
                [np.concatenate(b) for b in ids]), 1), batch * len(vocabs))
    dataset = (tf.data.Dataset.from_tensor_slices(per_batch)
               .map(lambda b: sok.stage_features(b, len(vocabs))).prefetch(2))

    reference = sequence_tables(device, inits)
    list_step = tf.function(sequence_step(reference, keras_optimizer(optimizer, 0.05)))
    for batch_ids in ids:
        list_step([tf.constant(i) for i in batch_ids])
    tables = sequence_tables(device, inits)
    staged_step = sequence_step(tables, keras_optimizer(optimizer, 0.05))
    train_from_iterator(staged_step, dataset, steps)
    for a, b in zip(tables, reference):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


def test_staged_sequence_id_out_of_range_fails_its_step_and_updates_nothing(device):
    init = np.arange(40, dtype=np.float32).reshape(10, 4)
    tables = sequence_tables(device, [init, init])
    step = tf.function(sequence_step(tables, keras_optimizer("SGD", 0.1)))
    bad = sok.stage_features(tf.ragged.constant([[1], [2, 3], [4], [10]], tf.int64), 2)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"id 10 of table 'seq_1:0' is out of range \[0, 10\)"):
        step(bad)
    for table in tables:
        np.testing.assert_array_equal(table.numpy(), init)
    step(sok.stage_features(tf.ragged.constant([[1], [2, 3], [4], [9]], tf.int64), 2))
    assert not np.array_equal(tables[1].numpy(), init)


def test_sequence_lookup_of_a_packed_batch_bad_input():
    tables = [sok.Variable(np.ones([5, 2], np.float32)) for _ in range(2)]
    three = tf.ragged.constant([[1], [2], [3]], dtype=tf.int64)
    with pytest.raises(ValueError, match="holds 3 rows, which do not split into 2 features"):
        sok.all2all_dense_embedding(tables, three)
    with pytest.raises(ValueError, match="the staged batch holds 3 features but 2 tables"):
        sok.all2all_dense_embedding(tables, sok.stage_features(three, 3))
    with pytest.raises(TypeError, match="indices of a packed batch have dtype float32"):
        sok.all2all_dense_embedding(tables, tf.ragged.constant([[1.0], [2.0]]))
    with pytest.raises(ValueError, match="2-D RaggedTensor"):
        sok.all2all_dense_embedding(tables, tf.ragged.constant([[[1]], [[2]]], dtype=tf.int64))
