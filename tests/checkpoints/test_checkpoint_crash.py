"""A dump interrupted at any moment leaves a checkpoint that loads as one whole dump (the
previous or the new one, never a mixture) and whatever it left behind is removed by the next
dump. Interruptions are made at every file-system step of a dump, in this process (an
exception no handler catches, after a half-written file where the step writes one), in a
child process killed by SIGKILL, and on 2 Horovod workers with either worker dying."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import sparse_operation_kit as sok
from sparse_operation_kit import checkpoint
from conftest import ROOT, horovodrun, subprocess_env
from multiworker.crash_tables import count_dump_steps, fill, make_tables, values_held

KEYS = 2000


class Interrupted(BaseException):
    """Stands for the process dying: nothing in sok.dump handles it."""


def interrupt_at(monkeypatch, step_to_die):
    def die(step_name):
        raise Interrupted(step_name)
    return count_dump_steps(monkeypatch.setattr, step_to_die, die)


def restored_dump(path, tables, optimizer, keys=KEYS):
    """Loads `path` into tables first set to -1 and returns the one dump value restored
    (None when the load is refused); fails on a mixture of dumps."""
    fill(tables, optimizer, keys, -1.0)
    try:
        sok.load(str(path), tables, optimizer)
    except ValueError:
        return None
    held = values_held(tables, optimizer)
    rows = set().union(*(v for (_, kind), v in held.items() if kind == "rows"))
    state = set().union(*(v for (_, kind), v in held.items() if kind == "state"))
    assert len(rows) == 1 and state == {rows.pop() + 0.5}, held
    return float(min(state)) - 0.5


def leftovers(path):
    return sorted(n for n in os.listdir(path) if n.endswith((".partial", ".pending", ".tmp")))


@pytest.fixture(scope="module")
def crash_tables():
    return make_tables(KEYS)


BIG_KEYS = 200_000  # a dump of some 20 MB, so a kill at a random moment lands inside it


@pytest.fixture(scope="module")
def big_tables():
    return make_tables(BIG_KEYS)


def test_a_dump_interrupted_at_any_step_leaves_one_whole_dump(tmp_path, monkeypatch,
                                                               crash_tables):
    tables, optimizer = crash_tables
    with monkeypatch.context() as counting:
        steps = interrupt_at(counting, step_to_die=-1)
        fill(tables, optimizer, KEYS, 1.0)
        sok.dump(str(tmp_path / "count"), tables, optimizer)
        fill(tables, optimizer, KEYS, 2.0)
        steps[0] = 0
        sok.dump(str(tmp_path / "count"), tables, optimizer)
        total = steps[0]
    assert total >= 3 * len(tables) * 2  # every file written, then moved into place
    restored = []
    for step_to_die in range(1, total + 1):
        path = tmp_path / f"at_{step_to_die}"
        fill(tables, optimizer, KEYS, 1.0)
        sok.dump(str(path), tables, optimizer)
        fill(tables, optimizer, KEYS, 2.0)
        with monkeypatch.context() as dying:
            interrupt_at(dying, step_to_die)
            with pytest.raises(Interrupted):
                sok.dump(str(path), tables, optimizer)
        restored.append(restored_dump(path, tables, optimizer))
        # the next dump finishes or discards what was left, then holds only itself
        fill(tables, optimizer, KEYS, 3.0)
        sok.dump(str(path), tables, optimizer)
        assert leftovers(path) == [], (step_to_die, leftovers(path))
        assert restored_dump(path, tables, optimizer) == 3.0
    # the old dump until the journal is current, the new one from then on
    assert set(restored) == {1.0, 2.0}, restored
    switch = restored.index(2.0)
    assert restored == [1.0] * switch + [2.0] * (total - switch), restored


def test_a_dump_that_fails_keeps_the_previous_one_and_leaves_nothing(tmp_path, monkeypatch,
                                                                     crash_tables):
    tables, optimizer = crash_tables
    fill(tables, optimizer, KEYS, 1.0)
    sok.dump(str(tmp_path), tables, optimizer)
    before = sorted(os.listdir(tmp_path))
    fill(tables, optimizer, KEYS, 2.0)
    write_file, calls = checkpoint._write_file, [0]

    def disk_full(path, *args):
        calls[0] += 1
        if calls[0] == 5:
            raise OSError(28, "No space left on device", path)
        return write_file(path, *args)

    monkeypatch.setattr(checkpoint, "_write_file", disk_full)
    with pytest.raises(RuntimeError, match="sok.dump did not complete; the checkpoint's previous "
                                           "dump is unchanged: OSError: .*No space left"):
        sok.dump(str(tmp_path), tables, optimizer)
    assert sorted(os.listdir(tmp_path)) == before
    assert restored_dump(tmp_path, tables, optimizer) == 1.0


CHILD = """
import sys
import sparse_operation_kit as sok
sys.path.insert(0, {here!r})
from crash_tables import fill, make_tables
sok.init(comm_tool="single")
tables, optimizer = make_tables({keys})
fill(tables, optimizer, {keys}, 1.0)
sok.dump(sys.argv[1], tables, optimizer)
fill(tables, optimizer, {keys}, 2.0)
print("SECOND", flush=True)
sok.dump(sys.argv[1], tables, optimizer)
print("DONE", flush=True)
"""


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.4])
def test_a_dumping_process_killed_leaves_one_whole_dump(tmp_path, big_tables, delay):
    keys = BIG_KEYS
    script = CHILD.format(here=os.path.join(ROOT, "tests", "multiworker"), keys=keys)
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], env=subprocess_env(),
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "SECOND"
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    tables, optimizer = big_tables
    assert restored_dump(tmp_path, tables, optimizer, keys) in (1.0, 2.0)


FILES = 4 * 3  # four tables, each with keys, rows and Adagrad's accumulator


@pytest.mark.parametrize("dying_rank, step_to_die, expected", [
    (1, 3, 1.0),              # worker 1 dies while its rows are gathered
    (0, 2, 1.0),              # rank 0 dies writing the second file
    (0, FILES + 1, 1.0),      # ... with every file written, before the journal is current
    (0, FILES + 2, 2.0),      # ... after the journal is current, before a file is moved
])
def test_a_worker_dying_mid_dump_leaves_one_whole_dump(tmp_path, crash_tables, dying_rank,
                                                       step_to_die, expected):

    output = horovodrun("dump_interrupted.py", str(tmp_path), str(dying_rank), str(step_to_die),
                        expect_success=False)
    assert f"DYING rank={dying_rank}" in output, output[-3000:]
    tables, optimizer = crash_tables
    assert restored_dump(tmp_path, tables, optimizer) == expected
    fill(tables, optimizer, KEYS, 3.0)
    sok.dump(str(tmp_path), tables, optimizer)
    assert leftovers(tmp_path) == []
    assert restored_dump(tmp_path, tables, optimizer) == 3.0
