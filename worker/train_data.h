// Opens the training and validation readers a TrainConfig names.
//
// --benchmark 1: synthetic data of --image-shape, no validation.
// Otherwise --data-dir holds MNIST idx files (train-images-idx3-ubyte[.gz],
// ...) or CIFAR-10 binary batches (data_batch_*.bin, test_batch*.bin). The
// training reader is shuffled (seed --seed; --shuffle-train 0: the file's
// order) and both are partitioned by (rank, num_workers), as fit.py does.
#ifndef PSTRAIN_WORKER_TRAIN_DATA_H_
#define PSTRAIN_WORKER_TRAIN_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "data/data_iter.h"
#include "proto/train_config.pb.h"

namespace pstrain {

struct TrainData {
  std::unique_ptr<DataIter> train;
  std::unique_ptr<DataIter> val;  // null when there is no validation set
  // Over all parts (fit.py's num_examples); may be left 0 where the config
  // gives --num-examples.
  int64_t total_train_examples = 0;
  std::vector<int64_t> image_shape;  // {C, H, W}
  int num_classes = 10;
  std::string kind;  // "mnist", "cifar10", "synthetic"
};

// InvalidArgument when --image-shape disagrees with the data set's shape;
// NotFound when --data-dir holds neither format; reader errors as they come.
StatusOr<TrainData> OpenTrainData(const TrainConfig& cfg, int rank, int num_workers);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_TRAIN_DATA_H_
