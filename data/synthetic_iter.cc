#include "data/synthetic_iter.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <utility>

namespace pstrain {

StatusOr<std::unique_ptr<DataIter>> NewSyntheticIter(const std::vector<int64_t>& shape,
                                                     int num_classes, int64_t num_examples,
                                                     const IterOptions& opts) {
  if (shape.size() != 3 || shape[0] < 1 || shape[1] < 1 || shape[2] < 1) {
    return Status::InvalidArgument("synthetic data needs an image shape C,H,W of positive sizes");
  }
  if (num_classes < 1 || num_examples < 1) {
    return Status::InvalidArgument(StrCat("synthetic data needs num_classes >= 1 (got ",
                                          num_classes, ") and num_examples >= 1 (got ",
                                          num_examples, ")"));
  }
  auto set = std::make_shared<ExampleSet>();
  set->shape = shape;
  // Each batch is made as floats: one that the host cannot hold is an error
  // here rather than an allocation failure.
  const int64_t host_bytes = int64_t{sysconf(_SC_PHYS_PAGES)} * sysconf(_SC_PAGESIZE);
  const int64_t batch_bytes_each = set->example_size() * int64_t{sizeof(float)};
  if (host_bytes > 0 && opts.batch_size > host_bytes / batch_bytes_each) {
    return Status::ResourceExhausted(
        StrCat("synthetic data: a batch of ", opts.batch_size, " examples of ", set->example_size(),
               " floats needs more than this host's ", host_bytes >> 20, " MiB of memory"));
  }
  constexpr int64_t kPoolBytes = int64_t{64} << 20;
  num_examples =
      std::min(num_examples, std::max<int64_t>(opts.batch_size, kPoolBytes / set->example_size()));
  set->pixels.resize(num_examples * set->example_size());
  set->labels.resize(num_examples);
  std::mt19937_64 rng(opts.seed);
  for (auto& p : set->pixels) p = static_cast<uint8_t>(rng() >> 56);
  std::uniform_int_distribution<int> label(0, num_classes - 1);
  for (auto& l : set->labels) l = static_cast<float>(label(rng));
  return NewInMemoryIter(std::move(set), opts, "synthetic");
}

}  // namespace pstrain
