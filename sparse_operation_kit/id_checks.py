"""How lookups check ids against their tables, and which gradient indices are checked.

The mode (`set_id_check`) decides whether a one-id lookup on a GPU waits for the device's
check; the lookups mark the index tensors of the gradients they build from checked ids, and
the optimizer reads the mark (`indices_are_checked`) to skip checking them again.
"""
import weakref

_ID_CHECK_MODES = ("strict", "deferred")
_mode = {"mode": "strict"}


def set_id_check(mode):
    """How a one-id lookup on a GPU reports an id out of its table's range (the one-id path:
    one worker, ids whose type states one id a sample, as `RaggedTensor.from_tensor` of
    [batch, 1] ids; the CPU always fails at once, and other paths stay strict).

    "strict" (the default): the lookup's step fails with InvalidArgumentError naming the table,
    the id and the range, and nothing is updated; the step waits once for the GPU to reach
    the check (about 0.15 ms a step at T3's shape on an H100).
    "deferred": the step does not wait. Its update lands nowhere (its gradient ids become -1 on
    the GPU) and the same InvalidArgumentError is raised by a later one-id lookup on the GPU
    in the process, once the GPU has passed the check: normally the next step or the next
    iteration of a tf.function's loop. From when the error is found until it is raised, no
    one-id step on the GPU updates anything (the step that raises it may still apply its own
    update, whose ids were in range). Takes effect for functions traced afterwards.
    """
    if mode not in _ID_CHECK_MODES:
        raise ValueError(f"unknown id check mode {mode!r}; valid modes are {_ID_CHECK_MODES}")
    _mode["mode"] = mode


def mode():
    """The id check mode functions traced now take: "strict" or "deferred"."""
    return _mode["mode"]


# Index tensors of static tables' gradients built here from ids already checked against the
# tables' rows (by Sok>PartitionKeys or Sok>CheckGatheredIds, which the gradients wait for):
# the optimizer need not check them again, which on the GPU would wait for the stream.
# Keyed by id(), the tensor held weakly.
_CHECKED_INDICES = weakref.WeakValueDictionary()


def checked(indices):
    """Marks `indices` (a gradient's, built from ids already checked) for the optimizer."""
    _CHECKED_INDICES[id(indices)] = indices
    return indices


def indices_are_checked(indices):
    """Whether `indices` are a sok table gradient's, built from ids checked in its lookup."""
    return _CHECKED_INDICES.get(id(indices)) is indices
