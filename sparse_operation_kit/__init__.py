"""sparse_operation_kit: fused, distributed embedding lookups for TensorFlow 2.

A drop-in replacement for NVIDIA SparseOperationKit v2's Python API that also runs on CPU.
Importing prints nothing and loads the op library only when an op first runs; an unsupported
TensorFlow or Keras is refused (ImportError naming the supported lines).
"""
from sparse_operation_kit import _versions

_versions.check()


from sparse_operation_kit._ops import raw_ops
from sparse_operation_kit import communication
from sparse_operation_kit.communication import init, set_comm_tool
from sparse_operation_kit.dynamic_variable import (DynamicVariable, assign, export,
                                                    incremental_model_dump,
                                                    sparse_read_and_erase,
                                                    sparse_read_and_evict, tier_counts)
from sparse_operation_kit import layers
# SOK v1's layers, where v1 scripts look for them (sok.DistributedEmbedding, ...).
from sparse_operation_kit.layers import All2AllDenseEmbedding, DistributedEmbedding
from sparse_operation_kit.checkpoint import dump, load
from sparse_operation_kit.interaction import dot_interaction
from sparse_operation_kit.id_checks import set_id_check
from sparse_operation_kit.lookup import all2all_dense_embedding, lookup_sparse
from sparse_operation_kit import lookup_gradients  # registers the lookups' gradients
from sparse_operation_kit.optimizer import SGD, OptimizerWrapper
from sparse_operation_kit.staging import StagedFeatures, stage_features
from sparse_operation_kit.planner import (EmbeddingCollection, EmbeddingPlanner,
                                          EmbeddingTableConfig, generate_plan, read_plan,
                                          validate_plan, write_plan)
from sparse_operation_kit.variables import DistributedVariable, LocalizedVariable, Variable
from sparse_operation_kit import distributed_variable, dump_load, utils
from sparse_operation_kit.utils import filter_variables, tf_version
from sparse_operation_kit.version import __version__

__all__ = [
    "init", "set_comm_tool", "communication", "Variable", "DistributedVariable",
    "LocalizedVariable", "DynamicVariable", "lookup_sparse", "all2all_dense_embedding",
    "filter_variables", "export", "assign", "sparse_read_and_evict", "tier_counts", "sparse_read_and_erase", "OptimizerWrapper", "SGD",
    "dot_interaction", "layers", "dump", "load", "incremental_model_dump", "EmbeddingTableConfig", "EmbeddingPlanner",
    "EmbeddingCollection", "generate_plan", "validate_plan", "read_plan", "write_plan", "raw_ops", "tf_version", "set_id_check",
    "DistributedEmbedding", "All2AllDenseEmbedding", "StagedFeatures", "stage_features",
    "__version__",
]
