#include "nn/caching_allocator.h"

#include <glog/logging.h>

#include <algorithm>

namespace pstrain {

CachingAllocator::CachingAllocator(RawAlloc raw_alloc, RawFree raw_free,
                                   std::function<void()> quiesce)
    : raw_alloc_(std::move(raw_alloc)),
      raw_free_(std::move(raw_free)),
      quiesce_(std::move(quiesce)) {}

CachingAllocator::~CachingAllocator() {
  MutexLock lock(&mu_);
  LOG_IF(ERROR, !used_.empty()) << used_.size() << " device blocks (" << in_use_
                                << " bytes) still in use when their allocator went";
  ReleaseCachedLocked();
}

size_t CachingAllocator::RoundSize(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kSmallLimit = size_t{1} << 20;
  bytes = std::max<size_t>(bytes, 1);
  if (bytes < kSmallLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

void* CachingAllocator::Allocate(size_t bytes, std::string* error) {
  const size_t size = RoundSize(bytes);
  MutexLock lock(&mu_);
  auto it = free_.lower_bound(size);
  void* p = nullptr;
  size_t got = size;
  if (it != free_.end() && it->first <= size + size / 8) {
    p = it->second;
    got = it->first;
    cached_ -= got;
    free_.erase(it);
  } else {
    std::string why;
    p = raw_alloc_(size, &why);
    if (p == nullptr && !free_.empty()) {
      if (quiesce_) quiesce_();
      ReleaseCachedLocked();
      p = raw_alloc_(size, &why);
    }
    if (p == nullptr) {
      if (error != nullptr) {
        *error = StrCat("out of device memory allocating ", size, " bytes (", in_use_, " in use)",
                        why.empty() ? "" : ": ", why);
      }
      return nullptr;
    }
    ++raw_allocations_;
  }
  used_[p] = got;
  in_use_ += got;
  peak_ = std::max(peak_, in_use_);
  return p;
}

void CachingAllocator::Free(void* p) {
  if (p == nullptr) return;
  MutexLock lock(&mu_);
  auto it = used_.find(p);
  CHECK(it != used_.end()) << "freeing a device block this allocator did not hand out";
  in_use_ -= it->second;
  cached_ += it->second;
  free_.emplace(it->second, p);
  used_.erase(it);
}

void CachingAllocator::ReleaseCached() {
  MutexLock lock(&mu_);
  ReleaseCachedLocked();
}

void CachingAllocator::ReleaseCachedLocked() {
  for (auto& [size, p] : free_) raw_free_(p);
  free_.clear();
  cached_ = 0;
}

MemoryStats CachingAllocator::stats() const {
  MutexLock lock(&mu_);
  MemoryStats s;
  s.in_use = in_use_;
  s.peak = peak_;
  s.reserved = in_use_ + cached_;
  return s;
}

size_t CachingAllocator::raw_allocations() const {
  MutexLock lock(&mu_);
  return raw_allocations_;
}

}  // namespace pstrain
