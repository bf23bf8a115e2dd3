"""The README and docs/ say what is true: the quick start runs as written, every Python block
compiles, every path and make target they name exists, the DLRM guide covers every flag of
main.py, and no file of the repository tells development history."""
import ast
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, subprocess_env

DOCS = ["README.md", "CHANGELOG.md", "tutorials/DLRM_Benchmark/README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
    if name.endswith(".md"))
# What a build or a run makes (sok_checkpoint.json: the manifest sok.dump writes), named in
# the docs but not part of the repository.
MADE_BY_RUNS = ("benchmarks/out", "build/", "build-gpu", "sparse_operation_kit/lib", ".venv",
                "sok_checkpoint.json")
PATH_SUFFIXES = (".py", ".sh", ".md", ".json", ".log", ".cu", ".cc", ".h", ".cuh", ".txt", "/")


def read(relative):
    with open(os.path.join(ROOT, relative)) as handle:
        return handle.read()


def tracked_files():
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    return [name for name in listed.stdout.splitlines() if os.path.exists(os.path.join(ROOT, name))]


def code_blocks(text, language):
    """The bodies of the fenced blocks whose info string fully matches the regex language."""
    blocks, body, info = [], None, None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if body is None:
                body, info = [], line.strip()[3:].strip()
            else:
                if re.fullmatch(language, info):
                    blocks.append("\n".join(body) + "\n")
                body = None
        elif body is not None:
            body.append(line)
    return blocks


def test_readme_is_short():
    assert len(read("README.md").splitlines()) <= 250


def test_readme_quick_start_runs(tmp_path):
    readme = read("README.md")
    quick_start = readme.split("## Quick start", 1)[1]
    code = code_blocks(quick_start, "python")[0]
    script = tmp_path / "example.py"
    script.write_text(code + "\nprint('OK', a.shape, d.shape, rows.shape, interaction.shape)\n")
    result = subprocess.run([sys.executable, str(script)], env=subprocess_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK (3, 16) (3, 16) (2, 2, 16) (8, 367)" in result.stdout


@pytest.mark.parametrize("doc", DOCS)
def test_python_blocks_compile(doc):
    for block in code_blocks(read(doc), "python"):
        ast.parse(block)


def referenced_paths(text):
    """Repository paths a document names: in backticks (first word), as link targets, and as
    the words of its shell blocks (scripts run, files read)."""
    candidates = [span.split()[0] for span in re.findall(r"`([^`\n]+)`", text) if span.split()]
    candidates += re.findall(r"\]\(([^)#\s]+)", text)
    for block in code_blocks(text, "(?:bash|sh)?"):
        candidates += [word.strip("\"'") for line in block.splitlines()
                       if not line.lstrip().startswith("#")
                       for word in line.split("#")[0].split()
                       if "/" in word and "=" not in word and "$" not in word]
    for path in candidates:
        path = path.rstrip(".,:;")
        if (re.match(r"^[\w.\-/]+$", path) and path.endswith(PATH_SUFFIXES)
                and ("/" in path or path.count(".") == 1) and not path.startswith(("/", "http"))
                and not path.startswith(MADE_BY_RUNS) and "://" not in path):
            yield path


@pytest.mark.parametrize("doc", DOCS)
def test_named_paths_exist(doc):
    """Resolved from the document's folder, the repository root, or (for a bare file name)
    any tracked file of that name."""
    base = os.path.dirname(os.path.join(ROOT, doc))
    names = {os.path.basename(name) for name in tracked_files()}
    missing = [path for path in referenced_paths(read(doc))
               if not os.path.exists(os.path.join(base, path))
               and not os.path.exists(os.path.join(ROOT, path))
               and not ("/" not in path.rstrip("/") and path in names)]
    assert not missing, f"{doc} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_named_make_targets_exist(doc):
    targets = set(re.findall(r"^([\w.\-]+):", read("Makefile"), re.M))
    named = set(re.findall(r"`make ([\w.\-]+)", read(doc)))
    named |= {line.split()[1] for block in code_blocks(read(doc), "(?:bash|sh)?")
              for line in block.splitlines() if line.startswith("make ") and len(line.split()) > 1}
    assert named <= targets, f"{doc}: no such make targets {named - targets}"


def argparse_flags(relative):
    return set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", read(relative)))


def test_dlrm_guide_covers_every_flag_of_its_scripts():
    guide = read("tutorials/DLRM_Benchmark/README.md")
    scripts = ["tutorials/DLRM_Benchmark/main.py", "tutorials/DLRM_Benchmark/split_bin.py",
               "tutorials/DLRM_Benchmark/gen_data.py"]
    known = set().union(*(argparse_flags(script) for script in scripts))
    assert "--global_batch_size" in known  # the flags are found at all
    for script in scripts:
        undocumented = [flag for flag in argparse_flags(script)
                        if not re.search(re.escape(flag) + r"\b", guide)]
        assert not undocumented, f"{script}: flags missing from the guide: {undocumented}"
    named = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", guide))
    external = {"--no-build-isolation", "--gloo", "--no-deps"}
    assert named - external <= known, f"the guide names unknown flags {named - known - external}"


# Numbered work units, the machine a run happened on, and files outside the repository. The
# words are spelled by letter classes so that this file does not itself match what it forbids.
NUMBERED = ("[Ss]essio[n]", "[Rr]oun[d]", "[Ii]ssu[e]")
HISTORY = re.compile("|".join(
    [rf"\b{word} ?#?\d+" for word in NUMBERED]
    + [r"_roun[d]\d", r"\bthis V[M]\b", r"work perio[d]", r"BENCHMARK[S]\.md", r"\bSPE[C] section",
       r"\.\./share[d]/", r"\.ferr[y]/", r"results/previou[s]", r"results/kernel[s]"]))


def test_no_file_tells_development_history():
    """File names and text describe the product as it is (git log holds its history)."""
    offenders = []
    for name in tracked_files():
        if re.search(r"session|_round\d|round\d|_run\d|previous/|_commands\.md", name):
            offenders.append(name)
            continue
        if name == ".gitignore" or name.endswith(".log"):
            continue
        try:
            text = read(name)
        except UnicodeDecodeError:
            continue
        offenders += [f"{name}:{text[:match.start()].count(chr(10)) + 1}: {match.group(0)}"
                      for match in HISTORY.finditer(text)]
    assert not offenders, offenders


@pytest.mark.parametrize("doc", DOCS)
def test_named_python_modules_exist(doc):
    """`python -m sparse_operation_kit.x` in a document names a module of the package."""
    for module in set(re.findall(r"python3? -m (sparse_operation_kit[\w.]*)", read(doc))):
        path = os.path.join(ROOT, *module.split("."))
        assert os.path.exists(path + ".py") or os.path.isdir(path), f"{doc}: no module {module}"


def test_build_report_runs():
    """The install check the README gives: python -m sparse_operation_kit.info."""
    assert "python -m sparse_operation_kit.info" in read("README.md")
    result = subprocess.run([sys.executable, "-m", "sparse_operation_kit.info"],
                            env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^sparse_operation_kit: \d+\.\d+\.\d+$", result.stdout, re.M)
