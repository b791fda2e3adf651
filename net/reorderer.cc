#include "net/reorderer.h"

#include <glog/logging.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace pstrain {

Reorderer::Reorderer(std::string name, int verbose) : name_(std::move(name)), verbose_(verbose) {}

Reorderer::Outcome Reorderer::Deliver(int sender, uint64_t stream, uint64_t seq, Message&& msg,
                                      const Handler& handler) {
  return Put(sender, stream, seq, &msg, /*hold=*/true, handler);
}

Reorderer::Outcome Reorderer::Skip(int sender, uint64_t stream, uint64_t seq,
                                   const Handler& handler) {
  return Put(sender, stream, seq, nullptr, /*hold=*/true, handler);
}

Reorderer::Outcome Reorderer::Pass(int sender, uint64_t stream, uint64_t seq, Message* msg,
                                   const Handler& handler) {
  return Put(sender, stream, seq, msg, /*hold=*/false, handler);
}

bool Reorderer::Paused(int sender) const {
  auto it = order_.find(sender);
  return it != order_.end() && it->second.stash.size() >= kMaxStashed;
}

size_t Reorderer::waiting(int sender) const {
  auto it = order_.find(sender);
  return it != order_.end() ? it->second.stash.size() : 0;
}

uint64_t Reorderer::expected(int sender) const {
  auto it = order_.find(sender);
  return it != order_.end() ? it->second.expected : 0;
}

Reorderer::Outcome Reorderer::Put(int sender, uint64_t stream, uint64_t seq, Message* msg,
                                  bool hold, const Handler& handler) {
  InOrder& o = order_[sender];
  if (stream != o.stream) {
    if (std::find(o.retired.begin(), o.retired.end(), stream) != o.retired.end()) {
      LOG_EVERY_N(WARNING, 100) << name_ << ": dropped message " << seq << " from "
                                << NodeIdName(sender)
                                << ": it belongs to a numbering the sender replaced already";
      return Outcome::kStale;
    }
    // A new connection from that node (a replaced process): its numbers start
    // over, and what its predecessor left waiting is not coming.
    if (o.stream != 0 && verbose_ >= 1) {
      LOG(INFO) << name_ << ": " << NodeIdName(sender) << " numbers its messages anew ("
                << o.stash.size() << " of the old numbering dropped)";
    }
    std::vector<uint64_t> retired = std::move(o.retired);
    if (o.stream != 0) retired.push_back(o.stream);
    if (retired.size() > kMaxRetired) retired.erase(retired.begin());
    o = InOrder{};
    o.stream = stream;
    o.retired = std::move(retired);
  }
  if (seq < o.expected && o.given_up.erase(seq) > 0) {
    LOG(WARNING) << name_ << ": message " << seq << " from " << NodeIdName(sender)
                 << " arrived after it was given up: handed on out of order";
    if (msg != nullptr) handler(std::move(*msg));
    return Outcome::kHandedOn;
  }
  if (seq < o.expected || o.stash.count(seq) > 0) {
    LOG(WARNING) << name_ << ": dropped message " << seq << " from " << NodeIdName(sender)
                 << ": that number was seen (or given up) already";
    return Outcome::kDuplicate;
  }
  if (!hold) {
    // Nothing comes before it any more: what waited for earlier numbers goes
    // first, in order.
    while (!o.stash.empty() && o.stash.begin()->first < seq) {
      auto node = o.stash.extract(o.stash.begin());
      if (node.mapped().has_value()) handler(std::move(*node.mapped()));
    }
    o.expected = seq;
  }
  if (seq != o.expected) {
    if (o.stash.size() >= kMaxHeld) {
      LOG_EVERY_N(WARNING, 1000) << name_ << ": dropped message " << seq << " from "
                                 << NodeIdName(sender) << ": " << o.stash.size()
                                 << " of its messages wait already for its message " << o.expected;
      return Outcome::kRefused;
    }
    if (o.stash.size() == kMaxStashed) {
      LOG(WARNING) << name_ << ": " << o.stash.size() << " messages from " << NodeIdName(sender)
                   << " are waiting for its message " << o.expected
                   << "; its shared-memory queue is not read until that arrives";
    }
    std::optional<Message> keep;
    if (msg != nullptr) keep = std::move(*msg);
    if (o.stash.empty()) o.waiting_since = SteadyClock::now();
    o.stash.emplace(seq, std::move(keep));
    return Outcome::kStashed;
  }
  if (msg != nullptr) handler(std::move(*msg));
  ++o.expected;
  HandOnFollowing(o, handler);
  return Outcome::kHandedOn;
}

void Reorderer::HandOnFollowing(InOrder& o, const Handler& handler) {
  while (!o.stash.empty() && o.stash.begin()->first == o.expected) {
    auto node = o.stash.extract(o.stash.begin());
    if (node.mapped().has_value()) handler(std::move(*node.mapped()));
    ++o.expected;
  }
  // What still waits, waits for a later number: its wait starts now.
  if (!o.stash.empty()) o.waiting_since = SteadyClock::now();
}

size_t Reorderer::SkipOverdue(SteadyClock::time_point now, SteadyClock::duration timeout,
                              const Handler& handler) {
  size_t given_up = 0;
  for (auto& [sender, o] : order_) {
    if (o.stash.empty() || now - o.waiting_since < timeout) continue;
    const uint64_t next = o.stash.begin()->first;
    LOG(ERROR) << name_ << ": message" << (next - o.expected > 1 ? "s " : " ") << o.expected
               << (next - o.expected > 1 ? StrCat("-", next - 1) : std::string()) << " from "
               << NodeIdName(sender) << " never arrived in "
               << std::chrono::duration_cast<std::chrono::seconds>(timeout).count()
               << " s (lost); the messages that waited for it go on without it";
    given_up += next - o.expected;
    // Remembered to hand on should they come after all: the last kMaxHeld
    // only (a run may be as long as a peer's numbers are far apart).
    for (uint64_t lost = next - std::min<uint64_t>(next - o.expected, kMaxHeld); lost < next;
         ++lost) {
      o.given_up.insert(lost);
      if (o.given_up.size() > kMaxHeld) o.given_up.erase(o.given_up.begin());
    }
    o.expected = next;
    HandOnFollowing(o, handler);
  }
  return given_up;
}

}  // namespace pstrain
