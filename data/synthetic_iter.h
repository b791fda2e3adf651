// Synthetic data of any shape (fit.py's --benchmark 1): random images and
// labels drawn once from `seed`, then batched like any in-memory data set, so
// a benchmark measures training, not the reader. To bound memory the reader
// holds min(num_examples, max(batch, 64 MiB worth)) examples: num_examples()
// reports that pool, and a loop that needs more batches resets and goes on.
#ifndef PSTRAIN_DATA_SYNTHETIC_ITER_H_
#define PSTRAIN_DATA_SYNTHETIC_ITER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "data/data_iter.h"
#include "data/in_memory_iter.h"

namespace pstrain {

// `shape` is {C, H, W}; labels are uniform in [0, num_classes). InvalidArgument
// for a non-positive dimension, count or class number.
StatusOr<std::unique_ptr<DataIter>> NewSyntheticIter(const std::vector<int64_t>& shape,
                                                     int num_classes, int64_t num_examples,
                                                     const IterOptions& opts);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_SYNTHETIC_ITER_H_
