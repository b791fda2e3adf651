// Shared memory between co-located nodes: the data plane of the Van.
//
// Every server and worker owns one ShmArena, a memfd-backed region that its
// co-located peers map (through /proc/<pid>/fd/<fd>, checked against a random
// token, so a peer on another host or in another PID namespace simply fails to
// map it). A data message to a peer that has mapped our arena carries, instead
// of its value frames, one (offset, bytes) descriptor per frame: the values
// skip loopback TCP (two kernel copies and the socket work) and the receiver
// reads them in place.
//
// The arena holds blocks, each a 64-byte BlockHeader and its payload, in two
// regions:
//   ring   transient blocks: the Van copies a value frame into one when it
//          sends it (a worker's pushed gradients), and AllocateOutgoing hands
//          one out for a buffer built to be sent once (a server's reply).
//   store  long-lived blocks handed out by AllocateStore (a server's stored
//          values).
// Blocks handed out (store or ring) are sent by reference, with no copy.
// A block's header holds a reference count in shared memory: the number of
// messages in flight or being read that reference it. The owner reuses a ring
// block once it and every earlier ring block are free, and writes or reuses a
// store block only while nobody reads it (readers()). When the ring or store
// has no room the Van sends over TCP and the server keeps values on its heap,
// so a slow reader never blocks anyone.
//
// Every reference handed to a peer is also a ticket: a slot, in that
// receiver's ticket table in this arena, holding the block and a tag. The
// receiver drops its reference when the last Blob of that frame is destroyed
// (ShmMapping) by clearing the slot, and only the one that clears it (a
// compare-and-swap) decrements the count. So when a receiver dies or is
// replaced, the owner takes back every reference it still held, unread queue
// entries included (ReleaseReceiver), and the ring is not stalled behind a
// dead reader; a late release by the old process finds its slot cleared and
// does nothing.
//
// Threads: ShmArena and ShmMapping are thread-safe.
#ifndef PSTRAIN_NET_SHM_ARENA_H_
#define PSTRAIN_NET_SHM_ARENA_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "net/message.h"
#include "proto/ps.pb.h"

namespace pstrain {

// Layout constants (bytes). An arena is: header page, message queues, ring, store.
constexpr uint64_t kShmArenaHeaderBytes = 4096;  // ArenaHeader
constexpr uint64_t kShmBlockHeaderBytes = 64;    // BlockHeader before each payload
constexpr uint64_t kShmAlign = 64;               // every payload starts on this boundary
// Message queues: one per receiving node id below kShmMaxQueues, each a
// single-producer single-consumer ring of kShmQueueEntries (offset, bytes,
// ticket) entries naming a block of this arena that holds one message.
constexpr int kShmMaxQueues = 2048;
constexpr uint64_t kShmQueueEntries = 1024;
constexpr uint64_t kShmQueueBytes = 128 + 32 * kShmQueueEntries;
// Ticket tables: one per receiving node id below kShmMaxQueues, each
// kShmTicketSlots 8-byte slots (0: free), one per reference the receiver holds.
constexpr uint32_t kShmTicketSlots = 8192;
constexpr uint64_t kShmTicketBytes = 8 * uint64_t{kShmTicketSlots};
constexpr uint64_t kShmTicketsBegin = kShmArenaHeaderBytes + kShmMaxQueues * kShmQueueBytes;
constexpr uint64_t kShmRingBegin = kShmTicketsBegin + kShmMaxQueues * kShmTicketBytes;
// Block offsets in a ticket have 38 bits (in units of kShmAlign).
constexpr uint64_t kShmMaxArenaBytes = uint64_t{1} << 44;

// One reference handed to a receiver: its slot in the receiver's ticket table
// and the value written there (the block, the receiver's incarnation and a
// generation, never 0). Travels with the (offset, bytes) that name the block.
struct ShmTicket {
  uint32_t slot = 0;
  uint64_t value = 0;
};

inline uint64_t ShmRoundUp(uint64_t n) { return (n + kShmAlign - 1) / kShmAlign * kShmAlign; }

class ShmArena : public std::enable_shared_from_this<ShmArena> {
 public:
  // Creates an arena with a ring of `ring_bytes` and a store of `store_bytes`
  // (each rounded down to kShmAlign; the ring at least 4 KB, the store may be
  // 0). Memory is reserved, not touched: pages cost only once used. IOError
  // when memfd_create, ftruncate or mmap fail.
  static StatusOr<std::shared_ptr<ShmArena>> Create(uint64_t ring_bytes, uint64_t store_bytes);
  ~ShmArena();
  ShmArena(const ShmArena&) = delete;
  ShmArena& operator=(const ShmArena&) = delete;

  // What a peer needs to map this arena (goes into the node table).
  const ShmInfo& info() const { return info_; }

  struct Block {
    uint64_t offset = 0;  // of the payload from the arena's start (what the peer gets)
    char* data = nullptr;
  };
  // A ring block with `payload` bytes and one reference (the message that will
  // carry it), or nullopt when the ring has no room now.
  std::optional<Block> AllocateRing(uint64_t payload) EXCLUDES(ring_mu_);

  // A store block of `payload` bytes (contents undefined) owned by the
  // returned Blob; when the Blob's last copy goes, the block is reused once no
  // reader holds it. nullopt when the store has no room.
  struct Stored {
    Blob blob;
    char* data = nullptr;
    const int32_t* readers = nullptr;  // see Readers()
  };
  std::optional<Stored> AllocateStore(uint64_t payload) EXCLUDES(store_mu_);
  // A ring block of `payload` bytes (contents undefined) owned by the returned
  // Blob, for a buffer that is sent once or twice and then dropped; the ring
  // reuses it once the Blob and every reader are gone. nullopt when the ring
  // has no room. `readers` is left null.
  std::optional<Stored> AllocateOutgoing(uint64_t payload) EXCLUDES(ring_mu_);
  // Peers reading a store block now (its reference count); the owner may
  // write the block in place only at 0. Acquire semantics: once it reads 0,
  // every reader's reads happened before.
  static int32_t Readers(const int32_t* readers) {
    return __atomic_load_n(readers, __ATOMIC_ACQUIRE);
  }

  // If [data, data + size) is exactly the payload of a block this arena handed
  // out (AllocateStore, AllocateOutgoing), adds a reference for one message
  // and returns the payload's offset; else nullopt.
  std::optional<uint64_t> Reference(const char* data, uint64_t size);
  // Drops a reference taken by AllocateRing or Reference that was not made a
  // ticket.
  void Release(uint64_t offset);

  // Hands the reference just taken on the block at payload `offset`
  // (AllocateRing, Reference) to node `receiver`'s `incarnation` (a number
  // the caller changes when a new process takes that node id): a ticket in
  // the receiver's table, which the receiver's release (ShmMapping), a
  // ReleaseTicket or a ReleaseReceiver clears. nullopt, with the reference
  // dropped, when the id has no table or the table has no free slot.
  std::optional<ShmTicket> Ticket(int receiver, uint8_t incarnation, uint64_t offset);
  // Drops a ticket's reference (a message that was not sent). False when it
  // was dropped already.
  bool ReleaseTicket(int receiver, const ShmTicket& ticket);
  // Drops every reference that `incarnation` of node `receiver` still holds:
  // a receiver that died or was replaced (its values read or not, its queue
  // entries unread). Returns how many. A late release by that process is
  // then a no-op. Thread-safe with Ticket and releases; a ticket handed to
  // that incarnation after this started may be missed (call it once nothing
  // more is sent to it).
  int ReleaseReceiver(int receiver, uint8_t incarnation);

  // Appends (offset, bytes, ticket) to the queue read by node `receiver`, for
  // its `incarnation`. False when it is full, the id has no queue, or the
  // queue was reset for another incarnation (a send to a replaced process
  // still under way). The caller keeps its own order per receiver (the Van
  // numbers messages under the peer's lock).
  bool Enqueue(int receiver, uint8_t incarnation, uint64_t offset, uint64_t bytes,
               const ShmTicket& ticket) EXCLUDES(queue_mu_);
  // Empties the queue read by node `receiver` (the producer moves the
  // consumer's position) and gives it to `incarnation` (0 until then): for a
  // receiver replaced by a process that must not see what was queued for the
  // old one, nor what a send to the old one under way would queue. The
  // blocks those entries name are taken back by ReleaseReceiver for the old
  // incarnation. REQUIRES: nobody reads that queue now (the old reader is
  // gone, the new one has not mapped the arena yet).
  void ResetQueue(int receiver, uint8_t incarnation) EXCLUDES(queue_mu_);
  // This node's receive thread is (about to be) asleep: peers that enqueue
  // must ring its doorbell. Sequentially consistent, so an enqueue that misses
  // the flag is seen by the rescan that follows setting it.
  void SetSleeping(bool sleeping);

  // Ring bytes held by blocks not yet reclaimed, store bytes handed out (for
  // tests and stats).
  uint64_t ring_used_bytes() EXCLUDES(ring_mu_);
  uint64_t store_used_bytes() EXCLUDES(store_mu_);
  uint64_t ring_capacity() const { return ring_end_ - kShmRingBegin; }

 private:
  ShmArena() = default;
  void ReclaimRing() REQUIRES(ring_mu_);
  void ReclaimStore() REQUIRES(store_mu_);
  void FreeStore(uint64_t block) EXCLUDES(store_mu_);
  // Drops a reference on the block whose header a cleared ticket named, if
  // that is a block of ours (the ticket slots are peer-writable memory).
  void DropTicketReference(uint64_t ticket_value);

  char* base_ = nullptr;
  uint64_t size_ = 0;      // mapped bytes
  uint64_t ring_end_ = 0;  // ring: [kShmRingBegin, ring_end_); store: [ring_end_, size_)
  int fd_ = -1;
  ShmInfo info_;

  Mutex ring_mu_;
  uint64_t head_ GUARDED_BY(ring_mu_) = kShmRingBegin;    // next block goes here
  uint64_t tail_ GUARDED_BY(ring_mu_) = kShmRingBegin;    // oldest block not reclaimed
  uint64_t used_ GUARDED_BY(ring_mu_) = 0;                // bytes from tail_ to head_
  std::deque<uint64_t> ring_sizes_ GUARDED_BY(ring_mu_);  // blocks from tail_ on, in order

  Mutex queue_mu_;  // one producer per queue, even if two threads send to one peer
  // The incarnation each queue is for (ResetQueue).
  std::array<uint8_t, kShmMaxQueues> queue_incarnation_ GUARDED_BY(queue_mu_){};

  // Where each receiver's next ticket is looked for, and the tickets' generation.
  std::array<std::atomic<uint64_t>, kShmMaxQueues> ticket_cursor_{};
  std::atomic<uint32_t> ticket_generation_{0};

  Mutex store_mu_;
  uint64_t store_next_ GUARDED_BY(store_mu_) = 0;  // bump pointer (set by Create)
  uint64_t store_used_ GUARDED_BY(store_mu_) = 0;
  std::multimap<uint64_t, uint64_t> store_free_ GUARDED_BY(store_mu_);  // block bytes -> block
  std::vector<uint64_t> store_retired_ GUARDED_BY(store_mu_);           // dropped, still being read
  std::unordered_map<uint64_t, uint64_t> store_sizes_ GUARDED_BY(store_mu_);  // block -> bytes
};

// A buffer from `arena` (AllocateStore, or AllocateOutgoing when `outgoing`),
// or from the heap when `arena` is null or has no room (readers null then).
ShmArena::Stored AllocateOrHeap(ShmArena* arena, uint64_t bytes, bool outgoing);

// What tells this host from another for shared memory: the kernel's boot id
// (random at every boot, so two machines never share it) and this process's
// network namespace. Processes in two network namespaces of one machine (the
// emulated hosts of bench/cluster) are other hosts: their traffic must take
// the network, as it would between machines.
std::string ThisHost();

// A peer's arena mapped into this process.
class ShmMapping : public std::enable_shared_from_this<ShmMapping> {
 public:
  // Maps the arena `info` describes. Unavailable when it is not reachable from
  // here (another host or network namespace by ThisHost(), another PID
  // namespace, no permission, a stale entry): the caller then talks to that
  // peer over TCP.
  static StatusOr<std::shared_ptr<ShmMapping>> Open(const ShmInfo& info);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  // A received value frame for node `me`: `bytes` at payload `offset` of a
  // block, held by `ticket` in me's table. The Blob reads the arena in place;
  // destroying its last copy clears the ticket and drops the block's
  // reference. InvalidArgument (naming offset and size) when that is not a
  // live block of the arena or the ticket is not held for it.
  StatusOr<Blob> Resolve(int me, uint64_t offset, uint64_t bytes, const ShmTicket& ticket);
  // Hands back, unread, what Resolve would have read: for a message that is
  // dropped. Nothing when the ticket is not held for that block.
  void Drop(int me, uint64_t offset, const ShmTicket& ticket);

  // One entry of a queue: a block holding one message, and its ticket.
  struct QueueItem {
    uint64_t offset = 0;
    uint64_t bytes = 0;
    ShmTicket ticket;
  };
  // Takes the next entry of the queue the peer fills for node `me`: 1 and the
  // entry, 0 when it is empty, -1 when its indices are corrupt (the queue is
  // then skipped to its end). Consumer side: one thread per queue.
  int Dequeue(int me, QueueItem* item);
  bool QueueEmpty(int me) const;
  // Whether the peer's receive thread said it is asleep (see SetSleeping).
  bool PeerSleeping() const;

 private:
  ShmMapping() = default;
  // me's ticket slot for `ticket` if it holds the block whose payload is at
  // `offset`; else null.
  uint64_t* HeldTicket(int me, uint64_t offset, const ShmTicket& ticket) const;
  char* base_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_NET_SHM_ARENA_H_
