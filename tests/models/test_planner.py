"""Placement plans: generation, validation errors, the embedding collection (one worker)."""
import json

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.planner import Kind

NOTEBOOK = [203931, 18598, 14092, 7012, 18977, 4, 6385, 1245, 49, 186213, 71328, 67288, 11, 2168,
            7338, 61, 4, 932, 15, 204515, 141526, 199433, 60919, 9137, 71, 34]


@pytest.mark.parametrize("workers", [1, 2, 8])
@pytest.mark.parametrize("preset", [None, "notebook_dp_mp", "notebook_dp_sharded"])
def test_generated_plans_validate_and_place_every_table_once(workers, preset, tmp_path):
    plan = sok.generate_plan(NOTEBOOK, workers, budget_bytes=2 << 30, preset=preset)
    path = str(tmp_path / "plan.json")
    sok.write_plan(plan, path)
    placements = sok.validate_plan(sok.read_plan(path), workers, num_tables=len(NOTEBOOK))
    assert sorted(placements) == list(range(len(NOTEBOOK)))
    for table, rows in enumerate(NOTEBOOK):
        if rows <= 6000:
            assert placements[table].kind == Kind.DATA_PARALLEL
    localized = [t for t, p in placements.items() if p.kind == Kind.LOCALIZED]
    for table in localized:  # on exactly one worker
        owners = [w for w, groups in enumerate(plan) for g in groups
                  if g["table_placement_strategy"] == "mp" and table in g["local_embedding_list"]]
        assert owners == [placements[table].worker]


def test_default_planner_balances_localized_tables_and_shards_large_ones():
    sizes = [1_000_000, 900_000, 50_000, 40_000, 30_000, 20_000, 100]
    plan = sok.generate_plan(sizes, 2, budget_bytes=600 << 20)
    placements = sok.validate_plan(plan, 2, len(sizes))
    kinds = [placements[t].kind for t in range(len(sizes))]
    assert kinds[:2] == [Kind.DISTRIBUTED] * 2 and kinds[-1] == Kind.DATA_PARALLEL
    load = [sum(sizes[t] for t, p in placements.items()
                if p.kind == Kind.LOCALIZED and p.worker == w) for w in range(2)]
    assert load == [70_000, 70_000]


def test_budget_too_small():
    with pytest.raises(ValueError, match="worker 0 needs .* MiB for its tables, over the 1.0 MiB"):
        sok.generate_plan(NOTEBOOK, 2, budget_bytes=1 << 20)


def plan_for(groups_per_worker):
    return [list(groups) for groups in groups_per_worker]


@pytest.mark.parametrize("plan, message", [
    ([[{"local_embedding_list": [0], "table_placement_strategy": "mp"}]],
     "the plan has 1 worker lists but there are 2 workers"),
    ([[{"local_embedding_list": [0], "table_placement_strategy": "pp"}], []],
     "worker 0 group 0: unknown table_placement_strategy 'pp'"),
    ([[{"local_embedding_list": [0], "table_placement_strategy": "mp"}],
      [{"local_embedding_list": [0], "table_placement_strategy": "dp"}]],
     "table 0 is placed two ways: localized on worker 0 and dp on worker 1"),
    ([[{"local_embedding_list": [0], "table_placement_strategy": "mp"}],
      [{"local_embedding_list": [0], "table_placement_strategy": "mp"}]],
     "table 0 is placed two ways"),
    ([[{"local_embedding_list": [0], "global_embedding_list": [[0], [1]],
        "table_placement_strategy": "mp"}],
      [{"local_embedding_list": [1], "global_embedding_list": [[0], [2]],
        "table_placement_strategy": "mp"}]],
     "worker 1 group 0: global_embedding_list disagrees"),
    ([[{"local_embedding_list": [0], "global_embedding_list": [[0], [1]],
        "table_placement_strategy": "mp"}],
      [{"local_embedding_list": [1], "global_embedding_list": [[0, 2], [1]],
        "table_placement_strategy": "mp"}]],
     "worker 1 group 0: global_embedding_list differs from worker 0's"),
    ([[{"local_embedding_list": [0], "table_placement_strategy": "dp"}], []],
     "table 0 is dp but missing from workers \\[1\\]"),
    ([[{"local_embedding_list": [0], "table_placement_strategy": "mp", "num_sharding": 3}], []],
     "num_sharding 3 must be 1 or the worker count 2"),
    ([[{"local_embedding_list": [5], "table_placement_strategy": "mp"}], []],
     "worker 0: table 5 does not exist"),
    ([[{"local_embedding_list": [0], "table_placement_strategy": "mp"}], []],
     "tables \\[1\\] are not placed by the plan"),
])
def test_invalid_plans(plan, message):
    with pytest.raises(ValueError, match=message):
        sok.validate_plan(plan, 2, num_tables=2)


def test_collection_matches_tf_reference(tmp_path):
    configs = [sok.EmbeddingTableConfig(i, rows, 4) for i, rows in enumerate([50, 5000, 20])]
    dynamic = sok.EmbeddingTableConfig(3, -1, 4)
    planner = sok.EmbeddingPlanner()
    planner.embedding_lookup(configs[0], "a", "out_a", "sum")
    planner.embedding_lookup(configs[1], "b", "out_b", "mean")
    planner.embedding_lookup(configs[2], "c", "out_c", "concat")
    planner.embedding_lookup(configs[0], "a2", "out_a2", "mean")  # shares table 0
    planner.embedding_lookup(dynamic, "d", "out_d", "sum")
    plan = sok.generate_plan([50, 5000, 20, 1000], 1, dp_rows=30)
    path = str(tmp_path / "plan.json")
    sok.write_plan(plan, path)
    collection = planner.create_embedding_collection(path)
    assert collection.placements[2].kind == Kind.DATA_PARALLEL
    assert collection.supports_jit is False  # Keras 3 never compiles its model with XLA
    rng = np.random.default_rng(0)
    ids = {name: tf.RaggedTensor.from_row_lengths(
        tf.constant(rng.integers(0, vocab, size=9), tf.int64), [3, 0, 4, 2])
        for name, vocab in [("a", 50), ("b", 5000), ("a2", 50), ("d", 1 << 40)]}
    ids["c"] = tf.constant(rng.integers(0, 20, size=[4, 2]), tf.int64)
    outputs = collection(ids)
    tables = collection.tables
    ref = lambda t, name, combiner: tf.nn.safe_embedding_lookup_sparse(  # noqa: E731
        tf.convert_to_tensor(tables[t]), ids[name].to_sparse(), combiner=combiner)
    np.testing.assert_allclose(outputs["out_a"].numpy(), ref(0, "a", "sum").numpy(), rtol=1e-6)
    np.testing.assert_allclose(outputs["out_b"].numpy(), ref(1, "b", "mean").numpy(), rtol=1e-6)
    np.testing.assert_allclose(outputs["out_a2"].numpy(), ref(0, "a2", "mean").numpy(), rtol=1e-6)
    np.testing.assert_allclose(
        outputs["out_c"].numpy(),
        tf.reshape(tf.gather(tf.convert_to_tensor(tables[2]), ids["c"]), [4, 8]).numpy())
    rows = tables[3].sparse_read(ids["d"].values, insert=False).numpy()
    np.testing.assert_allclose(outputs["out_d"].numpy()[0], rows[:3].sum(0), rtol=1e-6)
    assert collection.data_parallel_variables == [tables[2]]


def test_planner_rejects_bad_lookups(tmp_path):
    planner = sok.EmbeddingPlanner()
    table = sok.EmbeddingTableConfig(0, 10, 4)
    with pytest.raises(ValueError, match="unknown combiner 'max'; valid combiners are"):
        planner.embedding_lookup(table, "a", "out", "max")
    planner.embedding_lookup(table, "a", "out")
    with pytest.raises(ValueError, match="top_name 'out' is used twice"):
        planner.embedding_lookup(table, "b", "out")
    path = str(tmp_path / "plan.json")
    sok.write_plan([[{"local_embedding_list": [1], "table_placement_strategy": "dp"}]], path)
    with pytest.raises(ValueError, match="tables \\[0\\] are looked up but not placed"):
        planner.create_embedding_collection(path)
