"""Horovod DLRM benchmark with sparse_operation_kit tables on Criteo-format data.

    horovodrun -np 2 --gloo python main.py --data_dir DIR --global_batch_size 4096 ...

Trains DLRM, evaluates the ROC AUC on the test split (allreduced over workers), stops early at
a target AUC, logs throughput, and prints a final table of timings and samples per second.
"""
import argparse
import os
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from criteo_format import VOCABULARIES  # noqa: E402
from dataset import BinaryDataset, SyntheticDataset  # noqa: E402
from model import DLRM  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit.info import keras_version  # noqa: E402

KERAS_3 = keras_version().startswith("3.")  # tf.keras is Keras 3
REFERENCE_BATCH = 55296  # the schedule's step counts are for this global batch
AUC_BINS = 10000


def str2bool(text):
    return str(text).lower() in ("1", "true", "yes")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default=None, help="split files: train/ and test/")
    parser.add_argument("--global_batch_size", type=int, default=65536)
    parser.add_argument("--amp", action="store_true", help="mixed float16 dense part")
    parser.add_argument("--xla", action="store_true", help="XLA-compile the dense part")
    parser.add_argument("--compress", action="store_true",
                        help="float16 embedding all-to-all and dense-gradient allreduce")
    parser.add_argument("--custom_interact", action="store_true",
                        help="the fused Sok>DotInteraction op instead of TF ops")
    parser.add_argument("--eval_in_last", action="store_true", help="evaluate only at the end")
    parser.add_argument("--eval_interval", type=int, default=0,
                        help="steps between evaluations (default: once per epoch)")
    parser.add_argument("--use_synthetic_dataset", action="store_true")
    parser.add_argument("--synthetic_steps", type=int, default=200)
    parser.add_argument("--synthetic_vocab", choices=["notebook", "criteo_tb"], default="notebook",
                        help="vocabularies of the synthetic data (criteo_tb capped at 4M rows)")
    parser.add_argument("--early_stop", type=int, default=-1,
                        help="stop after this many iterations, as SOK's flag (-1: never)")
    parser.add_argument("--auc_threshold", type=float, default=-1.0,
                        help="stop once the test AUC reaches this value (-1: never)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=24.0)
    parser.add_argument("--optimizer", choices=["sgd", "adagrad", "adam"], default="sgd",
                        help="for the dense part and, lazily, the tables (SOK's DLRM uses sgd)")
    parser.add_argument("--warmup_steps", type=int, default=8000)
    parser.add_argument("--decay_start_step", type=int, default=48000)
    parser.add_argument("--decay_steps", type=int, default=24000)
    parser.add_argument("--embedding", choices=["static", "dynamic", "keras", "none"],
                        default="static",
                        help="keras: tf.keras.layers.Embedding tables (C6's competitor); none: "
                             "no tables, features read as zeros (the dense part alone)")
    parser.add_argument("--table_grad_scale", choices=["sok", "global_mean"], default="sok",
                        help="sok: the tables step as in SOK's DLRM at the same --lr (each "
                             "worker's mean loss, gradients added over workers: workers x the "
                             "global mean's); global_mean: the global mean loss's gradient")
    parser.add_argument("--embedding_dim", type=int, default=128)
    parser.add_argument("--log_interval", type=int, default=50)
    parser.add_argument("--max_steps", type=int, default=-1)
    args = parser.parse_args(argv)
    if args.early_stop > 0:  # SOK's iteration limit; --max_steps is the same, both may be given
        args.max_steps = (args.early_stop if args.max_steps < 0
                          else min(args.max_steps, args.early_stop))
    return args


class WarmupPolyDecay(tf.keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up, constant, then quadratic decay to zero (the SOK/HugeCTR DLRM schedule)."""

    def __init__(self, lr, warmup_steps, decay_start_step, decay_steps):
        self.lr, self.warmup = float(lr), max(1, int(warmup_steps))
        self.decay_start, self.decay_steps = int(decay_start_step), max(1, int(decay_steps))

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = self.lr * tf.minimum(1.0, (step + 1.0) / self.warmup)
        progress = tf.clip_by_value((step - self.decay_start) / self.decay_steps, 0.0, 1.0)
        return tf.where(step < self.decay_start, warmup, self.lr * (1.0 - progress) ** 2)

    def get_config(self):
        return {"lr": self.lr, "warmup_steps": self.warmup,
                "decay_start_step": self.decay_start, "decay_steps": self.decay_steps}


def scale_table_gradients(grads, workers, convention="sok"):
    """The tables' gradients of the global mean loss, scaled to `convention`. SOK's DLRM
    trains each worker on its own mean loss and the all-to-all adds the tables' gradients
    over the workers, so at the same --lr its table step is `workers` times the global
    mean's; its dense gradients are averaged, which is the global mean's (as here)."""
    if convention == "global_mean" or workers == 1:
        return grads
    return [g if g is None else
            tf.IndexedSlices(g.values * workers, g.indices, g.dense_shape)
            if isinstance(g, tf.IndexedSlices) else g * workers for g in grads]


def scale_loss(optimizer, loss):
    """The loss scaled by a LossScaleOptimizer (--amp), in either Keras generation's API."""
    return optimizer.scale_loss(loss) if KERAS_3 else optimizer.get_scaled_loss(loss)


def unscale_gradients(optimizer, table_grads, dense_grads, tables_to_optimizer):
    """Gradients of a scaled loss, unscaled where Keras will not do it: Keras 2 unscales none
    itself; Keras 3's LossScaleOptimizer unscales what it applies, so only the sok tables'
    gradients (applied by their own optimizer) are unscaled here."""
    if not KERAS_3:
        grads = optimizer.get_unscaled_gradients(list(table_grads) + list(dense_grads))
        return grads[:len(table_grads)], grads[len(table_grads):]
    if tables_to_optimizer:
        return table_grads, dense_grads
    inverse = 1.0 / tf.convert_to_tensor(optimizer.dynamic_scale)
    return [tf.IndexedSlices(g.values * inverse, g.indices, g.dense_shape)
            if isinstance(g, tf.IndexedSlices) else g * inverse for g in table_grads], dense_grads


def auc_from_histograms(positive, negative):
    """ROC AUC from per-bin counts of positive and negative scores (bins in increasing score)."""
    positive, negative = positive.astype(np.float64), negative.astype(np.float64)
    if positive.sum() == 0 or negative.sum() == 0:
        return float("nan")
    negatives_below = np.cumsum(negative) - negative
    wins = (positive * (negatives_below + 0.5 * negative)).sum()
    return float(wins / (positive.sum() * negative.sum()))


def main(argv=None):
    args = parse_args(argv)
    import horovod.tensorflow as hvd

    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")  # one GPU per worker, as SOK's main.py
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    sok.init(comm_tool="horovod")
    rank, workers = hvd.rank(), hvd.size()
    if args.amp:
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
    log = print if rank == 0 else (lambda *a, **k: None)

    if args.use_synthetic_dataset:
        vocab = [min(v, 4_000_000) for v in VOCABULARIES[args.synthetic_vocab]]
        train = SyntheticDataset(vocab, args.global_batch_size, rank, workers, args.synthetic_steps)
        test = SyntheticDataset(vocab, args.global_batch_size, rank, workers, 4, seed=99)
    else:
        train = BinaryDataset(os.path.join(args.data_dir, "train"), args.global_batch_size,
                              rank, workers, training=True)
        test = BinaryDataset(os.path.join(args.data_dir, "test"), args.global_batch_size, rank,
                             workers, training=False)
        vocab = train.metadata["vocab_sizes"]

    scale = REFERENCE_BATCH / args.global_batch_size
    schedule = WarmupPolyDecay(args.lr, args.warmup_steps * scale,
                               args.decay_start_step * scale, args.decay_steps * scale)
    model = DLRM(vocab, args.embedding_dim, args.embedding, args.custom_interact, args.xla,
                 args.compress)
    # Keras 2's legacy optimizers (as SOK scripts use them); Keras 3 has only the new ones.
    optimizers = getattr(tf.keras.optimizers, "legacy", None) if not KERAS_3 else None
    make_optimizer = getattr(optimizers or tf.keras.optimizers,
                             {"sgd": "SGD", "adagrad": "Adagrad", "adam": "Adam"}[args.optimizer])
    dense_optimizer = make_optimizer(schedule)
    if args.amp:
        dense_optimizer = tf.keras.mixed_precision.LossScaleOptimizer(dense_optimizer)
        if KERAS_3:  # it scales by its variable once built: built before the step is traced
            dense, categorical, _ = next(iter(train))
            model(dense, categorical, training=False)  # makes the dense layers' variables
            dense_optimizer.build(model.tables + model.dense_variables
                                  if args.embedding == "keras" else model.dense_variables)
    table_optimizer = sok.OptimizerWrapper(make_optimizer(schedule))
    compression = hvd.Compression.fp16 if args.compress else hvd.Compression.none
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")

    def allreduce_dense(grad):
        if workers == 1:
            return grad
        if isinstance(grad, tf.IndexedSlices):  # a replicated Keras table: rows allgathered
            return hvd.allreduce(grad, op=hvd.Sum)
        grad = tf.convert_to_tensor(grad)
        return hvd.allreduce(sok.raw_ops.sok_unfoldable(grad), op=hvd.Sum,
                             compression=compression)

    @tf.function
    def train_step(dense, categorical, labels):
        with tf.GradientTape() as tape:
            logits = model(dense, categorical, training=True)
            # Each worker's share of the global mean: gradients add up over workers.
            loss = tf.reduce_sum(loss_fn(labels, logits)) / args.global_batch_size
            scaled = scale_loss(dense_optimizer, loss) if args.amp else loss
        variables = model.tables + model.dense_variables
        grads = tape.gradient(scaled, variables)
        table_grads, dense_grads = grads[:len(model.tables)], grads[len(model.tables):]
        if args.amp:
            table_grads, dense_grads = unscale_gradients(dense_optimizer, table_grads,
                                                         dense_grads, args.embedding == "keras")
        dense_grads = [allreduce_dense(g) for g in dense_grads]
        if args.embedding == "keras":  # replicated tables (plain data parallelism)
            table_grads = [allreduce_dense(g) for g in table_grads]
            dense_optimizer.apply_gradients(zip(table_grads + dense_grads, variables))
        else:
            if model.tables:
                table_grads = scale_table_gradients(table_grads, workers, args.table_grad_scale)
                table_optimizer.apply_gradients(zip(table_grads, model.tables))
            dense_optimizer.apply_gradients(zip(dense_grads, model.dense_variables))
        return hvd.allreduce(loss, op=hvd.Sum) if workers > 1 else loss

    @tf.function
    def score_histograms(dense, categorical, labels):
        scores = tf.sigmoid(model(dense, categorical, training=False))
        positive = tf.boolean_mask(scores, labels > 0.5)
        negative = tf.boolean_mask(scores, labels <= 0.5)
        hist = lambda s: tf.histogram_fixed_width(s, [0.0, 1.0], nbins=AUC_BINS)  # noqa: E731
        return hist(positive), hist(negative)

    def evaluate():
        positive = np.zeros(AUC_BINS, np.int64)
        negative = np.zeros(AUC_BINS, np.int64)
        for dense, categorical, labels in test:
            p, n = score_histograms(dense, categorical, labels)
            positive += p.numpy()
            negative += n.numpy()
        if workers > 1:
            totals = hvd.allreduce(tf.constant(np.stack([positive, negative])), op=hvd.Sum).numpy()
            positive, negative = totals[0], totals[1]
        return auc_from_histograms(positive, negative)

    steps_per_epoch = len(train)
    eval_interval = args.eval_interval or steps_per_epoch
    log(f"DLRM: {workers} worker(s), global batch {args.global_batch_size}, {steps_per_epoch} "
        f"steps an epoch, embedding {args.embedding} dim {args.embedding_dim}", flush=True)
    train_seconds = eval_seconds = 0.0
    step, auc, stopped = 0, float("nan"), False
    iteration_times = []
    start_all = time.perf_counter()
    for epoch in range(args.epochs):
        window_start, window_steps = time.perf_counter(), 0
        for dense, categorical, labels in train:
            begin = time.perf_counter()
            loss = train_step(dense, categorical, labels)
            if step % args.log_interval == 0 or step == steps_per_epoch - 1:
                loss = float(loss)  # synchronises
            elapsed = time.perf_counter() - begin
            train_seconds += elapsed
            if step >= 5:  # after tracing
                iteration_times.append(elapsed)
            step += 1
            window_steps += 1
            if step % args.log_interval == 0:
                rate = window_steps * args.global_batch_size / (time.perf_counter() - window_start)
                log(f"epoch {epoch} step {step}: loss {float(loss):.4f}, {rate:,.0f} samples/s",
                    flush=True)
                window_start, window_steps = time.perf_counter(), 0
            if not args.eval_in_last and step % eval_interval == 0:
                begin = time.perf_counter()
                auc = evaluate()
                eval_seconds += time.perf_counter() - begin
                log(f"step {step}: test AUC {auc:.4f}", flush=True)
                if 0 < args.auc_threshold <= auc:
                    stopped = True
                    break
            if 0 < args.max_steps <= step:
                break
        if stopped or 0 < args.max_steps <= step:
            break
    if args.eval_in_last or np.isnan(auc) or (step % eval_interval != 0 and not stopped):
        begin = time.perf_counter()
        auc = evaluate()
        eval_seconds += time.perf_counter() - begin
    total_seconds = time.perf_counter() - start_all
    average_ms = 1e3 * float(np.mean(iteration_times)) if iteration_times else float("nan")
    samples_per_second = args.global_batch_size / (average_ms / 1e3) if iteration_times else 0.0
    exit_criteria = (f"AUC >= {args.auc_threshold} (reached)" if stopped else
                     f"{args.epochs} epoch(s)" if args.max_steps < 0 else f"{step} steps")
    header = ["batch size", "exit criteria", "evaluation frequency", "xla", "custom interact",
              "amp", "compress", "training minutes", "evaluating minutes", "total minutes",
              "average iteration ms", "samples per second", "test AUC", "workers", "embedding"]
    row = [args.global_batch_size, exit_criteria,
           "at end" if args.eval_in_last else f"every {eval_interval} steps", args.xla,
           args.custom_interact, args.amp, args.compress, f"{train_seconds / 60:.2f}",
           f"{eval_seconds / 60:.2f}", f"{total_seconds / 60:.2f}", f"{average_ms:.1f}",
           f"{samples_per_second:,.0f}", f"{auc:.4f}", workers, args.embedding]
    log("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n| " +
        " | ".join(str(cell) for cell in row) + " |", flush=True)
    log(f"FINAL samples_per_second={samples_per_second:.1f} auc={auc:.4f} steps={step}",
        flush=True)
    return {"auc": auc, "samples_per_second": samples_per_second, "steps": step}


if __name__ == "__main__":
    main()
