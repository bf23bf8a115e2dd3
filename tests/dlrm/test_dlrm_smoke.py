"""End to end: generate, split, train DLRM on 2 Horovod workers, check AUC and the table."""
import os
import re
import subprocess
import sys

from conftest import LAUNCHER, ROOT, subprocess_env

DLRM = os.path.join(ROOT, "tutorials", "DLRM_Benchmark")
sys.path.insert(0, DLRM)


def test_two_workers_learn_the_planted_signal(tmp_path):
    from criteo_format import VOCABULARIES  # noqa: PLC0415

    generated = subprocess.run(
        [sys.executable, os.path.join(DLRM, "gen_data.py"), str(tmp_path / "raw"),
         "--train_samples", "120000", "--test_samples", "20000"],
        check=True, capture_output=True, text=True).stdout
    ceiling = float(re.search(r"\(the ceiling\): ([0-9.]+)", generated).group(1))
    for split in ["train", "test"]:
        subprocess.run([sys.executable, os.path.join(DLRM, "split_bin.py"),
                        str(tmp_path / "raw" / f"{split}.bin"), str(tmp_path / split),
                        f"--slot_size_array={VOCABULARIES['notebook']}"], check=True,
                       capture_output=True)
    env = subprocess_env()
    result = subprocess.run(
        LAUNCHER + ["-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
         os.path.join(DLRM, "main.py"), "--data_dir", str(tmp_path), "--global_batch_size", "1024",
         "--optimizer", "adam", "--lr", "0.003", "--warmup_steps", "5", "--embedding_dim", "16",
         "--custom_interact", "--epochs", "2", "--log_interval", "50"],
        env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "| batch size | exit criteria |" in output and "samples per second" in output
    auc = float(re.search(r"FINAL samples_per_second=[0-9.]+ auc=([0-9.]+)", output).group(1))
    # Well above chance: at least half the way from 0.5 to the generating model's AUC.
    assert auc > 0.5 + 0.5 * (ceiling - 0.5), (auc, ceiling)


def test_amp_xla_compress_dynamic_tables_run_on_two_workers():
    """The flag combinations run end to end (synthetic data) and show in the final table."""
    env = subprocess_env()
    result = subprocess.run(
        LAUNCHER + ["-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
         os.path.join(DLRM, "main.py"), "--use_synthetic_dataset", "--synthetic_steps", "8",
         "--global_batch_size", "256", "--embedding_dim", "8", "--embedding", "dynamic",
         "--amp", "--xla", "--compress", "--custom_interact", "--eval_in_last", "--lr", "0.1",
         "--early_stop", "5"],  # SOK's flag: stop after 5 of the 8 iterations
        env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    row = next(line for line in output.splitlines() if "| 256 |" in line)
    # xla, custom interact (float16 under amp), amp, compress
    assert "| at end | True | True | True | True |" in row, row
    assert "| 256 | 5 steps |" in row, row
    assert "| dynamic |" in row


DENSE_CHECKSUM = """
import sys
sys.path.insert(0, sys.argv[1])
from model import DLRM
model = DLRM([5] * 26, dim=8, embedding="none")
print(repr(sum(float(abs(v.numpy()).sum()) for v in model.dense_variables)))
"""


def test_every_worker_starts_from_the_same_dense_part():
    # The dense part is replicated and its gradients allreduced: separate processes (workers)
    # must build the same initial weights, with no broadcast.
    sums = [subprocess.run([sys.executable, "-c", DENSE_CHECKSUM, DLRM], check=True,
                           capture_output=True, text=True).stdout.split()[-1] for _ in range(2)]
    assert sums[0] == sums[1] and float(sums[0]) > 0, sums
