// The Reorderer on its own: numbered messages from co-located senders,
// arriving over two paths that overtake each other, handed on in each
// sender's order.
#include "net/reorderer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <random>
#include <vector>

namespace pstrain {
namespace {

constexpr int kSender = 9;  // worker rank 0
constexpr int kOther = 11;  // worker rank 1
constexpr uint64_t kStream = 0x5eed;

// A message carrying `id` as its request id (what the tests follow).
Message Tagged(int sender, uint64_t id) {
  Message m;
  m.header.set_sender(sender);
  m.header.set_request_id(id);
  return m;
}

// Records what is handed on: (sender, request id).
struct Sink {
  std::vector<std::pair<int, uint64_t>> got;
  Reorderer::Handler handler() {
    return [this](Message&& m) { got.emplace_back(m.header.sender(), m.header.request_id()); };
  }
  std::vector<uint64_t> ids() const {
    std::vector<uint64_t> out;
    for (const auto& g : got) out.push_back(g.second);
    return out;
  }
};

using Out = Reorderer::Outcome;

TEST(ReordererTest, InOrderArrivalsAreHandedOnAtOnce) {
  Reorderer r("test", 0);
  Sink sink;
  const auto h = sink.handler();
  for (uint64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(r.Deliver(kSender, kStream, i, Tagged(kSender, i), h), Out::kHandedOn);
    EXPECT_EQ(sink.got.size(), i + 1);
  }
  EXPECT_EQ(r.expected(kSender), 5u);
  EXPECT_EQ(r.waiting(kSender), 0u);
}

TEST(ReordererTest, EarlyArrivalsWaitForTheMissingOneThenFollowIt) {
  Reorderer r("test", 0);
  Sink sink;
  const auto h = sink.handler();
  // Shared memory took 0, 2, 3 and 5; ZeroMQ (slower) took 1 and 4.
  EXPECT_EQ(r.Deliver(kSender, kStream, 0, Tagged(kSender, 0), h), Out::kHandedOn);
  EXPECT_EQ(r.Deliver(kSender, kStream, 2, Tagged(kSender, 2), h), Out::kStashed);
  EXPECT_EQ(r.Deliver(kSender, kStream, 3, Tagged(kSender, 3), h), Out::kStashed);
  EXPECT_EQ(r.Deliver(kSender, kStream, 5, Tagged(kSender, 5), h), Out::kStashed);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{0}));
  EXPECT_EQ(r.waiting(kSender), 3u);
  EXPECT_EQ(r.expected(kSender), 1u);
  EXPECT_EQ(r.Deliver(kSender, kStream, 1, Tagged(kSender, 1), h), Out::kHandedOn);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{0, 1, 2, 3})) << "5 still waits for 4";
  EXPECT_EQ(r.waiting(kSender), 1u);
  EXPECT_EQ(r.Deliver(kSender, kStream, 4, Tagged(kSender, 4), h), Out::kHandedOn);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(r.waiting(kSender), 0u);
  EXPECT_EQ(r.expected(kSender), 6u);
}

// Every interleaving of two in-order paths gives the sender's order back.
TEST(ReordererTest, TwoPathsInAnyInterleavingComeOutInTheSendersOrder) {
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    std::mt19937 rng(seed);
    // The sender puts each message on the queue or on ZeroMQ; each path keeps
    // its own order, but either may run ahead of the other.
    std::deque<uint64_t> queue, tcp;
    const uint64_t n = 200;
    for (uint64_t i = 0; i < n; ++i) (rng() % 3 == 0 ? tcp : queue).push_back(i);
    Reorderer r("test", 0);
    Sink sink;
    const auto h = sink.handler();
    while (!queue.empty() || !tcp.empty()) {
      std::deque<uint64_t>& path = tcp.empty() || (!queue.empty() && rng() % 2 == 0) ? queue : tcp;
      const uint64_t seq = path.front();
      path.pop_front();
      ASSERT_NE(r.Deliver(kSender, kStream, seq, Tagged(kSender, seq), h), Out::kDuplicate);
    }
    std::vector<uint64_t> want(n);
    for (uint64_t i = 0; i < n; ++i) want[i] = i;
    ASSERT_EQ(sink.ids(), want) << "seed " << seed;
    EXPECT_EQ(r.waiting(kSender), 0u);
  }
}

TEST(ReordererTest, ASkippedNumberDoesNotHoldUpTheOnesAfterIt) {
  Reorderer r("test", 0);
  Sink sink;
  const auto h = sink.handler();
  EXPECT_EQ(r.Deliver(kSender, kStream, 0, Tagged(kSender, 0), h), Out::kHandedOn);
  EXPECT_EQ(r.Deliver(kSender, kStream, 2, Tagged(kSender, 2), h), Out::kStashed);
  EXPECT_EQ(r.Deliver(kSender, kStream, 3, Tagged(kSender, 3), h), Out::kStashed);
  // Message 1 was dropped (malformed): its number is given up.
  EXPECT_EQ(r.Skip(kSender, kStream, 1, h), Out::kHandedOn);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{0, 2, 3}));
  // A skip that comes before its neighbours: 5 is dropped while 4 is on its way.
  EXPECT_EQ(r.Skip(kSender, kStream, 5, h), Out::kStashed);
  EXPECT_EQ(r.Deliver(kSender, kStream, 6, Tagged(kSender, 6), h), Out::kStashed);
  EXPECT_EQ(r.Deliver(kSender, kStream, 4, Tagged(kSender, 4), h), Out::kHandedOn);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{0, 2, 3, 4, 6}));
  EXPECT_EQ(r.expected(kSender), 7u);
  // The skipped number cannot come back later.
  EXPECT_EQ(r.Deliver(kSender, kStream, 5, Tagged(kSender, 5), h), Out::kDuplicate);
  EXPECT_EQ(sink.got.size(), 5u);
}

TEST(ReordererTest, ANumberSeenTwiceIsRefusedAndTheFirstCopyKept) {
  Reorderer r("test", 0);
  Sink sink;
  const auto h = sink.handler();
  EXPECT_EQ(r.Deliver(kSender, kStream, 0, Tagged(kSender, 100), h), Out::kHandedOn);
  EXPECT_EQ(r.Deliver(kSender, kStream, 0, Tagged(kSender, 999), h), Out::kDuplicate);
  EXPECT_EQ(r.Deliver(kSender, kStream, 2, Tagged(kSender, 102), h), Out::kStashed);
  Message copy = Tagged(kSender, 999);
  EXPECT_EQ(r.Deliver(kSender, kStream, 2, std::move(copy), h), Out::kDuplicate);
  EXPECT_EQ(copy.header.request_id(), 999u) << "a refused message is left as it was";
  EXPECT_EQ(r.Skip(kSender, kStream, 2, h), Out::kDuplicate) << "waiting already";
  EXPECT_EQ(r.Deliver(kSender, kStream, 1, Tagged(kSender, 101), h), Out::kHandedOn);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{100, 101, 102}));
}

TEST(ReordererTest, ARestartedSenderNumbersAnewAndItsOldWaitingMessagesAreForgotten) {
  Reorderer r("test", 1);
  Sink sink;
  const auto h = sink.handler();
  EXPECT_EQ(r.Deliver(kSender, 1111, 0, Tagged(kSender, 0), h), Out::kHandedOn);
  EXPECT_EQ(r.Deliver(kSender, 1111, 1, Tagged(kSender, 1), h), Out::kHandedOn);
  EXPECT_EQ(r.Deliver(kSender, 1111, 3, Tagged(kSender, 3), h), Out::kStashed);
  EXPECT_EQ(r.waiting(kSender), 1u);
  // The sender's process was replaced: its new numbering starts at 0 again,
  // which under the old numbering would have been a duplicate.
  EXPECT_EQ(r.Deliver(kSender, 2222, 0, Tagged(kSender, 50), h), Out::kHandedOn);
  EXPECT_EQ(r.waiting(kSender), 0u) << "the old process's message 3 is not coming";
  EXPECT_EQ(r.Deliver(kSender, 2222, 2, Tagged(kSender, 52), h), Out::kStashed);
  EXPECT_EQ(r.Deliver(kSender, 2222, 1, Tagged(kSender, 51), h), Out::kHandedOn);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{0, 1, 50, 51, 52}));
  EXPECT_EQ(r.expected(kSender), 3u);
}

// A message of the replaced numbering that arrives after the new one began
// (a straggler of the replaced process) is refused: before, it restarted the
// order under the old numbering, and the new numbering's next message then
// waited forever for numbers handed on already.
TEST(ReordererTest, AStragglerOfAReplacedNumberingIsRefused) {
  Reorderer r("test", 0);
  Sink sink;
  const auto h = sink.handler();
  EXPECT_EQ(r.Deliver(kSender, 1111, 0, Tagged(kSender, 0), h), Out::kHandedOn);
  EXPECT_EQ(r.Deliver(kSender, 2222, 0, Tagged(kSender, 50), h), Out::kHandedOn);
  EXPECT_EQ(r.Deliver(kSender, 2222, 1, Tagged(kSender, 51), h), Out::kHandedOn);
  EXPECT_EQ(r.Deliver(kSender, 1111, 1, Tagged(kSender, 1), h), Out::kStale);
  EXPECT_EQ(r.Skip(kSender, 1111, 2, h), Out::kStale);
  EXPECT_EQ(r.Pass(kSender, 1111, 3, nullptr, h), Out::kStale);
  EXPECT_TRUE(Reorderer::Ignored(Out::kStale));
  EXPECT_EQ(r.Deliver(kSender, 2222, 2, Tagged(kSender, 52), h), Out::kHandedOn);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{0, 50, 51, 52}));
  // A third numbering retires the second; the first stays refused.
  EXPECT_EQ(r.Deliver(kSender, 3333, 0, Tagged(kSender, 70), h), Out::kHandedOn);
  EXPECT_EQ(r.Deliver(kSender, 2222, 3, Tagged(kSender, 53), h), Out::kStale);
  EXPECT_EQ(r.Deliver(kSender, 1111, 4, Tagged(kSender, 4), h), Out::kStale);
  EXPECT_EQ(r.expected(kSender), 1u);
}

// Only the last kMaxRetired numberings are remembered (the memory stays
// bounded however often a sender is replaced).
TEST(ReordererTest, RetiredNumberingsAreBounded) {
  Reorderer r("test", 0);
  Sink sink;
  const auto h = sink.handler();
  const uint64_t first = 100;
  const uint64_t last = first + Reorderer::kMaxRetired + 1;
  for (uint64_t stream = first; stream <= last; ++stream) {
    ASSERT_EQ(r.Deliver(kSender, stream, 0, Tagged(kSender, stream), h), Out::kHandedOn);
  }
  EXPECT_EQ(r.Deliver(kSender, last - 1, 1, Tagged(kSender, 1), h), Out::kStale);
  EXPECT_EQ(r.Deliver(kSender, last - Reorderer::kMaxRetired, 1, Tagged(kSender, 1), h),
            Out::kStale);
  // The oldest is forgotten: it counts as a new numbering again.
  EXPECT_EQ(r.Deliver(kSender, first, 0, Tagged(kSender, 999), h), Out::kHandedOn);
}

// A number that never arrives (its message lost with no header to say which)
// is given up once the messages behind it waited past the timeout: they go
// on, up to the next gap, whose wait starts then; the lost one, arriving
// after all (a sender frozen that long), is handed on then, once.
TEST(ReordererTest, ANumberMissingPastTheTimeoutIsGivenUp) {
  Reorderer r("test", 0);
  Sink sink;
  const auto h = sink.handler();
  const auto timeout = std::chrono::seconds(30);
  EXPECT_EQ(r.Deliver(kSender, kStream, 0, Tagged(kSender, 0), h), Out::kHandedOn);
  EXPECT_EQ(r.Deliver(kSender, kStream, 2, Tagged(kSender, 2), h), Out::kStashed);
  EXPECT_EQ(r.Deliver(kSender, kStream, 3, Tagged(kSender, 3), h), Out::kStashed);
  EXPECT_EQ(r.Deliver(kSender, kStream, 5, Tagged(kSender, 5), h), Out::kStashed);
  EXPECT_EQ(r.Deliver(kOther, kStream, 0, Tagged(kOther, 100), h), Out::kHandedOn);
  const auto start = SteadyClock::now();
  EXPECT_EQ(r.SkipOverdue(start, timeout, h), 0u);
  EXPECT_EQ(r.SkipOverdue(start + std::chrono::seconds(10), timeout, h), 0u);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{0, 100}));
  EXPECT_EQ(r.SkipOverdue(start + std::chrono::seconds(31), timeout, h), 1u);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{0, 100, 2, 3}));
  EXPECT_EQ(r.expected(kSender), 4u);
  EXPECT_EQ(r.waiting(kSender), 1u);
  EXPECT_EQ(r.Deliver(kSender, kStream, 1, Tagged(kSender, 1), h), Out::kHandedOn);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{0, 100, 2, 3, 1}));
  EXPECT_EQ(r.Deliver(kSender, kStream, 1, Tagged(kSender, 1), h), Out::kDuplicate);
  // Number 4's wait began when 2 and 3 went on: not overdue at once.
  EXPECT_EQ(r.SkipOverdue(SteadyClock::now(), timeout, h), 0u);
  EXPECT_EQ(r.Deliver(kSender, kStream, 4, Tagged(kSender, 4), h), Out::kHandedOn);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{0, 100, 2, 3, 1, 4, 5}));
  EXPECT_EQ(r.waiting(kSender), 0u);
  EXPECT_EQ(r.SkipOverdue(start + std::chrono::hours(1), timeout, h), 0u) << "nothing waits";
}

// Several numbers in a row missing are given up together.
TEST(ReordererTest, AMissingRunIsGivenUpWhole) {
  Reorderer r("test", 0);
  Sink sink;
  const auto h = sink.handler();
  EXPECT_EQ(r.Deliver(kSender, kStream, 4, Tagged(kSender, 4), h), Out::kStashed);
  EXPECT_EQ(
      r.SkipOverdue(SteadyClock::now() + std::chrono::minutes(1), std::chrono::seconds(30), h), 4u);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{4}));
  EXPECT_EQ(r.expected(kSender), 5u);
  EXPECT_EQ(r.Skip(kSender, kStream, 2, h), Out::kHandedOn) << "given up, then dropped after all";
  EXPECT_EQ(r.Skip(kSender, kStream, 2, h), Out::kDuplicate);
  // A number far past the rest (a peer may number as it likes) is given up
  // at once, remembering a bounded run.
  EXPECT_EQ(r.Deliver(kSender, kStream, uint64_t{1} << 60, Tagged(kSender, 9), h), Out::kStashed);
  EXPECT_EQ(
      r.SkipOverdue(SteadyClock::now() + std::chrono::minutes(1), std::chrono::seconds(30), h),
      (uint64_t{1} << 60) - 5);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{4, 9}));
  EXPECT_EQ(r.Deliver(kSender, kStream, (uint64_t{1} << 60) - 1, Tagged(kSender, 10), h),
            Out::kHandedOn);
  EXPECT_EQ(r.Deliver(kSender, kStream, 5, Tagged(kSender, 11), h), Out::kDuplicate)
      << "past the remembered run";
}

TEST(ReordererTest, SendersAreOrderedIndependently) {
  Reorderer r("test", 0);
  Sink sink;
  const auto h = sink.handler();
  EXPECT_EQ(r.Deliver(kSender, kStream, 1, Tagged(kSender, 1), h), Out::kStashed);
  // Another sender's message 0 is not held up by kSender's missing 0.
  EXPECT_EQ(r.Deliver(kOther, kStream, 0, Tagged(kOther, 0), h), Out::kHandedOn);
  EXPECT_EQ(r.Deliver(kSender, kStream, 0, Tagged(kSender, 0), h), Out::kHandedOn);
  const std::vector<std::pair<int, uint64_t>> want = {{kOther, 0}, {kSender, 0}, {kSender, 1}};
  EXPECT_EQ(sink.got, want);
  EXPECT_EQ(r.expected(kOther), 1u);
  EXPECT_EQ(r.expected(kSender), 2u);
}

TEST(ReordererTest, ASenderWithTooManyWaitingIsPausedUntilTheMissingOneArrives) {
  Reorderer r("test", 0);
  Sink sink;
  const auto h = sink.handler();
  // Numbers 1 .. kMaxStashed wait for 0 (skips are cheaper than messages and
  // count the same); one real message at the end.
  const uint64_t last = Reorderer::kMaxStashed;
  for (uint64_t i = 1; i < last; ++i) ASSERT_EQ(r.Skip(kSender, kStream, i, h), Out::kStashed);
  EXPECT_FALSE(r.Paused(kSender));
  EXPECT_EQ(r.Deliver(kSender, kStream, last, Tagged(kSender, last), h), Out::kStashed);
  EXPECT_TRUE(r.Paused(kSender));
  EXPECT_FALSE(r.Paused(kOther));
  EXPECT_TRUE(sink.got.empty());
  EXPECT_EQ(r.Deliver(kSender, kStream, 0, Tagged(kSender, 0), h), Out::kHandedOn);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{0, last}));
  EXPECT_FALSE(r.Paused(kSender));
  EXPECT_EQ(r.expected(kSender), last + 1);
}

// A sender whose queue is not read sends over ZeroMQ alone, in order: its
// numbers are passed as they come, gaps and all, never held; once its queue is
// read the numbering is in step.
TEST(ReordererTest, ASenderWhoseQueueIsNotReadIsPassedAtOnceAndStaysInStep) {
  Reorderer r("test", 0);
  Sink sink;
  const auto h = sink.handler();
  for (uint64_t seq : {3u, 4u, 9u}) {
    Message m = Tagged(kSender, seq);
    EXPECT_EQ(r.Pass(kSender, kStream, seq, &m, h), Out::kHandedOn);
  }
  EXPECT_EQ(r.Pass(kSender, kStream, 12, nullptr, h), Out::kHandedOn) << "a dropped one";
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{3, 4, 9}));
  EXPECT_EQ(r.waiting(kSender), 0u);
  EXPECT_EQ(r.expected(kSender), 13u);
  Message again = Tagged(kSender, 9);
  EXPECT_EQ(r.Pass(kSender, kStream, 9, &again, h), Out::kDuplicate);
  // Its queue is read from now on: 14 (queue) overtakes 13 (ZeroMQ).
  EXPECT_EQ(r.Deliver(kSender, kStream, 14, Tagged(kSender, 14), h), Out::kStashed);
  EXPECT_EQ(r.Deliver(kSender, kStream, 13, Tagged(kSender, 13), h), Out::kHandedOn);
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{3, 4, 9, 13, 14}));
}

// A peer that numbers with gaps cannot fill the receiver's memory: past
// kMaxHeld waiting, its messages are refused; the one it waits for still
// releases those held.
TEST(ReordererTest, NoSenderHoldsMoreThanKMaxHeld) {
  Reorderer r("test", 0);
  Sink sink;
  const auto h = sink.handler();
  for (uint64_t i = 1; i <= Reorderer::kMaxHeld; ++i) {
    ASSERT_EQ(r.Skip(kSender, kStream, 2 * i, h), Out::kStashed) << i;
  }
  EXPECT_EQ(r.Deliver(kSender, kStream, 3, Tagged(kSender, 3), h), Out::kRefused);
  EXPECT_EQ(r.Skip(kSender, kStream, 5, h), Out::kRefused);
  EXPECT_EQ(r.waiting(kSender), Reorderer::kMaxHeld);
  EXPECT_EQ(r.Deliver(kOther, kStream, 0, Tagged(kOther, 0), h), Out::kHandedOn)
      << "other senders are not held up";
  EXPECT_EQ(r.Deliver(kSender, kStream, 0, Tagged(kSender, 0), h), Out::kHandedOn);
  EXPECT_EQ(r.Deliver(kSender, kStream, 1, Tagged(kSender, 1), h), Out::kHandedOn);
  EXPECT_EQ(r.waiting(kSender), Reorderer::kMaxHeld - 1) << "2 passed; 4 on wait for 3";
  EXPECT_EQ(r.expected(kSender), 3u);
  EXPECT_EQ(r.Deliver(kSender, kStream, 3, Tagged(kSender, 3), h), Out::kHandedOn);
}

}  // namespace
}  // namespace pstrain
