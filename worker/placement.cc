#include "worker/placement.h"

#include <cmath>

#include "net/message.h"

namespace pstrain {

StatusOr<Placement> ParsePlacement(const std::string& name) {
  if (name == "balanced") return Placement::kBalanced;
  if (name == "mxnet") return Placement::kMxnet;
  return Status::InvalidArgument(StrCat("placement '", name, "' is not balanced or mxnet"));
}

StatusOr<std::vector<PartPlan>> PlaceKey(uint64_t key, uint64_t len, const PlacementOptions& o) {
  if (key > kMaxUserKey) {
    return Status::InvalidArgument(StrCat("key ", key, " exceeds the largest key ", kMaxUserKey));
  }
  if (len == 0) return Status::InvalidArgument(StrCat("key ", key, " has length 0"));
  const uint64_t S = static_cast<uint64_t>(o.num_servers);
  const int home = static_cast<int>((key * 9973) % S);
  std::vector<PartPlan> parts;
  if (o.policy == Placement::kMxnet) {
    if (len < static_cast<uint64_t>(o.bigarray_bound) || S == 1) {
      parts.push_back(PartPlan{home, 0, 0, len});
      return parts;
    }
    // MXNet 1.x boundaries: round(n / S * i).
    const double step = static_cast<double>(len) / static_cast<double>(S);
    for (uint64_t i = 0; i < S; ++i) {
      const uint64_t b = static_cast<uint64_t>(std::llround(step * i));
      const uint64_t e = i + 1 == S ? len : static_cast<uint64_t>(std::llround(step * (i + 1)));
      if (e > b) parts.push_back(PartPlan{static_cast<int>(i), static_cast<int>(i), b, e - b});
    }
    return parts;
  }
  const uint64_t chunk = static_cast<uint64_t>(std::max<int64_t>(1, o.chunk_elems));
  const uint64_t count = (len + chunk - 1) / chunk;
  if (count > static_cast<uint64_t>(kMaxParts)) {
    return Status::InvalidArgument(StrCat("key ", key, " of ", len, " elements needs ", count,
                                          " chunks of ", chunk, "; at most ", kMaxParts));
  }
  for (uint64_t j = 0; j < count; ++j) {
    const uint64_t b = len * j / count;
    const uint64_t e = len * (j + 1) / count;
    parts.push_back(
        PartPlan{static_cast<int>((key * 9973 + j) % S), static_cast<int>(j), b, e - b});
  }
  return parts;
}

}  // namespace pstrain
