// Where the parts of a parameter array live (../shared/design.md 6).
// kMxnet is the default: kBalanced did not measure faster (bench/RESULTS.md).
//
// kMxnet: MXNet's rule. Arrays under `bigarray_bound` elements go whole to
//   server (key * 9973) % S; larger ones are split into S parts, part i on
//   server i, boundaries round(n/S*i) (mxnet_facts.md 1.3).
// kBalanced: arrays of at most `chunk_elems` elements go whole to server
//   (key * 9973) % S; larger ones are cut into ceil(n / chunk_elems) parts of
//   near-equal size, part j on server (key * 9973 + j) % S. More parts than
//   servers lets one server's request shards work on one array in parallel
//   and pipelines big arrays through the network.
#ifndef PSTRAIN_WORKER_PLACEMENT_H_
#define PSTRAIN_WORKER_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain {

enum class Placement { kBalanced, kMxnet };
StatusOr<Placement> ParsePlacement(const std::string& name);  // "balanced" | "mxnet"

struct PartPlan {
  int server = 0;
  int part = 0;         // index within the key
  uint64_t offset = 0;  // first element
  uint64_t len = 0;     // elements, > 0
};

struct PlacementOptions {
  Placement policy = Placement::kMxnet;
  int num_servers = 1;
  int64_t bigarray_bound = 1000000;
  int64_t chunk_elems = 262144;
};

// The parts of array `key` of `len` elements, in element order; they cover
// [0, len) exactly. InvalidArgument if key exceeds 2^32-1, len is 0 or the
// array would need more than 65536 parts.
StatusOr<std::vector<PartPlan>> PlaceKey(uint64_t key, uint64_t len, const PlacementOptions& o);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_PLACEMENT_H_
