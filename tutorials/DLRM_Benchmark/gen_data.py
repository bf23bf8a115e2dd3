"""Writes raw Criteo-format files (train.bin, test.bin) with a planted signal.

Each categorical id is drawn from a power law (dynamicemb's PowerLaw(1, N, alpha) sampler, then
a fixed permutation so hot ids are spread over the vocabulary); each id carries a hidden effect,
and each dense feature a hidden weight on log(x + 3). The label is Bernoulli(sigmoid(logit)).
The AUC of the generating model on the test file is printed: no model can do better.

Usage: python gen_data.py OUTPUT_DIR [--train_samples N --test_samples N --vocab notebook]
"""
import argparse
import os

import numpy as np
from tqdm import tqdm

from criteo_format import NUM_CATEGORICAL, NUM_DENSE, RECORD_INTS, VOCABULARIES, auc

CHUNK = 1 << 18


def power_law(rng, size, vocab, alpha=1.05):
    """Ids in [0, vocab), the smallest hottest (before permutation)."""
    if vocab == 1:
        return np.zeros(size, np.int64)
    x = rng.random(size)
    top = float(vocab + 1)
    y = (x * (top ** (1 - alpha) - 1) + 1) ** (1 / (1 - alpha))
    return np.minimum(y.astype(np.int64), vocab) - 1


class PlantedModel:
    """The hidden model: per-id effects for every feature and dense weights."""

    def __init__(self, vocab_sizes, seed, strength):
        rng = np.random.default_rng(seed)
        self.vocab_sizes = vocab_sizes
        self.permutations = [rng.permutation(v) if v <= 50_000_000 else None for v in vocab_sizes]
        self.effects = [rng.normal(0, strength, size=v).astype(np.float32) for v in vocab_sizes]
        self.dense_weights = rng.normal(0, 0.3, size=NUM_DENSE)
        self.bias = -1.0

    def sample(self, rng, n):
        """(records [n, 40] int32, true probabilities [n])."""
        dense = rng.poisson(lam=rng.uniform(0.5, 20, size=NUM_DENSE), size=(n, NUM_DENSE))
        logits = self.bias + (np.log(dense + 3.0) - 2.0) @ self.dense_weights
        categorical = np.empty((n, NUM_CATEGORICAL), np.int64)
        for f, vocab in enumerate(self.vocab_sizes):
            ids = power_law(rng, n, vocab)
            if self.permutations[f] is not None:
                ids = self.permutations[f][ids]
            categorical[:, f] = ids
            logits += self.effects[f][ids]
        probability = 1.0 / (1.0 + np.exp(-logits))
        labels = (rng.random(n) < probability).astype(np.int64)
        records = np.concatenate([labels[:, None], dense, categorical], axis=1).astype(np.int32)
        return records, probability


def write(path, model, rng, samples, desc):
    labels, scores = [], []
    with open(path, "wb") as handle, tqdm(total=samples, desc=desc, unit="rec") as progress:
        for start in range(0, samples, CHUNK):
            records, probability = model.sample(rng, min(CHUNK, samples - start))
            assert records.shape[1] == RECORD_INTS
            records.astype("<i4").tofile(handle)
            labels.append(records[:, 0])
            scores.append(probability)
            progress.update(len(records))
    return np.concatenate(labels), np.concatenate(scores)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir")
    parser.add_argument("--train_samples", type=int, default=1_000_000)
    parser.add_argument("--test_samples", type=int, default=100_000)
    parser.add_argument("--vocab", choices=sorted(VOCABULARIES), default="notebook")
    parser.add_argument("--strength", type=float, default=0.35,
                        help="standard deviation of each id's hidden effect on the logit")
    parser.add_argument("--seed", type=int, default=2024)
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    model = PlantedModel(VOCABULARIES[args.vocab], args.seed, args.strength)
    rng = np.random.default_rng(args.seed + 1)
    write(os.path.join(args.output_dir, "train.bin"), model, rng, args.train_samples, "train")
    labels, scores = write(os.path.join(args.output_dir, "test.bin"), model, rng,
                           args.test_samples, "test")
    print(f"positive rate {labels.mean():.3f}; AUC of the generating model on test.bin "
          f"(the ceiling): {auc(labels, scores):.4f}")


if __name__ == "__main__":
    main()
