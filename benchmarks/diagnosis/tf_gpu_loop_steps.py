"""Where a small looped step's time goes.

For T4 / G1a (65,536 keys) and G1b (1Mi), the eval step (lookup_sparse, training=False, one
element of the output returned), the table's raw find and an empty step (one id of the batch
read) run in a tf.range loop of 20 or 100 steps a call, and unrolled (a Python loop of 20
steps in one graph), us a step, medians of 5 interleaved rounds. Then TensorFlow's profiler
over five looped calls: the GPU's busy time a step and its kernels (on the GPU machine CUPTI
serves the first profile of a process only; later ones report nothing). DIAG_KEYS, DIAG_DEV
and DIAG_BIG shrink it for a CPU smoke run."""
import collections, glob, os, sys
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "gpu")]
import numpy as np
import tensorflow as tf
import sparse_operation_kit as sok
import tf_gpu_dynamic as m
from tf_gpu import timed
from tf_gpu_kernel_profile import plane_events
from tensorflow.tsl.profiler.protobuf import xplane_pb2

sok.init(comm_tool="single")
m.KEYS = KEYS = int(os.environ.get("DIAG_KEYS", m.KEYS))
rng = np.random.default_rng(7)
present = np.unique(rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=KEYS))
rng.shuffle(present)

def one_id(ids):
    return tf.RaggedTensor.from_uniform_row_length(ids, 1, validate=False)

def unrolled(step, loop):
    @tf.function
    def run(ids):
        total = tf.constant(0.0)
        for k in range(loop):
            total += step(ids[k])
        return total
    return run

def gpu_report(logdir, steps):
    """The GPU's busy time a step and its activities by name, from the profile in logdir."""
    path = glob.glob(os.path.join(logdir, "plugins/profile/*/*.xplane.pb"))[0]
    space = xplane_pb2.XSpace()
    space.ParseFromString(open(path, "rb").read())
    plane = next(p for p in space.planes if p.name.startswith("/device:GPU:0"))
    events = plane_events(plane, lambda line: "Stream" in line)
    busy, end, per = 0.0, events[0][0], collections.Counter()
    for start, stop, name in events:
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
        per[name[:90]] += stop - start
    print(f"   span {(end - events[0][0]) / steps:.1f} us/step, busy {busy / steps:.1f} us/step")
    for name, us in per.most_common(8):
        print(f"     {us / steps:8.1f} us  {name}")


with tf.device(os.environ.get("DIAG_DEV", "GPU:0")):
    table = m.prefilled_table(present)
    for batch, draw, label in [(65536, m.uniform_draw, "T4"), (65536, m.power_law_draw, "G1a"),
                               (int(os.environ.get("DIAG_BIG", 1 << 20)), m.power_law_draw, "G1b")]:
        nb = 100 if batch <= 65536 else 20
        drawn = draw(rng, nb * batch).reshape(nb, batch)
        keys_all = tf.constant(present[drawn])
        steps = {
            "eval_noloss": lambda k: sok.lookup_sparse([table], [one_id(k)], combiners=["sum"], training=False)[0][0, 0],
            "find_raw": lambda k: table.sparse_read(k, insert=False)[0, 0],
            "empty": lambda k: tf.cast(k[0], tf.float32),
        }
        loops = [20, 100] if batch <= 65536 else [5, 20]
        fns = {}
        for sname, step in steps.items():
            for loop in loops:
                for kind, maker in [("looped", m.looped_over), ("unrolled", unrolled)]:
                    if kind == "unrolled" and loop > 20:
                        continue
                    fn = maker(step, loop)
                    wins = [keys_all[w:w + loop] for w in range(0, nb - loop + 1, loop)]
                    pos = {"i": 0}
                    def call(fn=fn, wins=wins, pos=pos):
                        pos["i"] += 1
                        return fn(wins[pos["i"] % len(wins)])
                    fns[f"{label} {sname} {kind}{loop}"] = (call, loop)
        for call, loop in fns.values():
            call().numpy(); call().numpy()
        samples = {n: [] for n in fns}
        for _ in range(5):
            for n, (call, loop) in fns.items():
                samples[n].append(timed(call, 10) / loop * 1e3)
        for n, v in samples.items():
            print(f"{n:34s} {np.median(v):8.1f} us/step  (min {min(v):.1f})", flush=True)
        for n in [f"{label} eval_noloss looped{loops[0]}", f"{label} eval_noloss unrolled{loops[0]}", f"{label} empty looped{loops[0]}"]:
            call, loop = fns[n]
            logdir = os.path.join("/tmp/prof", n.replace(" ", "_"))
            call().numpy()
            tf.profiler.experimental.start(logdir)
            for _ in range(5):
                r = call()
            r.numpy()
            tf.profiler.experimental.stop()
            print("#", n, flush=True)
            try:
                gpu_report(logdir, 5 * loop)
            except Exception as e:
                print("  report failed", repr(e))
