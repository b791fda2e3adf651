// Values of data messages in shared memory: where the sender puts them in its
// arena and how the receiver reads them in place.
//
// A data message to a co-located peer that has mapped our arena may carry,
// instead of value frames, one (offset, bytes, ticket) per value frame
// (PsHeader.shm_frame_offset, shm_frame_bytes, shm_frame_slot,
// shm_frame_ticket) naming blocks of the sender's arena (net/shm_arena.h).
// The sender (ShmPlacement) sends a value that lies in its arena already (a
// server's stored value, a buffer from AllocateOrHeap) by reference, with no
// copy, and copies any other into a ring block; a message whose values cannot
// all be placed keeps them where they are (on the heap) and goes over TCP. The
// receiver (ResolveShmValues) turns the descriptors back into Blobs that read
// the sender's arena in place; dropping a Blob hands its block back.
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

// At most this many value frames of one message are placed (half of a
// receiver's ticket table); a message with more goes over TCP.
constexpr size_t kShmMaxPlacedFrames = kShmTicketSlots / 2;

// Sender side. Threads: thread-safe (the arena is).
class ShmPlacement {
 public:
  // Places values in `arena`, which must outlive this object. Values that
  // total less than `min_copy_bytes` are not copied into the ring (cheaper
  // inline); they are still sent by reference when they lie in the arena.
  ShmPlacement(ShmArena* arena, uint64_t min_copy_bytes);

  // Finds a block of the arena for every value frame of `msg` (a reference
  // to the one it lies in, else a ring block it is copied into), hands that
  // reference to node `receiver`'s `incarnation` as a ticket
  // (ShmArena::Ticket), and appends the block's offset, size and ticket to
  // extra's shm_frame_offset, shm_frame_bytes, shm_frame_slot and
  // shm_frame_ticket, in frame order. All or nothing: false, with every block
  // this call took handed back and those fields of `extra` cleared, when one
  // value does not fit (counted in fallbacks() when the message was large
  // enough to copy), and at once, counting nothing, for a receiver id without
  // a ticket table or more than kShmMaxPlacedFrames values. On true the
  // blocks are held for the message until the receiver drops its Blobs; if
  // the message is then not sent, call Release(*extra, receiver).
  bool Place(const Message& msg, int receiver, uint8_t incarnation, PsHeader* extra);
  // Hands back the blocks `placed` lists for `receiver` (a placed message that
  // was not sent).
  void Release(const PsHeader& placed, int receiver);

  // Messages large enough to copy whose values did not fit in the arena.
  int64_t fallbacks() const { return fallbacks_.load(); }

 private:
  ShmArena* const arena_;
  const uint64_t min_copy_bytes_;
  std::atomic<int64_t> fallbacks_{0};
};

// ---- receiver side ----

// Resolves the value frames that header `h` (of a data message from
// h.sender() to node `me`) lists in the sender's arena, mapped here as
// `sender_arena` (null: not mapped), appending one Blob per frame to `values`
// in order. InvalidArgument naming the sender when the arena is not mapped,
// when the offsets, sizes, tickets and num_value_frames disagree, or when a
// frame names no live block or a ticket me does not hold; `values` then holds
// the frames resolved before the bad one.
Status ResolveShmValues(const PsHeader& h, ShmMapping* sender_arena, int me,
                        std::vector<Blob>* values);
// For a message to node `me` that is dropped after `resolved` of the frames
// `h` lists were resolved: whether some were not, and handing those back
// (their tickets cleared, ShmMapping::Drop) so the sender's ring is not
// stalled behind them. `sender_arena` is the arena of the node the message
// came from (for a queued one, the queue's owner, whatever sender it claims).
// A frame whose ticket me does not hold is ignored.
bool HasUnresolvedShmValues(const PsHeader& h, size_t resolved);
void ReleaseUnresolvedShmValues(const PsHeader& h, size_t resolved, ShmMapping* sender_arena,
                                int me);

}  // namespace pstrain

#endif  // PSTRAIN_NET_SHM_PLACEMENT_H_
