"""The TensorFlow and Keras lines this package supports, checked when it is imported."""
import importlib
import os
import warnings

import tensorflow as tf

SUPPORTED_TENSORFLOW = ("2.15", "2.16", "2.17", "2.18", "2.19", "2.20", "2.21")
ALLOW_ENV = "SOK_ALLOW_UNSUPPORTED_VERSIONS"
SUPPORTED = ("TensorFlow 2.15 with Keras 2, or TensorFlow 2.16 to 2.21 with Keras 3 (3.0 or "
             "newer) or with tf_keras (Keras 2: pip install the tf_keras of the same line, set "
             "TF_USE_LEGACY_KERAS=1)")


def unsupported(tensorflow_version, keras_version):
    """Why this TensorFlow / tf.keras pair is not supported, or None when it is."""
    line = ".".join(tensorflow_version.split(".")[:2])
    if line not in SUPPORTED_TENSORFLOW:
        return f"TensorFlow {tensorflow_version} is not supported"
    major = str(keras_version).split(".")[0]
    if major == "3" and line == "2.15":
        return f"Keras {keras_version} under TensorFlow 2.15 is not supported"
    if major not in ("2", "3"):
        return f"tf.keras is Keras {keras_version} under TensorFlow {tensorflow_version}"
    return None


def keras_behind_tf_keras():
    """(version, module) of the Keras that tf.keras is: tf_keras (Keras 2) under
    TF_USE_LEGACY_KERAS=1 from TensorFlow 2.16 on, else the keras package; (None, None) if
    neither is installed."""
    line = tuple(int(part) for part in tf.__version__.split(".")[:2] if part.isdigit())
    legacy = os.environ.get("TF_USE_LEGACY_KERAS", "") in ("1", "true", "True")
    for name in (["tf_keras"] if legacy and line >= (2, 16) else []) + ["keras"]:
        try:
            return importlib.import_module(name).__version__, name
        except ImportError:
            continue
    return None, None


def tf_keras_is_keras_3():
    """Whether tf.keras is Keras 3 (TensorFlow 2.16 and newer without TF_USE_LEGACY_KERAS)."""
    version = keras_behind_tf_keras()[0]
    return version is not None and str(version).startswith("3.")


def check():
    """Raises ImportError naming the supported lines for an unsupported TensorFlow or Keras;
    with SOK_ALLOW_UNSUPPORTED_VERSIONS=1 it warns instead."""
    reason = unsupported(tf.__version__, keras_behind_tf_keras()[0])
    if reason is None:
        return
    message = f"sparse_operation_kit: {reason}. Supported: {SUPPORTED}."
    if os.environ.get(ALLOW_ENV, "") in ("1", "true", "True"):
        warnings.warn(message + f" Going on because {ALLOW_ENV} is set.", stacklevel=3)
        return
    raise ImportError(message + f" Set {ALLOW_ENV}=1 to import it anyway.")
