"""The regression runner's verdicts, on synthetic result files."""
import json
import os
import sys

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import run  # noqa: E402


def test_verdicts(tmp_path):
    baselines = {"figures": {
        "up": {"file": "a", "path": ["x"], "baseline": 2.0, "tolerance": 0.1},
        "down": {"file": "a", "path": ["y"], "baseline": 2.0, "tolerance": 0.1},
        "same": {"file": "a", "path": ["z"], "baseline": 2.0, "tolerance": 0.1},
        "gone": {"file": "b", "path": ["x"], "baseline": 1.0, "tolerance": 0.1},
        "faster_ms": {"file": "a", "path": ["t"], "baseline": 1.0, "tolerance": 0.1,
                      "better": "lower"},
        "slower_ms": {"file": "a", "path": ["u"], "baseline": 1.0, "tolerance": 0.1,
                      "better": "lower"}}}
    (tmp_path / "a.json").write_text(json.dumps({"x": 2.5, "y": 1.5, "z": 2.1, "t": 0.8,
                                                 "u": 1.2}))
    verdicts = {name: verdict for name, _, _, verdict in run.compare(baselines, str(tmp_path))}
    assert verdicts == {"up": "improved", "down": "degraded", "same": "balanced",
                        "gone": "not run", "faster_ms": "improved", "slower_ms": "degraded"}


def test_publish_copies_results_into_the_committed_folder(tmp_path, monkeypatch):
    published = tmp_path / "results"
    published.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "c9_new.json").write_text(json.dumps({"speedup": 3.0}))
    (out / "c9_new.log").write_text("log")
    (out / "scratch.txt").write_text("not a result")
    monkeypatch.setattr(run.provenance, "PUBLISHED", str(published))
    assert run.publish(str(out)) == ["c9_new.json", "c9_new.log"]
    assert json.loads((published / "c9_new.json").read_text()) == {"speedup": 3.0}
    assert not (published / "scratch.txt").exists()


def test_every_committed_result_says_how_it_was_made():
    here = os.path.dirname(run.__file__)
    results = os.path.join(here, "results")
    for name in sorted(os.listdir(results)):
        if name.endswith(".json"):
            with open(os.path.join(results, name)) as handle:
                made = json.load(handle).get("provenance", {})
            assert made.get("device") and made.get("versions") and made.get("command"), name
            programs = [word for word in made["command"].split()
                        if word.startswith(("benchmarks/", "kit_src/", "tests/"))]
            assert programs, made
            for program in programs:
                assert os.path.exists(os.path.join(os.path.dirname(here), program)), made


def test_committed_results_match_committed_baselines():
    here = os.path.dirname(run.__file__)
    with open(os.path.join(here, "baselines.json")) as handle:
        baselines = json.load(handle)
    rows = run.compare(baselines, os.path.join(here, "results"))
    assert all(verdict == "balanced" for *_, verdict in rows), rows
