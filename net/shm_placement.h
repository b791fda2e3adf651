// Values of data messages in shared memory: where the sender puts them in its
// arena and how the receiver reads them in place.
//
// A data message to a co-located peer that has mapped our arena may carry,
// instead of value frames, one (offset, bytes) pair per value frame
// (PsHeader.shm_frame_offset, shm_frame_bytes) naming blocks of the sender's
// arena (net/shm_arena.h). The sender (ShmPlacement) sends a value that lies
// in its arena already (a server's stored value, a buffer from
// AllocateOrHeap) by reference, with no copy, and copies any other into a ring
// block; a message whose values cannot all be placed keeps them where they are
// (on the heap) and goes over TCP. The receiver (ResolveShmValues) turns the
// pairs back into Blobs that read the sender's arena in place; dropping a Blob
// hands its block back.
#ifndef PSTRAIN_NET_SHM_PLACEMENT_H_
#define PSTRAIN_NET_SHM_PLACEMENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "net/message.h"
#include "net/shm_arena.h"
#include "proto/ps.pb.h"

namespace pstrain {

// Sender side. Threads: thread-safe (the arena is).
class ShmPlacement {
 public:
  // Places values in `arena`, which must outlive this object. Values that
  // total less than `min_copy_bytes` are not copied into the ring (cheaper
  // inline); they are still sent by reference when they lie in the arena.
  ShmPlacement(ShmArena* arena, uint64_t min_copy_bytes);

  // Finds a block of the arena for every value frame of `msg` (a reference
  // to the one it lies in, else a ring block it is copied into) and appends
  // its offset and size to extra's shm_frame_offset and shm_frame_bytes, in
  // frame order. All or nothing: false, with every block this call took handed
  // back and those two fields of `extra` cleared, when one value does not fit
  // (counted in fallbacks() when the message was large enough to copy).
  // On true the blocks are held for the message until the receiver drops its
  // Blobs; if the message is then not sent, call Release(*extra).
  bool Place(const Message& msg, PsHeader* extra);
  // Hands back the blocks `placed` lists (a placed message that was not sent).
  void Release(const PsHeader& placed);

  // Messages large enough to copy whose values did not fit in the arena.
  int64_t fallbacks() const { return fallbacks_.load(); }

 private:
  ShmArena* const arena_;
  const uint64_t min_copy_bytes_;
  std::atomic<int64_t> fallbacks_{0};
};

// ---- receiver side ----

// Resolves the value frames that header `h` (of a data message from
// h.sender()) lists in the sender's arena, mapped here as `sender_arena`
// (null: not mapped), appending one Blob per frame to `values` in order.
// InvalidArgument naming the sender when the arena is not mapped, when the
// offsets, sizes and num_value_frames disagree, or when a pair names no live
// block; `values` then holds the frames resolved before the bad one.
Status ResolveShmValues(const PsHeader& h, ShmMapping* sender_arena, std::vector<Blob>* values);
// For a message that is dropped after `resolved` of the frames `h` lists were
// resolved: whether some were not, and handing those back (a reference is
// taken and dropped at once, which frees the block) so the sender's ring is
// not stalled behind them. `sender_arena` is the arena of the node the message
// came from (for a queued one, the queue's owner, whatever sender it claims).
// A pair that names no live block is ignored.
bool HasUnresolvedShmValues(const PsHeader& h, size_t resolved);
void ReleaseUnresolvedShmValues(const PsHeader& h, size_t resolved, ShmMapping* sender_arena);

}  // namespace pstrain

#endif  // PSTRAIN_NET_SHM_PLACEMENT_H_
