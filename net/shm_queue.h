// Whole messages through shared memory: a sender's queue for each co-located
// peer, in the sender's arena.
//
// A message to a peer that has mapped our arena (and whose doorbell we can
// ring, net/doorbell.h) skips ZeroMQ altogether: its envelope (the serialized
// header, keys, lens, and the values not placed in the arena on their own; see
// WriteEnvelope in net/message.h) goes into one ring block of our arena, and
// (offset, bytes, ticket) onto the single-producer queue that the peer reads in our
// arena (ShmArena::Enqueue). The peer's receive thread drains the queues of
// every arena it has mapped (ShmInbox, ReadQueued) next to its ZeroMQ socket
// and reads each envelope in place. When the ring or the queue is full the
// sender uses ZeroMQ instead; numbering (net/shm_sequence.h) keeps the order.
#ifndef PSTRAIN_NET_SHM_QUEUE_H_
#define PSTRAIN_NET_SHM_QUEUE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "net/message.h"
#include "net/shm_arena.h"

namespace pstrain {

// ---- sender side ----

// Writes the envelope of `msg` with the serialized header `header` (whose
// num_value_frames is 1 when `inline_values`) into one ring block of `arena`
// and queues it for node `receiver` (its `incarnation`, ShmArena::Ticket).
// False, with nothing taken, when the ring, the receiver's ticket table or
// that queue is full, or the queue is another incarnation's (ResetQueue). The block is the
// receiver's until it drops the message (or the owner takes it back, ShmArena::ReleaseReceiver).
// REQUIRES: calls for one receiver are serialized by the caller (the Van's per-peer lock), so the
// queue holds them in send order.
bool EnqueueMessage(ShmArena* arena, int receiver, uint8_t incarnation, const std::string& header,
                    const Message& msg, bool inline_values);

// ---- receiver side ----

enum class QueueRead {
  kEmpty,    // nothing queued
  kMessage,  // *out holds a well-formed message
  kBad,      // an entry was taken but is unusable: out->error says why
};
// Takes the next entry of the queue that `peer` fills for node `me` in its
// arena, mapped here as `peer_arena`, and decodes it into *out (the values
// read the peer's arena in place). On kBad, out->error names the peer and
// out->header_ok says whether out->msg.header is the entry's (a numbered
// message's number is then in `peer`'s order, whatever sender it claims). A
// message that claims a sender other than `peer` is kBad. Consumer side: one
// thread per queue.
QueueRead ReadQueued(ShmMapping& peer_arena, int peer, int me, Decoded* out);

// The peers whose arenas this node has mapped, whose queues its receive
// thread drains. Threads: Add and Remove from any thread; Current from the receive
// thread only.
class ShmInbox {
 public:
  using Entries = std::vector<std::pair<int, std::shared_ptr<ShmMapping>>>;

  // From now on `peer`'s queue is read in `mapping` (which replaces an earlier
  // mapping of that id: a replaced process).
  void Add(int peer, std::shared_ptr<ShmMapping> mapping) EXCLUDES(mu_);
  // From now on `peer`'s queue is not read (a peer gone for good).
  void Remove(int peer) EXCLUDES(mu_);
  // The peers to read, with every Add so far. Takes the lock only when Add was
  // called since the last call; the reference stays valid until the next call.
  const Entries& Current() EXCLUDES(mu_);

 private:
  Mutex mu_;
  Entries added_ GUARDED_BY(mu_);
  std::atomic<uint64_t> version_{0};
  // The receive thread's copy of added_, and the version it was taken at.
  Entries current_;
  uint64_t current_version_ = ~uint64_t{0};
};

}  // namespace pstrain

#endif  // PSTRAIN_NET_SHM_QUEUE_H_
