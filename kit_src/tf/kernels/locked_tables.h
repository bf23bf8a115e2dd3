// The tables (resource variables) an op reads, locked shared while it reads them: one
// definition for every op that reads rows straight from tf.Variables.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace sok {

// A dtype as Python names it (float32, float16, bfloat16), for errors users read.
inline std::string DtypeName(::tensorflow::DataType dtype) {
  switch (dtype) {
    case ::tensorflow::DT_FLOAT:
      return "float32";
    case ::tensorflow::DT_HALF:
      return "float16";
    default:
      return ::tensorflow::DataTypeString(dtype);
  }
}

// A table's rows as an op reads them: [rows, dim] row-major in the op's device memory.
struct TableRows {
  const void* data = nullptr;
  int64_t rows = 0;
};

// The variables an op reads, locked shared for the lifetime of this object (each once when
// several inputs share one), so an update cannot tear a row while the op reads it; on a GPU
// the lock covers enqueueing the work, as TensorFlow's own GPU ops hold it.
class LockedTables {
 public:
  // `count` table inputs from `first_input`, each of `dtype` and [rows, dim]; `names` (or
  // null: the input's index) name them in errors.
  ::tensorflow::Status Lock(::tensorflow::OpKernelContext* ctx, int first_input, int count,
                            int64_t dim, ::tensorflow::DataType dtype,
                            const std::vector<std::string>* names) {
    namespace tf = ::tensorflow;
    vars_.resize(count);
    for (int t = 0; t < count; ++t) {
      TF_RETURN_IF_ERROR(tf::LookupResource(ctx, tf::HandleFromInput(ctx, first_input + t),
                                            &vars_[t]));
      bool seen = false;
      for (int k = 0; k < t; ++k) seen = seen || vars_[k].get() == vars_[t].get();
      if (!seen) locks_.push_back(std::make_unique<tf::tf_shared_lock>(*vars_[t]->mu()));
      const tf::Tensor& table = *vars_[t]->tensor();
      if (table.dtype() != dtype || table.dims() != 2 || table.dim_size(1) != dim) {
        const std::string name = names ? "'" + (*names)[t] + "'" : std::to_string(t);
        return tf::errors::InvalidArgument("table ", name, " must be ", DtypeName(dtype),
                                           " [rows, ", dim, "], got ",
                                           DtypeName(table.dtype()), " ",
                                           table.shape().DebugString());
      }
      tables_.push_back(TableRows{table.tensor_data().data(), table.dim_size(0)});
    }
    return tf::Status();
  }
  const std::vector<TableRows>& tables() const { return tables_; }

 private:
  std::vector<::tensorflow::core::RefCountPtr<::tensorflow::Var>> vars_;
  std::vector<std::unique_ptr<::tensorflow::tf_shared_lock>> locks_;
  std::vector<TableRows> tables_;
};

}  // namespace sok
