#include "net/shm_placement.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

namespace pstrain {

ShmPlacement::ShmPlacement(ShmArena* arena, uint64_t min_copy_bytes)
    : arena_(arena), min_copy_bytes_(min_copy_bytes) {}

bool ShmPlacement::Place(const Message& msg, int receiver, uint8_t incarnation, PsHeader* extra) {
  // A node id without a ticket table, or more frames than half of one: TCP,
  // as for a peer that has not mapped our arena (not a fallback).
  if (receiver < 0 || receiver >= kShmMaxQueues || msg.values.size() > kShmMaxPlacedFrames) {
    return false;
  }
  uint64_t bytes = 0;
  for (const Blob& v : msg.values) bytes += v.size();
  const bool copy_ok = bytes >= min_copy_bytes_;
  for (const Blob& v : msg.values) {
    std::optional<uint64_t> offset = arena_->Reference(v.data(), v.size());
    char* copy_to = nullptr;  // a ring block of ours, filled once the ticket is taken
    if (!offset.has_value() && copy_ok) {
      if (auto block = arena_->AllocateRing(v.size())) {
        offset = block->offset;
        copy_to = block->data;
      }
    }
    std::optional<ShmTicket> ticket;
    if (offset.has_value()) ticket = arena_->Ticket(receiver, incarnation, *offset);
    if (!ticket.has_value()) {
      // All or nothing: hand back what this message took and use TCP.
      Release(*extra, receiver);
      extra->clear_shm_frame_offset();
      extra->clear_shm_frame_bytes();
      extra->clear_shm_frame_slot();
      extra->clear_shm_frame_ticket();
      if (copy_ok) ++fallbacks_;
      return false;
    }
    if (copy_to != nullptr) std::memcpy(copy_to, v.data(), v.size());
    extra->add_shm_frame_offset(*offset);
    extra->add_shm_frame_bytes(v.size());
    extra->add_shm_frame_slot(ticket->slot);
    extra->add_shm_frame_ticket(ticket->value);
  }
  return true;
}

void ShmPlacement::Release(const PsHeader& placed, int receiver) {
  const int n = std::min(placed.shm_frame_slot_size(), placed.shm_frame_ticket_size());
  for (int i = 0; i < n; ++i) {
    arena_->ReleaseTicket(receiver,
                          ShmTicket{placed.shm_frame_slot(i), placed.shm_frame_ticket(i)});
  }
}

Status ResolveShmValues(const PsHeader& h, ShmMapping* sender_arena, int me,
                        std::vector<Blob>* values) {
  if (sender_arena == nullptr) {
    return Status::InvalidArgument(
        StrCat(NodeIdName(h.sender()),
               " sent values through shared memory, but its arena is not mapped here"));
  }
  const int n = h.shm_frame_offset_size();
  if (h.shm_frame_bytes_size() != n || h.shm_frame_slot_size() != n ||
      h.shm_frame_ticket_size() != n || static_cast<uint64_t>(n) != h.num_value_frames()) {
    return Status::InvalidArgument(
        StrCat(NodeIdName(h.sender()), " listed ", n, " shared-memory frame offsets, ",
               h.shm_frame_bytes_size(), " sizes, ", h.shm_frame_slot_size(), " ticket slots and ",
               h.shm_frame_ticket_size(), " tickets, header says ", h.num_value_frames(),
               " value frames"));
  }
  values->reserve(values->size() + n);
  for (int i = 0; i < n; ++i) {
    auto v = sender_arena->Resolve(me, h.shm_frame_offset(i), h.shm_frame_bytes(i),
                                   ShmTicket{h.shm_frame_slot(i), h.shm_frame_ticket(i)});
    if (!v.ok()) {
      return Status::InvalidArgument(
          StrCat(NodeIdName(h.sender()), ": value frame ", i, ": ", v.status().message()));
    }
    values->push_back(std::move(v).value());
  }
  return Status::Ok();
}

namespace {
int ListedShmFrames(const PsHeader& h) {
  return std::min(h.shm_frame_offset_size(),
                  std::min(h.shm_frame_slot_size(), h.shm_frame_ticket_size()));
}
}  // namespace

bool HasUnresolvedShmValues(const PsHeader& h, size_t resolved) {
  return static_cast<size_t>(ListedShmFrames(h)) > resolved;
}

void ReleaseUnresolvedShmValues(const PsHeader& h, size_t resolved, ShmMapping* sender_arena,
                                int me) {
  if (sender_arena == nullptr) return;
  const int listed = ListedShmFrames(h);
  for (int i = static_cast<int>(resolved); i < listed; ++i) {
    sender_arena->Drop(me, h.shm_frame_offset(i),
                       ShmTicket{h.shm_frame_slot(i), h.shm_frame_ticket(i)});
  }
}

}  // namespace pstrain
