// CIFAR-10 binary batches (data_batch_{1..5}.bin, test_batch.bin): records of
// 3073 bytes, one label byte (0-9) then 1024 R, 1024 G and 1024 B bytes of a
// 32x32 image, row-major.
#ifndef PSTRAIN_DATA_CIFAR10_H_
#define PSTRAIN_DATA_CIFAR10_H_

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "data/data_iter.h"
#include "data/in_memory_iter.h"

namespace pstrain {

// Reads the files in order into {3, 32, 32} examples. Corruption naming the
// file and byte offset for a partial last record or a label >= 10.
StatusOr<ExampleSet> ReadCifar10(const std::vector<std::string>& files);

// The batch files of `dir`, sorted by name: data_batch_*.bin (train) or
// test_batch*.bin (validation). NotFound when there are none.
StatusOr<std::vector<std::string>> FindCifar10Files(const std::string& dir, bool train);

StatusOr<std::unique_ptr<DataIter>> NewCifar10Iter(const std::string& dir, bool train,
                                                   const IterOptions& opts);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_CIFAR10_H_
