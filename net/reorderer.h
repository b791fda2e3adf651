// Reorderer: each co-located sender's messages handed on in the sender's order.
//
// A node that maps a peer's arena numbers every message to that peer
// (PsHeader.shm_seq, within the numbering PsHeader.shm_stream; see
// net/shm_sequence.h) and sends each one either through the peer's
// shared-memory queue or over ZeroMQ, whichever can take it at that moment. The
// two paths overtake each other, so the receiving Van gives every numbered
// message to a Reorderer, which hands each sender's messages on in number
// order:
//   - one that arrives before its turn waits (is stashed) until every earlier
//     number has been handed on or skipped;
//   - a number whose message was dropped (malformed, forged) is skipped, so the
//     ones after it are not held up;
//   - a number seen before (handed on or waiting) is refused and logged;
//   - a new numbering from a sender (its process replaced by a new one, or a
//     new connection) starts over at the new numbering's first message, and
//     whatever still waited under the old numbering is forgotten; a message
//     of an old numbering that arrives after that is refused (kStale), so a
//     straggler of the replaced process cannot restart the order;
//   - a number missing for longer than the caller's timeout (a message lost
//     without a header to say which, as a corrupt queue entry) is given up
//     (SkipOverdue): the messages that waited for it go on, and the lost
//     one's request fails by its own deadline; should it arrive after all
//     (a sender frozen that long), it is handed on then, out of order;
//   - a sender whose queue this node does not read (it has not mapped the
//     sender's arena, yet or at all) sends everything over ZeroMQ, in order:
//     its numbers are passed (Pass) as they come, never held, so the numbering
//     is in step once the queue is read;
//   - no sender holds more than kMaxHeld messages waiting: past that they are
//     refused (a peer that numbers with gaps cannot make the wait grow
//     without bound; the bytes each holds are bounded per frame only, by
//     PSTRAIN_MAX_MESSAGE_BYTES).
// Unnumbered messages (peers that share no memory) never come here.
//
// Threads: not thread-safe. The Van's receive thread alone uses it.
#ifndef PSTRAIN_NET_REORDERER_H_
#define PSTRAIN_NET_REORDERER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "net/message.h"

namespace pstrain {

class Reorderer {
 public:
  // Called with each message when its turn comes (the Van's handler).
  using Handler = std::function<void(Message&&)>;
  // What Deliver or Skip did with a number.
  enum class Outcome {
    kHandedOn,   // it was the sender's next: handed on (Deliver) or passed (Skip),
                 // with every waiting one that followed it; or a number given
                 // up (SkipOverdue) that came after all: handed on alone
    kStashed,    // an earlier number is missing: it waits
    kDuplicate,  // that number was handed on or skipped, or is waiting already: ignored
    kRefused,    // kMaxHeld of the sender's wait already: ignored
    kStale,      // a numbering the sender replaced already: ignored
  };
  // Whether the message (or number) was ignored, not handed on or kept.
  static bool Ignored(Outcome o) {
    return o == Outcome::kDuplicate || o == Outcome::kRefused || o == Outcome::kStale;
  }
  // Messages of one sender that may wait for an earlier number before the
  // sender's shared-memory queue stops being read (Paused): the missing one is
  // then on ZeroMQ, behind them.
  static constexpr size_t kMaxStashed = size_t{1} << 16;
  // Messages of one sender that may wait at all. A sender that keeps to the
  // protocol never comes near: its queue is not read past kMaxStashed, and
  // its ZeroMQ messages are drained between reads of the queue.
  static constexpr size_t kMaxHeld = 2 * kMaxStashed;
  // Replaced numberings remembered per sender (to refuse their stragglers).
  static constexpr size_t kMaxRetired = 8;

  // `name` and `verbose` (VanOptions') only shape log lines.
  Reorderer(std::string name, int verbose);
  Reorderer(const Reorderer&) = delete;
  Reorderer& operator=(const Reorderer&) = delete;

  // Message number `seq` of `sender`'s numbering `stream`. If it is the
  // sender's next, calls handler(msg) and then the handler with every
  // waiting message that follows it without a gap; otherwise `msg` is moved
  // into the stash until its turn. kDuplicate leaves `msg` as it was.
  Outcome Deliver(int sender, uint64_t stream, uint64_t seq, Message&& msg, const Handler& handler);
  // Number `seq` of `sender`'s numbering `stream` will never be handed on
  // (its message was dropped): the messages after it do not wait for it.
  // Hands on those that were waiting only for it.
  Outcome Skip(int sender, uint64_t stream, uint64_t seq, const Handler& handler);
  // Number `seq` of a sender whose queue is not read (all it sends comes over
  // ZeroMQ, in order): `msg` (null: a dropped message) is handed on at once,
  // after any of the sender's waiting messages numbered before it and before
  // those that follow it without a gap; the sender's next expected number is
  // past them all. kDuplicate for a number seen.
  Outcome Pass(int sender, uint64_t stream, uint64_t seq, Message* msg, const Handler& handler);
  // Gives up every number that the messages waiting behind it have waited
  // for since `timeout` before `now` or longer (logged as an error, naming
  // the sender and the number): they are handed on, up to the next gap,
  // which starts its own wait. Returns how many numbers were given up. The
  // Van calls it when a pass of its receive loop found nothing to read (a
  // number missing then is not merely unread).
  size_t SkipOverdue(SteadyClock::time_point now, SteadyClock::duration timeout,
                     const Handler& handler);

  // Whether kMaxStashed or more of `sender`'s messages wait for an earlier
  // number (the receive thread stops reading that sender's queue).
  bool Paused(int sender) const;
  // How many of `sender`'s messages (or skipped numbers) wait for an earlier
  // number, and the number it waits for (for tests).
  size_t waiting(int sender) const;
  uint64_t expected(int sender) const;

 private:
  // Per sender: its numbering, the next number to hand on, and the numbers
  // that arrived before it (nullopt: skipped).
  struct InOrder {
    uint64_t stream = 0;  // 0: none seen yet (a numbering is never 0)
    uint64_t expected = 0;
    std::map<uint64_t, std::optional<Message>> stash;
    // (stash not empty) Since when the stash has waited for `expected`.
    SteadyClock::time_point waiting_since;
    std::vector<uint64_t> retired;  // replaced numberings, the newest last
    std::set<uint64_t> given_up;    // by SkipOverdue, not arrived since (at most kMaxHeld)
  };
  // Hands on the stash's messages that follow `o.expected` without a gap.
  void HandOnFollowing(InOrder& o, const Handler& handler);
  // Deliver (msg) or Skip (null); `hold` false: Pass.
  Outcome Put(int sender, uint64_t stream, uint64_t seq, Message* msg, bool hold,
              const Handler& handler);

  const std::string name_;
  const int verbose_;
  std::map<int, InOrder> order_;
};

}  // namespace pstrain

#endif  // PSTRAIN_NET_REORDERER_H_
