// Deadline: a point in steady-clock time after which a wait gives up.
// Every blocking call in pstrain takes one (see ../shared/design.md section 6).
#ifndef PSTRAIN_COMMON_DEADLINE_H_
#define PSTRAIN_COMMON_DEADLINE_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

namespace pstrain {

using SteadyClock = std::chrono::steady_clock;

class Deadline {
 public:
  // A deadline `d` from now.
  template <typename Rep, typename Period>
  static Deadline In(std::chrono::duration<Rep, Period> d) {
    return Deadline(SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(d));
  }
  static Deadline InMillis(int64_t ms) { return In(std::chrono::milliseconds(ms)); }
  static Deadline At(SteadyClock::time_point t) { return Deadline(t); }
  // For waits bounded by something else (a peer's death, a shutdown); use rarely.
  static Deadline Never() { return Deadline(SteadyClock::time_point::max()); }

  bool Expired() const { return SteadyClock::now() >= at_; }
  SteadyClock::time_point time_point() const { return at_; }
  // Milliseconds left, clamped to [0, INT32_MAX] (the range zmq_poll takes).
  int64_t RemainingMillis() const {
    if (at_ == SteadyClock::time_point::max()) return INT32_MAX;
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(at_ - SteadyClock::now()).count();
    return std::clamp<int64_t>(left, 0, INT32_MAX);
  }
  // The earlier of two deadlines.
  Deadline Min(Deadline other) const { return Deadline(std::min(at_, other.at_)); }

 private:
  explicit Deadline(SteadyClock::time_point at) : at_(at) {}
  SteadyClock::time_point at_;
};

// Polls done() until it returns true (then true) or `deadline` passes first
// (then false; the caller says what it waited for). For waits with no
// blocking call that takes a deadline (a CUDA event or stream): for `spin`
// it polls back to back, yielding the core between polls (most such waits
// end within it), then sleeps between polls, doubling from 10 us to 100 us,
// so a long wait leaves the cores to others and wakes at most 100 us late.
template <typename DoneFn>
bool PollUntil(DoneFn&& done, Deadline deadline, std::chrono::microseconds spin) {
  constexpr auto kMaxSleep = std::chrono::microseconds(100);
  const Deadline spin_ends = Deadline::In(spin);
  auto sleep = std::chrono::microseconds(10);
  while (!done()) {
    if (deadline.Expired()) return false;
    if (!spin_ends.Expired()) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kMaxSleep);
  }
  return true;
}

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_DEADLINE_H_
