// Whole messages through a shared-memory queue on their own (the sender's
// envelope in its ring, the receiver's read of it), the set of queues a
// receive thread drains, and two Vans whose doorbell is absent or unreachable.
#include "net/shm_queue.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "net/van.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

const int kSender = WorkerId(0);
const int kReceiver = ServerId(0);

std::shared_ptr<ShmArena> MakeArena(uint64_t ring) {
  auto a = ShmArena::Create(ring, 0);
  CHECK_OK(a.status());
  return *a;
}

std::shared_ptr<ShmMapping> Map(const ShmArena& arena) {
  auto m = ShmMapping::Open(arena.info());
  CHECK_OK(m.status());
  return *m;
}

Blob Floats(size_t n, float v) {
  std::vector<float> f(n, v);
  return Blob::Copy(f.data(), n * sizeof(float));
}

// A push of `floats` copies of float(id) under request id `id`.
Message Push(int sender, int receiver, uint64_t id, size_t floats) {
  Message m;
  m.header.set_version(PROTOCOL_VERSION_CURRENT);
  m.header.set_cmd(CMD_DATA);
  m.header.set_sender(sender);
  m.header.set_receiver(receiver);
  m.header.set_push(true);
  m.header.set_request_id(id);
  m.header.set_num_keys(1);
  m.header.set_num_value_frames(1);
  m.header.set_value_bytes(floats * sizeof(float));
  const uint64_t key = WireKey(0, 5, 0);
  const uint32_t len = static_cast<uint32_t>(floats);
  m.keys = Blob::Copy(&key, sizeof(key));
  m.lens = Blob::Copy(&len, sizeof(len));
  m.values.push_back(Floats(floats, static_cast<float>(id)));
  return m;
}

// The header as the Van queues it: values inline, as one frame.
std::string QueuedHeader(const Message& m) {
  PsHeader h = m.header;
  h.set_num_value_frames(1);
  return h.SerializeAsString();
}

float LastFloat(const Blob& b) {
  float f;
  std::memcpy(&f, b.data() + b.size() - sizeof(f), sizeof(f));
  return f;
}

TEST(ShmQueueTest, QueuedMessagesAreReadBackWholeAndInOrder) {
  auto arena = MakeArena(1 << 16);  // the sender's
  auto mapping = Map(*arena);       // the receiver's view of it
  for (uint64_t i = 0; i < 3; ++i) {
    const Message m = Push(kSender, kReceiver, i, 100 + i);
    ASSERT_TRUE(EnqueueMessage(arena.get(), kReceiver, 0, QueuedHeader(m), m, true));
  }
  Decoded d;
  EXPECT_EQ(ReadQueued(*mapping, kSender, ServerId(1), &d), QueueRead::kEmpty)
      << "another node's queue";
  for (uint64_t i = 0; i < 3; ++i) {
    Decoded got;
    ASSERT_EQ(ReadQueued(*mapping, kSender, kReceiver, &got), QueueRead::kMessage) << got.error;
    const Message& m = got.msg;
    EXPECT_EQ(m.header.request_id(), i);
    EXPECT_EQ(m.header.sender(), kSender);
    EXPECT_EQ(m.key(0), WireKey(0, 5, 0));
    EXPECT_EQ(m.len(0), 100 + i);
    ASSERT_EQ(m.values.size(), 1u);
    EXPECT_EQ(m.values[0].size(), (100 + i) * sizeof(float));
    EXPECT_EQ(LastFloat(m.values[0]), static_cast<float>(i));
    EXPECT_OK(ValidateFrames(m));
  }
  EXPECT_EQ(ReadQueued(*mapping, kSender, kReceiver, &d), QueueRead::kEmpty);
  // Read and dropped: the sender's ring is free again.
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
}

TEST(ShmQueueTest, AFullRingOrQueueTakesNothing) {
  auto small = MakeArena(4096);
  const Message big = Push(kSender, kReceiver, 0, 2048);  // 8 KB of values: no room
  EXPECT_FALSE(EnqueueMessage(small.get(), kReceiver, 0, QueuedHeader(big), big, true));
  EXPECT_EQ(small->ring_used_bytes(), 0u);
  Decoded d;
  EXPECT_EQ(ReadQueued(*Map(*small), kSender, kReceiver, &d), QueueRead::kEmpty);

  auto arena = MakeArena(1 << 20);
  const Message m = Push(kSender, kReceiver, 0, 1);
  uint64_t queued = 0;
  while (EnqueueMessage(arena.get(), kReceiver, 0, QueuedHeader(m), m, true)) ++queued;
  EXPECT_EQ(queued, kShmQueueEntries) << "the queue, not the ring, was full";
  EXPECT_FALSE(EnqueueMessage(arena.get(), kReceiver, 0, QueuedHeader(m), m, true));
  // One read makes room for one more.
  auto mapping = Map(*arena);
  ASSERT_EQ(ReadQueued(*mapping, kSender, kReceiver, &d), QueueRead::kMessage);
  EXPECT_TRUE(EnqueueMessage(arena.get(), kReceiver, 0, QueuedHeader(m), m, true));
  // Once every queued message is read and dropped the ring is empty: the
  // refused message's block was handed back (the ring reclaims in order).
  d = Decoded();
  for (uint64_t i = 0; i < kShmQueueEntries; ++i) {
    ASSERT_EQ(ReadQueued(*mapping, kSender, kReceiver, &d), QueueRead::kMessage);
  }
  d = Decoded();
  EXPECT_EQ(ReadQueued(*mapping, kSender, kReceiver, &d), QueueRead::kEmpty);
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
}

TEST(ShmQueueTest, BadEntriesAreReportedWithThePeersName) {
  auto arena = MakeArena(1 << 16);
  auto mapping = Map(*arena);
  // An entry that names no block.
  ASSERT_TRUE(arena->Enqueue(kReceiver, 0, 1 << 30, 64, ShmTicket{}));
  Decoded d;
  ASSERT_EQ(ReadQueued(*mapping, kSender, kReceiver, &d), QueueRead::kBad);
  EXPECT_FALSE(d.header_ok);
  EXPECT_NE(d.error.find(NodeIdName(kSender) + ": queue entry"), std::string::npos) << d.error;
  // A block that holds no message.
  auto junk = arena->AllocateRing(100);
  ASSERT_TRUE(junk.has_value());
  std::memset(junk->data, 0xab, 100);
  std::optional<ShmTicket> junk_ticket = arena->Ticket(kReceiver, 0, junk->offset);
  ASSERT_TRUE(junk_ticket.has_value());
  ASSERT_TRUE(arena->Enqueue(kReceiver, 0, junk->offset, 100, *junk_ticket));
  d = Decoded();
  ASSERT_EQ(ReadQueued(*mapping, kSender, kReceiver, &d), QueueRead::kBad);
  EXPECT_FALSE(d.header_ok);
  EXPECT_EQ(d.error.rfind(NodeIdName(kSender), 0), 0u) << d.error;
  // A well-formed message that claims another sender: its header is readable
  // (its number is in kSender's order), but it is refused.
  Message forged = Push(WorkerId(5), kReceiver, 7, 4);
  forged.header.set_shm_seq(3);
  ASSERT_TRUE(EnqueueMessage(arena.get(), kReceiver, 0, QueuedHeader(forged), forged, true));
  d = Decoded();
  ASSERT_EQ(ReadQueued(*mapping, kSender, kReceiver, &d), QueueRead::kBad);
  EXPECT_TRUE(d.header_ok);
  EXPECT_EQ(d.msg.header.shm_seq(), 3u);
  EXPECT_NE(d.error.find("claims to come from " + NodeIdName(WorkerId(5))), std::string::npos)
      << d.error;
  // And a good one after all that still comes through.
  const Message good = Push(kSender, kReceiver, 8, 4);
  ASSERT_TRUE(EnqueueMessage(arena.get(), kReceiver, 0, QueuedHeader(good), good, true));
  d = Decoded();
  ASSERT_EQ(ReadQueued(*mapping, kSender, kReceiver, &d), QueueRead::kMessage) << d.error;
  EXPECT_EQ(d.msg.header.request_id(), 8u);
}

TEST(ShmQueueTest, TheInboxListsEveryMappedPeerOnceWithItsLatestMapping) {
  auto a = MakeArena(4096), b = MakeArena(4096);
  ShmInbox inbox;
  EXPECT_TRUE(inbox.Current().empty());
  auto old_a = Map(*a);
  inbox.Add(WorkerId(0), old_a);
  inbox.Add(WorkerId(1), Map(*b));
  const ShmInbox::Entries* first = &inbox.Current();
  ASSERT_EQ(first->size(), 2u);
  EXPECT_EQ((*first)[0].first, WorkerId(0));
  EXPECT_EQ((*first)[0].second, old_a);
  EXPECT_EQ(&inbox.Current(), first) << "no Add since: the same list";
  // Worker 0's process was replaced: its new arena replaces the old one.
  auto new_a = Map(*a);
  inbox.Add(WorkerId(0), new_a);
  const ShmInbox::Entries& now = inbox.Current();
  ASSERT_EQ(now.size(), 2u);
  EXPECT_EQ(now[0].first, WorkerId(0));
  EXPECT_EQ(now[0].second, new_a);
  EXPECT_EQ(now[1].first, WorkerId(1));
}

TEST(ShmQueueTest, AddFromAnotherThreadIsSeenByTheReader) {
  auto a = MakeArena(4096);
  ShmInbox inbox;
  std::thread adder([&] {
    for (int i = 0; i < 50; ++i) inbox.Add(WorkerId(i), Map(*a));
  });
  size_t seen = 0;
  for (int spin = 0; spin < 5000 && seen < 50; ++spin) {
    seen = inbox.Current().size();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  adder.join();
  EXPECT_EQ(inbox.Current().size(), 50u);
}

// ---- two Vans whose doorbells are absent or unreachable ----

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

// a (worker 0) sends to b (server 0); a sees b's arena as `b_info` says, with
// whatever doorbell the test puts there.
struct Pair {
  Inbox at_a, at_b;
  std::unique_ptr<Van> a, b;
  explicit Pair(const std::function<void(ShmInfo*)>& edit_b_info) {
    VanOptions vo;
    vo.bind_host = "127.0.0.1";
    vo.shm_bytes = 1 << 20;
    vo.name = "a";
    auto va = Van::Create(vo, [this](Message&& m) { Put(&at_a, std::move(m)); });
    vo.name = "b";
    auto vb = Van::Create(vo, [this](Message&& m) { Put(&at_b, std::move(m)); });
    CHECK_OK(va.status());
    CHECK_OK(vb.status());
    a = std::move(va).value();
    b = std::move(vb).value();
    a->SetSelfId(kSender);
    b->SetSelfId(kReceiver);
    a->StartReceiving();
    b->StartReceiving();
    CHECK(b->shm_info() != nullptr && !b->shm_info()->doorbell().empty());
    ShmInfo b_info = *b->shm_info();
    edit_b_info(&b_info);
    CHECK_OK(a->Connect(kReceiver, "127.0.0.1", b->port(), &b_info));
    CHECK_OK(b->Connect(kSender, "127.0.0.1", a->port(), a->shm_info()));
    // b tells a it mapped a's arena: from now on a may use its arena for b.
    CHECK_OK(b->Send(kSender, Push(kReceiver, kSender, 0, 4)));
    (void)at_a.Next();
  }
  static void Put(Inbox* inbox, Message&& m) {
    MutexLock l(&inbox->mu);
    inbox->got.push_back(std::move(m));
    inbox->cv.SignalAll();
  }
};

void ExpectInOrder(Inbox& inbox, uint64_t first, uint64_t count) {
  for (uint64_t i = first; i < first + count; ++i) {
    Message m = inbox.Next();
    ASSERT_EQ(m.header.request_id(), i);
    ASSERT_EQ(LastFloat(m.values[0]), static_cast<float>(i));
  }
}

TEST(ShmQueueTest, WithoutTheReceiversDoorbellMessagesGoOverTcpValuesStillInSharedMemory) {
  Pair p([](ShmInfo* info) { info->clear_doorbell(); });
  const uint64_t n = 60;
  for (uint64_t i = 0; i < n; ++i)
    ASSERT_OK(p.a->Send(kReceiver, Push(kSender, kReceiver, i, 2048)));
  ExpectInOrder(p.at_b, 0, n);
  EXPECT_EQ(p.a->shm_queued(), 0) << "no doorbell to ring: never through the queue";
  EXPECT_EQ(p.a->doorbells_rung(), 0);
  EXPECT_EQ(p.a->shm_sent(), static_cast<int64_t>(n)) << "8 KB values still in the arena";
}

TEST(ShmQueueTest, AnUnreachableDoorbellIsGivenUpAndNothingIsLostOrReordered) {
  Pair p([](ShmInfo* info) { info->set_doorbell(StrCat("pstrain-nobody-", getpid())); });
  // While b is awake a queues without ringing; once a finds b asleep it rings,
  // fails, and sends over TCP from then on. b still reads what was queued.
  uint64_t next = 0;
  for (int tries = 0; tries < 50 && p.a->doorbells_rung() == 0; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // b falls asleep
    ASSERT_OK(p.a->Send(kReceiver, Push(kSender, kReceiver, next++, 4)));
  }
  ASSERT_EQ(p.a->doorbells_rung(), 1) << "b never slept?";
  const int64_t queued = p.a->shm_queued();
  EXPECT_GE(queued, 1);
  for (uint64_t i = 0; i < 40; ++i) {
    ASSERT_OK(p.a->Send(kReceiver, Push(kSender, kReceiver, next++, i % 2 == 0 ? 4 : 2048)));
  }
  ExpectInOrder(p.at_b, 0, next);
  EXPECT_EQ(p.a->shm_queued(), queued) << "after the failed ring, nothing more was queued";
  EXPECT_EQ(p.a->doorbells_rung(), 1);
}

// A send to a replaced process that was under way while the queue was reset
// for its successor must not queue anything the successor would read.
TEST(ShmQueueTest, AQueueResetForANewIncarnationTakesNothingForTheOldOne) {
  auto arena = MakeArena(1 << 20);
  auto mapping = Map(*arena);
  const Message old_msg = Push(kSender, kReceiver, 1, 4);
  ASSERT_TRUE(EnqueueMessage(arena.get(), kReceiver, 0, QueuedHeader(old_msg), old_msg, true));
  arena->ResetQueue(kReceiver, 1);
  EXPECT_FALSE(EnqueueMessage(arena.get(), kReceiver, 0, QueuedHeader(old_msg), old_msg, true))
      << "the old incarnation queued after the reset";
  EXPECT_EQ(arena->ReleaseReceiver(kReceiver, 0), 1) << "the entry emptied by the reset";
  EXPECT_EQ(arena->ring_used_bytes(), 0u) << "the refused message took nothing";
  const Message new_msg = Push(kSender, kReceiver, 2, 4);
  ASSERT_TRUE(EnqueueMessage(arena.get(), kReceiver, 1, QueuedHeader(new_msg), new_msg, true));
  Decoded d;
  ASSERT_EQ(ReadQueued(*mapping, kSender, kReceiver, &d), QueueRead::kMessage) << d.error;
  EXPECT_EQ(d.msg.header.request_id(), 2u);
  d = Decoded();
  EXPECT_EQ(ReadQueued(*mapping, kSender, kReceiver, &d), QueueRead::kEmpty);
}

}  // namespace
}  // namespace pstrain
