"""`sok.dump` / `sok.load`: SOK v2's checkpoint files (docs/api.md, Checkpoints).

Per variable, `<path>/<name>-key`, `<path>/<name>-weight` and, with an optimizer,
`<path>/<name>-<OptimizerName>-<slot>`, `<name>` the variable's name with punctuation
replaced by `_`. Each file is a 296-byte header (table name: 256 bytes UTF-8 right-justified
with spaces; file type: uint32 big-endian, key 0 / weight 1 / optimizer state 2; slot name:
32 bytes; dtype code: uint32 big-endian) followed by raw little-endian data: keys as a vector,
weights and slots as [n, dim] rows in the order of the keys. Static tables store global row
ids as keys. Tables of one list that share a name (unnamed tables are all "Variable:0") are
told apart by their place among them: files `<name>.<k>-*`, header name `<name>#<k>`.

Every worker's rows are gathered and rank 0 writes; loading keeps the rows this worker owns
under the current worker count, so a dump from N workers loads into M. A load checks every
file before changing anything. File names come from rank 0's table names, so workers that
named their unnamed tables differently still agree.

A dump is all-or-nothing (`sok_checkpoint.json`, the manifest, records each file's size and
CRC-32): the new files are written beside the old ones as `*.partial`, then a journal naming
them and the new manifest is made current by one atomic rename; only after that are the
files moved into place and the journal renamed to the manifest. A crash before the journal
leaves the previous dump whole; a crash after it leaves the new dump whole, in its partial
files and the ones already moved, which `load` reads through the journal and the next `dump`
finishes. Whatever a crashed dump left is removed by the next one.
"""
import json
import os
import re
import struct
import uuid
import zlib
from collections import Counter

import numpy as np
import tensorflow as tf

from sparse_operation_kit import communication
from sparse_operation_kit._ops import raw_ops
from sparse_operation_kit.dynamic_variable import DynamicVariable
from sparse_operation_kit.optimizer import dynamic_slot_names, shown_slot_names, static_slots
from sparse_operation_kit.variables import Variable

HEADER_BYTES = 296
KEY, WEIGHT, OPTIMIZER_STATE = 0, 1, 2
DTYPE_CODES = {np.dtype(np.int32): 0, np.dtype(np.int64): 1, np.dtype(np.uint32): 2,
               np.dtype(np.uint64): 3, np.dtype(np.float16): 4, np.dtype(np.float32): 5,
               np.dtype(np.float64): 6}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
MANIFEST = "sok_checkpoint.json"
JOURNAL = MANIFEST + ".pending"
MANIFEST_FORMAT = 1
# What an interrupted dump leaves: partial files, and a journal not yet made current.
_LEFTOVER = re.compile(r"(.+-.+\.partial|" + re.escape(JOURNAL) + r"\.tmp)$")


def _clean(name):
    """A file base name from a table name ("table:0", as SOK names tables): every character
    other than a letter or digit as "_"."""
    return re.sub(r"[^0-9A-Za-z]", "_", name)


class _Table:
    """One table of a dump or load: its files' base name and the name its headers carry."""

    def __init__(self, variable, name, copy, copies):
        self.variable, self.name, self.copies = variable, name, copies
        self.base = _clean(name) if copies == 1 else f"{_clean(name)}.{copy}"
        self.header_name = name if copies == 1 else f"{name}#{copy}"


def _signature(variable):
    kind = "dynamic" if isinstance(variable, DynamicVariable) else "static"
    return variable.name, kind, int(variable.shape[1])


def _tables(variables):
    """The list's tables named as rank 0 names them (every worker calls this together); a list
    whose tables differ between workers is refused on every worker."""
    signatures = [_signature(v) for v in variables]
    if communication.num_workers() > 1:
        every = communication._state.hvd.allgather_object(signatures)
        shapes = [[s[1:] for s in worker] for worker in every]
        if any(shape != shapes[0] for shape in shapes):
            raise ValueError(f"sok.dump / sok.load: the workers gave different tables (kind and "
                             f"dimension by position, per worker: {shapes})")
        signatures = every[0]
    names = [s[0] for s in signatures]
    copies, seen = Counter(names), Counter()
    tables = []
    for variable, name in zip(variables, names):
        tables.append(_Table(variable, name, seen[name], copies[name]))
        seen[name] += 1
    return tables


def _header(table_name, file_type, slot_name, dtype):
    name = table_name.encode("utf-8")[-256:].rjust(256, b" ")
    slot = slot_name.encode("utf-8")[:32].ljust(32, b" ")
    return name + struct.pack(">I", file_type) + slot + struct.pack(">I", DTYPE_CODES[np.dtype(dtype)])


def _fsync_directory(path):
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_file(path, header_name, file_type, slot_name, array):
    """Writes header and rows to `path`, synced to disk; returns {bytes, crc32}."""
    array = np.ascontiguousarray(array)
    if np.dtype(array.dtype) not in DTYPE_CODES:  # bfloat16: no code; float32 holds it exactly
        array = array.astype(np.float32)
    header = _header(header_name, file_type, slot_name, array.dtype)
    body = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    with open(path, "wb") as handle:
        handle.write(header)
        handle.write(body)
        handle.flush()
        os.fsync(handle.fileno())
    return {"bytes": len(header) + len(body), "crc32": zlib.crc32(body, zlib.crc32(header))}


def _write_json(path, document):
    """Writes `document` to `path` atomically: a synced temporary file renamed over it."""
    temporary = path + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(document, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    _fsync_directory(os.path.dirname(path) or ".")


def _read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError) as error:
        raise ValueError(f"checkpoint manifest {path} cannot be read: {error}") from None


class _Checkpoint:
    """A folder's current dump as its manifest (or, after a dump interrupted once its journal
    was current, its journal) describes it: which files belong to which table, their sizes
    and CRCs, and where each one's bytes are now. Folders without a manifest (SOK's dumps)
    have no entries and their files are read as they are."""

    def __init__(self, path):
        self.path = path
        self.tables, self.moves = {}, {}
        journal, manifest = os.path.join(path, JOURNAL), os.path.join(path, MANIFEST)
        if os.path.exists(journal):
            document = _read_json(journal)
            self.moves = {target: partial for partial, target in document["moves"]}
        elif os.path.exists(manifest):
            document = _read_json(manifest)
        else:
            return
        if document.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"checkpoint manifest in {path} has format "
                             f"{document.get('format')}, this version reads {MANIFEST_FORMAT}")
        self.tables = document["tables"]

    def location(self, file):
        """Where `file`'s bytes are: its partial file while a journal has not moved it."""
        partial = self.moves.get(file)
        if partial and os.path.exists(os.path.join(self.path, partial)):
            return os.path.join(self.path, partial)
        return os.path.join(self.path, file)

    def entry(self, table):
        """The manifest's record of `table`, after checking that the list given has as many
        tables of its name as the dumped list had (they are told apart by position)."""
        named = [e for e in self.tables.values() if e["name"] == table.name]
        if named and all(e["copies"] != table.copies for e in named):
            raise ValueError(
                f"the checkpoint in {self.path} holds {named[0]['copies']} table(s) named "
                f"'{table.name}', told apart by their position in the dumped list, and "
                f"{table.copies} are given: load the list that was dumped")
        return self.tables.get(table.base)


def _read(checkpoint, entry, file, table_name, file_type, width):
    """The file's array after checking its size and CRC (when the manifest records it) and its
    header; ValueError names what is wrong."""
    path = checkpoint.location(file)
    if not os.path.exists(path):
        raise ValueError(f"checkpoint file {os.path.join(checkpoint.path, file)} is missing")
    with open(path, "rb") as handle:
        data = handle.read()
    recorded = entry["files"].get(file) if entry else None
    if recorded and (len(data) != recorded["bytes"] or zlib.crc32(data) != recorded["crc32"]):
        raise ValueError(f"{path} is not the file its dump wrote ({len(data)} bytes, "
                         f"{recorded['bytes']} recorded, or its CRC differs): the checkpoint "
                         "was changed or damaged after it was written")
    if len(data) < HEADER_BYTES:
        raise ValueError(f"{path} is truncated: {len(data)} bytes, shorter than its header")
    name = data[:256].decode("utf-8").strip()
    kind = struct.unpack(">I", data[256:260])[0]
    code = struct.unpack(">I", data[292:296])[0]
    # SOK leaves the name blank; ":0" is optional (dynamic tables were named without it).
    if name and (name != table_name if "#" in table_name + name else
                 name.split(":")[0] != table_name.split(":")[0]):
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
        shown = shown_slot_names(optimizer) if optimizer else []
        for i, slot in enumerate(names):
            if slot in shown and state.shape[1] >= (i + 1) * dim:
                slots[slot] = state[:, i * dim:(i + 1) * dim]
        for slot, table in _generic_slot_tables(optimizer, variable).items():
            slots[slot] = table.sparse_read(keys, insert=False).numpy()
        return keys.astype(np.int64), values, slots
    keys = variable.global_row_ids() if isinstance(variable, Variable) else \
        np.arange(variable.shape[0], dtype=np.int64)
    slots = {name: slot.numpy() for name, slot in static_slots(optimizer, variable).items()} \
        if optimizer is not None else {}
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
    """SOK's forms: one variable or a list; an optimizer or a one-element list of one."""
    variables = list(variables) if isinstance(variables, (list, tuple)) else [variables]
    if isinstance(optimizer, (list, tuple)):
        if len(optimizer) > 1:
            raise ValueError(f"give one optimizer (or a list of one), got {len(optimizer)}")
        optimizer = optimizer[0] if optimizer else None
    return variables, optimizer


def _optimizer_name(optimizer):
    return type(getattr(optimizer, "optimizer", optimizer)).__name__


class _DumpWriter:
    """Rank 0's side of a dump: files written as partials, then made current at once."""

    def __init__(self, path):
        self.path = path
        os.makedirs(path, exist_ok=True)
        finish_interrupted_dump(path)
        self.previous = _Checkpoint(path).tables
        self.dump_id = uuid.uuid4().hex
        self.tables, self.moves = {}, []

    def add(self, table, optimizer, keys, weights, slots):
        files = {}
        contents = [(f"{table.base}-key", KEY, "", keys),
                    (f"{table.base}-weight", WEIGHT, "", weights)]
        contents += [(f"{table.base}-{_optimizer_name(optimizer)}-{slot}", OPTIMIZER_STATE, slot,
                      rows) for slot, rows in slots.items()]
        for file, file_type, slot, array in contents:
            partial = f"{file}.{self.dump_id}.partial"
            files[file] = _write_file(os.path.join(self.path, partial), table.header_name,
                                      file_type, slot, array)
            self.moves.append([partial, file])
        kind, dimension = _signature(table.variable)[1:]
        self.tables[table.base] = {"name": table.name, "copies": table.copies, "kind": kind,
                                   "dimension": dimension, "rows": int(len(keys)),
                                   "dump": self.dump_id, "files": files}

    def commit(self):
        """The journal's rename is the moment the new dump replaces the previous one."""
        _fsync_directory(self.path)
        tables = {base: entry for base, entry in self.previous.items()
                  if base not in self.tables}
        tables.update(self.tables)
        stale = sorted(file for base in self.tables for file in
                       self.previous.get(base, {}).get("files", {})
                       if file not in self.tables[base]["files"])
        _write_json(os.path.join(self.path, JOURNAL),
                    {"format": MANIFEST_FORMAT, "dump": self.dump_id, "tables": tables,
                     "moves": self.moves, "stale": stale})
        finish_interrupted_dump(self.path)

    def abandon(self):
        for partial, _ in self.moves:
            try:
                os.remove(os.path.join(self.path, partial))
            except FileNotFoundError:
                pass


def finish_interrupted_dump(path):
    """Completes a dump whose journal is current (moves its partial files into place, removes
    the files it replaced that it does not have, makes the journal the manifest) and removes
    what a dump interrupted before its journal left behind."""
    journal = os.path.join(path, JOURNAL)
    if os.path.exists(journal):
        document = _read_json(journal)
        for partial, target in document["moves"]:
            source = os.path.join(path, partial)
            if os.path.exists(source):
                os.replace(source, os.path.join(path, target))
        for file in document["stale"]:
            try:
                os.remove(os.path.join(path, file))
            except FileNotFoundError:
                pass
        _fsync_directory(path)
        os.replace(journal, os.path.join(path, MANIFEST))
        _fsync_directory(path)
    for name in os.listdir(path):
        if _LEFTOVER.fullmatch(name):
            os.remove(os.path.join(path, name))


def _outcome(failure):
    """Every worker returns once rank 0 has finished; rank 0's error is raised on each."""
    if communication.num_workers() > 1:
        failure = communication._state.hvd.broadcast_object(failure, root_rank=0)
    if failure:
        raise RuntimeError(f"sok.dump did not complete; the checkpoint's previous dump is "
                           f"unchanged: {failure}")


def dump(path, variables, optimizer=None):
    """Writes every variable's rows (all workers' shards gathered, rank 0 writes); every worker
    returns when the files are in place."""
    variables, optimizer = _arguments(variables, optimizer)
    tables = _tables(variables)
    writer, failure = None, None
    if communication.rank() == 0:
        try:
            writer = _DumpWriter(path)
        except OSError as error:
            failure = f"{type(error).__name__}: {error}"
    for table in tables:  # every worker takes part in every gather, even after a failure
        keys, weights, slots = _local_rows(table.variable, optimizer)
        keys, weights = _gather(keys), _gather(weights)
        slots = {name: _gather(rows) for name, rows in sorted(slots.items())}
        if writer is not None and failure is None:
            try:
                writer.add(table, optimizer, keys, weights, slots)
            except OSError as error:
                failure = f"{type(error).__name__}: {error}"
    if writer is not None and failure is None:
        try:
            writer.commit()
        except OSError as error:
            failure = f"{type(error).__name__}: {error}"
    if writer is not None and failure is not None:
        writer.abandon()
    _outcome(failure)


def _owned(variable, keys):
    if isinstance(variable, DynamicVariable):
        return variable.owns(keys)
    placement = variable.placement if isinstance(variable, Variable) else None
    if placement is None:
        return np.ones(len(keys), bool)
    return placement.owner_of(keys) == communication.rank()


def _existing_base(checkpoint, table, entry):
    """Where a table's files are: its base, or, for a dynamic table dumped without a manifest
    before its name carried ":0", its bare name."""
    if entry is not None or not isinstance(table.variable, DynamicVariable):
        return table.base
    if not os.path.exists(os.path.join(checkpoint.path, table.base + "-key")):
        legacy = _clean(table.name.split(":")[0])
        if os.path.exists(os.path.join(checkpoint.path, legacy + "-key")):
            return legacy
    return table.base


def _stage(checkpoint, table, optimizer):
    """Reads and checks one table's files: (variable, owned keys, weights, {slot: rows})."""
    variable = table.variable
    entry = checkpoint.entry(table)
    base = _existing_base(checkpoint, table, entry)
    dim = int(variable.shape[1])
    if entry is not None and (entry["kind"], entry["dimension"]) != _signature(variable)[1:]:
        raise ValueError(f"the checkpoint's '{entry['name']}' ({base}) is a {entry['kind']} "
                         f"table of dimension {entry['dimension']}; it is loaded into a "
                         f"{_signature(variable)[1]} table of dimension {dim}")
    name = table.header_name
    keys = _read(checkpoint, entry, base + "-key", name, KEY, 1).astype(np.int64)
    weights = _read(checkpoint, entry, base + "-weight", name, WEIGHT, dim)
    if len(weights) != len(keys):
        raise ValueError(f"{base}-weight has {len(weights)} rows for {len(keys)} keys")
    if not isinstance(variable, DynamicVariable):
        rows = variable.global_rows if isinstance(variable, Variable) else variable.shape[0]
        if len(keys) and (keys.min() < 0 or keys.max() >= rows):
            raise ValueError(f"{base}-key has row ids outside [0, {rows}) of '{variable.name}'")
    mine = _owned(variable, keys)
    slots = {}
    inner = getattr(optimizer, "optimizer", optimizer)
    generic = _generic_slot_tables(optimizer, variable, create=True) \
        if isinstance(variable, DynamicVariable) else {}
    saved_state = [f for f in os.listdir(checkpoint.path)
                   if f.startswith(f"{base}-{type(inner).__name__}-")] if inner else []
    for slot in _slot_names(variable, inner, saved_state) + list(generic):
        file = f"{base}-{type(inner).__name__}-{slot}"
        listed = entry is None or file in entry["files"]  # a manifest names its dump's files
        if listed and os.path.exists(checkpoint.location(file)):
            rows = _read(checkpoint, entry, file, name, OPTIMIZER_STATE, dim)
            if len(rows) != len(keys):
                raise ValueError(f"{file} has {len(rows)} rows for {len(keys)} keys")
            slots[slot] = np.array(rows[mine], np.float32)
    return variable, keys[mine], np.array(weights[mine], np.float32), slots


def load(path, variables, optimizer=None):
    """Reads every variable's files, checks them all, then keeps the rows this worker owns."""
    variables, optimizer = _arguments(variables, optimizer)
    tables = _tables(variables)
    checkpoint = _Checkpoint(path)
    staged = [_stage(checkpoint, table, optimizer) for table in tables]
    for variable, keys, weights, slots in staged:  # all checked: now change the tables
        if isinstance(variable, DynamicVariable):
            names = dynamic_slot_names(optimizer) if optimizer else []
            shown = shown_slot_names(optimizer) if optimizer else []
            # a column no slot shows (RMSprop's momentum at momentum 0) is zeros
            state = [slots.get(n, np.zeros_like(weights) if n not in shown else None)
                     for n in names]
            state = np.concatenate(state, axis=1) if names and all(
                part is not None for part in state) else np.zeros([len(keys), 0], np.float32)
            raw_ops.sok_dynamic_table_import(variable.handle, keys, weights, state)
            for slot, table in _generic_slot_tables(optimizer, variable).items():
                if slot in slots:
                    table.assign(keys, slots[slot])
            continue
        local = np.searchsorted(variable.global_row_ids(), keys) \
            if isinstance(variable, Variable) else keys
        _assign_rows(variable, local, weights)
        held = static_slots(optimizer, variable) if slots else {}
        for slot, rows in slots.items():
            _assign_rows(held[slot], local, rows)


def _slot_names(variable, optimizer, saved_state):
    if optimizer is None:
        return []
    if isinstance(variable, DynamicVariable):
        return shown_slot_names(optimizer)
    if hasattr(optimizer, "get_slot_names"):
        return optimizer.get_slot_names()
    if saved_state and hasattr(optimizer, "build") and not getattr(optimizer, "built", True):
        raise ValueError(
            f"{type(optimizer).__name__} is not built yet, so it keeps no state for "
            f"{variable.name} to load into: build it first (optimizer.build(variables), or "
            f"one training step) to load {saved_state}, or load without the optimizer")
    return list(static_slots(optimizer, variable))


def _assign_rows(variable, local_rows, rows):
    value = variable.numpy()
    value[local_rows] = rows
    variable.assign(value)
