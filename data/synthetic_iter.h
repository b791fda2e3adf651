// Synthetic data of any shape (fit.py's --benchmark 1): `num_examples` random
// images and labels drawn once from `seed`, then batched like any in-memory
// data set, so a benchmark measures training, not the reader.
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
