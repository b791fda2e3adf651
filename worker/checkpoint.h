// Checkpoint files: `prefix-%04d.params`, the parameters, aux states and the
// local optimizer's momentum after epoch N (N 1-based as MXNet numbers
// them), in one file so that one rename commits them all. Checkpoints written
// before that kept the momentum in `prefix-%04d.states`, which a resumed run
// still reads when the .params holds none. The binary format, little-endian:
//
//   "PSTRCKPT"                      8-byte magic
//   uint32 version                  1
//   uint32 count                    number of arrays
//   count times:
//     uint32 kind                   0 parameter, 1 aux state, 2 optimizer state
//     uint32 name_len, name bytes   MXNet's name ("conv1_weight", "bn1_moving_mean")
//     uint32 ndim, int64 dims[ndim]
//     float32 data[prod(dims)]
//   uint32 crc32                    zlib CRC-32 of every byte before it
//
// Writes go to "<path>.tmp", which is synced to disk and renamed into place
// (the folder synced too), so neither a crash nor a power loss leaves a
// half-written checkpoint under the final name.
#ifndef PSTRAIN_WORKER_CHECKPOINT_H_
#define PSTRAIN_WORKER_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain {

struct NamedArray {
  enum class Kind : uint32_t { kParam = 0, kAux = 1, kOptimizerState = 2 };
  Kind kind = Kind::kParam;
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // prod(shape) floats
};

// "prefix-0003.params" / "prefix-0003.states".
std::string CheckpointParamsPath(const std::string& prefix, int epoch);
std::string CheckpointStatesPath(const std::string& prefix, int epoch);

// IOError naming the path when it cannot be written.
Status SaveArrays(const std::string& path, const std::vector<NamedArray>& arrays);
// NotFound if missing; Corruption naming the file and byte offset for a bad
// magic, version, truncation, a size that does not match its shape, or a CRC
// mismatch.
StatusOr<std::vector<NamedArray>> LoadArrays(const std::string& path);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_CHECKPOINT_H_
