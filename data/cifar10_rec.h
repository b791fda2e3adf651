// CIFAR-10 binary batches to MXNet RecordIO image files, for the image
// pipeline (`pstrain data get cifar10 --rec`, then `train --data-train`).
#ifndef PSTRAIN_DATA_CIFAR10_REC_H_
#define PSTRAIN_DATA_CIFAR10_REC_H_

#include <cstdint>
#include <string>

#include "common/status.h"

namespace pstrain {

struct Cifar10RecStats {
  int64_t train_records = 0;
  int64_t test_records = 0;
  bool already_there = false;  // both pairs existed with the right record counts
};

// Writes <out_dir>/train.rec + train.idx from the data_batch_*.bin files of
// `dir` (in name order) and test.rec + test.idx from test_batch*.bin. Each
// image is a PNG (lossless: decoding gives the original pixels) in a record
// with its label (0-9) and id = its number in the file, counting from 0. A pair
// whose .idx already lists as many records as the batches hold is kept (unless
// `force`). Files are written under ".part" names and renamed when complete,
// the .idx last. Reader errors name the batch file and byte offset.
Status WriteCifar10RecordIO(const std::string& dir, const std::string& out_dir, bool force,
                            Cifar10RecStats* stats);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_CIFAR10_REC_H_
