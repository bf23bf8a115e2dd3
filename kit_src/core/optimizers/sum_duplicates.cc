#include "kit_src/core/optimizers/sum_duplicates.h"

#include "absl/container/flat_hash_map.h"

namespace sok {

void SumDuplicates(const int64_t* keys, const GradientUses& grads, int64_t n, int64_t dim,
                   std::vector<int64_t>* unique_keys, std::vector<float>* summed) {
  absl::flat_hash_map<int64_t, int64_t> index_of;
  index_of.reserve(n);
  summed->reserve(n * dim);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = grads.values + (grads.rows ? grads.rows[i] : i) * dim;
    const float scale = grads.rows ? grads.scales[i] : 1.0f;
    auto inserted = index_of.try_emplace(keys[i], static_cast<int64_t>(unique_keys->size()));
    float* out = nullptr;
    if (inserted.second) {
      unique_keys->push_back(keys[i]);
      summed->resize(summed->size() + dim, 0.0f);
      out = summed->data() + summed->size() - dim;
    } else {
      out = summed->data() + inserted.first->second * dim;
    }
    for (int64_t d = 0; d < dim; ++d) out[d] += scale * row[d];
  }
}

}  // namespace sok
