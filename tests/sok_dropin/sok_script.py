"""A SOK v2 user's script, run unchanged under NVIDIA's SOK and under this package (the
`sparse_operation_kit` that PYTHONPATH finds): static and dynamic tables, distributed and
localized modes, every optimizer SOK's wrapper supports, dump and load, sparse_read_and_evict,
incremental_model_dump, all2all_dense_embedding, bad input. Everything it observes goes to
`<out>/<package>.npz` (arrays) and `<out>/<package>.json` (losses, file lists, error types,
timings); compare.py sets the two side by side.

    python3 tests/sok_dropin/sok_script.py OUT_DIR PACKAGE_LABEL [--speed]
"""
import json
import os
import sys
import tempfile
import time
import traceback

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")
import sparse_operation_kit as sok  # noqa: E402

sok.init()
OUT, LABEL = sys.argv[1], sys.argv[2]
SPEED = "--speed" in sys.argv
ONLY = tuple(p for p in os.environ.get("SOK_SCRIPT_ONLY", "").split(",") if p)  # name prefixes
arrays, report = {}, {"package": os.path.dirname(sok.__file__), "sections": {},
                     "versions": {"tensorflow": tf.__version__, "horovod": __import__("horovod").__version__,
                                  "python": sys.version.split()[0]}}
STEPS = 8


def section(name):
    """Runs the decorated function now, recording its result or its error type."""
    def run(function):
        if ONLY and not name.startswith(ONLY):
            return
        started = time.time()
        try:
            result = function()
            report["sections"][name] = {"ok": True, **(result or {})}
        except Exception as error:  # noqa: BLE001  (the error type is the observation)
            report["sections"][name] = {"ok": False, "error": type(error).__name__,
                                        "message": str(error)[:300],
                                        "trace": traceback.format_exc()[-800:]}
        report["sections"][name]["seconds"] = round(time.time() - started, 2)
        save()  # after every section: a crash of the process keeps what ran before it
        print(f"{name}: {'ok' if report['sections'][name]['ok'] else 'ERROR ' + report['sections'][name]['error']}", flush=True)
    return run


def save():
    os.makedirs(OUT, exist_ok=True)
    np.savez(os.path.join(OUT, f"{LABEL}.npz"), **arrays)
    with open(os.path.join(OUT, f"{LABEL}.json"), "w") as handle:
        json.dump(report, handle, indent=1)


def ragged(rng, rows, batch, hotness):
    lengths = rng.integers(1, hotness + 1, batch)
    return tf.RaggedTensor.from_row_lengths(rng.integers(0, rows, lengths.sum()), lengths)


def exported(name, variable):
    keys, values = sok.export(variable)
    keys, values = np.asarray(keys), np.asarray(values)
    order = np.argsort(keys, kind="stable")
    arrays[f"{name}/keys"], arrays[f"{name}/values"] = keys[order], values[order]


LEGACY = tf.keras.optimizers  # sok.init() makes it the legacy module, as in SOK
STATIC_OPTIMIZERS = {"sgd": lambda: LEGACY.SGD(0.1), "momentum": lambda: LEGACY.SGD(0.1, momentum=0.9),
                     "adam": lambda: LEGACY.Adam(0.01), "adagrad": lambda: LEGACY.Adagrad(0.1)}
DYNAMIC_OPTIMIZERS = dict(STATIC_OPTIMIZERS, adamax=lambda: LEGACY.Adamax(0.05),
                          adadelta=lambda: LEGACY.Adadelta(1.0), ftrl=lambda: LEGACY.Ftrl(0.1),
                          rmsprop=lambda: LEGACY.RMSprop(0.01), nadam=lambda: LEGACY.Nadam(0.01))

def dump_and_load(prefix, tables, wrapper):
    """sok.dump's files (names, header fields, rows by key), then a load into zeroed tables."""
    folder = tempfile.mkdtemp()
    sok.dump(folder, tables, wrapper)
    files = {}
    for name in sorted(os.listdir(folder)):
        data = open(os.path.join(folder, name), "rb").read()
        if len(data) < 296 or name.endswith(".json"):
            files[name] = {"bytes": len(data)}
            continue
        files[name] = {"bytes": len(data), "table": data[:256].decode(errors="replace").strip(),
                       "type": int.from_bytes(data[256:260], "big"),
                       "slot": data[260:292].decode(errors="replace").strip(),
                       "dtype": int.from_bytes(data[292:296], "big")}
    before = [np.asarray(sok.export(t)[1]).copy() for t in tables]
    for table in tables:
        keys, values = sok.export(table)
        sok.assign(table, keys, tf.zeros_like(values))
    sok.load(folder, tables, wrapper)
    after = [np.asarray(sok.export(t)[1]) for t in tables]
    restored = all(np.array_equal(np.sort(a, axis=0), np.sort(b, axis=0))
                   for a, b in zip(before, after))
    return {"dump_files": {n.replace(tables[0].name.split(":")[0], "T0")
                               .replace(tables[1].name.split(":")[0], "T1"): f
                           for n, f in files.items()}, "load_restored": restored}


for opt_name, make in STATIC_OPTIMIZERS.items():
    for mode in ("distributed", "localized:0"):
        @section(f"static/{opt_name}/{mode}")
        def _():
            rng = np.random.default_rng(1)
            tables = [sok.Variable(rng.random([1000, 16]).astype(np.float32), mode=mode),
                      sok.Variable(rng.random([300, 8]).astype(np.float32), mode=mode)]
            optimizer = make()
            losses = []
            for _ in range(STEPS):
                ids = [ragged(rng, 1000, 64, 3), ragged(rng, 300, 64, 2)]
                with tf.GradientTape() as tape:
                    outs = sok.lookup_sparse(tables, ids, combiners=["sum", "mean"])
                    loss = sum(tf.reduce_sum(o * o) for o in outs)
                grads = tape.gradient(loss, tables)
                optimizer.apply_gradients(zip(grads, tables))
                losses.append(float(loss))
            for i, table in enumerate(tables):
                arrays[f"static/{opt_name}/{mode}/{i}"] = table.numpy()
                for slot in optimizer.get_slot_names():
                    arrays[f"static/{opt_name}/{mode}/{i}/{slot}"] = \
                        optimizer.get_slot(table, slot).numpy()
            return {"losses": losses}

for opt_name, make in DYNAMIC_OPTIMIZERS.items():
    for var_type in ("hbm", "hybrid"):
        @section(f"dynamic/{opt_name}/{var_type}")
        def _():
            rng = np.random.default_rng(2)
            # capacities given: SOK's hybrid (HierarchicalKV) tables reserve GPU memory for
            # their default capacity otherwise, and 36 of them do not fit
            sizes = dict(init_capacity=1 << 14, max_capacity=1 << 16)
            tables = [sok.DynamicVariable(dimension=16, var_type=var_type, initializer="0.5",
                                          **sizes),
                      sok.DynamicVariable(dimension=8, var_type=var_type, initializer="-0.25",
                                          mode="localized:0", **sizes)]
            optimizer = make()
            wrapper = sok.OptimizerWrapper(optimizer)
            weights = [tf.constant(rng.normal(size=[64, d]), tf.float32) for d in (16, 8)]

            @tf.function
            def step(ids):
                with tf.GradientTape() as tape:
                    outs = sok.lookup_sparse(tables, ids, combiners=["sum", "mean"])
                    loss = sum(tf.reduce_sum(o * w) for o, w in zip(outs, weights))
                grads = tape.gradient(loss, tables)
                wrapper.apply_gradients(zip(grads, tables))
                return loss

            losses = [float(step([ragged(rng, 1 << 40, 64, 3) % 5000, ragged(rng, 700, 64, 2)]))
                      for _ in range(STEPS)]
            prefix = f"dynamic/{opt_name}/{var_type}"
            slots = list(wrapper.get_slot_names())
            for i, table in enumerate(tables):
                exported(f"{prefix}/{i}", table)
                for slot in slots:
                    exported(f"{prefix}/{i}/{slot}", wrapper.get_slot(table, slot))
            result = {"losses": losses, "slot_names": slots,
                      "size": [int(np.asarray(t.size)[0]) for t in tables]}
            if opt_name == "adagrad":
                result.update(dump_and_load(prefix, tables, wrapper))
            return result


@section("sparse_read_and_evict")
def _():
    table = sok.DynamicVariable(dimension=16, var_type="hybrid", initializer="11",
                                init_capacity=8192, max_capacity=16384)
    wrapper = sok.OptimizerWrapper(LEGACY.SGD(learning_rate=1.0, momentum=0.9))
    evicted_counts, values_ok, overlap = [], True, False
    seen = np.zeros(0, np.int64)
    for i in range(5):
        ids = tf.ragged.constant(tf.range(i * 8192, (i + 1) * 8192, dtype=tf.int64), dtype=tf.int64)
        with tf.GradientTape() as tape:
            emb, keys, values = sok.sparse_read_and_evict(table, ids)
            loss = tf.reduce_sum(emb)
        wrapper.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
        keys = np.asarray(keys)
        evicted_counts.append(int(len(keys)))
        values_ok &= bool(np.all(np.asarray(values) == 10))
        overlap |= bool(np.isin(keys, seen).any())
        seen = np.concatenate([seen, keys])
    return {"evicted_counts": evicted_counts, "evicted_values_all_10": values_ok,
            "evicted_twice": overlap, "size": int(np.asarray(table.size)[0])}


@section("incremental_model_dump")
def _():
    tables = [sok.DynamicVariable(dimension=8, var_type="hybrid", initializer="13",
                                  init_capacity=1 << 16, max_capacity=1 << 16)]
    wrapper = sok.OptimizerWrapper(LEGACY.SGD(learning_rate=1.0))
    rng = np.random.default_rng(4)
    matches = []
    for i in range(3):
        ids = ragged(rng, 4000, 256, 3)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse(tables, [ids], combiners=["sum"])[0])
        wrapper.apply_gradients(zip(tape.gradient(loss, tables), tables))
        time.sleep(1.0)  # as SOK's test: the threshold well clear of both steps' writes
        moment = time.time()
        time.sleep(1.0)
        ids = ragged(rng, 4000, 256, 3)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse(tables, [ids], combiners=["sum"])[0])
        wrapper.apply_gradients(zip(tape.gradient(loss, tables), tables))
        import datetime  # noqa: PLC0415
        keys, _ = sok.incremental_model_dump(tables, datetime.datetime.utcfromtimestamp(moment))
        got, want = set(np.asarray(keys[0]).tolist()), set(ids.flat_values.numpy().tolist())
        matches.append([len(want), len(got - want), len(want - got)])
    return {"last_step_keys_extra_missing": matches}


@section("all2all_dense_embedding")
def _():
    rng = np.random.default_rng(5)
    table = sok.Variable(rng.random([5000, 32]).astype(np.float32))
    optimizer = LEGACY.SGD(learning_rate=1.0)
    losses = []
    for _ in range(STEPS):
        ids = tf.constant(rng.integers(0, 5000, 512), tf.int64)
        with tf.GradientTape() as tape:
            emb = sok.all2all_dense_embedding(table, ids)
            loss = tf.reduce_sum(emb * emb)
        optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
        losses.append(float(loss))
    arrays["all2all/table"] = table.numpy()
    return {"losses": losses}


def timed(function, args_list, warmup=20):
    for args in args_list[:warmup]:
        function(*args)
    barrier = np.asarray  # a host read of the last result ends the timed region
    started = time.perf_counter()
    for args in args_list[warmup:]:
        result = function(*args)
    barrier(result)
    return (time.perf_counter() - started) / (len(args_list) - warmup) * 1000.0


if SPEED:
    KEYS, DIM, BATCH = 8 << 20, 128, 65536
    for var_type in ("hbm", "hybrid"):
        @section(f"speed/dynamic/{var_type}")
        def _():
            table = sok.DynamicVariable(dimension=DIM, var_type=var_type, initializer="0.1",
                                        init_capacity=KEYS, max_capacity=KEYS * 2)
            chunk = 1 << 20
            for start in range(0, KEYS, chunk):
                keys = tf.range(start, start + chunk, dtype=tf.int64)
                sok.assign(table, keys, tf.fill([chunk, DIM], 0.1))
            wrapper = sok.OptimizerWrapper(LEGACY.SGD(0.01))
            rng = np.random.default_rng(6)
            batches = []
            for _ in range(120):  # power-law ids, one a sample, as the step's argument
                ids = np.minimum((rng.pareto(1.05, BATCH) * 1000).astype(np.int64), KEYS - 1)
                batches.append((tf.RaggedTensor.from_row_lengths(
                    tf.constant(ids), tf.ones([BATCH], tf.int64)),))

            @tf.function
            def forward(ids):
                return sok.lookup_sparse([table], [ids], combiners=["sum"])[0]

            @tf.function
            def train(ids):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0])
                wrapper.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
                return loss

            return {"forward_ms": round(timed(forward, batches), 3),
                    "train_ms": round(timed(train, batches), 3),
                    "keys": KEYS, "dimension": DIM, "batch": BATCH}

    @section("speed/static")
    def _():
        rows, tables_count = 1 << 20, 4
        tables = [sok.Variable(tf.fill([rows, DIM], 0.1)) for _ in range(tables_count)]
        optimizer = LEGACY.SGD(0.01)
        rng = np.random.default_rng(7)
        batches = [([tf.RaggedTensor.from_row_lengths(
            tf.constant(rng.integers(0, rows, BATCH), tf.int64), tf.ones([BATCH], tf.int64))
            for _ in range(tables_count)],) for _ in range(120)]

        @tf.function
        def train(ids):
            with tf.GradientTape() as tape:
                outs = sok.lookup_sparse(tables, ids, combiners=["sum"] * tables_count)
                loss = sum(tf.reduce_sum(o) for o in outs)
            optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
            return loss

        return {"train_ms": round(timed(train, batches), 3), "tables": tables_count,
                "rows": rows, "dimension": DIM, "batch": BATCH}

ERROR_CASES = {  # bad input, last: SOK's process may not survive one
    "float ids": lambda t, s: sok.lookup_sparse([t], [tf.ragged.constant([[1.0]], tf.float32)]),
    "dimension 0": lambda t, s: sok.DynamicVariable(dimension=0),
    "localized on a missing worker": lambda t, s: sok.Variable(np.ones([4, 4], np.float32),
                                                               mode="localized:7"),
    "unknown mode": lambda t, s: sok.Variable(np.ones([4, 4], np.float32), mode="x"),
    "combiner": lambda t, s: sok.lookup_sparse([s], [tf.ragged.constant([[1]], tf.int64)],
                                               combiners=["max"]),
    "tables and ids of different lengths": lambda t, s: sok.lookup_sparse(
        [s, s], [tf.ragged.constant([[1]], tf.int64)]),
    "load from a missing folder": lambda t, s: sok.load("/nonexistent/sok", [s]),
}
for case, bad_call in ERROR_CASES.items():
    @section(f"errors/{case}")
    def _():
        print(f"trying errors/{case}", flush=True)
        table = sok.DynamicVariable(dimension=4, var_type="hbm", initializer="1")
        static = sok.Variable(np.ones([10, 4], np.float32))
        try:
            bad_call(table, static)
        except Exception as error:  # noqa: BLE001  (the error type is the observation)
            return {"raises": type(error).__name__}
        return {"raises": None}

print("WROTE", LABEL, flush=True)
