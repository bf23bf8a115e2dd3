"""The regression runner's verdicts, on synthetic result files."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))
import run  # noqa: E402


def test_verdicts(tmp_path):
    baselines = {"figures": {
        "up": {"file": "a", "path": ["x"], "baseline": 2.0, "tolerance": 0.1},
        "down": {"file": "a", "path": ["y"], "baseline": 2.0, "tolerance": 0.1},
        "same": {"file": "a", "path": ["z"], "baseline": 2.0, "tolerance": 0.1},
        "gone": {"file": "b", "path": ["x"], "baseline": 1.0, "tolerance": 0.1}}}
    (tmp_path / "a.json").write_text(json.dumps({"x": 2.5, "y": 1.5, "z": 2.1}))
    verdicts = {name: verdict for name, _, _, verdict in run.compare(baselines, str(tmp_path))}
    assert verdicts == {"up": "improved", "down": "degraded", "same": "balanced",
                        "gone": "missing"}


def test_committed_results_match_committed_baselines():
    here = os.path.dirname(run.__file__)
    with open(os.path.join(here, "baselines.json")) as handle:
        baselines = json.load(handle)
    rows = run.compare(baselines, os.path.join(here, "results"))
    assert all(verdict == "balanced" for *_, verdict in rows), rows
