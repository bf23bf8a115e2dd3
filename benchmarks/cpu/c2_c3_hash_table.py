"""C2 / C3: DynamicVariable lookup of present keys and insert of new keys, against TensorFlow
Recommenders-Addons' CPU cuckoo table (dynamic_embedding), same process, same keys.

C2: 65,536 int64 keys a call, dim 16, table holding ~3.3M keys uniform in [0, 2^22). Both
    calls end when their op has run (CPU ops run synchronously); the rows stay a tensor, as
    C3's. The same calls with the rows copied into NumPy (4 MiB, about 1 ms on either side)
    are timed in the same rounds and reported beside them.
C3: 65,536 new keys a call into the same table: find-or-insert of a zeros-initialised table
    against TFRA's upsert of zero rows (the same rows written; sok's rows stay a tensor, not
    copied into NumPy, as TFRA's upsert returns none), and, with the default
    random-normal initializer (N(0, 0.05)), sok's find-or-insert against TFRA's find-or-insert
    (lookup with a RandomNormal initializer, then upsert of what it read), filled alike.
"""
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402

DIM, BATCH, KEY_RANGE = 16, 65536, 1 << 22


def main():
    args = common.int_options(__doc__, fill=3_300_000, iterations=20)
    import tensorflow_recommenders_addons.dynamic_embedding as de  # benchmark-only competitor

    sok.init(comm_tool="single")
    rng = np.random.default_rng(0)
    present = rng.choice(KEY_RANGE, size=args.fill, replace=False).astype(np.int64)
    print(f"filling both tables with {args.fill} keys", flush=True)
    table = sok.DynamicVariable(DIM, initializer="zeros", init_capacity=args.fill)
    tfra = de.get_variable("c2", key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM,
                           initializer=tf.keras.initializers.Zeros())
    values = tf.zeros([1 << 20, DIM])
    for start in range(0, args.fill, 1 << 20):
        chunk = tf.constant(present[start:start + (1 << 20)])
        table.assign(chunk, values[:len(chunk)])
        tfra.upsert(chunk, values[:len(chunk)])

    sok_find = tf.function(lambda k: table.sparse_read(k, insert=False))
    tfra_find = tf.function(lambda k: tfra.lookup(k))
    queries = [tf.constant(rng.choice(present, size=BATCH)) for _ in range(8)]
    state = {"i": 0}

    def cycle(fn, to_numpy):
        def call():
            state["i"] += 1
            rows = fn(queries[state["i"] % len(queries)])
            return rows.numpy() if to_numpy else rows
        return call

    c2_sok, c2_tfra, c2_sok_np, c2_tfra_np = common.interleaved_median_ms(
        [cycle(sok_find, False), cycle(tfra_find, False), cycle(sok_find, True),
         cycle(tfra_find, True)], iterations=args.iterations)

    # C3: every call inserts keys neither table has seen (beyond the filled range).
    fresh = iter(range(KEY_RANGE, KEY_RANGE + (1 << 40), BATCH))
    sok_insert = tf.function(lambda k: table.sparse_read(k, insert=True))
    @tf.function
    def tfra_insert(keys, values):
        tfra.upsert(keys, values)
    new_values = tf.zeros([BATCH, DIM])

    def new_keys():
        return tf.constant(np.arange(BATCH, dtype=np.int64) + next(fresh))

    # Both calls end when their op has run (CPU ops run synchronously): sok's returns the rows
    # it read as a tensor, TFRA's upsert returns nothing; neither is copied into NumPy.
    c3_sok, c3_tfra = common.interleaved_median_ms(
        [lambda: sok_insert(new_keys()), lambda: tfra_insert(new_keys(), new_values)],
        iterations=args.iterations)

    print("filling two tables with the default random-normal initializer", flush=True)
    normal = sok.DynamicVariable(DIM, init_capacity=args.fill)  # N(0, 0.05), SOK's default
    tfra_normal = de.get_variable("c3_normal", key_dtype=tf.int64, value_dtype=tf.float32,
                                  dim=DIM,
                                  initializer=tf.keras.initializers.RandomNormal(0.0, 0.05))
    for start in range(0, args.fill, 1 << 20):
        chunk = tf.constant(present[start:start + (1 << 20)])
        normal.assign(chunk, values[:len(chunk)])
        tfra_normal.upsert(chunk, values[:len(chunk)])
    sok_normal_insert = tf.function(lambda k: normal.sparse_read(k, insert=True))

    @tf.function
    def tfra_find_or_insert(keys):
        rows = tfra_normal.lookup(keys)  # missing keys read their initial rows
        tfra_normal.upsert(keys, rows)
        return rows

    c3n_sok, c3n_tfra = common.interleaved_median_ms(
        [lambda: sok_normal_insert(new_keys()).numpy(),
         lambda: tfra_find_or_insert(new_keys()).numpy()], iterations=args.iterations)
    results = {
        "C2_lookup": common.comparison(c2_sok, "tfra", c2_tfra, target=">= 4x",
                                       what="rows left as a tensor (as C3)"),
        "C2_lookup_to_numpy": common.comparison(c2_sok_np, "tfra", c2_tfra_np,
                                                what="the same calls, rows copied into NumPy"),
        "C3_insert": common.comparison(c3_sok, "tfra", c3_tfra, target=">= 4x",
                                       what="zeros initializer; TFRA upsert of zero rows"),
        "C3_insert_normal_init": common.comparison(
            c3n_sok, "tfra", c3n_tfra,
            what="N(0, 0.05) initializer; TFRA lookup (RandomNormal) then upsert"),
    }
    common.report_comparisons("c2_c3_hash_table", {
        "benchmark": "C2 lookup of present keys / C3 insert of new keys vs TFRA 0.7.2 cuckoo table",
        "config": {"keys_per_call": BATCH, "dim": DIM, "filled_keys": args.fill,
                   "key_range": KEY_RANGE, "iterations": args.iterations},
        "results": results}, "tfra")


if __name__ == "__main__":
    main()
