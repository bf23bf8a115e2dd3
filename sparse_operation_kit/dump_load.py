"""SOK's module name for its checkpoint files (`sparse_operation_kit.dump_load`)."""
from sparse_operation_kit.checkpoint import dump, load
from sparse_operation_kit.dynamic_variable import incremental_model_dump

__all__ = ["dump", "load", "incremental_model_dump"]
