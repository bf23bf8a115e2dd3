"""SOK's module name for the static tables (`sparse_operation_kit.distributed_variable`)."""
from sparse_operation_kit.utils import filter_variables
from sparse_operation_kit.variables import DistributedVariable, LocalizedVariable, Variable

__all__ = ["Variable", "DistributedVariable", "LocalizedVariable", "filter_variables"]
