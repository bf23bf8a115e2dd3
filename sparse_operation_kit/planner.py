"""HugeCTR's embedding collection in Keras form, with embedding-table placement plans.

A plan file (HugeCTR's ETPS JSON) holds one list per worker of groups:
    {"local_embedding_list": [table ids on this worker],
     "global_embedding_list": [[...worker 0's ids...], [...worker 1's...], ...],
     "table_placement_strategy": "dp" | "mp",
     "num_sharding": N, "sharding_id": k}          (optional, "mp" only)
"dp" tables are replicated on every worker (their gradients are allreduced); an "mp" table in
one worker's list is localized there; an "mp" group with num_sharding equal to the worker
count row-shards its tables over every worker (sok's "distributed").

The planner is a chain of small stages (classify -> place -> check the budget -> to JSON) so
each can be replaced.
"""
import dataclasses
import enum
import json
import os

import tensorflow as tf

from sparse_operation_kit import communication
from sparse_operation_kit.dynamic_variable import DynamicVariable
from sparse_operation_kit.lookup import all2all_dense_embedding, lookup_sparse
from sparse_operation_kit.no_xla import NoXla
from sparse_operation_kit.variables import Variable

STRATEGIES = ("dp", "mp")
COMBINERS = ("sum", "mean", "concat")


class Kind(enum.Enum):
    DATA_PARALLEL = "dp"
    LOCALIZED = "localized"
    DISTRIBUTED = "distributed"


@dataclasses.dataclass(frozen=True)
class Placement:
    kind: Kind
    worker: int = -1  # the worker of a localized table


@dataclasses.dataclass
class EmbeddingTableConfig:
    """One table of the collection; max_vocabulary_size=-1 means a dynamic (hash) table."""

    id_space: int
    max_vocabulary_size: int
    ev_size: int
    min_key: int = 0
    max_key: int = -1
    opt_params: dict = None

    @property
    def dynamic(self):
        return self.max_vocabulary_size == -1

    def bytes(self):
        rows = self.max_vocabulary_size if not self.dynamic else max(1, self.max_key - self.min_key)
        return 4 * rows * self.ev_size


# --- plans ---------------------------------------------------------------------------------


def validate_plan(plan, num_workers, num_tables=None):
    """Checks a plan and returns {table id: Placement}. ValueError names the table and worker."""
    if not isinstance(plan, list) or len(plan) != num_workers:
        raise ValueError(f"the plan has {len(plan) if isinstance(plan, list) else 'no'} worker "
                         f"lists but there are {num_workers} workers")
    placements, where, global_lists = {}, {}, {}
    for worker, groups in enumerate(plan):
        for index, group in enumerate(groups):
            strategy = group.get("table_placement_strategy")
            if strategy not in STRATEGIES:
                raise ValueError(f"worker {worker} group {index}: unknown table_placement_strategy "
                                 f"{strategy!r}; valid strategies are {STRATEGIES}")
            local = list(group.get("local_embedding_list", []))
            global_list = group.get("global_embedding_list")
            if global_list is not None:
                if len(global_list) != num_workers or list(global_list[worker]) != local:
                    raise ValueError(f"worker {worker} group {index}: global_embedding_list "
                                     f"disagrees with its local_embedding_list {local}")
                key = (strategy, int(group.get("num_sharding", 1)))
                first = global_lists.setdefault(key, (worker, global_list))
                if [list(x) for x in first[1]] != [list(x) for x in global_list]:
                    raise ValueError(f"worker {worker} group {index}: global_embedding_list "
                                     f"differs from worker {first[0]}'s")
            sharding = int(group.get("num_sharding", 1))
            if strategy == "dp":
                placement = Placement(Kind.DATA_PARALLEL)
            elif sharding == 1:
                placement = Placement(Kind.LOCALIZED, worker)
            elif sharding == num_workers:
                if group.get("sharding_id", worker) != worker:
                    raise ValueError(f"worker {worker} group {index}: sharding_id "
                                     f"{group.get('sharding_id')} must be the worker's own index")
                placement = Placement(Kind.DISTRIBUTED)
            else:
                raise ValueError(f"worker {worker} group {index}: num_sharding {sharding} must be 1 "
                                 f"or the worker count {num_workers}")
            for table in local:
                if num_tables is not None and not 0 <= table < num_tables:
                    raise ValueError(f"worker {worker}: table {table} does not exist "
                                     f"({num_tables} tables)")
                previous = placements.get(table)
                replicated = placement.kind in (Kind.DATA_PARALLEL, Kind.DISTRIBUTED)
                if previous is not None and (previous != placement or not replicated):
                    raise ValueError(f"table {table} is placed two ways: {where[table]} and "
                                     f"{placement.kind.value} on worker {worker}")
                placements[table] = placement
                where.setdefault(table, f"{placement.kind.value} on worker {worker}")
    for table, placement in placements.items():
        if placement.kind in (Kind.DATA_PARALLEL, Kind.DISTRIBUTED):
            missing = [w for w, groups in enumerate(plan)
                       if not any(table in g.get("local_embedding_list", []) for g in groups)]
            if missing:
                raise ValueError(f"table {table} is {placement.kind.value} but missing from "
                                 f"workers {missing}")
    if num_tables is not None:
        unplaced = sorted(set(range(num_tables)) - set(placements))
        if unplaced:
            raise ValueError(f"tables {unplaced} are not placed by the plan")
    return placements


def read_plan(path):
    with open(path) as handle:
        return json.load(handle)


def write_plan(plan, path):
    """Writes to a temporary name, then renames: a reader never sees half a plan."""
    partial = path + ".partial"
    with open(partial, "w") as handle:
        json.dump(plan, handle, indent=2)
    os.replace(partial, path)


def _to_plan(placements, num_workers):
    """{table: Placement} -> the ETPS JSON structure, one group per kind and worker."""
    plan = [[] for _ in range(num_workers)]
    by_kind = {kind: sorted(t for t, p in placements.items() if p.kind == kind) for kind in Kind}
    localized = [[t for t in by_kind[Kind.LOCALIZED] if placements[t].worker == w]
                 for w in range(num_workers)]
    for worker in range(num_workers):
        if any(localized):
            plan[worker].append({"local_embedding_list": localized[worker],
                                 "global_embedding_list": localized,
                                 "table_placement_strategy": "mp"})
        if by_kind[Kind.DISTRIBUTED]:
            tables = by_kind[Kind.DISTRIBUTED]
            plan[worker].append({"local_embedding_list": tables,
                                 "global_embedding_list": [tables] * num_workers,
                                 "table_placement_strategy": "mp",
                                 "num_sharding": num_workers, "sharding_id": worker})
        if by_kind[Kind.DATA_PARALLEL]:
            tables = by_kind[Kind.DATA_PARALLEL]
            plan[worker].append({"local_embedding_list": tables,
                                 "global_embedding_list": [tables] * num_workers,
                                 "table_placement_strategy": "dp"})
    return plan


def classify(table_bytes, num_workers, budget_bytes, dp_bytes):
    """Stage 1: data parallel under dp_bytes; distributed when one worker could not hold the
    table within half its budget; localized otherwise."""
    kinds = {}
    for table, size in enumerate(table_bytes):
        if size <= dp_bytes:
            kinds[table] = Kind.DATA_PARALLEL
        elif num_workers > 1 and size > budget_bytes / 2:
            kinds[table] = Kind.DISTRIBUTED
        else:
            kinds[table] = Kind.LOCALIZED
    return kinds


def place_localized(kinds, table_bytes, num_workers):
    """Stage 2: localized tables, largest first, each on the least loaded worker."""
    load = [0] * num_workers
    placements = {}
    for table in sorted(kinds, key=lambda t: -table_bytes[t]):
        if kinds[table] != Kind.LOCALIZED:
            placements[table] = Placement(kinds[table])
            continue
        worker = min(range(num_workers), key=lambda w: (load[w], w))
        load[worker] += table_bytes[table]
        placements[table] = Placement(Kind.LOCALIZED, worker)
    return placements


def check_budget(placements, table_bytes, num_workers, budget_bytes):
    """Stage 3: every worker's share fits its memory budget."""
    for worker in range(num_workers):
        used = sum(size if p.kind == Kind.DATA_PARALLEL or
                   (p.kind == Kind.LOCALIZED and p.worker == worker)
                   else size / num_workers if p.kind == Kind.DISTRIBUTED else 0
                   for p, size in ((placements[t], table_bytes[t]) for t in placements))
        if used > budget_bytes:
            raise ValueError(f"worker {worker} needs {used / 2**20:.1f} MiB for its tables, over "
                             f"the {budget_bytes / 2**20:.1f} MiB budget")


def generate_plan(table_sizes, num_workers, budget_bytes=float("inf"), ev_size=128,
                  dp_rows=6000, preset=None):
    """A plan from table sizes (rows), worker count and a per-worker memory budget.

    preset: None (the stages above), "notebook_dp_mp" (HugeCTR notebook: tables of at most
    6000 rows data parallel, the others model parallel round-robin over workers), or
    "notebook_dp_sharded" (small tables data parallel, the others row-sharded everywhere).
    """
    table_bytes = [4 * rows * ev_size for rows in table_sizes]
    if preset == "notebook_dp_mp":
        big = [t for t, rows in enumerate(table_sizes) if rows > dp_rows]
        placements = {t: Placement(Kind.DATA_PARALLEL) for t, rows in enumerate(table_sizes)
                      if rows <= dp_rows}
        placements.update({t: Placement(Kind.LOCALIZED, i % num_workers) for i, t in enumerate(big)})
    elif preset == "notebook_dp_sharded":
        placements = {t: Placement(Kind.DATA_PARALLEL if rows <= dp_rows else Kind.DISTRIBUTED)
                      for t, rows in enumerate(table_sizes)}
    elif preset is None:
        kinds = classify(table_bytes, num_workers, budget_bytes, 4 * dp_rows * ev_size)
        placements = place_localized(kinds, table_bytes, num_workers)
    else:
        raise ValueError(f"unknown preset {preset!r}; valid presets are None, 'notebook_dp_mp', "
                         "'notebook_dp_sharded'")
    check_budget(placements, table_bytes, num_workers, budget_bytes)
    return _to_plan(placements, num_workers)


# --- the collection ------------------------------------------------------------------------


@dataclasses.dataclass
class _LookupSpec:
    table: EmbeddingTableConfig
    bottom_name: str
    top_name: str
    combiner: str


class EmbeddingPlanner:
    """Collects lookups, then builds the collection a plan file places."""

    def __init__(self):
        self._lookups = []

    def embedding_lookup(self, emb_table, bottom_name, top_name, combiner="sum"):
        if combiner not in COMBINERS:
            raise ValueError(f"lookup {top_name!r}: unknown combiner {combiner!r}; valid "
                             f"combiners are {COMBINERS}")
        if any(spec.top_name == top_name for spec in self._lookups):
            raise ValueError(f"top_name {top_name!r} is used twice")
        self._lookups.append(_LookupSpec(emb_table, bottom_name, top_name, combiner))

    def create_embedding_collection(self, plan_file):
        return EmbeddingCollection(self._lookups, read_plan(plan_file))


class EmbeddingCollection(NoXla, tf.keras.layers.Layer):
    """Takes {bottom_name: ids} and returns {top_name: embeddings}, all tables in one fused
    lookup. Ids: ragged / sparse [batch, None] for sum / mean; dense [batch, hotness] for
    concat ([batch, hotness * ev_size]). Data-parallel tables' gradients are summed over
    workers by `reduce_gradients` (`data_parallel_variables` lists those tables)."""

    def __init__(self, lookups, plan, **kwargs):
        super().__init__(**kwargs)
        communication._require_init()
        configs = []
        for spec in lookups:
            if all(spec.table is not c for c in configs):
                configs.append(spec.table)
        by_id = {c.id_space: c for c in configs}
        placements = validate_plan(plan, communication.num_workers())
        missing = sorted(set(by_id) - set(placements))
        if missing:
            raise ValueError(f"tables {missing} are looked up but not placed by the plan")
        self._specs = lookups
        self._tables = {}
        for table_id, config in by_id.items():
            placement = placements[table_id]
            self._tables[table_id] = self._build_table(table_id, config, placement)
        self.placements = {t: placements[t] for t in by_id}

    def _build_table(self, table_id, config, placement):
        initializer = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=table_id)
        name = f"{self.name}/table{table_id}"
        if placement.kind == Kind.DATA_PARALLEL:
            if config.dynamic:
                raise ValueError(f"table {table_id}: a dynamic table cannot be data parallel")
            return tf.Variable(initializer([config.max_vocabulary_size, config.ev_size]), name=name)
        mode = "distributed" if placement.kind == Kind.DISTRIBUTED else f"localized:{placement.worker}"
        if config.dynamic:
            return DynamicVariable(config.ev_size, initializer="uniform", name=name, mode=mode)
        full = initializer([config.max_vocabulary_size, config.ev_size])
        return Variable(full, mode=mode, name=name)

    @property
    def tables(self):
        return dict(self._tables)

    @property
    def data_parallel_variables(self):
        return [self._tables[t] for t, p in self.placements.items() if p.kind == Kind.DATA_PARALLEL]

    def reduce_gradients(self, grads_and_vars):
        """Sums the gradients of data-parallel tables over workers; others pass through."""
        replicated = {id(v) for v in self.data_parallel_variables}
        return [(communication.allreduce_sum(g) if id(v) in replicated and g is not None else g, v)
                for g, v in grads_and_vars]

    def call(self, inputs, training=None):
        training = True if training is None else bool(training)
        pooled = [s for s in self._specs if s.combiner != "concat"]
        outputs = {}
        if pooled:
            results = lookup_sparse([self._tables[s.table.id_space] for s in pooled],
                                    [inputs[s.bottom_name] for s in pooled],
                                    combiners=[s.combiner for s in pooled], training=training)
            outputs.update({s.top_name: r for s, r in zip(pooled, results)})
        for spec in self._specs:
            if spec.combiner == "concat":
                rows = all2all_dense_embedding(self._tables[spec.table.id_space],
                                               inputs[spec.bottom_name])
                outputs[spec.top_name] = tf.reshape(
                    rows, [tf.shape(rows)[0], rows.shape[1] * spec.table.ev_size])
        return outputs
