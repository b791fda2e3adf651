// The shared-memory data plane: the arena's ring and store, mapping a peer's
// arena, and two Vans in this process that exchange values through it.
#include "net/shm_arena.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "net/shm_queue.h"
#include "net/van.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

constexpr uint64_t kBlock = kShmBlockHeaderBytes;
constexpr int kReader = 3;  // the node id of the peer that maps an arena

// Hands the reference just taken on the block at `offset` to kReader.
ShmTicket Hand(ShmArena& arena, uint64_t offset) {
  std::optional<ShmTicket> t = arena.Ticket(kReader, 0, offset);
  CHECK(t.has_value());
  return *t;
}

std::shared_ptr<ShmArena> MakeArena(uint64_t ring, uint64_t store = 0) {
  auto a = ShmArena::Create(ring, store);
  CHECK_OK(a.status());
  return *a;
}

TEST(ShmArenaTest, RingReusesSpaceOnlyOnceEveryEarlierBlockIsFree) {
  auto arena = MakeArena(4096);  // room for 4 blocks of 960 payload bytes (1 KB each)
  std::vector<ShmArena::Block> b;
  for (int i = 0; i < 4; ++i) {
    auto blk = arena->AllocateRing(1024 - kBlock);
    ASSERT_TRUE(blk.has_value()) << i;
    b.push_back(*blk);
  }
  EXPECT_FALSE(arena->AllocateRing(1).has_value()) << "the ring is full";
  EXPECT_EQ(arena->ring_used_bytes(), 4096u);
  arena->Release(b[1].offset);  // out of order: block 0 still holds the tail
  EXPECT_FALSE(arena->AllocateRing(1).has_value());
  arena->Release(b[0].offset);  // blocks 0 and 1 come back together
  EXPECT_EQ(arena->ring_used_bytes(), 2048u);
  auto again = arena->AllocateRing(2048 - kBlock);  // wraps to the start
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->offset, b[0].offset);
  arena->Release(b[2].offset);
  arena->Release(b[3].offset);
  arena->Release(again->offset);
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
  EXPECT_FALSE(arena->AllocateRing(4096).has_value()) << "bigger than the ring";
}

TEST(ShmArenaTest, RingPadsTheEndWhenABlockDoesNotFitBeforeIt) {
  auto arena = MakeArena(4096);
  auto a = arena->AllocateRing(1536 - kBlock);
  auto b = arena->AllocateRing(1536 - kBlock);
  ASSERT_TRUE(a && b);
  arena->Release(a->offset);
  // 1 KB left at the end, 1.5 KB free at the start: the 1.5 KB block goes to
  // the start and the end is padded.
  auto c = arena->AllocateRing(1536 - kBlock);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->offset, a->offset);
  EXPECT_EQ(arena->ring_used_bytes(), 4096u);
  arena->Release(b->offset);  // frees b and the padding behind it
  EXPECT_EQ(arena->ring_used_bytes(), 1536u);
  arena->Release(c->offset);
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
}

TEST(ShmArenaTest, RingSurvivesManyRandomSizedBlocksReleasedOutOfOrder) {
  auto arena = MakeArena(1 << 16);
  std::deque<ShmArena::Block> live;
  std::vector<std::pair<ShmArena::Block, uint64_t>> all;
  uint32_t rng = 12345;
  auto next = [&] { return rng = rng * 1664525u + 1013904223u; };
  for (int i = 0; i < 5000; ++i) {
    const uint64_t size = 1 + next() % 9000;
    auto blk = arena->AllocateRing(size);
    if (blk.has_value()) {
      std::memset(blk->data, i & 0xff, size);
      live.push_back(*blk);
    }
    // Release one at random (not always the oldest) now and then.
    if (!live.empty() && (next() % 3 == 0 || !blk.has_value())) {
      const size_t k = next() % live.size();
      arena->Release(live[k].offset);
      live.erase(live.begin() + static_cast<long>(k));
    }
  }
  for (const auto& blk : live) arena->Release(blk.offset);
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
}

TEST(ShmArenaTest, RingDoesNotTrustBlockHeadersThatPeersCanWrite) {
  auto arena = MakeArena(1 << 16);
  auto a = arena->AllocateRing(1000);
  auto b = arena->AllocateRing(1000);
  ASSERT_TRUE(a && b);
  // A peer scribbles over the size fields of both headers (bytes 8..23).
  std::memset(a->data - kBlock + 8, 0, 16);
  std::memset(b->data - kBlock + 8, 0xff, 16);
  arena->Release(a->offset);
  arena->Release(b->offset);
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
  auto c = arena->AllocateRing(60000);
  ASSERT_TRUE(c.has_value());
  arena->Release(c->offset);
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
}

TEST(ShmArenaTest, PeerMapsTheArenaAndItsReadsReleaseRingBlocks) {
  auto arena = MakeArena(1 << 20);
  auto mapping = ShmMapping::Open(arena->info());
  ASSERT_OK(mapping.status());
  auto blk = arena->AllocateRing(1000);
  ASSERT_TRUE(blk.has_value());
  std::memcpy(blk->data, "hello", 6);
  {
    auto blob = (*mapping)->Resolve(kReader, blk->offset, 1000, Hand(*arena, blk->offset));
    ASSERT_OK(blob.status());
    EXPECT_STREQ(blob->data(), "hello");
    EXPECT_NE(blob->data(), blk->data) << "a second mapping of the same memory";
    EXPECT_GT(arena->ring_used_bytes(), 0u);
  }
  EXPECT_EQ(arena->ring_used_bytes(), 0u) << "the reader's release frees the block";
}

TEST(ShmArenaTest, MappingRefusesAWrongTokenOrAMissingArena) {
  auto arena = MakeArena(1 << 20);
  ShmInfo bad = arena->info();
  bad.set_token(bad.token() ^ 1);
  EXPECT_EQ(ShmMapping::Open(bad).status().code(), StatusCode::kUnavailable);
  ShmInfo gone = arena->info();
  gone.set_fd(100000);
  auto s = ShmMapping::Open(gone).status();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("/fd/100000"), std::string::npos) << s;
}

// Two network namespaces of one machine are two hosts (bench/cluster): the
// arena stays where it is and the peer talks over TCP.
TEST(ShmArenaTest, AnArenaInAnotherNetworkNamespaceIsOnAnotherHost) {
  auto arena = MakeArena(1 << 20);
  ASSERT_OK(ShmMapping::Open(arena->info()).status());  // the same host maps it
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWNET) != 0) _exit(2);
    const Status s = ShmMapping::Open(arena->info()).status();
    _exit(s.code() == StatusCode::kUnavailable &&
                  s.message().find("on another host") != std::string::npos
              ? 0
              : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 2) {
    GTEST_SKIP() << "cannot make a network namespace here (needs root or user namespaces)";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0) << "a process in another network namespace mapped the arena";
}

TEST(ShmArenaTest, ResolveRejectsOffsetsThatAreNotLiveBlocks) {
  auto arena = MakeArena(1 << 20);
  auto mapping = ShmMapping::Open(arena->info());
  ASSERT_OK(mapping.status());
  auto blk = arena->AllocateRing(4096);
  ASSERT_TRUE(blk.has_value());
  ShmMapping& m = **mapping;
  const ShmTicket t = Hand(*arena, blk->offset);
  EXPECT_FALSE(m.Resolve(kReader, blk->offset + 8, 16, t).ok()) << "misaligned";
  EXPECT_FALSE(m.Resolve(kReader, blk->offset + 64, 16, t).ok()) << "inside a block";
  EXPECT_FALSE(m.Resolve(kReader, blk->offset, 8192, t).ok()) << "more than the block holds";
  EXPECT_FALSE(m.Resolve(kReader, uint64_t{1} << 40, 16, t).ok()) << "past the arena";
  EXPECT_FALSE(m.Resolve(kReader, 0, 16, t).ok()) << "the arena header";
  auto s = m.Resolve(kReader, ~uint64_t{0} - 63, 128, t).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(arena->ReleaseTicket(kReader, t));
  EXPECT_FALSE(arena->ReleaseTicket(kReader, t)) << "once";
  EXPECT_FALSE(m.Resolve(kReader, blk->offset, 16, t).ok()) << "a released block";
  EXPECT_EQ(arena->ring_used_bytes(), 0u) << "failed resolves take no reference";
  // A block whose count a peer zeroed is refused even with its ticket.
  auto other = arena->AllocateRing(64);
  ASSERT_TRUE(other.has_value());
  const ShmTicket live = Hand(*arena, other->offset);
  arena->Release(other->offset);
  EXPECT_FALSE(m.Resolve(kReader, other->offset, 64, live).ok()) << "no reference left";
}

TEST(ShmArenaTest, StoreBlocksAreReferencedWithoutCopyAndReusedOnlyWhenUnread) {
  auto arena = MakeArena(1 << 20, 1 << 20);
  auto mapping = ShmMapping::Open(arena->info());
  ASSERT_OK(mapping.status());
  auto stored = arena->AllocateStore(4000);
  ASSERT_TRUE(stored.has_value());
  std::memset(stored->data, 7, 4000);
  EXPECT_EQ(ShmArena::Readers(stored->readers), 0);
  EXPECT_FALSE(arena->Reference(stored->data + 64, 100).has_value()) << "not a block start";
  EXPECT_FALSE(arena->Reference(stored->data, 100).has_value()) << "not the whole payload";
  auto offset = arena->Reference(stored->data, 4000);
  ASSERT_TRUE(offset.has_value());
  EXPECT_EQ(ShmArena::Readers(stored->readers), 1);
  const char* data = stored->data;
  Blob read;
  {
    auto blob = (*mapping)->Resolve(kReader, *offset, 4000, Hand(*arena, *offset));
    ASSERT_OK(blob.status());
    EXPECT_EQ(blob->data()[3999], 7);
    read = *blob;
  }
  // The owner drops its value while a peer still reads it: not reused yet.
  stored.reset();
  const uint64_t used = arena->store_used_bytes();
  EXPECT_GE(used, 4000u);
  auto other = arena->AllocateStore(4000);
  ASSERT_TRUE(other.has_value());
  EXPECT_NE(other->data, data);
  read = Blob();  // the reader is done
  EXPECT_EQ(arena->store_used_bytes(), used) << "the retired block is free again";
  auto reused = arena->AllocateStore(4000);
  ASSERT_TRUE(reused.has_value());
  EXPECT_EQ(reused->data, data) << "same size: the freed block comes back";
  auto again = arena->Reference(reused->data, 4000);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(ShmArena::Readers(reused->readers), 1);
  arena->Release(*again);  // a send that failed hands its reference back
  EXPECT_EQ(ShmArena::Readers(reused->readers), 0);
  EXPECT_FALSE(arena->AllocateStore(2 << 20).has_value()) << "bigger than the store";
}

TEST(ShmArenaTest, OutgoingBuffersLiveInTheRingUntilTheOwnerAndEveryReaderLetGo) {
  auto arena = MakeArena(1 << 16);
  auto mapping = ShmMapping::Open(arena->info());
  ASSERT_OK(mapping.status());
  auto out = arena->AllocateOutgoing(5000);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->readers, nullptr);
  std::memset(out->data, 3, 5000);
  auto offset = arena->Reference(out->data, 5000);  // the Van sends it by reference
  ASSERT_TRUE(offset.has_value());
  auto blob = (*mapping)->Resolve(kReader, *offset, 5000, Hand(*arena, *offset));
  ASSERT_OK(blob.status());
  out.reset();  // the owner is done first
  EXPECT_GT(arena->ring_used_bytes(), 0u) << "the reader still holds it";
  EXPECT_EQ(blob->data()[4999], 3);
  *blob = Blob();
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
}

TEST(ShmArenaTest, AllocateOrHeapFallsBackToTheHeapWhenTheArenaIsFullOrAbsent) {
  auto arena = MakeArena(4096, 4096);
  ShmArena::Stored heap = AllocateOrHeap(nullptr, 100, false);
  EXPECT_EQ(heap.readers, nullptr);
  EXPECT_EQ(heap.blob.size(), 100u);
  ShmArena::Stored big = AllocateOrHeap(arena.get(), 1 << 20, false);
  EXPECT_EQ(big.readers, nullptr) << "bigger than the store: heap";
  EXPECT_FALSE(arena->Reference(big.data, 1 << 20).has_value());
  ShmArena::Stored in_store = AllocateOrHeap(arena.get(), 1000, false);
  EXPECT_NE(in_store.readers, nullptr);
  ShmArena::Stored in_ring = AllocateOrHeap(arena.get(), 1000, true);
  EXPECT_TRUE(arena->Reference(in_ring.data, 1000).has_value());
}

// ---- two Vans in this process ----

struct Inbox {
  Mutex mu;
  CondVar cv{&mu};
  std::vector<Message> got GUARDED_BY(mu);
  Message Next() {
    MutexLock l(&mu);
    cv.WaitUntil(Deadline::InMillis(5000), [this]() REQUIRES(mu) { return !got.empty(); });
    CHECK(!got.empty()) << "no message within 5 s";
    Message m = std::move(got.front());
    got.erase(got.begin());
    return m;
  }
};

struct VanPair {
  Inbox inbox_a, inbox_b;
  // While set, b's receive thread waits in its handler (its queue fills up).
  std::atomic<bool> hold_b{false};
  std::unique_ptr<Van> a, b;  // a is "worker 0" to b, b is "server 0" to a
  explicit VanPair(uint64_t ring = 1 << 20, uint64_t store = 1 << 20) {
    VanOptions vo;
    vo.bind_host = "127.0.0.1";
    vo.shm_bytes = ring;
    vo.name = "a";
    auto va = Van::Create(vo, [this](Message&& m) {
      MutexLock l(&inbox_a.mu);
      inbox_a.got.push_back(std::move(m));
      inbox_a.cv.SignalAll();
    });
    vo.name = "b";
    vo.shm_store_bytes = store;
    auto vb = Van::Create(vo, [this](Message&& m) {
      for (int i = 0; i < 5000 && hold_b.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      MutexLock l(&inbox_b.mu);
      inbox_b.got.push_back(std::move(m));
      inbox_b.cv.SignalAll();
    });
    CHECK_OK(va.status());
    CHECK_OK(vb.status());
    a = std::move(va).value();
    b = std::move(vb).value();
    a->SetSelfId(WorkerId(0));
    b->SetSelfId(ServerId(0));
    a->StartReceiving();
    b->StartReceiving();
    CHECK_OK(a->Connect(ServerId(0), "127.0.0.1", b->port(), b->shm_info()));
    CHECK_OK(b->Connect(WorkerId(0), "127.0.0.1", a->port(), a->shm_info()));
  }
};

// A data message from `sender` with one key of `values`.
Message DataMessage(int sender, int receiver, const Blob& values) {
  Message m;
  m.header.set_version(PROTOCOL_VERSION_CURRENT);
  m.header.set_cmd(CMD_DATA);
  m.header.set_sender(sender);
  m.header.set_receiver(receiver);
  m.header.set_push(true);
  m.header.set_num_keys(1);
  m.header.set_num_value_frames(1);
  m.header.set_value_bytes(values.size());
  const uint64_t key = WireKey(0, 5, 0);
  const uint32_t len = static_cast<uint32_t>(values.size() / sizeof(float));
  m.keys = Blob::Copy(&key, sizeof(key));
  m.lens = Blob::Copy(&len, sizeof(len));
  m.values.push_back(values);
  return m;
}

Blob Floats(size_t n, float v) {
  std::vector<float> f(n, v);
  return Blob::Copy(f.data(), n * sizeof(float));
}

TEST(VanShmTest, ValuesGoThroughSharedMemoryOnceThePeerSaysItMappedOurs) {
  VanPair p;
  ASSERT_NE(p.a->shm_info(), nullptr);
  // a has mapped b's arena, but b has not said it mapped a's: TCP.
  ASSERT_OK(p.a->Send(ServerId(0), DataMessage(WorkerId(0), ServerId(0), Floats(5000, 1.5f))));
  Message first = p.inbox_b.Next();
  EXPECT_TRUE(first.header.shm_mapped());
  EXPECT_EQ(first.header.shm_frame_offset_size(), 0);
  EXPECT_EQ(p.a->shm_sent(), 0);
  EXPECT_TRUE(p.b->PeerMapsOurArena(WorkerId(0)));
  // b now knows; its reply goes through its arena.
  ASSERT_OK(p.b->Send(WorkerId(0), DataMessage(ServerId(0), WorkerId(0), Floats(5000, 2.5f))));
  Message reply = p.inbox_a.Next();
  EXPECT_EQ(reply.header.shm_frame_offset_size(), 1);
  EXPECT_EQ(p.b->shm_sent(), 1);
  ASSERT_EQ(reply.values.size(), 1u);
  EXPECT_EQ(reinterpret_cast<const float*>(reply.values[0].data())[4999], 2.5f);
  EXPECT_GT(p.b->arena()->ring_used_bytes(), 0u) << "a still holds the reply";
  reply = Message();
  // a's receive thread lets go of the queued message's envelope on its own time.
  for (int i = 0; i < 500 && p.b->arena()->ring_used_bytes() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(p.b->arena()->ring_used_bytes(), 0u);
  // And a's next push too (b's reply said b mapped a's arena).
  ASSERT_OK(p.a->Send(ServerId(0), DataMessage(WorkerId(0), ServerId(0), Floats(5000, 3.5f))));
  Message second = p.inbox_b.Next();
  EXPECT_EQ(p.a->shm_sent(), 1);
  EXPECT_EQ(reinterpret_cast<const float*>(second.values[0].data())[0], 3.5f);
}

TEST(VanShmTest, StoredValuesAreSentByReferenceAndSmallValuesAreNotGivenRingBlocks) {
  VanPair p;
  ASSERT_OK(p.a->Send(ServerId(0), DataMessage(WorkerId(0), ServerId(0), Floats(16, 1.0f))));
  (void)p.inbox_b.Next();  // the handshake
  ShmArena::Stored stored = AllocateOrHeap(p.b->arena().get(), 64 * sizeof(float), false);
  ASSERT_NE(stored.readers, nullptr) << "b has a store";
  for (int i = 0; i < 64; ++i) reinterpret_cast<float*>(stored.data)[i] = static_cast<float>(i);
  ASSERT_OK(p.b->Send(WorkerId(0), DataMessage(ServerId(0), WorkerId(0), stored.blob)));
  Message m = p.inbox_a.Next();
  ASSERT_EQ(m.header.shm_frame_offset_size(), 1) << "256 bytes, but by reference";
  EXPECT_EQ(ShmArena::Readers(stored.readers), 1);
  EXPECT_EQ(reinterpret_cast<const float*>(m.values[0].data())[63], 63.0f);
  m = Message();
  EXPECT_EQ(ShmArena::Readers(stored.readers), 0);
  // A small value that is not in the store gets no block of its own (it rides
  // inside the queued message).
  ASSERT_OK(p.b->Send(WorkerId(0), DataMessage(ServerId(0), WorkerId(0), Floats(16, 4.0f))));
  Message small = p.inbox_a.Next();
  EXPECT_EQ(small.header.shm_frame_offset_size(), 0);
  EXPECT_EQ(reinterpret_cast<const float*>(small.values[0].data())[15], 4.0f);
}

TEST(VanShmTest, AFullRingFallsBackToTcpAndNothingIsLost) {
  VanPair p(/*ring=*/1 << 16);
  ASSERT_OK(p.b->Send(WorkerId(0), DataMessage(ServerId(0), WorkerId(0), Floats(16, 1.0f))));
  (void)p.inbox_a.Next();  // the handshake: a may now use its ring
  std::vector<Message> held;
  for (int i = 0; i < 6; ++i) {
    ASSERT_OK(
        p.a->Send(ServerId(0), DataMessage(WorkerId(0), ServerId(0), Floats(4096, float(i)))));
    held.push_back(p.inbox_b.Next());  // b holds every push: the ring fills up
  }
  EXPECT_EQ(p.a->shm_sent(), 3) << "three 16 KB blocks fit in 64 KB";
  EXPECT_EQ(p.a->shm_fallbacks(), 3);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(reinterpret_cast<const float*>(held[i].values[0].data())[4095], float(i));
  }
  held.clear();
  ASSERT_OK(p.a->Send(ServerId(0), DataMessage(WorkerId(0), ServerId(0), Floats(4096, 9.0f))));
  (void)p.inbox_b.Next();
  EXPECT_EQ(p.a->shm_sent(), 4) << "room again once b let go";
}

TEST(VanShmTest, ForgedSharedMemoryDescriptorsAreDroppedAndTheVanKeepsServing) {
  VanPair p;
  ASSERT_OK(p.a->Send(ServerId(0), DataMessage(WorkerId(0), ServerId(0), Floats(16, 1.0f))));
  (void)p.inbox_b.Next();
  void* ctx = zmq_ctx_new();
  auto send = [&](const PsHeader& h) {
    void* d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 1000;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof(linger));
    std::string ep = StrCat("tcp://127.0.0.1:", p.b->port());
    zmq_connect(d, ep.c_str());
    const uint64_t key = WireKey(0, 5, 0);
    const uint32_t len = 4;
    std::string hs = h.SerializeAsString();
    zmq_send(d, hs.data(), hs.size(), ZMQ_SNDMORE);
    zmq_send(d, &key, sizeof(key), ZMQ_SNDMORE);
    zmq_send(d, &len, sizeof(len), 0);
    zmq_close(d);
  };
  Message proto = DataMessage(WorkerId(0), ServerId(0), Floats(4, 0.0f));
  PsHeader h = proto.header;
  h.add_shm_frame_offset(12345 * 64);  // a's arena, but no block there
  h.add_shm_frame_bytes(16);
  send(h);
  h.set_shm_frame_offset(0, 8);  // misaligned
  send(h);
  h.add_shm_frame_bytes(16);  // two sizes, one offset
  send(h);
  // A real block of a's, named by a message that is dropped anyway (two
  // sizes for one offset): b must hand the block back.
  auto real = p.a->arena()->AllocateRing(16);
  ASSERT_TRUE(real.has_value());
  std::optional<ShmTicket> real_ticket = p.a->arena()->Ticket(ServerId(0), 0, real->offset);
  ASSERT_TRUE(real_ticket.has_value());
  PsHeader named = proto.header;
  named.add_shm_frame_offset(real->offset);
  named.add_shm_frame_bytes(16);
  named.add_shm_frame_bytes(16);
  named.add_shm_frame_slot(real_ticket->slot);
  named.add_shm_frame_ticket(real_ticket->value);
  send(named);
  PsHeader stranger = proto.header;
  stranger.set_sender(WorkerId(7));  // nobody b has mapped
  stranger.add_shm_frame_offset(4096 + 64);
  stranger.add_shm_frame_bytes(16);
  send(stranger);
  for (int i = 0; i < 200 && p.b->dropped() < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(p.b->dropped(), 5);
  EXPECT_EQ(p.a->arena()->ring_used_bytes(), 0u) << "the dropped message's block came back";
  zmq_ctx_term(ctx);
  ASSERT_OK(p.a->Send(ServerId(0), DataMessage(WorkerId(0), ServerId(0), Floats(2000, 6.0f))));
  Message ok = p.inbox_b.Next();
  EXPECT_EQ(reinterpret_cast<const float*>(ok.values[0].data())[1999], 6.0f);
}

// Found by review: a message that a co-located node queued for b under
// another node's name was dropped, but its shared-memory descriptors were
// handed back in the arena of the node it claimed to be, freeing a block that
// node still used. They belong to the queue's owner.
TEST(VanShmTest, AQueuedMessageWithAForgedSenderFreesNothingOfTheClaimedSender) {
  VanPair p;
  VanOptions vo;
  vo.bind_host = "127.0.0.1";
  vo.shm_bytes = 1 << 20;
  vo.name = "c";
  auto c = Van::Create(vo, [](Message&&) {});
  ASSERT_OK(c.status());
  (*c)->SetSelfId(WorkerId(1));
  (*c)->StartReceiving();
  ASSERT_OK(p.b->Connect(WorkerId(1), "127.0.0.1", (*c)->port(), (*c)->shm_info()));
  auto victim = (*c)->arena()->AllocateRing(16);
  ASSERT_TRUE(victim.has_value());
  const uint64_t used = (*c)->arena()->ring_used_bytes();
  ASSERT_GT(used, 0u);
  // a queues, in its own arena for b, a push that claims to be c's and names
  // c's block.
  Message forged = DataMessage(WorkerId(1), ServerId(0), Floats(4, 0.0f));
  // With a real ticket of c's for b, so that only the arena it is looked up
  // in decides.
  std::optional<ShmTicket> victim_ticket = (*c)->arena()->Ticket(ServerId(0), 0, victim->offset);
  ASSERT_TRUE(victim_ticket.has_value());
  forged.header.add_shm_frame_offset(victim->offset);
  forged.header.add_shm_frame_bytes(16);
  forged.header.add_shm_frame_slot(victim_ticket->slot);
  forged.header.add_shm_frame_ticket(victim_ticket->value);
  forged.values.clear();
  ASSERT_TRUE(EnqueueMessage(p.a->arena().get(), ServerId(0), 0, forged.header.SerializeAsString(),
                             forged,
                             /*inline_values=*/false));
  for (int i = 0; i < 200 && p.b->dropped() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(p.b->dropped(), 1);
  EXPECT_EQ((*c)->arena()->ring_used_bytes(), used) << "c's block was freed by a forged message";
  // b goes on serving a.
  ASSERT_OK(p.a->Send(ServerId(0), DataMessage(WorkerId(0), ServerId(0), Floats(2000, 6.0f))));
  Message ok = p.inbox_b.Next();
  EXPECT_EQ(reinterpret_cast<const float*>(ok.values[0].data())[1999], 6.0f);
}

// Whether `arena`'s ring empties within 5 s (the Van lets a closed
// connection go once no thread holds it: its event reader may, briefly).
bool RingEmpties(ShmArena& arena) {
  const Deadline deadline = Deadline::InMillis(5000);
  while (arena.ring_used_bytes() != 0 && !deadline.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return arena.ring_used_bytes() == 0;
}

// A Van of node `id` that keeps every message it gets (so it holds the
// sender's shared-memory blocks, as a process that died reading would).
struct Holder {
  Inbox inbox;
  std::unique_ptr<Van> van;
  Holder(const std::string& name, int id, uint64_t shm_bytes = 1 << 20) {
    VanOptions vo;
    vo.bind_host = "127.0.0.1";
    vo.shm_bytes = shm_bytes;
    vo.name = name;
    auto made = Van::Create(vo, [this](Message&& m) {
      MutexLock l(&inbox.mu);
      inbox.got.push_back(std::move(m));
      inbox.cv.SignalAll();
    });
    CHECK_OK(made.status());
    van = std::move(made).value();
    van->SetSelfId(id);
    van->StartReceiving();
  }
  // Connects with worker 0 (p.a) both ways and says it mapped a's arena (if
  // it has shared memory).
  void JoinWorker0(VanPair& p, int id) {
    CHECK_OK(p.a->Connect(id, "127.0.0.1", van->port(), van->shm_info()));
    CHECK_OK(van->Connect(WorkerId(0), "127.0.0.1", p.a->port(), p.a->shm_info()));
    CHECK_OK(van->Send(WorkerId(0), DataMessage(id, WorkerId(0), Floats(16, 1.0f))));
    (void)p.inbox_a.Next();  // a now sends it values through shared memory
  }
  void WaitFor(size_t n) {
    MutexLock l(&inbox.mu);
    CHECK(inbox.cv.WaitUntil(Deadline::InMillis(5000),
                             [&]() REQUIRES(inbox.mu) { return inbox.got.size() >= n; }));
  }
  void LetGo() {
    MutexLock l(&inbox.mu);
    inbox.got.clear();
  }
};

// A co-located peer that dies holding values of ours (read, and queued
// unread) used to stall our ring for the rest of the job, so every later
// message of ours went over TCP. Closing the connection takes them back, and
// the dead process's late releases touch nothing.
TEST(VanShmTest, ClosingAPeerThatDiedHoldingOurBlocksTakesThemBack) {
  VanPair p;
  auto c = std::make_unique<Holder>("c", ServerId(1));
  c->JoinWorker0(p, ServerId(1));
  const int64_t sent_before = p.a->shm_sent();
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(p.a->Send(ServerId(1), DataMessage(WorkerId(0), ServerId(1), Floats(2000, 2.0f))));
  }
  c->WaitFor(3);
  c->van->StopReceiving();  // c "dies": what a sends now stays in c's queue
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK(p.a->Send(ServerId(1), DataMessage(WorkerId(0), ServerId(1), Floats(2000, 3.0f))));
  }
  EXPECT_EQ(p.a->shm_sent() - sent_before, 5);
  EXPECT_GT(p.a->arena()->ring_used_bytes(), 5 * 8000u);

  p.a->Disconnect(ServerId(1));  // a learns that c is gone
  EXPECT_TRUE(RingEmpties(*p.a->arena())) << "c's blocks did not come back";
  EXPECT_EQ(p.a->Send(ServerId(1), DataMessage(WorkerId(0), ServerId(1), Floats(4, 1.0f))).code(),
            StatusCode::kUnavailable);

  // The ring starts over where c's first block was; c letting go late must
  // not free what a put there since.
  auto reused = p.a->arena()->AllocateRing(100);
  ASSERT_TRUE(reused.has_value());
  c->LetGo();
  c.reset();
  EXPECT_GT(p.a->arena()->ring_used_bytes(), 0u) << "a stale release freed a live block";
  p.a->arena()->Release(reused->offset);
  EXPECT_EQ(p.a->arena()->ring_used_bytes(), 0u);

  // a's values to b still go through shared memory.
  ASSERT_OK(p.b->Send(WorkerId(0), DataMessage(ServerId(0), WorkerId(0), Floats(16, 1.0f))));
  (void)p.inbox_a.Next();
  const int64_t sent = p.a->shm_sent();
  ASSERT_OK(p.a->Send(ServerId(0), DataMessage(WorkerId(0), ServerId(0), Floats(2000, 4.0f))));
  Message m = p.inbox_b.Next();
  EXPECT_EQ(reinterpret_cast<const float*>(m.values[0].data())[1999], 4.0f);
  EXPECT_EQ(p.a->shm_sent(), sent + 1);
}

// A peer replaced by a new process under its id (server recovery): the old
// process's blocks come back, those it held and those queued for it unread,
// the new one gets none of the old one's messages and its tickets are its
// own, and the old one letting go late frees none of them.
TEST(VanShmTest, AReplacedPeersBlocksComeBackAndItsSuccessorKeepsItsOwn) {
  VanPair p;
  auto old_c = std::make_unique<Holder>("c", ServerId(1));
  old_c->JoinWorker0(p, ServerId(1));
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK(p.a->Send(ServerId(1), DataMessage(WorkerId(0), ServerId(1), Floats(2000, 2.0f))));
  }
  old_c->WaitFor(2);
  old_c->van->StopReceiving();
  for (int i = 0; i < 2; ++i) {  // queued, never read
    ASSERT_OK(p.a->Send(ServerId(1), DataMessage(WorkerId(0), ServerId(1), Floats(2000, 3.0f))));
  }
  EXPECT_GT(p.a->arena()->ring_used_bytes(), 4 * 8000u);

  Holder new_c("c2", ServerId(1));
  new_c.JoinWorker0(p, ServerId(1));  // a's Connect replaces the connection
  EXPECT_TRUE(RingEmpties(*p.a->arena())) << "the old process's blocks did not come back";
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK(p.a->Send(ServerId(1), DataMessage(WorkerId(0), ServerId(1), Floats(2000, 5.0f))));
  }
  new_c.WaitFor(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // nothing else comes
  {
    MutexLock l(&new_c.inbox.mu);
    EXPECT_EQ(new_c.inbox.got.size(), 2u) << "the new process got the old one's messages";
  }
  const uint64_t held_by_new = p.a->arena()->ring_used_bytes();
  EXPECT_GE(held_by_new, 2 * 8000u);
  old_c->LetGo();
  old_c.reset();
  EXPECT_EQ(p.a->arena()->ring_used_bytes(), held_by_new) << "the old process freed a new block";
  {
    MutexLock l(&new_c.inbox.mu);
    for (const Message& m : new_c.inbox.got) {
      EXPECT_EQ(reinterpret_cast<const float*>(m.values[0].data())[1999], 5.0f);
    }
  }
  new_c.LetGo();
  EXPECT_EQ(p.a->arena()->ring_used_bytes(), 0u);
}

// Shared-memory arenas mapped in this process (every Van of the test is here).
int MappedArenas() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    n += line.find("pstrain-arena") != std::string::npos;
  return n;
}

// A peer replaced by a process without shared memory (it could not map ours,
// or runs without): the old process's arena is no longer read nor kept mapped.
TEST(VanShmTest, APeerReplacedByOneOverTcpOnlyLetsTheOldArenaGo) {
  VanPair p;
  auto old_c = std::make_unique<Holder>("c", ServerId(1));
  old_c->JoinWorker0(p, ServerId(1));
  const int with_old = MappedArenas();
  Holder new_c("c2", ServerId(1), /*shm_bytes=*/0);
  ASSERT_EQ(new_c.van->shm_info(), nullptr);
  new_c.JoinWorker0(p, ServerId(1));  // a's Connect replaces the connection
  old_c->van->StopReceiving();
  old_c.reset();  // its own arena and its mapping of a's go
  // a's receive thread lets its copy of the old mapping go on its next pass.
  int now = MappedArenas();
  for (int i = 0; i < 500 && now != with_old - 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    now = MappedArenas();
  }
  EXPECT_EQ(now, with_old - 3) << "a still maps the replaced process's arena";
  ASSERT_OK(p.a->Send(ServerId(1), DataMessage(WorkerId(0), ServerId(1), Floats(2000, 5.0f))));
  new_c.WaitFor(1);
}

// a -> b: message i carries request id i and `floats` copies of float(i).
Message Numbered(uint64_t i, size_t floats) {
  Message m = DataMessage(WorkerId(0), ServerId(0), Floats(floats, static_cast<float>(i)));
  m.header.set_request_id(i);
  return m;
}

void ExpectInOrder(Inbox& inbox, uint64_t first, uint64_t count) {
  for (uint64_t i = first; i < first + count; ++i) {
    Message m = inbox.Next();
    ASSERT_EQ(m.header.request_id(), i);
    const float* v = reinterpret_cast<const float*>(m.values[0].data());
    ASSERT_EQ(v[m.values[0].size() / sizeof(float) - 1], static_cast<float>(i));
  }
}

TEST(VanShmTest, MessagesKeepTheirOrderWhenSomeGoThroughTheQueueAndSomeOverTcp) {
  VanPair p(/*ring=*/1 << 18);
  ASSERT_OK(p.b->Send(WorkerId(0), DataMessage(ServerId(0), WorkerId(0), Floats(16, 1.0f))));
  (void)p.inbox_a.Next();  // the handshake: a may now use its ring and b's queue
  // Sizes from 4 bytes to 400 KB: small ones ride inside the queued message,
  // big ones fill the 256 KB ring and go over TCP.
  const size_t sizes[] = {1, 10, 5000, 100000, 3, 60000, 70000, 80000, 2};
  const uint64_t n = 400;
  std::thread reader([&] { ExpectInOrder(p.inbox_b, 0, n); });
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_OK(p.a->Send(ServerId(0), Numbered(i, sizes[i % 9])));
  }
  reader.join();
  EXPECT_GT(p.a->shm_queued(), 0);
  EXPECT_LT(p.a->shm_queued(), static_cast<int64_t>(n)) << "some must have gone over TCP";
}

TEST(VanShmTest, AFullQueueSpillsOverToTcpWithoutReordering) {
  VanPair p;
  ASSERT_OK(p.b->Send(WorkerId(0), DataMessage(ServerId(0), WorkerId(0), Floats(16, 1.0f))));
  (void)p.inbox_a.Next();
  p.hold_b = true;  // b stops reading: its queue (1024 entries) fills
  const uint64_t n = 1500;
  for (uint64_t i = 0; i < n; ++i) ASSERT_OK(p.a->Send(ServerId(0), Numbered(i, 8)));
  EXPECT_LE(p.a->shm_queued(), static_cast<int64_t>(kShmQueueEntries) + 1);
  p.hold_b = false;
  ExpectInOrder(p.inbox_b, 0, n);
}

TEST(VanShmTest, ASleepingReceiverIsWokenByItsDoorbell) {
  VanPair p;
  ASSERT_OK(p.b->Send(WorkerId(0), DataMessage(ServerId(0), WorkerId(0), Floats(16, 1.0f))));
  (void)p.inbox_a.Next();
  const int64_t rung_before = p.a->doorbells_rung();
  int prompt = 0;
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // b goes to sleep
    const auto start = std::chrono::steady_clock::now();
    ASSERT_OK(p.a->Send(ServerId(0), Numbered(round, 4)));
    Message m = p.inbox_b.Next();
    EXPECT_EQ(m.header.request_id(), static_cast<uint64_t>(round));
    // Without the doorbell b would notice only at its 100 ms poll timeout,
    // on average 50 ms later.
    prompt += std::chrono::steady_clock::now() - start < std::chrono::milliseconds(20);
  }
  // b may be between two polls (awake) when a message comes: no ring needed then.
  EXPECT_GE(p.a->doorbells_rung() - rung_before, 3);
  EXPECT_GE(prompt, 4);
}

TEST(VanShmTest, GarbageInAPeersQueueIsDroppedAndLaterMessagesStillArrive) {
  VanPair p;
  ASSERT_OK(p.b->Send(WorkerId(0), DataMessage(ServerId(0), WorkerId(0), Floats(16, 1.0f))));
  (void)p.inbox_a.Next();
  ShmArena& arena = *p.a->arena();
  // An entry that names no block, and a block that holds no message.
  ASSERT_TRUE(arena.Enqueue(ServerId(0), 0, 1 << 30, 64, ShmTicket{}));
  auto junk = arena.AllocateRing(100);
  ASSERT_TRUE(junk.has_value());
  std::memset(junk->data, 0xab, 100);
  std::optional<ShmTicket> junk_ticket = arena.Ticket(ServerId(0), 0, junk->offset);
  ASSERT_TRUE(junk_ticket.has_value());
  ASSERT_TRUE(arena.Enqueue(ServerId(0), 0, junk->offset, 100, *junk_ticket));
  ASSERT_OK(p.a->Send(ServerId(0), Numbered(0, 4)));
  Message m = p.inbox_b.Next();
  EXPECT_EQ(m.header.request_id(), 0u);
  EXPECT_GE(p.b->dropped(), 2);
}

}  // namespace
}  // namespace pstrain
