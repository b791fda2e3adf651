#include "net/reorderer.h"

#include <glog/logging.h>

#include <utility>

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
    // A new connection from that node (a replaced process): its numbers start
    // over, and what its predecessor left waiting is not coming.
    if (o.stream != 0 && verbose_ >= 1) {
      LOG(INFO) << name_ << ": " << NodeIdName(sender) << " numbers its messages anew ("
                << o.stash.size() << " of the old numbering dropped)";
    }
    o = InOrder{};
    o.stream = stream;
  }
  if (seq < o.expected || o.stash.count(seq) > 0) {
    LOG(WARNING) << name_ << ": dropped message " << seq << " from " << NodeIdName(sender)
                 << ": that number was seen already";
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
    o.stash.emplace(seq, std::move(keep));
    return Outcome::kStashed;
  }
  if (msg != nullptr) handler(std::move(*msg));
  ++o.expected;
  while (!o.stash.empty() && o.stash.begin()->first == o.expected) {
    auto node = o.stash.extract(o.stash.begin());
    if (node.mapped().has_value()) handler(std::move(*node.mapped()));
    ++o.expected;
  }
  return Outcome::kHandedOn;
}

}  // namespace pstrain
