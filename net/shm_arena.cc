#include "net/shm_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>

namespace pstrain {
namespace {

constexpr uint64_t kArenaMagic = 0x70737472616e6133ull;  // "pstrana3"
constexpr uint32_t kBlockMagic = 0x4b4c4250;             // "PBLK"
constexpr uint32_t kPadMagic = 0x44415050;               // "PPAD": unused end of the ring

// At offset 0 of the arena.
struct ArenaHeader {
  uint64_t magic;
  uint64_t token;
  uint64_t bytes;
  char pad[40];
  uint32_t sleeping;  // its own cache line: the receive thread's flag
};

// One message queue (kShmQueueBytes). `head` is written by the producer only,
// `tail` by the consumer only; each on its own cache line.
struct QueueEntry {
  uint64_t offset;
  uint64_t bytes;
  uint64_t slot;    // the message block's ticket
  uint64_t ticket;  // (its slot and value)
};
struct Queue {
  uint64_t head;  // entries written
  char pad0[56];
  uint64_t tail;  // entries taken
  char pad1[56];
  QueueEntry entries[kShmQueueEntries];
};
static_assert(sizeof(Queue) == kShmQueueBytes, "queue layout");
static_assert(sizeof(ArenaHeader) <= kShmArenaHeaderBytes, "arena header");
static_assert(kShmRingBegin % kShmAlign == 0, "ring alignment");

Queue* QueueAt(char* base, int id) {
  return reinterpret_cast<Queue*>(base + kShmArenaHeaderBytes + uint64_t(id) * kShmQueueBytes);
}

// A ticket's value: the block's header offset in units of kShmAlign (38
// bits), the receiver's incarnation (8) and a generation (18), so a stale
// release of a slot that was cleared and taken again for the same block does
// not match.
constexpr int kTicketGenerationBits = 18;
constexpr int kTicketBlockShift = kTicketGenerationBits + 8;
static_assert(kShmMaxArenaBytes / kShmAlign <= (uint64_t{1} << (64 - kTicketBlockShift)),
              "a ticket holds any block offset");

uint64_t TicketValue(uint64_t header_offset, uint8_t incarnation, uint32_t generation) {
  return (header_offset / kShmAlign) << kTicketBlockShift |
         uint64_t{incarnation} << kTicketGenerationBits |
         (generation & ((uint32_t{1} << kTicketGenerationBits) - 1));
}
uint64_t TicketHeaderOffset(uint64_t value) { return (value >> kTicketBlockShift) * kShmAlign; }
uint8_t TicketIncarnation(uint64_t value) {
  return static_cast<uint8_t>(value >> kTicketGenerationBits);
}

uint64_t* TicketsAt(char* base, int id) {
  return reinterpret_cast<uint64_t*>(base + kShmTicketsBegin + uint64_t(id) * kShmTicketBytes);
}

// Clears `slot` if it still holds `value`: true for the one caller that did.
bool ClearTicket(uint64_t* slot, uint64_t value) {
  return __atomic_compare_exchange_n(slot, &value, 0, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

// Before every block's payload. `refs` is shared between processes and only
// touched with atomic builtins.
struct BlockHeader {
  uint32_t magic;
  int32_t refs;
  uint64_t total;    // bytes of the block, header included (a multiple of kShmAlign)
  uint64_t payload;  // payload bytes asked for
};
static_assert(sizeof(BlockHeader) <= kShmBlockHeaderBytes, "block header too big");
static_assert(__atomic_always_lock_free(sizeof(int32_t), nullptr),
              "shared reference counts need lock-free 32-bit atomics");

std::string Errno() { return std::strerror(errno); }

std::string ReadHostIdentity() {
  std::string boot;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof(buf), f) != nullptr) boot = buf;
    std::fclose(f);
  }
  while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
  struct stat st {};
  const std::string net =
      stat("/proc/self/ns/net", &st) == 0 ? StrCat(st.st_dev, ":", st.st_ino) : "?";
  return StrCat(boot.empty() ? "?" : boot, "/net:", net);
}

// One received frame's hold on its block: destroying it hands the block back,
// unless the owner took it back already (ShmArena::ReleaseReceiver).
struct FrameHold {
  std::shared_ptr<ShmMapping> mapping;  // keeps the mapping alive while read
  uint64_t* slot = nullptr;             // our ticket
  uint64_t ticket = 0;
  int32_t* refs = nullptr;
  ~FrameHold() {
    if (ClearTicket(slot, ticket)) __atomic_fetch_sub(refs, 1, __ATOMIC_RELEASE);
  }
};

// The owner's hold on a store block.
struct StoreHold {
  std::function<void()> free;
  ~StoreHold() { free(); }
};

}  // namespace

std::string ThisHost() { return ReadHostIdentity(); }

StatusOr<std::shared_ptr<ShmArena>> ShmArena::Create(uint64_t ring_bytes, uint64_t store_bytes) {
  ring_bytes = ring_bytes / kShmAlign * kShmAlign;
  store_bytes = store_bytes / kShmAlign * kShmAlign;
  if (ring_bytes < 4096) {
    return Status::InvalidArgument(
        StrCat("shared-memory ring of ", ring_bytes, " bytes is too small (at least 4096)"));
  }
  const uint64_t bytes = kShmRingBegin + ring_bytes + store_bytes;
  if (bytes > kShmMaxArenaBytes) {
    return Status::InvalidArgument(StrCat("shared-memory arena of ", bytes,
                                          " bytes is too big (at most ", kShmMaxArenaBytes, ")"));
  }
  std::shared_ptr<ShmArena> a(new ShmArena());
  a->fd_ = static_cast<int>(syscall(SYS_memfd_create, "pstrain-arena", MFD_CLOEXEC));
  if (a->fd_ < 0) return Status::IOError("memfd_create: " + Errno());
  if (ftruncate(a->fd_, static_cast<off_t>(bytes)) != 0) {
    return Status::IOError(StrCat("ftruncate of a ", bytes, "-byte arena: ", Errno()));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, a->fd_, 0);
  if (p == MAP_FAILED)
    return Status::IOError(StrCat("mmap of a ", bytes, "-byte arena: ", Errno()));
  a->base_ = static_cast<char*>(p);
  a->size_ = bytes;
  a->ring_end_ = kShmRingBegin + ring_bytes;
  {
    MutexLock l(&a->store_mu_);
    a->store_next_ = a->ring_end_;
  }
  std::random_device rd;
  uint64_t token = (uint64_t{rd()} << 32) ^ rd();
  token ^= static_cast<uint64_t>(getpid()) << 17;
  auto* h = reinterpret_cast<ArenaHeader*>(a->base_);
  h->magic = kArenaMagic;
  h->token = token;
  // Tickets of two arenas differ even for the same slot and block (a message
  // read from one and looked up in the other finds nothing).
  a->ticket_generation_.store(static_cast<uint32_t>(token >> 32), std::memory_order_relaxed);
  h->bytes = bytes;
  a->info_.set_pid(getpid());
  a->info_.set_fd(a->fd_);
  a->info_.set_bytes(bytes);
  a->info_.set_token(token);
  a->info_.set_uid(getuid());
  a->info_.set_host(ThisHost());
  return a;
}

ShmArena::~ShmArena() {
  if (base_ != nullptr) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);
}

void ShmArena::ReclaimRing() {
  // Block sizes come from ring_sizes_, never from shared memory a peer could
  // have scribbled on; only the reference counts are read there.
  while (used_ > 0) {
    auto* b = reinterpret_cast<BlockHeader*>(base_ + tail_);
    if (__atomic_load_n(&b->refs, __ATOMIC_ACQUIRE) != 0) break;
    const uint64_t total = ring_sizes_.front();
    ring_sizes_.pop_front();
    tail_ += total;
    used_ -= total;
    if (tail_ == ring_end_) tail_ = kShmRingBegin;
  }
  if (used_ == 0) head_ = tail_ = kShmRingBegin;  // start over: fewer pages touched
}

std::optional<ShmArena::Block> ShmArena::AllocateRing(uint64_t payload) {
  const uint64_t need = kShmBlockHeaderBytes + ShmRoundUp(payload);
  if (need > ring_capacity()) return std::nullopt;
  MutexLock l(&ring_mu_);
  ReclaimRing();
  if (used_ > 0 && head_ == tail_) return std::nullopt;  // full
  if (used_ > 0 && head_ < tail_) {                      // wrapped: free is [head_, tail_)
    if (tail_ - head_ < need) return std::nullopt;
  } else if (ring_end_ - head_ < need) {  // free: [head_, end) and [start, tail_)
    if (tail_ - kShmRingBegin < need) return std::nullopt;
    auto* pad = reinterpret_cast<BlockHeader*>(base_ + head_);
    pad->magic = kPadMagic;
    pad->total = ring_end_ - head_;
    ring_sizes_.push_back(ring_end_ - head_);
    pad->payload = 0;
    __atomic_store_n(&pad->refs, 0, __ATOMIC_RELAXED);
    used_ += ring_end_ - head_;
    head_ = kShmRingBegin;
  }
  auto* b = reinterpret_cast<BlockHeader*>(base_ + head_);
  b->magic = kBlockMagic;
  b->total = need;
  b->payload = payload;
  __atomic_store_n(&b->refs, 1, __ATOMIC_RELAXED);
  ring_sizes_.push_back(need);
  Block block{head_ + kShmBlockHeaderBytes, base_ + head_ + kShmBlockHeaderBytes};
  head_ += need;
  used_ += need;
  if (head_ == ring_end_) head_ = kShmRingBegin;
  return block;
}

std::optional<ShmArena::Stored> ShmArena::AllocateOutgoing(uint64_t payload) {
  std::optional<Block> block = AllocateRing(payload);
  if (!block.has_value()) return std::nullopt;
  auto hold = std::make_shared<StoreHold>();
  // The Blob's reference is the block's first; the arena stays alive with it.
  hold->free = [arena = shared_from_this(), offset = block->offset] { arena->Release(offset); };
  Stored s;
  s.data = block->data;
  s.blob = Blob(std::shared_ptr<const void>(hold, s.data), s.data, payload);
  return s;
}

ShmArena::Stored AllocateOrHeap(ShmArena* arena, uint64_t bytes, bool outgoing) {
  if (arena != nullptr) {
    auto s = outgoing ? arena->AllocateOutgoing(bytes) : arena->AllocateStore(bytes);
    if (s.has_value()) return *std::move(s);
  }
  ShmArena::Stored s;
  s.blob = Blob::Allocate(bytes, &s.data);
  return s;
}

void ShmArena::ReclaimStore() {
  size_t keep = 0;
  for (uint64_t block : store_retired_) {
    auto* b = reinterpret_cast<BlockHeader*>(base_ + block);
    if (__atomic_load_n(&b->refs, __ATOMIC_ACQUIRE) == 0) {
      const uint64_t total = store_sizes_.at(block);  // ours, not the shared header's
      store_free_.emplace(total, block);
      store_used_ -= total;
    } else {
      store_retired_[keep++] = block;
    }
  }
  store_retired_.resize(keep);
}

std::optional<ShmArena::Stored> ShmArena::AllocateStore(uint64_t payload) {
  const uint64_t need = kShmBlockHeaderBytes + ShmRoundUp(payload);
  uint64_t block = 0;
  {
    MutexLock l(&store_mu_);
    ReclaimStore();
    // Stored values come in few sizes (one per key), so an exact fit is the
    // common case, and the block freed last (still in cache) is taken; a free
    // block up to 1/8 bigger is taken too.
    auto it = store_free_.upper_bound(need);
    if (it != store_free_.begin() && std::prev(it)->first == need) {
      --it;
    } else {
      it = store_free_.lower_bound(need);
    }
    if (it != store_free_.end() && it->first <= need + need / 8) {
      block = it->second;
      store_used_ += it->first;
      store_free_.erase(it);
    } else if (size_ - store_next_ >= need) {
      block = store_next_;
      store_next_ += need;
      store_used_ += need;
      store_sizes_[block] = need;
      auto* b = reinterpret_cast<BlockHeader*>(base_ + block);
      b->total = need;
    } else {
      return std::nullopt;
    }
  }
  auto* b = reinterpret_cast<BlockHeader*>(base_ + block);
  b->magic = kBlockMagic;
  b->payload = payload;
  __atomic_store_n(&b->refs, 0, __ATOMIC_RELAXED);
  auto hold = std::make_shared<StoreHold>();
  // The Blob keeps the arena (and so its memory) alive.
  hold->free = [arena = shared_from_this(), block] { arena->FreeStore(block); };
  Stored s;
  s.data = base_ + block + kShmBlockHeaderBytes;
  s.blob = Blob(std::shared_ptr<const void>(hold, s.data), s.data, payload);
  s.readers = &b->refs;
  return s;
}

void ShmArena::FreeStore(uint64_t block) {
  MutexLock l(&store_mu_);
  store_retired_.push_back(block);
  ReclaimStore();
}

std::optional<uint64_t> ShmArena::Reference(const char* data, uint64_t size) {
  if (data < base_ + kShmRingBegin + kShmBlockHeaderBytes || data >= base_ + size_) {
    return std::nullopt;
  }
  const uint64_t offset = static_cast<uint64_t>(data - base_);
  if (offset % kShmAlign != 0) return std::nullopt;
  auto* b = reinterpret_cast<BlockHeader*>(base_ + offset - kShmBlockHeaderBytes);
  if (b->magic != kBlockMagic || b->payload != size) return std::nullopt;
  __atomic_fetch_add(&b->refs, 1, __ATOMIC_RELAXED);
  return offset;
}

std::optional<ShmTicket> ShmArena::Ticket(int receiver, uint8_t incarnation, uint64_t offset) {
  if (offset < kShmRingBegin + kShmBlockHeaderBytes) return std::nullopt;  // no block: no reference
  if (receiver < 0 || receiver >= kShmMaxQueues) {
    Release(offset);
    return std::nullopt;
  }
  uint64_t* slots = TicketsAt(base_, receiver);
  const uint64_t value = TicketValue(offset - kShmBlockHeaderBytes, incarnation,
                                     ticket_generation_.fetch_add(1, std::memory_order_relaxed));
  std::atomic<uint64_t>& cursor = ticket_cursor_[receiver];
  // Receivers mostly let go in the order they were sent to, so the slots
  // after the last one taken are mostly free: look from there, over the whole
  // table if need be, and move the cursor past a run of held slots so the
  // next ticket does not walk it again. The cursor only grows: every slot
  // below min(cursor, kShmTicketSlots) may have been used (ReleaseReceiver).
  const uint64_t start = cursor.fetch_add(1, std::memory_order_relaxed);
  for (uint64_t i = 0; i < kShmTicketSlots; ++i) {
    const auto slot = static_cast<uint32_t>((start + i) % kShmTicketSlots);
    if (__atomic_load_n(&slots[slot], __ATOMIC_RELAXED) != 0) continue;
    uint64_t expected = 0;
    if (__atomic_compare_exchange_n(&slots[slot], &expected, value, false, __ATOMIC_RELEASE,
                                    __ATOMIC_RELAXED)) {
      if (i > 0) cursor.fetch_add(i, std::memory_order_relaxed);
      return ShmTicket{slot, value};
    }
  }
  Release(offset);
  return std::nullopt;
}

bool ShmArena::ReleaseTicket(int receiver, const ShmTicket& ticket) {
  if (receiver < 0 || receiver >= kShmMaxQueues || ticket.slot >= kShmTicketSlots ||
      ticket.value == 0) {
    return false;
  }
  if (!ClearTicket(&TicketsAt(base_, receiver)[ticket.slot], ticket.value)) return false;
  DropTicketReference(ticket.value);
  return true;
}

int ShmArena::ReleaseReceiver(int receiver, uint8_t incarnation) {
  if (receiver < 0 || receiver >= kShmMaxQueues) return 0;
  // Only slots a ticket was ever tried in: an untouched table stays untouched
  // (reading a shared page allocates it).
  const uint64_t tried =
      std::min<uint64_t>(ticket_cursor_[receiver].load(std::memory_order_relaxed), kShmTicketSlots);
  uint64_t* slots = TicketsAt(base_, receiver);
  int released = 0;
  for (uint64_t i = 0; i < tried; ++i) {
    const uint64_t value = __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE);
    if (value == 0 || TicketIncarnation(value) != incarnation) continue;
    if (ClearTicket(&slots[i], value)) {
      DropTicketReference(value);
      ++released;
    }
  }
  return released;
}

void ShmArena::DropTicketReference(uint64_t ticket_value) {
  const uint64_t header = TicketHeaderOffset(ticket_value);
  if (header < kShmRingBegin || header > size_ - kShmBlockHeaderBytes) return;
  auto* b = reinterpret_cast<BlockHeader*>(base_ + header);
  if (__atomic_load_n(&b->magic, __ATOMIC_RELAXED) != kBlockMagic) return;
  __atomic_fetch_sub(&b->refs, 1, __ATOMIC_RELEASE);
}

bool ShmArena::Enqueue(int receiver, uint8_t incarnation, uint64_t offset, uint64_t bytes,
                       const ShmTicket& ticket) {
  if (receiver < 0 || receiver >= kShmMaxQueues) return false;
  MutexLock l(&queue_mu_);
  if (queue_incarnation_[receiver] != incarnation) return false;
  Queue* q = QueueAt(base_, receiver);
  const uint64_t head = __atomic_load_n(&q->head, __ATOMIC_RELAXED);
  if (head - __atomic_load_n(&q->tail, __ATOMIC_ACQUIRE) >= kShmQueueEntries) return false;
  q->entries[head % kShmQueueEntries] = QueueEntry{offset, bytes, ticket.slot, ticket.value};
  __atomic_store_n(&q->head, head + 1, __ATOMIC_RELEASE);
  // Pairs with the receiver's fence between setting `sleeping` and its rescan.
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return true;
}

void ShmArena::ResetQueue(int receiver, uint8_t incarnation) {
  if (receiver < 0 || receiver >= kShmMaxQueues) return;
  MutexLock l(&queue_mu_);
  queue_incarnation_[receiver] = incarnation;
  Queue* q = QueueAt(base_, receiver);
  __atomic_store_n(&q->tail, __atomic_load_n(&q->head, __ATOMIC_RELAXED), __ATOMIC_RELEASE);
}

void ShmArena::SetSleeping(bool sleeping) {
  auto* h = reinterpret_cast<ArenaHeader*>(base_);
  __atomic_store_n(&h->sleeping, sleeping ? 1u : 0u, __ATOMIC_SEQ_CST);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

void ShmArena::Release(uint64_t offset) {
  auto* b = reinterpret_cast<BlockHeader*>(base_ + offset - kShmBlockHeaderBytes);
  __atomic_fetch_sub(&b->refs, 1, __ATOMIC_RELEASE);
}

uint64_t ShmArena::ring_used_bytes() {
  MutexLock l(&ring_mu_);
  ReclaimRing();
  return used_;
}

uint64_t ShmArena::store_used_bytes() {
  MutexLock l(&store_mu_);
  ReclaimStore();
  return store_used_;
}

StatusOr<std::shared_ptr<ShmMapping>> ShmMapping::Open(const ShmInfo& info) {
  const std::string path = StrCat("/proc/", info.pid(), "/fd/", info.fd());
  if (const std::string here = ThisHost(); info.host() != here) {
    return Status::Unavailable(
        StrCat("arena ", path, " is on another host (", info.host(), ", this is ", here, ")"));
  }
  if (info.uid() != getuid()) {
    return Status::Unavailable(StrCat("arena ", path, " belongs to uid ", info.uid()));
  }
  if (info.bytes() < kShmRingBegin + 4096 || info.bytes() % kShmAlign != 0) {
    return Status::InvalidArgument(StrCat("arena ", path, " claims ", info.bytes(), " bytes"));
  }
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Status::Unavailable(StrCat("cannot open ", path, ": ", Errno()));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != info.bytes()) {
    close(fd);
    return Status::Unavailable(StrCat(path, " is not the peer's ", info.bytes(), "-byte arena"));
  }
  void* p = mmap(nullptr, info.bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  close(fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) return Status::Unavailable(StrCat("mmap of ", path, ": ", Errno()));
  std::shared_ptr<ShmMapping> m(new ShmMapping());
  m->base_ = static_cast<char*>(p);
  m->size_ = info.bytes();
  const auto* h = reinterpret_cast<const ArenaHeader*>(m->base_);
  if (h->magic != kArenaMagic || h->token != info.token() || h->bytes != info.bytes()) {
    return Status::Unavailable(StrCat(path, " is not the peer's arena (token mismatch)"));
  }
  return m;
}

int ShmMapping::Dequeue(int me, QueueItem* item) {
  if (me < 0 || me >= kShmMaxQueues) return 0;
  Queue* q = QueueAt(base_, me);
  const uint64_t tail = __atomic_load_n(&q->tail, __ATOMIC_RELAXED);
  const uint64_t head = __atomic_load_n(&q->head, __ATOMIC_ACQUIRE);
  if (head == tail) return 0;
  if (head - tail > kShmQueueEntries) {
    __atomic_store_n(&q->tail, head, __ATOMIC_RELEASE);
    return -1;
  }
  const QueueEntry e = q->entries[tail % kShmQueueEntries];
  __atomic_store_n(&q->tail, tail + 1, __ATOMIC_RELEASE);
  item->offset = e.offset;
  item->bytes = e.bytes;
  // A slot past the table is refused by Resolve; only the low bits are kept.
  item->ticket.slot = static_cast<uint32_t>(std::min<uint64_t>(e.slot, kShmTicketSlots));
  item->ticket.value = e.ticket;
  return 1;
}

bool ShmMapping::QueueEmpty(int me) const {
  if (me < 0 || me >= kShmMaxQueues) return true;
  Queue* q = QueueAt(base_, me);
  return __atomic_load_n(&q->head, __ATOMIC_ACQUIRE) == __atomic_load_n(&q->tail, __ATOMIC_RELAXED);
}

bool ShmMapping::PeerSleeping() const {
  const auto* h = reinterpret_cast<const ArenaHeader*>(base_);
  return __atomic_load_n(&h->sleeping, __ATOMIC_SEQ_CST) != 0;
}

ShmMapping::~ShmMapping() {
  if (base_ != nullptr) munmap(base_, size_);
}

uint64_t* ShmMapping::HeldTicket(int me, uint64_t offset, const ShmTicket& ticket) const {
  if (me < 0 || me >= kShmMaxQueues || ticket.slot >= kShmTicketSlots || ticket.value == 0 ||
      TicketHeaderOffset(ticket.value) + kShmBlockHeaderBytes != offset) {
    return nullptr;
  }
  uint64_t* slot = &TicketsAt(base_, me)[ticket.slot];
  return __atomic_load_n(slot, __ATOMIC_ACQUIRE) == ticket.value ? slot : nullptr;
}

StatusOr<Blob> ShmMapping::Resolve(int me, uint64_t offset, uint64_t bytes,
                                   const ShmTicket& ticket) {
  if (offset > size_ || bytes > size_ - offset) {
    return Status::InvalidArgument(StrCat("shared-memory frame of ", bytes, " bytes at offset ",
                                          offset, " lies outside the ", size_, "-byte arena"));
  }
  if (offset % kShmAlign != 0 || offset < kShmRingBegin + kShmBlockHeaderBytes) {
    return Status::InvalidArgument(StrCat("shared-memory offset ", offset,
                                          " cannot start a block's payload (misaligned or in the "
                                          "arena header)"));
  }
  uint64_t* slot = HeldTicket(me, offset, ticket);
  if (slot == nullptr) {
    return Status::InvalidArgument(StrCat("shared-memory frame of ", bytes, " bytes at offset ",
                                          offset, ": ticket ", ticket.slot, " of ", NodeIdName(me),
                                          " does not hold that block (released, or forged)"));
  }
  auto* b = reinterpret_cast<BlockHeader*>(base_ + offset - kShmBlockHeaderBytes);
  if (__atomic_load_n(&b->magic, __ATOMIC_RELAXED) != kBlockMagic ||
      __atomic_load_n(&b->payload, __ATOMIC_RELAXED) < bytes ||
      __atomic_load_n(&b->refs, __ATOMIC_ACQUIRE) <= 0) {
    return Status::InvalidArgument(
        StrCat("no live shared-memory block of ", bytes, " bytes at offset ", offset));
  }
  auto hold = std::make_shared<FrameHold>();
  hold->mapping = shared_from_this();
  hold->slot = slot;
  hold->ticket = ticket.value;
  hold->refs = &b->refs;
  char* data = base_ + offset;
  return Blob(std::shared_ptr<const void>(hold, data), data, bytes);
}

void ShmMapping::Drop(int me, uint64_t offset, const ShmTicket& ticket) {
  uint64_t* slot = HeldTicket(me, offset, ticket);
  if (slot == nullptr || offset > size_ || offset % kShmAlign != 0 ||
      offset < kShmRingBegin + kShmBlockHeaderBytes) {
    return;
  }
  auto* b = reinterpret_cast<BlockHeader*>(base_ + offset - kShmBlockHeaderBytes);
  if (ClearTicket(slot, ticket.value)) __atomic_fetch_sub(&b->refs, 1, __ATOMIC_RELEASE);
}

}  // namespace pstrain
