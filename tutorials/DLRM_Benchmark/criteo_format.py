"""The Criteo-format record and the vocabularies the tools know.

A raw record is 160 bytes, little endian: label int32, 13 dense int32, 26 categorical int32.
"""
import numpy as np

RECORD_INTS = 1 + 13 + 26
RECORD_BYTES = 4 * RECORD_INTS
NUM_DENSE, NUM_CATEGORICAL = 13, 26

VOCABULARIES = {
    # The seed notebook's 26 sizes (the default).
    "notebook": [203931, 18598, 14092, 7012, 18977, 4, 6385, 1245, 49, 186213, 71328, 67288, 11,
                 2168, 7338, 61, 4, 932, 15, 204515, 141526, 199433, 60919, 9137, 71, 34],
    # Criteo Terabyte's.
    "criteo_tb": [39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546,
                  403346, 10, 2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935,
                  12972, 108, 36],
}

TYPES = {"int32": np.int32, "int64": np.int64, "float32": np.float32}


def parse_slot_sizes(text):
    """'[1, 2, 3]' or '1,2,3' -> [1, 2, 3], 26 positive sizes."""
    sizes = [int(part) for part in text.strip("[] ").split(",") if part.strip()]
    if len(sizes) != NUM_CATEGORICAL or min(sizes) < 1:
        raise ValueError(f"--slot_size_array needs {NUM_CATEGORICAL} positive sizes, got {sizes}")
    return sizes


def auc(labels, scores):
    """Area under the ROC curve (ties count one half), exact, in NumPy."""
    labels = np.asarray(labels).astype(bool).ravel()
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(order))
    sorted_scores = np.asarray(scores).ravel()[order]
    # Average ranks over ties.
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    mean_rank = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(mean_rank, counts)
    positives = labels.sum()
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))
