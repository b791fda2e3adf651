// The doorbell on its own: a ring wakes a receiver waiting on it, rings pile
// up harmlessly, and a doorbell that is absent (never advertised, gone, or
// unreachable) is reported rather than waited for.
#include "net/doorbell.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "tests/test_util.h"

namespace pstrain {
namespace {

// A name no other test process uses.
std::string UniqueName(const std::string& what) {
  static int n = 0;
  return StrCat("pstrain-test-", getpid(), "-", what, "-", n++);
}

std::unique_ptr<Doorbell> OpenBell(const std::string& name) {
  auto bell = Doorbell::Open(name);
  CHECK_OK(bell.status());
  return std::move(bell).value();
}

// Waits up to `ms` for `fd` to become readable.
bool Readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1 && (p.revents & POLLIN) != 0;
}

TEST(DoorbellTest, ARingWakesAReceiverWaitingOnIt) {
  auto receiver = OpenBell(UniqueName("rx"));
  auto sender = OpenBell(UniqueName("tx"));
  ASSERT_TRUE(sender->can_ring());
  EXPECT_FALSE(Readable(receiver->fd(), 0)) << "silent until rung";
  // The receiver sleeps for up to 10 s; the ring must end that at once.
  std::chrono::steady_clock::duration slept{};
  bool woke = false;
  std::thread waiter([&] {
    const auto start = std::chrono::steady_clock::now();
    woke = Readable(receiver->fd(), 10000);
    slept = std::chrono::steady_clock::now() - start;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // it is asleep by now
  ASSERT_OK(sender->Ring(DoorbellAddress::Of(receiver->name())));
  waiter.join();
  EXPECT_TRUE(woke);
  EXPECT_LT(slept, std::chrono::seconds(5));
  // Drained, it is silent again until the next ring.
  receiver->Drain();
  EXPECT_FALSE(Readable(receiver->fd(), 0));
  ASSERT_OK(sender->Ring(DoorbellAddress::Of(receiver->name())));
  EXPECT_TRUE(Readable(receiver->fd(), 1000));
}

TEST(DoorbellTest, RingsPileUpWithoutErrorWhileTheReceiverIsBusy) {
  auto receiver = OpenBell(UniqueName("busy"));
  auto sender = OpenBell(UniqueName("ringer"));
  const DoorbellAddress to = DoorbellAddress::Of(receiver->name());
  // Far more rings than a datagram socket queues: a full doorbell means the
  // receiver will wake anyway, so ringing it is not an error.
  for (int i = 0; i < 5000; ++i) ASSERT_OK(sender->Ring(to));
  EXPECT_TRUE(Readable(receiver->fd(), 0));
  receiver->Drain();
  EXPECT_FALSE(Readable(receiver->fd(), 0)) << "one Drain forgets every ring";
}

TEST(DoorbellTest, AnAbsentDoorbellIsReportedNotWaitedFor) {
  // A peer that advertises none, or one whose name cannot be an address.
  EXPECT_FALSE(DoorbellAddress::Of("").valid());
  EXPECT_FALSE(DoorbellAddress::Of(std::string(200, 'x')).valid());
  DoorbellAddress cleared = DoorbellAddress::Of("pstrain-x");
  EXPECT_TRUE(cleared.valid());
  cleared.Clear();
  EXPECT_FALSE(cleared.valid());

  auto sender = OpenBell(UniqueName("alone"));
  // Nobody listens under that name (another network namespace looks the same).
  Status s = sender->Ring(DoorbellAddress::Of(UniqueName("nobody")));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  // A peer that went away.
  std::string gone_name = UniqueName("gone");
  auto gone = OpenBell(gone_name);
  ASSERT_OK(sender->Ring(DoorbellAddress::Of(gone_name)));
  gone.reset();
  EXPECT_EQ(sender->Ring(DoorbellAddress::Of(gone_name)).code(), StatusCode::kUnavailable);
}

TEST(DoorbellTest, ANameCanBeBoundOnlyOnce) {
  const std::string name = UniqueName("once");
  auto first = OpenBell(name);
  EXPECT_EQ(first->name(), name);
  auto second = Doorbell::Open(name);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kIOError) << second.status();
  first.reset();
  EXPECT_OK(Doorbell::Open(name).status());  // free again once its owner is gone
  EXPECT_FALSE(Doorbell::Open("").ok());
}

}  // namespace
}  // namespace pstrain
