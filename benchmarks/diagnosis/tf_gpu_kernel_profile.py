"""Where a train step's GPU time goes (diagnosis, not a benchmark of record): one workload's
step (T1 with ragged, one-id or SparseTensor ids, T1 / T2 packed or staged, T3 or G1b / G1c of tf_gpu.py /
tf_gpu_dynamic.py, static G1b too, or tf_vs_tbe.py's staged G1b / G2: g2_staged, g2_staged_fwd) is timed as 10 steps in one tf.function, then
PROFILE_STEPS more steps run between
cuProfilerStart / cuProfilerStop so that `ncu --profile-from-start off --metrics
gpu__time_duration.sum --csv` lists the kernels of those steps only. `summarize` turns that
CSV into kernel time per step by kernel name, against the step's wall time (the difference
is launch and host-wait time).

    python3 tf_gpu_kernel_profile.py WORKLOAD              # wall time only
    ncu ... python3 tf_gpu_kernel_profile.py WORKLOAD > x.csv
    python3 tf_gpu_kernel_profile.py summarize x.csv WALL_MS
    python3 tf_gpu_kernel_profile.py timeline WORKLOAD     # where the GPU waits for the host

`timeline` runs PROFILE_STEPS steps under TensorFlow's profiler (CUPTI) and prints, from its
XSpace, the GPU's busy time a step, its idle gaps and the TensorFlow ops the host ran in each:
the time ncu's kernel list cannot explain.
"""
import collections
import csv
import ctypes
import io
import os
import sys

import numpy as np

PROFILE_STEPS = 3
NO_INPUT = 0  # the steps read their captured ids


def profiler(start):
    """cuProfilerStart / Stop in TensorFlow's (primary) context of GPU 0."""
    cuda = ctypes.CDLL("libcuda.so.1")
    context = ctypes.c_void_p()
    if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0:
        cuda.cuCtxSetCurrent(context)
    (cuda.cuProfilerStart if start else cuda.cuProfilerStop)()


GPU_BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu")


TBE_WORKLOADS = ("G1B", "G2")
IDS_DIR = os.environ.get("IDS_DIR", "/tmp/tbe_ids")


def tbe_workload_step(name, optimizer):
    """`<workload>_staged[_fwd]` (G1b, G2): tf_vs_tbe.py's packed form fed by its staged
    pipeline, on the ids tbe_workloads.py wrote to $IDS_DIR (written there if missing); the
    train step, or with _fwd the forward alone; `<workload>_dynamic_staged[_fwd]`: the same
    on dynamic tables."""
    import tensorflow as tf
    import tbe_workloads
    import tf_vs_tbe
    key = next(k for k in tbe_workloads.WORKLOADS if k.upper() == name.split("_")[0].upper())
    if not os.path.exists(os.path.join(IDS_DIR, f"{key}.npz")):
        os.makedirs(IDS_DIR, exist_ok=True)
        tbe_workloads.write(IDS_DIR, key)
    spec, batches = tbe_workloads.WORKLOADS[key], tbe_workloads.load(IDS_DIR, key)
    tables = tf_vs_tbe.make_tables(spec, "_dynamic" in name, seed=1)
    iterator = iter(tf_vs_tbe.packed_dataset_of(spec, batches, staged=True))
    forward = tf_vs_tbe.packed_forward(spec, tables)
    step = forward if name.endswith("_fwd") else tf_vs_tbe.trained(forward, tables, optimizer)

    def packed_step(_unused=None):
        return step(next(iterator))
    return packed_step


def workload(name):
    """A train step (a no-argument function returning the loss) of the named workload."""
    import tensorflow as tf
    import sparse_operation_kit as sok
    sys.path.insert(0, GPU_BENCHMARKS)
    from tf_gpu import BATCH, CRITEO_TB, DIM, zipf_ids
    if not sok.communication.is_initialized():
        sok.init(comm_tool="single")
    rng = np.random.default_rng(12)
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.legacy.SGD(0.01))
    if name.endswith("_waited"):  # a staged forward that waits for the device's id check
        import sparse_operation_kit.lookup as lookup
        pooled = lookup.pool_from_tables_path
        lookup.pool_from_tables_path = lambda *args, **kwargs: pooled(
            *args, **dict(kwargs, ids_checked=False))
        name = name[:-len("_waited")]
    if name.endswith("_adam"):  # the same workload trained with Adam
        optimizer = sok.OptimizerWrapper(tf.keras.optimizers.legacy.Adam(0.01))
        name = name[:-len("_adam")]
    if name.split("_")[0].upper() in TBE_WORKLOADS and "_staged" in name:
        return tbe_workload_step(name, optimizer)
    if name in ("t1", "t1_one_id", "t1_sparse"):
        vocabs = [min(v, 4_000_000) for v in CRITEO_TB]
        tables = [sok.Variable(tf.random.stateless_uniform([v, DIM], [1, i], -0.05, 0.05))
                  for i, v in enumerate(vocabs)]
        ones = tf.ones([BATCH], tf.int64)
        ids = [tf.constant(zipf_ids(rng, v, BATCH), tf.int64) for v in vocabs]
        if name == "t1":
            inputs = [tf.RaggedTensor.from_row_lengths(i, ones) for i in ids]
        elif name == "t1_sparse":  # as tf_gpu.py: indices and values on the GPU
            with tf.device("CPU:0"):
                sparse = [tf.RaggedTensor.from_row_lengths(i, ones).to_sparse() for i in ids]
            inputs = [tf.SparseTensor(tf.identity(s.indices), tf.identity(s.values),
                                      s.dense_shape) for s in sparse]
        else:  # one id a sample stated in the type: Sok>GatherSingleIds
            inputs = [tf.RaggedTensor.from_tensor(i[:, None]) for i in ids]
    elif name in ("t1_packed", "t2_packed", "t1_staged", "t2_staged"):
        # one packed batch a step from a tf.data iterator (staged: by sok.stage_features)
        vocabs = [min(v, 4_000_000) for v in CRITEO_TB]
        tables = [sok.Variable(tf.random.stateless_uniform([v, DIM], [1, i], -0.05, 0.05))
                  for i, v in enumerate(vocabs)]
        hotness = 1 if name.startswith("t1") else 10
        combiner = "sum" if hotness == 1 else "mean"
        batches = []
        with tf.device("CPU:0"):
            for _ in range(4):
                lengths = [rng.integers(1, hotness + 1, size=BATCH) for _ in vocabs]
                values = np.concatenate([zipf_ids(rng, v, l.sum()) for v, l in zip(vocabs, lengths)])
                batches.append(tf.RaggedTensor.from_row_lengths(
                    tf.constant(values, tf.int64), tf.constant(np.concatenate(lengths))))
            dataset = tf.data.Dataset.from_tensors(batches[0])
            for batch in batches[1:]:
                dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
            dataset = dataset.repeat()
            if name.endswith("staged"):
                dataset = dataset.map(lambda ids: sok.stage_features(ids, len(vocabs)),
                                      num_parallel_calls=tf.data.AUTOTUNE)
            iterator = iter(dataset.prefetch(2))

        def packed_step(_unused=None):
            packed = next(iterator)
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(sok.lookup_sparse(tables, packed, combiners=combiner))
            optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
            return loss
        return packed_step
    elif name == "t3_tf":  # plain TensorFlow's T3, for comparison
        table = tf.Variable(tf.random.stateless_uniform([8 << 20, DIM], [3, 0], -0.05, 0.05))
        ids = tf.constant(rng.integers(0, 8 << 20, size=BATCH), tf.int64)
        tf_optimizer = tf.keras.optimizers.legacy.SGD(0.01)

        def tf_step(_unused=None):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids))
            tf_optimizer.apply_gradients([(tape.gradient(loss, table), table)])
            return loss
        return tf_step
    elif name in ("t3", "t3_nocheck", "g1b_static"):
        if name == "t3_nocheck":  # experiment: the forward without its id check's wait
            import sparse_operation_kit.lookup_paths as lookup_module

            class NoForwardCheck:
                def __getattr__(self, op):
                    if op == "sok_check_gathered_ids":
                        return lambda *args, **kwargs: None
                    return getattr(sok.raw_ops, op)
            lookup_module.raw_ops = NoForwardCheck()
        rows, batch = 8 << 20, 1 << 20 if name == "g1b_static" else BATCH
        tables = [sok.Variable(tf.random.stateless_uniform([rows, DIM], [3, 0], -0.05, 0.05))]
        inputs = [tf.RaggedTensor.from_tensor(
            tf.constant(rng.integers(0, rows, size=batch), tf.int64)[:, None])]
    elif name in ("g1b", "g1c"):  # as tf_gpu_dynamic.py: power-law keys, 2x capacity
        import tf_gpu_dynamic
        keys = tf_gpu_dynamic.KEYS
        present = rng.permutation(rng.integers(-(1 << 62), 1 << 62, size=keys))
        table = sok.DynamicVariable(DIM, name=name, init_capacity=2 * keys)
        for start in range(0, keys, 1 << 20):
            table.sparse_read(tf.constant(present[start:start + (1 << 20)]))
        tables = [table]
        inputs = [tf.RaggedTensor.from_tensor(
            tf.constant(present[tf_gpu_dynamic.power_law_draw(rng, 1 << 20)])[:, None])]
        if name == "g1c":
            optimizer = sok.OptimizerWrapper(tf.keras.optimizers.legacy.Adam(0.01))
    else:
        sys.exit(f"unknown workload {name!r}: t1, t1_one_id, t1_sparse, t3, g1b, g1c, "
                 "g1b_static")

    def step(_unused=None):  # tf_gpu.py's timers pass the step an input
        with tf.GradientTape() as tape:
            outputs = sok.lookup_sparse(tables, inputs, combiners=["sum"] * len(tables))
            loss = tf.add_n([tf.reduce_sum(o) for o in outputs])
        optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return loss
    return step


def run(name):
    import tensorflow as tf
    sys.path.insert(0, GPU_BENCHMARKS)
    from tf_gpu import looped, timed
    with tf.device("GPU:0"):
        step = workload(name)
        call, loop = tf.function(step), looped(step, 10)
        call_ms = min(timed(call, NO_INPUT, 10) for _ in range(3))
        loop_ms = min(timed(loop, NO_INPUT, 2) for _ in range(3)) / 10
        print(f"# {name}: call {call_ms:.3f} ms, loop {loop_ms:.3f} ms a step", file=sys.stderr,
              flush=True)
        profiler(True)
        for _ in range(PROFILE_STEPS):
            result = call(NO_INPUT)
        result.numpy()
        profiler(False)


def timeline(name):
    import tensorflow as tf
    sys.path.insert(0, GPU_BENCHMARKS)
    from tf_gpu import timed
    with tf.device("GPU:0"):
        call = tf.function(workload(name))
        wall_ms = min(timed(call, NO_INPUT, 10) for _ in range(3))
        space = profiled_space(lambda: call(NO_INPUT))
    print_timeline(name, space, wall_ms)


def profiled_space(call, logdir="/tmp/sok_timeline"):
    """The XSpace of PROFILE_STEPS calls of `call` under TensorFlow's profiler (CUPTI)."""
    import glob
    import shutil
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    shutil.rmtree(logdir, ignore_errors=True)
    tf.profiler.experimental.start(
        logdir, tf.profiler.experimental.ProfilerOptions(host_tracer_level=3))
    for _ in range(PROFILE_STEPS):
        result = call()
    result.numpy()
    tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    space.ParseFromString(open(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0],
                               "rb").read())
    return space


def plane_events(plane, keep_line):
    """(start_us, end_us, name) of the plane's events on the lines keep_line accepts."""
    events = []
    for line in plane.lines:
        if not keep_line(line.name):
            continue
        for event in line.events:
            start = line.timestamp_ns / 1e3 + event.offset_ps / 1e6
            events.append((start, start + event.duration_ps / 1e6,
                           plane.event_metadata[event.metadata_id].name))
    return sorted(events)


def print_one_gpu_step(plane, host, first="PoolFromTablesKernel"):
    """The GPU's activities, by stream, from one launch of `first` to the next but one, and
    the host ops running Sok>UnpackStagedFeatures in that span (when each step's copy was
    asked for)."""
    events = []
    for line in plane.lines:
        if not line.name.startswith("Stream"):
            continue
        for event in line.events:
            start = line.timestamp_ns / 1e3 + event.offset_ps / 1e6
            events.append((start, start + event.duration_ps / 1e6, line.name,
                           plane.event_metadata[event.metadata_id].name))
    events.sort()
    marks = [e[0] for e in events if first in e[3]]
    if len(marks) < 3:
        return
    t0, t1 = marks[1], marks[2]
    print(f"one step on the GPU from {first} (us from it; stream; activity):")
    for start, stop, stream, what in events:
        if t0 - 50 <= start < t1 and stop - start >= 5:
            short = what.replace("(anonymous namespace)::", "").split("(")[0][-50:]
            print(f"  {start - t0:9.1f} {stop - start:8.1f}  {stream[-12:]:>12}  {short}")
    for start, stop, op in host:
        if t0 - 6000 <= start < t1 and "UnpackStagedFeatures" in op:
            print(f"  host {op[-40:]} at {start - t0:9.1f} us")


def print_timeline(name, space, wall_ms, min_gap_us=8.0):
    planes = {plane.name: plane for plane in space.planes}
    host = [e for e in plane_events(planes["/host:CPU"], lambda n: n != "python")
            if ":" in e[2] and "::" not in e[2]]  # TensorFlow ops: "node:type"
    gpu = plane_events(planes["/device:GPU:0"], lambda n: n.startswith("Stream"))
    if not gpu:
        sys.exit("no GPU activity in the profile")
    busy, gaps, end = 0.0, [], gpu[0][0]
    for start, stop, kernel in gpu:
        if start - end > min_gap_us:
            gaps.append((end, start))
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    print(f"# {name}: wall {wall_ms:.3f} ms a call; profiled {PROFILE_STEPS} steps: GPU busy "
          f"{busy / 1e3 / PROFILE_STEPS:.3f} ms a step, {len(gpu) / PROFILE_STEPS:.0f} GPU "
          f"activities, {len(host) / PROFILE_STEPS:.0f} host ops, "
          f"{len(gaps) / PROFILE_STEPS:.1f} gaps over {min_gap_us} us a step "
          f"({sum(b - a for a, b in gaps) / 1e3 / PROFILE_STEPS:.3f} ms)")
    by_type = collections.Counter()
    for start, stop, op in host:
        by_type[op.split(":")[-1]] += (stop - start) / PROFILE_STEPS
    print("host op time a step by type (us):",
          ", ".join(f"{op} {us:.0f}" for op, us in by_type.most_common(12)))
    by_kernel, launches = collections.Counter(), collections.Counter()
    for start, stop, kernel in gpu:
        short = kernel.replace("(anonymous namespace)::", "").split("(")[0].split("<")[0][-60:]
        by_kernel[short] += (stop - start) / PROFILE_STEPS
        launches[short] += 1 / PROFILE_STEPS
    print("GPU time a step by kernel (us, launches):",
          ", ".join(f"{k} {us:.0f} ({launches[k]:.0f})" for k, us in by_kernel.most_common(15)))
    once = [k for k, n in launches.items() if round(n) == 1]
    print_one_gpu_step(planes["/device:GPU:0"], host,
                       max(once, key=by_kernel.get) if once else "PoolFromTablesKernel")
    copies = [e for e in gpu if e[2].startswith("MemcpyH2D")]
    kernels = [e for e in gpu if not e[2].startswith("Memcpy")]
    alongside = sum(max(0.0, min(c_end, k_end) - max(c_start, k_start))
                    for c_start, c_end, _ in copies for k_start, k_end, _ in kernels
                    if k_start < c_end and k_end > c_start)
    print(f"host-to-device copies: {sum(e - s for s, e, _ in copies) / PROFILE_STEPS:.0f} us a "
          f"step, {alongside / PROFILE_STEPS:.0f} us of it alongside kernels")
    # The second profiled step in order: host ops and GPU activities, from its first op.
    calls = [e for e in plane_events(planes["/host:CPU"], lambda n: n == "python")
             if e[2] in ("step", "tf_step", "packed_step")]
    if len(calls) >= 3:
        t0, t1 = calls[1][0], calls[2][0]
        merged = sorted([(s, e, "host " + op[-70:]) for s, e, op in host if t0 <= s < t1] +
                        [(s, e, "GPU  " + k[:70]) for s, e, k in gpu if t0 <= s < t1])
        for start, stop, what in merged:
            print(f"    {start - t0:8.1f} {stop - start:7.1f} us  {what}")
    for gap_start, gap_end in sorted(gaps, key=lambda g: g[0] - g[1])[:15]:
        during = [op.split(":")[0][-60:] for start, stop, op in host
                  if stop > gap_start and start < gap_end]
        before = [k[:50] for s, e, k in gpu if gap_start - 1 <= e <= gap_start + 0.01][-1:]
        print(f"  gap {gap_end - gap_start:7.1f} us after {before}: host ran {during[:8]}"
              f"{' ...' if len(during) > 8 else ''}")


def summarize(path, wall_ms):
    """Kernel time per step by kernel name, from ncu's CSV (gpu__time_duration.sum in ns)."""
    text = open(path).read()
    text = text[text.index('"ID"'):] if '"ID"' in text else text
    totals, counts = collections.Counter(), collections.Counter()
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3,
                 "msecond": 1.0, "ms": 1.0}.get(row["Metric Unit"], 1e-6)
        kernel = row["Kernel Name"].split("(")[0][:90]
        totals[kernel] += value * scale / PROFILE_STEPS
        counts[kernel] += 1 / PROFILE_STEPS
    busy = sum(totals.values())
    print(f"kernels {busy:.3f} ms a step ({sum(counts.values()):.0f} launches), wall {wall_ms} ms")
    for kernel, ms in totals.most_common(25):
        print(f"  {ms:8.4f} ms  {counts[kernel]:5.1f}x  {kernel}")


if __name__ == "__main__":
    if sys.argv[1] == "timeline":
        timeline(sys.argv[2])
    elif sys.argv[1] == "summarize":
        summarize(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "?")
    else:
        run(sys.argv[1])
