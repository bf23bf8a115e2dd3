"""The drop-in check's own machinery (tests/sok_dropin, run against NVIDIA's SOK on a GPU by
on_device.sh): its SOK-style script runs under this package on the CPU, compare.py finds two
runs of it the same, and finds a changed table or loss different. With SOK_REFERENCE_PYTHON
naming the Python of another TensorFlow line from 2.16 on, with tf_keras (`make test` names
2.16.2's), the script runs unchanged under both lines and gives the same losses, tables and
optimizer state."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, subprocess_env
from keras_optimizers import keras_2_only

HERE = os.path.join(ROOT, "tests", "sok_dropin")
SECTIONS = "static/adam/distributed,dynamic/adagrad/hbm,dynamic/rmsprop/hbm,errors/"


REFERENCE_PYTHON = os.environ.get("SOK_REFERENCE_PYTHON")
# A SOK v2 user's training: DynamicVariable and static tables, lookup_sparse, OptimizerWrapper
# around Keras' Adam and Adagrad, dump and load, and the error cases.
CROSS_LINE_SECTIONS = "static/adam/distributed,dynamic/adam/hbm,dynamic/adagrad/hbm,errors/"


def run_script(out, label, python=sys.executable, sections=SECTIONS, **env):
    result = subprocess.run(
        [python, os.path.join(HERE, "sok_script.py"), str(out), label],
        env=subprocess_env(SOK_SCRIPT_ONLY=sections, **env), capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0 and f"WROTE {label}" in result.stdout, result.stderr[-3000:]


def compare(out):
    return subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), str(out)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)


@keras_2_only  # a SOK v2 script: sok.init() names the legacy optimizers, which Keras 3 lacks
def test_two_runs_compare_the_same_and_a_change_is_found(tmp_path):
    run_script(tmp_path, "ours")
    for suffix in ("json", "npz"):
        os.link(tmp_path / f"ours.{suffix}", tmp_path / f"sok.{suffix}")
    report = json.loads((tmp_path / "ours.json").read_text())["sections"]
    assert all(entry["ok"] for name, entry in report.items() if not name.startswith("errors/"))
    assert report["errors/float ids"]["raises"] == "TypeError"
    assert report["dynamic/rmsprop/hbm"]["slot_names"] == ["rms"]  # as Keras and SOK
    assert report["dynamic/adagrad/hbm"]["load_restored"] is True
    same = compare(tmp_path)
    assert same.returncode == 0, same.stdout[-3000:]
    assert "0 with unexpected differences" in same.stdout

    os.remove(tmp_path / "sok.npz")
    with np.load(tmp_path / "ours.npz") as data:
        arrays = {name: data[name] for name in data.files}
    arrays["static/adam/distributed/0"] = arrays["static/adam/distributed/0"] + 1e-3
    np.savez(tmp_path / "sok.npz", **arrays)
    os.remove(tmp_path / "sok.json")
    report = json.loads((tmp_path / "ours.json").read_text())
    report["sections"]["dynamic/adagrad/hbm"]["losses"][3] += 0.5
    (tmp_path / "sok.json").write_text(json.dumps(report))
    different = compare(tmp_path)
    assert different.returncode == 1, different.stdout[-3000:]
    assert "DIFFERENT static/adam/distributed" in different.stdout
    assert "DIFFERENT dynamic/adagrad/hbm" in different.stdout


@keras_2_only  # SOK v2 scripts use Keras 2's legacy optimizers (tf_keras from 2.16 on)
@pytest.mark.skipif(not REFERENCE_PYTHON, reason="SOK_REFERENCE_PYTHON names no other line")
def test_the_script_gives_the_same_results_under_another_tensorflow_line(tmp_path):
    # compare.py reads the two runs as "sok" and "ours": here the reference line is "sok".
    run_script(tmp_path, "sok", python=REFERENCE_PYTHON, sections=CROSS_LINE_SECTIONS,
               TF_USE_LEGACY_KERAS="1")  # a TensorFlow from 2.16 on, with tf_keras
    run_script(tmp_path, "ours", sections=CROSS_LINE_SECTIONS)
    reports = [json.loads((tmp_path / f"{label}.json").read_text()) for label in ("sok", "ours")]
    lines = [report["versions"]["tensorflow"] for report in reports]
    assert lines[0] != lines[1], f"SOK_REFERENCE_PYTHON runs this TensorFlow too ({lines[0]})"
    trained = reports[1]["sections"]["dynamic/adam/hbm"]
    assert trained["ok"] and len(trained["losses"]) > 1, trained
    same = compare(tmp_path)
    assert same.returncode == 0, f"{lines}: {same.stdout[-3000:]}"
    assert "0 with unexpected differences, 0 with expected ones" in same.stdout, same.stdout
