#include "net/shm_queue.h"

#include <algorithm>
#include <optional>

namespace pstrain {

bool EnqueueMessage(ShmArena* arena, int receiver, uint8_t incarnation, const std::string& header,
                    const Message& msg, bool inline_values) {
  const uint64_t total = EnvelopeBytes(header, msg, inline_values);
  std::optional<ShmArena::Block> block = arena->AllocateRing(total);
  if (!block.has_value()) return false;
  std::optional<ShmTicket> ticket = arena->Ticket(receiver, incarnation, block->offset);
  if (!ticket.has_value()) return false;
  WriteEnvelope(header, msg, inline_values, block->data);
  if (!arena->Enqueue(receiver, incarnation, block->offset, total, *ticket)) {
    arena->ReleaseTicket(receiver, *ticket);
    return false;
  }
  return true;
}

QueueRead ReadQueued(ShmMapping& peer_arena, int peer, int me, Decoded* out) {
  ShmMapping::QueueItem item;
  const int rc = peer_arena.Dequeue(me, &item);
  if (rc == 0) return QueueRead::kEmpty;
  if (rc < 0) {
    out->header_ok = false;
    out->error = StrCat(NodeIdName(peer), ": its shared-memory queue is corrupt; skipped");
    return QueueRead::kBad;
  }
  auto envelope = peer_arena.Resolve(me, item.offset, item.bytes, item.ticket);
  if (!envelope.ok()) {
    out->header_ok = false;
    out->error = StrCat(NodeIdName(peer), ": queue entry: ", envelope.status().message());
    return QueueRead::kBad;
  }
  *out = DecodeQueued(*envelope);
  if (!out->error.empty()) {
    out->error = StrCat(NodeIdName(peer), ": ", out->error);
    return QueueRead::kBad;
  }
  if (out->msg.header.sender() != peer) {
    out->error = StrCat("message queued by ", NodeIdName(peer), " claims to come from ",
                        NodeIdName(out->msg.header.sender()));
    return QueueRead::kBad;
  }
  return QueueRead::kMessage;
}

void ShmInbox::Add(int peer, std::shared_ptr<ShmMapping> mapping) {
  MutexLock l(&mu_);
  auto it =
      std::find_if(added_.begin(), added_.end(), [peer](const auto& p) { return p.first == peer; });
  if (it != added_.end()) {
    it->second = std::move(mapping);
  } else {
    added_.emplace_back(peer, std::move(mapping));
  }
  ++version_;
}

void ShmInbox::Remove(int peer) {
  MutexLock l(&mu_);
  auto it =
      std::find_if(added_.begin(), added_.end(), [peer](const auto& p) { return p.first == peer; });
  if (it == added_.end()) return;
  added_.erase(it);
  ++version_;
}

const ShmInbox::Entries& ShmInbox::Current() {
  if (version_.load() != current_version_) {
    MutexLock l(&mu_);
    current_ = added_;
    current_version_ = version_.load();
  }
  return current_;
}

}  // namespace pstrain
