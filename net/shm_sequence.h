// The numbering of messages to a co-located peer (PsHeader.shm_seq within
// PsHeader.shm_stream), and what becomes of a number whose message never
// reaches the receiver's handler.
//
// A node that mapped a peer's arena numbers every message to it, under its
// per-peer send lock, whichever path (the peer's shared-memory queue or
// ZeroMQ) the message then takes; the receiver's Reorderer (net/reorderer.h)
// restores that order. A number that is lost would hold up every later
// message, so none is:
//   - sender: a message whose send failed (nothing of it reached the wire)
//     gives its number back (Rollback) and the next message carries it;
//   - receiver: a numbered message dropped as malformed gives its number up
//     (DroppedSlot names the slot to skip in the Reorderer);
//   - receiver: a message that claims a sender it did not come from must not
//     touch that sender's numbering or arena (Van::Drop checks its route
//     first).
#ifndef PSTRAIN_NET_SHM_SEQUENCE_H_
#define PSTRAIN_NET_SHM_SEQUENCE_H_

#include <cstdint>
#include <optional>

#include "proto/ps.pb.h"

namespace pstrain {

// The sender's numbering of its messages to one peer (one per connection).
// Threads: not thread-safe; the Van calls it under the peer's send lock, so
// numbers are taken in the order messages reach the paths.
class ShmSequence {
 public:
  // A numbering from 0 under a fresh random stream id (never 0).
  ShmSequence();
  // A numbering from 0 under `stream`. REQUIRES: stream != 0.
  explicit ShmSequence(uint64_t stream);

  uint64_t stream() const { return stream_; }
  // The number the next Stamp gives.
  uint64_t next() const { return next_; }
  // Puts the next number and the stream on `extra` (shm_seq, shm_stream).
  void Stamp(PsHeader* extra) {
    extra->set_shm_seq(next_++);
    extra->set_shm_stream(stream_);
  }
  // The message stamped last was not sent at all: its number goes to the next
  // one, so the receiver sees no gap. REQUIRES: a Stamp, and none since.
  void Rollback();

 private:
  uint64_t stream_;
  uint64_t next_ = 0;
};

// A number in one sender's order, as the Reorderer keys it.
struct SeqSlot {
  int sender = -1;  // whose order: the queue's owner or the claimed sender
  uint64_t stream = 0;
  uint64_t seq = 0;
};
// The slot a dropped message with header `h` gives up: nullopt when it is not
// numbered. `queue_owner` >= 0: the message came from that peer's
// shared-memory queue, whose order it was in whatever sender it claims;
// otherwise the claimed sender's.
std::optional<SeqSlot> DroppedSlot(const PsHeader& h, int queue_owner = -1);

}  // namespace pstrain

#endif  // PSTRAIN_NET_SHM_SEQUENCE_H_
