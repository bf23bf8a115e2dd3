"""C6: DLRM training samples/s with sok tables against the same model with
tf.keras.layers.Embedding tables (1 worker), plus sok on 2 Horovod workers (scaling), in one
run on the same synthetic data. Each configuration runs tutorials/DLRM_Benchmark/main.py.

Two optimizers, the same one for the tables and the dense part on both sides:
- sgd (SOK's DLRM recipe): Keras' sparse SGD touches only the rows looked up, as sok does;
- adam: Keras' (legacy) Adam moves every row of every table and its moments each step; sok's
  OptimizerWrapper updates the rows looked up (lazy Adam), the usual sparse-embedding update.
The same model with no tables (`--embedding none`: features read as zeros) gives the bound:
no embedding, however fast, makes a step cheaper than its dense part, so `bound_vs_keras` is
the most any embedding layer can gain over Keras' with that optimizer.
"""
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")


LEARNING_RATES = {"sgd": 0.1, "adam": 0.001}


def run(workers, embedding, optimizer, args):
    command = [HOROVODRUN, "-np", str(workers), "-H", f"localhost:{workers}", "--gloo",
               sys.executable, os.path.join(ROOT, "tutorials", "DLRM_Benchmark", "main.py"),
               "--use_synthetic_dataset", "--synthetic_steps", str(args.steps),
               "--global_batch_size", str(args.batch), "--embedding", embedding,
               "--embedding_dim", str(args.dim), "--eval_in_last", "--custom_interact",
               "--optimizer", optimizer, "--lr", str(LEARNING_RATES[optimizer]),
               "--log_interval", "1000"]
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    output = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"FINAL samples_per_second=([0-9.]+)", output).group(1))


def main():
    args = common.int_options(__doc__, batch=4096, dim=128, steps=40, rounds=3)
    results, rows = {}, []
    for optimizer in LEARNING_RATES:
        # Rounds in alternating orders, medians: the VM's speed drifts between processes.
        embeddings = ["static", "keras", "none"]
        rates = {embedding: [] for embedding in embeddings}
        for round_ in range(args.rounds):
            for embedding in embeddings[::-1] if round_ % 2 else embeddings:
                rates[embedding].append(run(1, embedding, optimizer, args))
        sok_one, keras_one, dense_only = (statistics.median(rates[e]) for e in embeddings)
        results[optimizer] = {
            "sok_1_worker": round(sok_one, 1), "keras_embedding_1_worker": round(keras_one, 1),
            "dense_part_only_1_worker": round(dense_only, 1),
            "speedup_vs_keras": round(sok_one / keras_one, 3),
            "bound_vs_keras": round(dense_only / keras_one, 3),
            "sok_share_of_bound": round(sok_one / dense_only, 3)}
        rows += [[optimizer, "sok, 1 worker", f"{sok_one:,.0f}"],
                 [optimizer, "tf.keras Embedding, 1 worker", f"{keras_one:,.0f}"],
                 [optimizer, "no tables (dense part alone), 1 worker", f"{dense_only:,.0f}"]]
        print(f"{optimizer}: sok {sok_one:,.0f}, keras {keras_one:,.0f}, dense part alone "
              f"{dense_only:,.0f} samples/s: {sok_one / keras_one:.2f}x (bound "
              f"{dense_only / keras_one:.2f}x)", flush=True)
    sok_two = run(2, "static", "sgd", args)
    rows.append(["sgd", "sok, 2 workers", f"{sok_two:,.0f}"])
    results["sgd"]["sok_2_workers"] = round(sok_two, 1)
    results["sgd"]["scaling_2_workers"] = round(sok_two / results["sgd"]["sok_1_worker"], 3)
    results["target"] = ">= 2x vs keras"
    path = common.report("c6_dlrm", {
        "benchmark": "C6 DLRM training samples/s, sok tables vs tf.keras.layers.Embedding",
        "config": {"batch": args.batch, "dim": args.dim, "steps": args.steps,
                   "rounds": args.rounds,
                   "data": "synthetic", "optimizers": LEARNING_RATES, "custom_interact": True,
                   "note": "2 workers share the machine's 2 cores"},
        "results": results}, ["optimizer", "configuration", "samples/s"], rows)
    print(f"speedup vs keras: sgd {results['sgd']['speedup_vs_keras']}x (bound "
          f"{results['sgd']['bound_vs_keras']}x), adam {results['adam']['speedup_vs_keras']}x "
          f"(bound {results['adam']['bound_vs_keras']}x); 2-worker scaling "
          f"{results['sgd']['scaling_2_workers']}x; written to {path}")


if __name__ == "__main__":
    main()
