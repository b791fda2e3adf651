// Values in shared memory on their own: what the sender places in its arena
// (by reference or copied into the ring, all or nothing), and how the
// receiver resolves them in place and hands back what it does not use.
#include "net/shm_placement.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/test_util.h"

namespace pstrain {
namespace {

constexpr uint64_t kMinCopy = 4096;
constexpr int kMe = 9;  // the receiving node's id

ShmTicket TicketOf(const PsHeader& h, int i) {
  return ShmTicket{h.shm_frame_slot(i), h.shm_frame_ticket(i)};
}

std::shared_ptr<ShmArena> MakeArena(uint64_t ring, uint64_t store = 0) {
  auto a = ShmArena::Create(ring, store);
  CHECK_OK(a.status());
  return *a;
}

// The receiver's view of `arena` (this process maps its own arena).
std::shared_ptr<ShmMapping> Map(const ShmArena& arena) {
  auto m = ShmMapping::Open(arena.info());
  CHECK_OK(m.status());
  return *m;
}

Blob Floats(size_t n, float v) {
  std::vector<float> f(n, v);
  return Blob::Copy(f.data(), n * sizeof(float));
}

float LastFloat(const Blob& b) {
  float f;
  std::memcpy(&f, b.data() + b.size() - sizeof(f), sizeof(f));
  return f;
}

Message WithValues(std::vector<Blob> values) {
  Message m;
  m.header.set_cmd(CMD_DATA);
  m.header.set_sender(WorkerId(0));
  m.header.set_num_value_frames(values.size());
  m.values = std::move(values);
  return m;
}

// The header a receiver gets: the message's plus what placement added.
PsHeader Received(const Message& m, const PsHeader& extra) {
  PsHeader h = m.header;
  h.MergeFrom(extra);
  return h;
}

TEST(ShmPlacementTest, AHeapValueThatFitsIsCopiedIntoTheRing) {
  auto arena = MakeArena(1 << 16);
  ShmPlacement placement(arena.get(), kMinCopy);
  Message m = WithValues({Floats(2048, 1.5f)});  // 8 KB on the heap
  PsHeader extra;
  ASSERT_TRUE(placement.Place(m, kMe, 0, &extra));
  ASSERT_EQ(extra.shm_frame_offset_size(), 1);
  ASSERT_EQ(extra.shm_frame_bytes_size(), 1);
  EXPECT_EQ(extra.shm_frame_bytes(0), 8192u);
  EXPECT_GE(arena->ring_used_bytes(), 8192u);
  auto mapping = Map(*arena);
  auto v = mapping->Resolve(kMe, extra.shm_frame_offset(0), extra.shm_frame_bytes(0),
                            TicketOf(extra, 0));
  ASSERT_OK(v.status());
  EXPECT_NE(v->data(), m.values[0].data()) << "a copy, in the arena";
  EXPECT_EQ(std::memcmp(v->data(), m.values[0].data(), 8192), 0);
  EXPECT_EQ(placement.fallbacks(), 0);
  v = Blob();  // the receiver lets go: the block is free again
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
}

TEST(ShmPlacementTest, AValueAlreadyInTheArenaIsReferencedNotCopied) {
  auto arena = MakeArena(1 << 16, 1 << 16);
  ShmPlacement placement(arena.get(), kMinCopy);
  // A server's stored value (store) and a reply buffer (ring), both small:
  // references cost nothing, so the copy threshold does not apply.
  ShmArena::Stored stored = AllocateOrHeap(arena.get(), 256, /*outgoing=*/false);
  ShmArena::Stored reply = AllocateOrHeap(arena.get(), 128, /*outgoing=*/true);
  ASSERT_NE(stored.readers, nullptr) << "in the store";
  for (int i = 0; i < 64; ++i) reinterpret_cast<float*>(stored.data)[i] = static_cast<float>(i);
  std::memset(reply.data, 7, 128);
  const uint64_t ring_before = arena->ring_used_bytes();
  Message m = WithValues({stored.blob, reply.blob});
  PsHeader extra;
  ASSERT_TRUE(placement.Place(m, kMe, 0, &extra));
  ASSERT_EQ(extra.shm_frame_offset_size(), 2);
  EXPECT_EQ(extra.shm_frame_bytes(0), 256u);
  EXPECT_EQ(extra.shm_frame_bytes(1), 128u);
  EXPECT_EQ(arena->ring_used_bytes(), ring_before) << "no ring block for a copy";
  EXPECT_EQ(ShmArena::Readers(stored.readers), 1) << "held for the message";
  auto mapping = Map(*arena);
  std::vector<Blob> values;
  ASSERT_OK(ResolveShmValues(Received(m, extra), mapping.get(), kMe, &values));
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(LastFloat(values[0]), 63.0f);
  EXPECT_EQ(values[1].data()[127], 7);
  values.clear();
  EXPECT_EQ(ShmArena::Readers(stored.readers), 0) << "the reader let go";
}

TEST(ShmPlacementTest, SmallHeapValuesStayOnTheHeap) {
  auto arena = MakeArena(1 << 16);
  ShmPlacement placement(arena.get(), kMinCopy);
  Message m = WithValues({Floats(16, 2.0f), Floats(16, 3.0f)});  // 128 bytes in all
  PsHeader extra;
  extra.set_shm_mapped(true);
  EXPECT_FALSE(placement.Place(m, kMe, 0, &extra));
  EXPECT_EQ(extra.shm_frame_offset_size(), 0);
  EXPECT_TRUE(extra.shm_mapped()) << "the rest of extra is left alone";
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
  EXPECT_EQ(placement.fallbacks(), 0) << "too small to copy is not a fallback";
  EXPECT_EQ(LastFloat(m.values[1]), 3.0f) << "the message keeps its heap values";
}

TEST(ShmPlacementTest, AllOrNothingWhenOneValueDoesNotFit) {
  auto arena = MakeArena(1 << 16);  // 64 KB ring
  ShmPlacement placement(arena.get(), kMinCopy);
  // The first fits and is copied, the second (128 KB) cannot: both stay on
  // the heap and the first's block is handed back.
  Message m = WithValues({Floats(2048, 1.0f), Floats(32768, 2.0f)});
  PsHeader extra;
  EXPECT_FALSE(placement.Place(m, kMe, 0, &extra));
  EXPECT_EQ(extra.shm_frame_offset_size(), 0);
  EXPECT_EQ(extra.shm_frame_bytes_size(), 0);
  EXPECT_EQ(arena->ring_used_bytes(), 0u) << "the first value's block came back";
  EXPECT_EQ(placement.fallbacks(), 1);
  // Once there is room, the same message goes through the arena.
  Message fits = WithValues({Floats(2048, 1.0f), Floats(4096, 2.0f)});
  EXPECT_TRUE(placement.Place(fits, kMe, 0, &extra));
  EXPECT_EQ(extra.shm_frame_offset_size(), 2);
  EXPECT_EQ(placement.fallbacks(), 1);
}

TEST(ShmPlacementTest, ReleaseHandsBackTheBlocksOfAMessageThatWasNotSent) {
  auto arena = MakeArena(1 << 16, 1 << 16);
  ShmPlacement placement(arena.get(), kMinCopy);
  ShmArena::Stored stored = AllocateOrHeap(arena.get(), 4096, /*outgoing=*/false);
  Message m = WithValues({stored.blob, Floats(4096, 1.0f)});
  PsHeader extra;
  ASSERT_TRUE(placement.Place(m, kMe, 0, &extra));
  EXPECT_GT(arena->ring_used_bytes(), 0u);
  EXPECT_EQ(ShmArena::Readers(stored.readers), 1);
  placement.Release(extra, kMe);
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
  EXPECT_EQ(ShmArena::Readers(stored.readers), 0);
}

TEST(ShmPlacementTest, TheReceiverReadsPlacedValuesInPlaceUntilItDropsThem) {
  auto arena = MakeArena(1 << 16);
  ShmPlacement placement(arena.get(), kMinCopy);
  Message m = WithValues({Floats(1024, 4.0f), Floats(3072, 5.0f)});
  PsHeader extra;
  ASSERT_TRUE(placement.Place(m, kMe, 0, &extra));
  auto mapping = Map(*arena);
  std::vector<Blob> values;
  ASSERT_OK(ResolveShmValues(Received(m, extra), mapping.get(), kMe, &values));
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(values[0].size(), 4096u);
  EXPECT_EQ(values[1].size(), 12288u);
  EXPECT_EQ(LastFloat(values[0]), 4.0f);
  EXPECT_EQ(LastFloat(values[1]), 5.0f);
  EXPECT_FALSE(HasUnresolvedShmValues(Received(m, extra), values.size()));
  Blob keep = values[1];
  values.clear();
  EXPECT_GT(arena->ring_used_bytes(), 0u) << "one Blob still reads the arena";
  keep = Blob();
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
}

TEST(ShmPlacementTest, ResolveRefusesDescriptorsThatDoNotAddUp) {
  auto arena = MakeArena(1 << 16);
  auto mapping = Map(*arena);
  ShmPlacement placement(arena.get(), kMinCopy);
  Message m = WithValues({Floats(2048, 1.0f)});
  PsHeader extra;
  ASSERT_TRUE(placement.Place(m, kMe, 0, &extra));
  const PsHeader good = Received(m, extra);
  std::vector<Blob> values;

  Status s = ResolveShmValues(good, nullptr, kMe, &values);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("its arena is not mapped here"), std::string::npos) << s;
  EXPECT_NE(s.message().find(NodeIdName(WorkerId(0))), std::string::npos) << s;

  PsHeader sizes = good;
  sizes.add_shm_frame_bytes(16);  // one offset, two sizes
  s = ResolveShmValues(sizes, mapping.get(), kMe, &values);
  EXPECT_NE(s.message().find("listed 1 shared-memory frame offsets, 2 sizes, 1 ticket slots"),
            std::string::npos)
      << s;
  PsHeader frames = good;
  frames.set_num_value_frames(2);
  s = ResolveShmValues(frames, mapping.get(), kMe, &values);
  EXPECT_NE(s.message().find("header says 2 value frames"), std::string::npos) << s;
  EXPECT_TRUE(values.empty());

  // Frame 0 is real, frame 1 names no block: frame 0 is resolved, 1 refused.
  PsHeader second = good;
  second.set_num_value_frames(2);
  second.add_shm_frame_offset(kShmRingBegin + (1 << 15) + kShmBlockHeaderBytes);
  second.add_shm_frame_bytes(64);
  second.add_shm_frame_slot(1);
  second.add_shm_frame_ticket(12345);
  s = ResolveShmValues(second, mapping.get(), kMe, &values);
  EXPECT_NE(s.message().find("value frame 1"), std::string::npos) << s;
  ASSERT_EQ(values.size(), 1u);
  EXPECT_EQ(LastFloat(values[0]), 1.0f);
  EXPECT_TRUE(HasUnresolvedShmValues(second, values.size()));
  ReleaseUnresolvedShmValues(second, values.size(), mapping.get(), kMe);  // ignores the bad one
  values.clear();
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
}

TEST(ShmPlacementTest, ADroppedMessagesUnresolvedBlocksAreHandedBack) {
  auto arena = MakeArena(1 << 16);
  ShmPlacement placement(arena.get(), kMinCopy);
  Message m = WithValues({Floats(2048, 1.0f), Floats(2048, 2.0f)});
  PsHeader extra;
  ASSERT_TRUE(placement.Place(m, kMe, 0, &extra));
  const PsHeader h = Received(m, extra);
  EXPECT_GT(arena->ring_used_bytes(), 0u);
  // Dropped before anything was resolved (a malformed header, say).
  EXPECT_TRUE(HasUnresolvedShmValues(h, 0));
  ReleaseUnresolvedShmValues(h, 0, nullptr,
                             kMe);  // the sender's arena is not mapped: nothing to do
  EXPECT_GT(arena->ring_used_bytes(), 0u);
  auto mapping = Map(*arena);
  ReleaseUnresolvedShmValues(h, 0, mapping.get(), kMe);
  EXPECT_EQ(arena->ring_used_bytes(), 0u) << "the sender's ring is not stalled";
  EXPECT_FALSE(HasUnresolvedShmValues(h, 2));
}

// A receiver that dies holding values (read or unread) used to stall the
// sender's ring for the rest of the job: the sender takes back every
// reference that process held, and only that process's.
TEST(ShmPlacementTest, TheBlocksADeadReceiverHeldAreTakenBackAndOnlyThose) {
  auto arena = MakeArena(1 << 18, 1 << 16);
  ShmPlacement placement(arena.get(), kMinCopy);
  auto mapping = Map(*arena);
  ShmArena::Stored stored = AllocateOrHeap(arena.get(), 4096, /*outgoing=*/false);
  // The dead process (incarnation 0 of kMe): one message read, held for ever,
  // one never read.
  Message read = WithValues({Floats(2048, 1.0f), stored.blob});
  PsHeader read_extra;
  ASSERT_TRUE(placement.Place(read, kMe, 0, &read_extra));
  std::vector<Blob> held;
  ASSERT_OK(ResolveShmValues(Received(read, read_extra), mapping.get(), kMe, &held));
  Message unread = WithValues({Floats(4096, 2.0f)});
  PsHeader unread_extra;
  ASSERT_TRUE(placement.Place(unread, kMe, 0, &unread_extra));
  // Its replacement (incarnation 1) and another node hold values too.
  Message next = WithValues({Floats(2048, 3.0f), stored.blob});
  PsHeader next_extra;
  ASSERT_TRUE(placement.Place(next, kMe, 1, &next_extra));
  Message other = WithValues({Floats(2048, 4.0f)});
  PsHeader other_extra;
  ASSERT_TRUE(placement.Place(other, kMe + 1, 0, &other_extra));
  const uint64_t used_by_live = 2 * (kShmBlockHeaderBytes + 8192);
  EXPECT_EQ(ShmArena::Readers(stored.readers), 2);

  EXPECT_EQ(arena->ReleaseReceiver(kMe, 0), 3) << "two read frames and one unread";
  EXPECT_EQ(ShmArena::Readers(stored.readers), 1) << "the replacement's reference stays";
  EXPECT_EQ(arena->ring_used_bytes(), used_by_live) << "the dead process's two blocks came back";
  EXPECT_EQ(arena->ReleaseReceiver(kMe, 0), 0) << "nothing twice";

  // The dead process's late release (a Blob let go after all) does nothing.
  held.clear();
  EXPECT_EQ(ShmArena::Readers(stored.readers), 1);
  std::vector<Blob> next_values;
  ASSERT_OK(ResolveShmValues(Received(next, next_extra), mapping.get(), kMe, &next_values));
  EXPECT_EQ(LastFloat(next_values[0]), 3.0f);
  EXPECT_EQ(ShmArena::Readers(stored.readers), 1);
  // A ticket taken back cannot be resolved any more.
  std::vector<Blob> late;
  Status s = ResolveShmValues(Received(unread, unread_extra), mapping.get(), kMe, &late);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not hold that block"), std::string::npos) << s;

  // The live readers let go: the ring is empty again.
  next_values.clear();
  placement.Release(other_extra, kMe + 1);
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
  EXPECT_EQ(ShmArena::Readers(stored.readers), 0);
}

TEST(ShmPlacementTest, OnlyTheReceiverATicketWasHandedToCanUseIt) {
  auto arena = MakeArena(1 << 16);
  ShmPlacement placement(arena.get(), kMinCopy);
  auto mapping = Map(*arena);
  Message m = WithValues({Floats(2048, 1.0f)});
  PsHeader extra;
  ASSERT_TRUE(placement.Place(m, kMe, 0, &extra));
  const ShmTicket t = TicketOf(extra, 0);
  const uint64_t offset = extra.shm_frame_offset(0);
  const uint64_t bytes = extra.shm_frame_bytes(0);
  for (const auto& [me, ticket] : {std::pair<int, ShmTicket>{kMe + 1, t},
                                   {kMe, ShmTicket{t.slot + 1, t.value}},
                                   {kMe, ShmTicket{t.slot, t.value + 1}},
                                   {kMe, ShmTicket{kShmTicketSlots, t.value}},
                                   {-1, t},
                                   {kShmMaxQueues, t}}) {
    auto v = mapping->Resolve(me, offset, bytes, ticket);
    EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument) << me << " " << ticket.slot;
    mapping->Drop(me, offset, ticket);  // nothing
  }
  EXPECT_GT(arena->ring_used_bytes(), 0u) << "no wrong ticket let the block go";
  EXPECT_OK(mapping->Resolve(kMe, offset, bytes, t).status());  // the Blob goes at once
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
}

// The ticket table is finite: when it is full the message goes over TCP, and
// nothing is leaked.
TEST(ShmPlacementTest, AFullTicketTableIsAFallbackAndTakesNothing) {
  auto arena = MakeArena(1 << 16, 1 << 16);
  ShmPlacement placement(arena.get(), kMinCopy);
  ShmArena::Stored stored = AllocateOrHeap(arena.get(), 64, /*outgoing=*/false);
  std::vector<PsHeader> sent;
  for (uint32_t i = 0; i < kShmTicketSlots; ++i) {
    PsHeader extra;
    ASSERT_TRUE(placement.Place(WithValues({stored.blob}), kMe, 0, &extra)) << i;
    sent.push_back(extra);
  }
  Message big = WithValues({Floats(2048, 1.0f)});
  PsHeader extra;
  EXPECT_FALSE(placement.Place(big, kMe, 0, &extra));
  EXPECT_EQ(extra.shm_frame_slot_size(), 0);
  EXPECT_EQ(placement.fallbacks(), 1);
  EXPECT_EQ(arena->ring_used_bytes(), 0u) << "the copy's block came back";
  EXPECT_TRUE(placement.Place(big, kMe + 1, 0, &extra)) << "another receiver has its own table";
  placement.Release(extra, kMe + 1);
  for (const PsHeader& h : sent) placement.Release(h, kMe);
  EXPECT_EQ(ShmArena::Readers(stored.readers), 0);
  EXPECT_TRUE(placement.Place(big, kMe, 0, &extra));
}

TEST(ShmPlacementTest, ReceiversWithoutATableAndHugeMessagesGoOverTcpUncounted) {
  auto arena = MakeArena(1 << 20);
  ShmPlacement placement(arena.get(), kMinCopy);
  PsHeader extra;
  EXPECT_FALSE(placement.Place(WithValues({Floats(2048, 1.0f)}), kShmMaxQueues, 0, &extra));
  EXPECT_FALSE(placement.Place(WithValues({Floats(2048, 1.0f)}), -1, 0, &extra));
  std::vector<Blob> many(kShmMaxPlacedFrames + 1, Floats(16, 1.0f));
  EXPECT_FALSE(placement.Place(WithValues(many), kMe, 0, &extra));
  EXPECT_EQ(extra.shm_frame_offset_size(), 0);
  EXPECT_EQ(placement.fallbacks(), 0);
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
  many.pop_back();  // exactly the cap: placed
  EXPECT_TRUE(placement.Place(WithValues(many), kMe, 0, &extra));
  placement.Release(extra, kMe);
  EXPECT_EQ(arena->ring_used_bytes(), 0u);
}

// Receivers hold slots for long stretches (a server, a round's pushes): a
// ticket is looked for past any run of held slots, not a few tries.
TEST(ShmPlacementTest, ATicketIsFoundPastALongRunOfHeldSlots) {
  auto arena = MakeArena(1 << 16, 1 << 16);
  ShmArena::Stored stored = AllocateOrHeap(arena.get(), 64, /*outgoing=*/false);
  std::vector<ShmTicket> held;
  for (uint32_t i = 0; i < kShmTicketSlots; ++i) {
    auto offset = arena->Reference(stored.data, 64);
    ASSERT_TRUE(offset.has_value());
    auto t = arena->Ticket(kMe, 0, *offset);
    ASSERT_TRUE(t.has_value()) << i;
    held.push_back(*t);
  }
  // The table is full: no ticket, and the reference is dropped with it.
  auto extra_ref = arena->Reference(stored.data, 64);
  ASSERT_TRUE(extra_ref.has_value());
  EXPECT_FALSE(arena->Ticket(kMe, 0, *extra_ref).has_value());
  EXPECT_EQ(ShmArena::Readers(stored.readers), static_cast<int32_t>(kShmTicketSlots));
  // The one free slot is 5000 slots past where the next search starts.
  ASSERT_TRUE(arena->ReleaseTicket(kMe, held[5000]));
  auto offset = arena->Reference(stored.data, 64);
  ASSERT_TRUE(offset.has_value());
  auto t = arena->Ticket(kMe, 0, *offset);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->slot, held[5000].slot);
  EXPECT_EQ(arena->ReleaseReceiver(kMe, 0), static_cast<int>(kShmTicketSlots));
  EXPECT_EQ(ShmArena::Readers(stored.readers), 0);
}

// Tickets of two arenas differ even for the same slot and block, so a
// message read from one arena and looked up in another finds nothing.
TEST(ShmPlacementTest, TwoArenasHandOutDifferentTickets) {
  auto a = MakeArena(1 << 16);
  auto b = MakeArena(1 << 16);
  int same = 0;
  for (int i = 0; i < 4; ++i) {
    auto ba = a->AllocateRing(64);
    auto bb = b->AllocateRing(64);
    ASSERT_TRUE(ba.has_value() && bb.has_value());
    ASSERT_EQ(ba->offset, bb->offset);
    auto ta = a->Ticket(kMe, 0, ba->offset);
    auto tb = b->Ticket(kMe, 0, bb->offset);
    ASSERT_TRUE(ta.has_value() && tb.has_value());
    EXPECT_EQ(ta->slot, tb->slot);
    same += ta->value == tb->value;
  }
  EXPECT_EQ(same, 0) << "the generations start from each arena's random token";
}

}  // namespace
}  // namespace pstrain
