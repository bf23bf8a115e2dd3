"""`sok.dump` / `sok.load`: SOK v2's checkpoint files (docs/api.md, Checkpoints).

Per variable, `<path>/<name>-key`, `<path>/<name>-weight` and, with an optimizer,
`<path>/<name>-<OptimizerName>-<slot>`, `<name>` the variable's name with punctuation
replaced by `_`. Each file is a 296-byte header (table name: 256 bytes UTF-8 right-justified
with spaces; file type: uint32 big-endian, key 0 / weight 1 / optimizer state 2; slot name:
32 bytes; dtype code: uint32 big-endian) followed by raw little-endian data: keys as a vector,
weights and slots as [n, dim] rows in the order of the keys. Static tables store global row
ids as keys. Every worker's rows are gathered and rank 0 writes (to temporary names, then
renames); loading keeps the rows this worker owns under the current worker count, so a dump
from N workers loads into M. A load checks every file before changing anything.
"""
import os
import re
import struct

import numpy as np
import tensorflow as tf

from sparse_operation_kit import communication
from sparse_operation_kit._ops import raw_ops
from sparse_operation_kit.dynamic_variable import DynamicVariable
from sparse_operation_kit.optimizer import dynamic_slot_names
from sparse_operation_kit.variables import DISTRIBUTED, Variable

HEADER_BYTES = 296
KEY, WEIGHT, OPTIMIZER_STATE = 0, 1, 2
DTYPE_CODES = {np.dtype(np.int32): 0, np.dtype(np.int64): 1, np.dtype(np.uint32): 2,
               np.dtype(np.uint64): 3, np.dtype(np.float16): 4, np.dtype(np.float32): 5,
               np.dtype(np.float64): 6}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


def file_name(variable):
    """The files' base name: the variable's name ("table:0" for static and dynamic tables, as
    SOK names them) with every other character than a letter or digit as "_"."""
    return re.sub(r"[^0-9A-Za-z]", "_", variable.name)


def _existing_base(path, variable):
    """Where the variable's files are: under file_name, or, for a dynamic table dumped before
    its name carried ":0", under its bare name."""
    base = os.path.join(path, file_name(variable))
    if isinstance(variable, DynamicVariable) and not os.path.exists(base + "-key"):
        legacy = os.path.join(path, re.sub(r"[^0-9A-Za-z]", "_", variable.name.split(":")[0]))
        if os.path.exists(legacy + "-key"):
            return legacy
    return base


def _header(table_name, file_type, slot_name, dtype):
    name = table_name.encode("utf-8")[-256:].rjust(256, b" ")
    slot = slot_name.encode("utf-8")[:32].ljust(32, b" ")
    return name + struct.pack(">I", file_type) + slot + struct.pack(">I", DTYPE_CODES[np.dtype(dtype)])


def _write(path, table_name, file_type, slot_name, array):
    array = np.ascontiguousarray(array)
    if np.dtype(array.dtype) not in DTYPE_CODES:  # bfloat16: no code; float32 holds it exactly
        array = array.astype(np.float32)
    partial = path + ".partial"
    with open(partial, "wb") as handle:
        handle.write(_header(table_name, file_type, slot_name, array.dtype))
        handle.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
    return partial


def _read(path, table_name, file_type, width):
    """The file's array after checking its header; ValueError names what is wrong."""
    if not os.path.exists(path):
        raise ValueError(f"checkpoint file {path} is missing")
    with open(path, "rb") as handle:
        data = handle.read()
    if len(data) < HEADER_BYTES:
        raise ValueError(f"{path} is truncated: {len(data)} bytes, shorter than its header")
    name = data[:256].decode("utf-8").strip()
    kind = struct.unpack(">I", data[256:260])[0]
    code = struct.unpack(">I", data[292:296])[0]
    # SOK leaves the name blank; ":0" is optional (dynamic tables were named without it).
    if name and name.split(":")[0] != table_name.split(":")[0]:
        raise ValueError(f"{path} holds table '{name}', expected '{table_name}'")
    if kind != file_type or code not in CODE_DTYPES:
        raise ValueError(f"{path} has file type {kind} / dtype code {code}, expected type "
                         f"{file_type}")
    dtype = CODE_DTYPES[code].newbyteorder("<")
    body = len(data) - HEADER_BYTES
    if body % (dtype.itemsize * width):
        raise ValueError(f"{path} is truncated or has the wrong width: {body} bytes of data "
                         f"for rows of {width} x {dtype.itemsize} bytes")
    return np.frombuffer(data[HEADER_BYTES:], dtype=dtype).reshape(-1, width) if width > 1 \
        else np.frombuffer(data[HEADER_BYTES:], dtype=dtype)


def _local_rows(variable, optimizer):
    """(keys, weights, {slot: rows}) held by this worker."""
    if isinstance(variable, DynamicVariable):
        keys, values, state = (t.numpy() for t in raw_ops.sok_dynamic_table_export(variable.handle))
        slots = {}
        names = dynamic_slot_names(optimizer) if optimizer else []
        dim = variable.dimension
        for i, slot in enumerate(names):
            if state.shape[1] >= (i + 1) * dim:
                slots[slot] = state[:, i * dim:(i + 1) * dim]
        for slot, table in _generic_slot_tables(optimizer, variable).items():
            slots[slot] = table.sparse_read(keys, insert=False).numpy()
        return keys.astype(np.int64), values, slots
    keys = variable.global_row_ids() if isinstance(variable, Variable) else \
        np.arange(variable.shape[0], dtype=np.int64)
    slots = {}
    inner = getattr(optimizer, "optimizer", optimizer)
    if inner is not None and hasattr(inner, "get_slot_names"):
        for slot in inner.get_slot_names():
            try:
                slots[slot] = inner.get_slot(variable, slot).numpy()
            except (KeyError, ValueError):
                continue
    return keys, variable.numpy(), slots


def _generic_slot_tables(optimizer, variable, create=False):
    """A dynamic table's slot tables under OptimizerWrapper's generic path, else {}."""
    if not hasattr(optimizer, "generic_slot_tables"):
        return {}
    return optimizer.generic_slot_tables(variable, create=create)


def _gather(array):
    if communication.num_workers() == 1:
        return array
    return communication._state.hvd.allgather(tf.constant(array)).numpy()


def _arguments(variables, optimizer):
    """SOK's forms: one variable or a list; an optimizer or a one-element list of one. Two
    tables whose files would share a name (unnamed tables are all "Variable:0") are refused."""
    variables = list(variables) if isinstance(variables, (list, tuple)) else [variables]
    if isinstance(optimizer, (list, tuple)):
        if len(optimizer) > 1:
            raise ValueError(f"give one optimizer (or a list of one), got {len(optimizer)}")
        optimizer = optimizer[0] if optimizer else None
    seen = {}
    for variable in variables:
        name = file_name(variable)
        if name in seen and seen[name] is not variable:
            raise ValueError(f"tables '{seen[name].name}' and '{variable.name}' would share the "
                             f"files {name}-*: give each table its own name")
        seen[name] = variable
    return variables, optimizer


def dump(path, variables, optimizer=None):
    """Writes every variable's rows (all workers' shards gathered, rank 0 writes)."""
    variables, optimizer = _arguments(variables, optimizer)
    os.makedirs(path, exist_ok=True)
    for variable in variables:
        keys, weights, slots = _local_rows(variable, optimizer)
        keys, weights = _gather(keys), _gather(weights)
        slots = {name: _gather(rows) for name, rows in sorted(slots.items())}
        if communication.rank() != 0:
            continue
        base = os.path.join(path, file_name(variable))
        partials = [(_write(base + "-key", variable.name, KEY, "", keys), base + "-key"),
                    (_write(base + "-weight", variable.name, WEIGHT, "", weights),
                     base + "-weight")]
        opt_name = type(getattr(optimizer, "optimizer", optimizer)).__name__
        for slot, rows in slots.items():
            target = f"{base}-{opt_name}-{slot}"
            partials.append((_write(target, variable.name, OPTIMIZER_STATE, slot, rows), target))
        for partial, target in partials:
            os.replace(partial, target)


def _owned(variable, keys):
    if isinstance(variable, DynamicVariable):
        return variable.owns(keys)
    placement = variable.placement if isinstance(variable, Variable) else None
    if placement is None:
        return np.ones(len(keys), bool)
    if placement.owner == DISTRIBUTED:
        return keys % communication.num_workers() == communication.rank()
    return np.full(len(keys), placement.owner == communication.rank())


def load(path, variables, optimizer=None):
    """Reads every variable's files, checks them all, then keeps the rows this worker owns."""
    variables, optimizer = _arguments(variables, optimizer)
    staged = []
    for variable in variables:
        base = _existing_base(path, variable)
        dim = int(variable.shape[1])
        keys = _read(base + "-key", variable.name, KEY, 1).astype(np.int64)
        weights = _read(base + "-weight", variable.name, WEIGHT, dim)
        if len(weights) != len(keys):
            raise ValueError(f"{base}-weight has {len(weights)} rows for {len(keys)} keys")
        if not isinstance(variable, DynamicVariable):
            rows = variable.global_rows if isinstance(variable, Variable) else variable.shape[0]
            if len(keys) and (keys.min() < 0 or keys.max() >= rows):
                raise ValueError(f"{base}-key has row ids outside [0, {rows}) of "
                                 f"'{variable.name}'")
        mine = _owned(variable, keys)
        slots = {}
        inner = getattr(optimizer, "optimizer", optimizer)
        generic = _generic_slot_tables(optimizer, variable, create=True) \
            if isinstance(variable, DynamicVariable) else {}
        for slot in _slot_names(variable, inner) + list(generic):
            target = f"{base}-{type(inner).__name__}-{slot}"
            if os.path.exists(target):
                rows = _read(target, variable.name, OPTIMIZER_STATE, dim)
                if len(rows) != len(keys):
                    raise ValueError(f"{target} has {len(rows)} rows for {len(keys)} keys")
                slots[slot] = np.array(rows[mine], np.float32)
        staged.append((variable, keys[mine], np.array(weights[mine], np.float32), slots))
    for variable, keys, weights, slots in staged:  # all checked: now change the tables
        if isinstance(variable, DynamicVariable):
            names = dynamic_slot_names(optimizer) if optimizer else []
            state = [slots[n] for n in names if n in slots]
            state = np.concatenate(state, axis=1) if state and len(state) == len(names) else \
                np.zeros([len(keys), 0], np.float32)
            raw_ops.sok_dynamic_table_import(variable.handle, keys, weights, state)
            for slot, table in _generic_slot_tables(optimizer, variable).items():
                if slot in slots:
                    table.assign(keys, slots[slot])
            continue
        local = np.searchsorted(variable.global_row_ids(), keys) \
            if isinstance(variable, Variable) else keys
        _assign_rows(variable, local, weights)
        inner = getattr(optimizer, "optimizer", optimizer)
        for slot, rows in slots.items():
            _assign_rows(inner.get_slot(variable, slot), local, rows)


def _slot_names(variable, optimizer):
    if optimizer is None:
        return []
    if isinstance(variable, DynamicVariable):
        return dynamic_slot_names(optimizer)
    return optimizer.get_slot_names() if hasattr(optimizer, "get_slot_names") else []


def _assign_rows(variable, local_rows, rows):
    value = variable.numpy()
    value[local_rows] = rows
    variable.assign(value)
