#include "net/shm_sequence.h"

#include <glog/logging.h>

#include <random>

namespace pstrain {

ShmSequence::ShmSequence() {
  std::random_device rd;
  stream_ = (uint64_t{rd()} << 32) ^ rd();
  if (stream_ == 0) stream_ = 1;
}

ShmSequence::ShmSequence(uint64_t stream) : stream_(stream) {
  CHECK_NE(stream, 0u) << "numbering 0 means none to the receiver";
}

void ShmSequence::Rollback() {
  DCHECK_GT(next_, 0u) << "Rollback without a Stamp";
  --next_;
}

std::optional<SeqSlot> DroppedSlot(const PsHeader& h, int queue_owner) {
  if (!h.has_shm_seq()) return std::nullopt;
  return SeqSlot{queue_owner >= 0 ? queue_owner : h.sender(), h.shm_stream(), h.shm_seq()};
}

}  // namespace pstrain
