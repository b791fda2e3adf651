// The numbering of messages to a co-located peer on its own: numbers taken
// under the sender's lock, given back when a send fails, given up when the
// receiver drops a message; with a Reorderer as the receiver, no number is
// ever lost.
#include "net/shm_sequence.h"

#include <gtest/gtest.h>

#include <vector>

#include "net/reorderer.h"

namespace pstrain {
namespace {

constexpr int kSender = 9;
constexpr int kQueueOwner = 13;

TEST(ShmSequenceTest, StampsConsecutiveNumbersUnderOneNonZeroStream) {
  ShmSequence seq;
  EXPECT_NE(seq.stream(), 0u);
  for (uint64_t i = 0; i < 4; ++i) {
    PsHeader h;
    seq.Stamp(&h);
    EXPECT_TRUE(h.has_shm_seq());
    EXPECT_EQ(h.shm_seq(), i);
    EXPECT_EQ(h.shm_stream(), seq.stream());
  }
  EXPECT_EQ(seq.next(), 4u);
  // Every connection gets its own numbering (a replaced peer's new one is
  // told apart from the old by the receiver).
  ShmSequence other;
  EXPECT_NE(other.stream(), seq.stream());
  EXPECT_EQ(other.next(), 0u);
}

TEST(ShmSequenceTest, AFailedSendGivesItsNumberToTheNextMessage) {
  ShmSequence seq(77);
  PsHeader a, b, c;
  seq.Stamp(&a);
  seq.Stamp(&b);
  seq.Rollback();  // b was not sent
  seq.Stamp(&c);
  EXPECT_EQ(a.shm_seq(), 0u);
  EXPECT_EQ(c.shm_seq(), 1u) << "the number b had";
  EXPECT_EQ(seq.next(), 2u);
}

TEST(ShmSequenceTest, WithRollbackTheReceiverSeesNoGapAfterFailedSends) {
  ShmSequence seq(1234);
  Reorderer r("test", 0);
  std::vector<uint64_t> got;
  const Reorderer::Handler h = [&](Message&& m) { got.push_back(m.header.request_id()); };
  // Ten messages; every third send fails once (peer busy) and is retried.
  std::vector<uint64_t> sent_ids;
  for (uint64_t id = 0; id < 10; ++id) {
    for (int attempt = 0;; ++attempt) {
      Message m;
      m.header.set_sender(kSender);
      m.header.set_request_id(id);
      seq.Stamp(&m.header);
      if (id % 3 == 0 && attempt == 0) {
        seq.Rollback();
        continue;
      }
      const PsHeader hd = m.header;
      r.Deliver(kSender, hd.shm_stream(), hd.shm_seq(), std::move(m), h);
      break;
    }
  }
  std::vector<uint64_t> want;
  for (uint64_t i = 0; i < 10; ++i) want.push_back(i);
  EXPECT_EQ(got, want);
  EXPECT_EQ(r.waiting(kSender), 0u) << "nothing waits for a number that was never sent";
  EXPECT_EQ(r.expected(kSender), 10u);
}

TEST(ShmSequenceTest, ADroppedMessageGivesUpItsSlotInTheRightOrder) {
  PsHeader plain;
  plain.set_sender(kSender);
  EXPECT_FALSE(DroppedSlot(plain).has_value()) << "unnumbered: nothing to skip";

  PsHeader numbered = plain;
  numbered.set_shm_seq(5);
  numbered.set_shm_stream(99);
  auto over_tcp = DroppedSlot(numbered);
  ASSERT_TRUE(over_tcp.has_value());
  EXPECT_EQ(over_tcp->sender, kSender) << "over ZeroMQ: the claimed sender's order";
  EXPECT_EQ(over_tcp->stream, 99u);
  EXPECT_EQ(over_tcp->seq, 5u);
  // From a peer's queue the queue's owner is the sender, whatever it claims.
  auto queued = DroppedSlot(numbered, kQueueOwner);
  ASSERT_TRUE(queued.has_value());
  EXPECT_EQ(queued->sender, kQueueOwner);
  EXPECT_EQ(queued->seq, 5u);
}

TEST(ShmSequenceTest, ADroppedNumberedMessageDoesNotHoldUpTheRest) {
  Reorderer r("test", 0);
  std::vector<uint64_t> got;
  const Reorderer::Handler h = [&](Message&& m) { got.push_back(m.header.request_id()); };
  ShmSequence seq(5);
  std::vector<Message> msgs(4);
  for (uint64_t i = 0; i < 4; ++i) {
    msgs[i].header.set_sender(kSender);
    msgs[i].header.set_request_id(i);
    seq.Stamp(&msgs[i].header);
  }
  // 0 arrives, 2 and 3 overtake 1, and 1 turns out to be malformed.
  r.Deliver(kSender, 5, 0, std::move(msgs[0]), h);
  r.Deliver(kSender, 5, 2, std::move(msgs[2]), h);
  r.Deliver(kSender, 5, 3, std::move(msgs[3]), h);
  auto slot = DroppedSlot(msgs[1].header);
  ASSERT_TRUE(slot.has_value());
  EXPECT_EQ(r.Skip(slot->sender, slot->stream, slot->seq, h), Reorderer::Outcome::kHandedOn);
  EXPECT_EQ(got, (std::vector<uint64_t>{0, 2, 3}));
}

}  // namespace
}  // namespace pstrain
