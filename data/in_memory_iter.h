// Readers of data sets that fit in memory (MNIST, CIFAR-10 binary, synthetic):
// the decoded examples are held once as bytes and batched on demand.
//
// Batching follows MXNet's MNISTIter / NDArrayIter with round_batch:
//  - partitioning: part p of P gets examples [floor(N*p/P), floor(N*(p+1)/P));
//  - shuffling (when enabled) draws a new order of the part at every Reset(),
//    from `seed` and the number of Reset() calls so far (so the k-th epoch's
//    order is the same in every run with the same seed);
//  - the last batch of a pass is filled up by wrapping around to the start of
//    the pass; Batch::pad counts those filler examples.
// Values are bytes * `scale` (MNISTIter uses 1/256); labels are floats.
// Next() converts straight into the caller's Batch buffers (resized once, then
// reused), so there is no copy besides the byte-to-float conversion itself;
// there is no prefetch thread because that conversion costs microseconds.
// Thread-compatible: one thread uses an iterator at a time.
#ifndef PSTRAIN_DATA_IN_MEMORY_ITER_H_
#define PSTRAIN_DATA_IN_MEMORY_ITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "data/data_iter.h"

namespace pstrain {

// Decoded examples: `count` images of shape {C, H, W} as bytes, one label each.
struct ExampleSet {
  std::vector<int64_t> shape;   // {C, H, W}
  std::vector<uint8_t> pixels;  // count * C*H*W bytes, NCHW
  std::vector<float> labels;    // count labels
  int64_t count() const { return static_cast<int64_t>(labels.size()); }
  int64_t example_size() const { return shape.size() == 3 ? shape[0] * shape[1] * shape[2] : 0; }
};

struct IterOptions {
  int64_t batch_size = 128;
  bool shuffle = false;
  uint64_t seed = 0;
  int part_index = 0;
  int num_parts = 1;
  float scale = 1.0f / 256.0f;
  // Batches shaped {batch, C*H*W, 1, 1} instead of {batch, C, H, W}.
  bool flat = false;
};

// Checks batch size >= 1, 0 <= part_index < num_parts, and that the part is not
// empty for `num_examples` examples; InvalidArgument naming the bad value.
Status ValidateIterOptions(const IterOptions& opts, int64_t num_examples);

// A DataIter over `examples` (shared, never modified). `what` starts the
// Describe() text ("MNIST train").
StatusOr<std::unique_ptr<DataIter>> NewInMemoryIter(std::shared_ptr<const ExampleSet> examples,
                                                    const IterOptions& opts, std::string what);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_IN_MEMORY_ITER_H_
