"""DLRM data tools: generator + split round trip, per-worker slices, corrupt inputs, AUC."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT

DLRM = os.path.join(ROOT, "tutorials", "DLRM_Benchmark")
sys.path.insert(0, DLRM)

import criteo_format  # noqa: E402
import dataset  # noqa: E402
import split_bin  # noqa: E402
from criteo_format import RECORD_INTS, VOCABULARIES  # noqa: E402

VOCAB = VOCABULARIES["notebook"]


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("raw")
    subprocess.run([sys.executable, os.path.join(DLRM, "gen_data.py"), str(out),
                    "--train_samples", "5003", "--test_samples", "1001"],
                   check=True, capture_output=True, text=True)
    return out


def test_generator_writes_valid_records(raw_dir):
    records = np.fromfile(raw_dir / "train.bin", dtype="<i4").reshape(-1, RECORD_INTS)
    assert records.shape == (5003, 40)
    assert set(np.unique(records[:, 0])) <= {0, 1}
    assert (records[:, 1:14] >= 0).all()
    assert ((records[:, 14:] >= 0) & (records[:, 14:] < np.asarray(VOCAB))).all()
    # Power law: the most frequent id of a large table is far more common than average.
    counts = np.bincount(records[:, 14])
    assert counts.max() > 50 * counts[counts > 0].mean() / 10


def test_split_round_trip(raw_dir, tmp_path):
    metadata = split_bin.split(str(raw_dir / "train.bin"), str(tmp_path), VOCAB)
    assert metadata["samples"] == 5003 and metadata["dense_log"] is True
    assert json.load(open(tmp_path / "metadata.json"))["vocab_sizes"] == VOCAB
    raw = np.fromfile(raw_dir / "train.bin", dtype="<i4").reshape(-1, RECORD_INTS)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "label.bin", np.int32), raw[:, 0])
    np.testing.assert_array_equal(np.fromfile(tmp_path / "dense.bin", np.int32).reshape(-1, 13),
                                  raw[:, 1:14])
    np.testing.assert_array_equal(np.fromfile(tmp_path / "category.bin", np.int32).reshape(-1, 26),
                                  raw[:, 14:])
    reader = dataset.BinaryDataset(str(tmp_path), 1000, training=True)
    dense, categorical, labels = reader.batch(0)
    np.testing.assert_allclose(dense, np.log(raw[:1000, 1:14] + 3.0), rtol=1e-6)
    np.testing.assert_array_equal(categorical, raw[:1000, 14:])
    np.testing.assert_array_equal(labels[:, 0], raw[:1000, 0])


def test_metadata_in_sok_spelling_reads_the_same_batches(raw_dir, tmp_path):
    """split_bin writes SOK's keys too; a metadata.json with SOK's keys only (no sample
    count: SOK derives it from the files) reads the same batches; files that disagree with
    each other or with the types are refused by name."""
    ours = split_bin.split(str(raw_dir / "train.bin"), str(tmp_path), VOCAB)
    for kind in ("label", "dense", "category"):
        assert ours[f"{kind}_raw_type"] == "int32"
    expected = dataset.BinaryDataset(str(tmp_path), 1000).batch(1)
    sok_keys = {"vocab_sizes": VOCAB, "label_raw_type": "int32", "dense_raw_type": "int32",
                "category_raw_type": "int32", "dense_log": True}
    with open(tmp_path / "metadata.json", "w") as handle:
        json.dump(sok_keys, handle)
    reader = dataset.BinaryDataset(str(tmp_path), 1000)
    assert reader.samples == 5003
    for got, want in zip(reader.batch(1), expected):
        np.testing.assert_array_equal(got, want)
    sok_keys["dense_log"] = False
    with open(tmp_path / "metadata.json", "w") as handle:
        json.dump(sok_keys, handle)
    raw = np.fromfile(raw_dir / "train.bin", dtype="<i4").reshape(-1, RECORD_INTS)
    np.testing.assert_array_equal(dataset.BinaryDataset(str(tmp_path), 1000).batch(0)[0],
                                  raw[:1000, 1:14])
    with open(tmp_path / "dense.bin", "ab") as handle:
        handle.write(b"\0" * 52)  # one sample more than the other files
    with pytest.raises(ValueError, match="different sample counts"):
        dataset.BinaryDataset(str(tmp_path), 1000)
    with open(tmp_path / "dense.bin", "ab") as handle:
        handle.write(b"\0" * 3)
    with pytest.raises(ValueError, match="dense.bin has .* bytes, not a multiple"):
        dataset.BinaryDataset(str(tmp_path), 1000)


@pytest.mark.parametrize("training", [True, False])
def test_worker_slices_cover_every_sample_once(raw_dir, tmp_path, training):
    split_bin.split(str(raw_dir / "train.bin"), str(tmp_path), VOCAB, dense_log=False)
    raw = np.fromfile(raw_dir / "train.bin", dtype="<i4").reshape(-1, RECORD_INTS)
    seen = []
    for rank in range(3):
        reader = dataset.BinaryDataset(str(tmp_path), 1000, rank, 3, training=training)
        assert len(reader) == (5 if training else 6)
        for dense, _, _ in reader:
            seen.append(dense)
    seen = np.concatenate(seen)
    expected = raw[:5000 if training else 5003, 1:14]
    # Each sample exactly once: same multiset of rows.
    assert len(seen) == len(expected)
    np.testing.assert_array_equal(np.unique(seen, axis=0), np.unique(expected.astype(np.float32),
                                                                      axis=0))


def test_local_slices_partition_a_batch():
    for size in [0, 1, 2, 7, 4096]:
        slices = [dataset.local_slice(size, r, 3) for r in range(3)]
        assert slices[0][0] == 0 and slices[-1][1] == size
        assert all(a[1] == b[0] for a, b in zip(slices, slices[1:]))


def test_truncated_file_is_rejected(raw_dir, tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes((raw_dir / "train.bin").read_bytes()[:160 * 10 + 7])
    with pytest.raises(ValueError, match="1607 bytes, not a multiple of the 160-byte record"):
        split_bin.split(str(bad), str(tmp_path / "out"), VOCAB)


def test_id_outside_vocabulary_is_rejected_and_nothing_written(raw_dir, tmp_path):
    records = np.fromfile(raw_dir / "train.bin", dtype="<i4").reshape(-1, RECORD_INTS).copy()
    records[42, 14 + 5] = VOCAB[5]  # slot 5 has 4 ids
    bad = tmp_path / "bad.bin"
    records.tofile(bad)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="record 42: id 4 of slot 5 is outside its vocabulary \\[0, 4\\)"):
        split_bin.split(str(bad), str(out), VOCAB)
    assert not any(out.iterdir())


def test_bad_slot_sizes():
    with pytest.raises(ValueError, match="needs 26 positive sizes"):
        criteo_format.parse_slot_sizes("[1, 2, 3]")


def test_auc_helpers_agree():
    sys.path.insert(0, DLRM)
    from main import AUC_BINS, auc_from_histograms  # noqa: PLC0415

    rng = np.random.default_rng(0)
    labels = rng.random(20000) < 0.3
    scores = np.clip(rng.normal(0.5 + 0.2 * labels, 0.2), 0, 0.9999)
    exact = criteo_format.auc(labels, scores)
    bins = np.minimum((scores * AUC_BINS).astype(int), AUC_BINS - 1)
    binned = auc_from_histograms(np.bincount(bins[labels], minlength=AUC_BINS),
                                 np.bincount(bins[~labels], minlength=AUC_BINS))
    assert abs(exact - binned) < 1e-3
    assert criteo_format.auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75


def test_table_gradient_scale_matches_sok_training_convention():
    """SOK's DLRM: each of W workers takes the gradient of its own mean loss and the
    all-to-all adds the tables' gradients over workers. main.py takes each worker's share of
    the global mean loss; scaled by scale_table_gradients the tables get SOK's gradient (here
    W = 2 workers simulated in one process, TensorFlow's autodiff on both sides)."""
    import tensorflow as tf
    import main as dlrm_main

    rng = np.random.default_rng(4)
    workers, local, vocab, dim = 2, 16, 10, 3
    table = tf.Variable(rng.normal(size=[vocab, dim]).astype(np.float32))
    ids = [tf.constant(rng.integers(0, vocab, size=[local, 2])) for _ in range(workers)]
    labels = [tf.constant(rng.integers(0, 2, size=[local, 1]).astype(np.float32))
              for _ in range(workers)]
    bce = tf.keras.losses.BinaryCrossentropy(from_logits=True,
                                             reduction=tf.keras.losses.Reduction.NONE)

    def gradient(w, divisor):
        with tf.GradientTape() as tape:
            logits = tf.reduce_sum(tf.gather(table, ids[w]), [1, 2])[:, None]
            loss = tf.reduce_sum(bce(labels[w], logits)) / divisor
        return tf.convert_to_tensor(tape.gradient(loss, table)).numpy()

    sok_grad = sum(gradient(w, local) for w in range(workers))  # local means, added
    global_mean = sum(gradient(w, local * workers) for w in range(workers))
    (scaled,) = dlrm_main.scale_table_gradients([tf.constant(global_mean)], workers, "sok")
    np.testing.assert_allclose(scaled.numpy(), sok_grad, rtol=1e-5, atol=1e-7)
    (sparse,) = dlrm_main.scale_table_gradients(
        [tf.IndexedSlices(tf.constant(global_mean), tf.range(vocab), tf.constant([vocab, dim]))],
        workers, "sok")
    np.testing.assert_allclose(tf.convert_to_tensor(sparse).numpy(), sok_grad, rtol=1e-5,
                               atol=1e-7)
    (unscaled,) = dlrm_main.scale_table_gradients([tf.constant(global_mean)], workers,
                                                  "global_mean")
    np.testing.assert_allclose(unscaled.numpy(), global_mean)
