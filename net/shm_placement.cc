#include "net/shm_placement.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

namespace pstrain {

ShmPlacement::ShmPlacement(ShmArena* arena, uint64_t min_copy_bytes)
    : arena_(arena), min_copy_bytes_(min_copy_bytes) {}

bool ShmPlacement::Place(const Message& msg, PsHeader* extra) {
  uint64_t bytes = 0;
  for (const Blob& v : msg.values) bytes += v.size();
  const bool copy_ok = bytes >= min_copy_bytes_;
  for (const Blob& v : msg.values) {
    std::optional<uint64_t> offset = arena_->Reference(v.data(), v.size());
    if (!offset.has_value() && copy_ok) {
      if (auto block = arena_->AllocateRing(v.size())) {
        std::memcpy(block->data, v.data(), v.size());
        offset = block->offset;
      }
    }
    if (!offset.has_value()) {
      // All or nothing: hand back what this message took and use TCP.
      Release(*extra);
      extra->clear_shm_frame_offset();
      extra->clear_shm_frame_bytes();
      if (copy_ok) ++fallbacks_;
      return false;
    }
    extra->add_shm_frame_offset(*offset);
    extra->add_shm_frame_bytes(v.size());
  }
  return true;
}

void ShmPlacement::Release(const PsHeader& placed) {
  for (uint64_t offset : placed.shm_frame_offset()) arena_->Release(offset);
}

Status ResolveShmValues(const PsHeader& h, ShmMapping* sender_arena, std::vector<Blob>* values) {
  if (sender_arena == nullptr) {
    return Status::InvalidArgument(
        StrCat(NodeIdName(h.sender()),
               " sent values through shared memory, but its arena is not mapped here"));
  }
  const int n = h.shm_frame_offset_size();
  if (h.shm_frame_bytes_size() != n || static_cast<uint64_t>(n) != h.num_value_frames()) {
    return Status::InvalidArgument(StrCat(
        NodeIdName(h.sender()), " listed ", n, " shared-memory frame offsets and ",
        h.shm_frame_bytes_size(), " sizes, header says ", h.num_value_frames(), " value frames"));
  }
  values->reserve(values->size() + n);
  for (int i = 0; i < n; ++i) {
    auto v = sender_arena->Resolve(h.shm_frame_offset(i), h.shm_frame_bytes(i));
    if (!v.ok()) {
      return Status::InvalidArgument(
          StrCat(NodeIdName(h.sender()), ": value frame ", i, ": ", v.status().message()));
    }
    values->push_back(std::move(v).value());
  }
  return Status::Ok();
}

bool HasUnresolvedShmValues(const PsHeader& h, size_t resolved) {
  const int listed = std::min(h.shm_frame_offset_size(), h.shm_frame_bytes_size());
  return static_cast<size_t>(listed) > resolved;
}

void ReleaseUnresolvedShmValues(const PsHeader& h, size_t resolved, ShmMapping* sender_arena) {
  if (sender_arena == nullptr) return;
  const int listed = std::min(h.shm_frame_offset_size(), h.shm_frame_bytes_size());
  for (int i = static_cast<int>(resolved); i < listed; ++i) {
    (void)sender_arena->Resolve(h.shm_frame_offset(i), h.shm_frame_bytes(i));
  }
}

}  // namespace pstrain
