// DataIter: the one interface between data readers and the training loop.
//
// Every reader (MNIST idx, CIFAR-10 binary, RecordIO images, synthetic) is a
// DataIter. A batch is float32 NCHW data plus `label_width` float labels per
// example. Batches are handed over without copies: Next() swaps its filled
// buffers with the caller's Batch, so the caller's old buffers are recycled by
// the reader (a prefetching reader fills them again on its own threads).
#ifndef PSTRAIN_DATA_DATA_ITER_H_
#define PSTRAIN_DATA_DATA_ITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain {

struct Batch {
  // {batch, channels, height, width}; a flat reader uses {batch, features, 1, 1}.
  std::vector<int64_t> shape;
  std::vector<float> data;   // shape[0]*shape[1]*shape[2]*shape[3] floats, NCHW
  std::vector<float> label;  // shape[0] * label_width floats
  int label_width = 1;
  // The last `pad` examples are filler (a short last batch wrapped around);
  // metrics must skip them.
  int pad = 0;
  // Example indices in the source, for debugging and tests (may be empty).
  std::vector<int64_t> index;

  int64_t batch_size() const { return shape.empty() ? 0 : shape[0]; }
  int64_t example_size() const { return shape.size() < 4 ? 0 : shape[1] * shape[2] * shape[3]; }
};

class DataIter {
 public:
  virtual ~DataIter() = default;

  // Starts a new pass (epoch). A shuffling reader draws a new order here.
  virtual void Reset() = 0;

  // Fills *batch with the next batch (swapping buffers, see above).
  // Returns false at the end of the pass, true otherwise; an error for a
  // corrupt or unreadable source, naming the file and byte offset.
  virtual StatusOr<bool> Next(Batch* batch) = 0;

  // Number of examples in one pass over this reader's part of the data.
  virtual int64_t num_examples() const = 0;

  // Shape of one batch's data, {batch, C, H, W}.
  virtual std::vector<int64_t> batch_shape() const = 0;

  // A short description for logs ("MNIST train part 0/2, 30000 examples").
  virtual std::string Describe() const = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_DATA_DATA_ITER_H_
