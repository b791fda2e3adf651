// CachingAllocator: hands out device memory from blocks it keeps, so that a
// training loop reaches a steady state with no calls into the device's
// allocator (cudaMalloc and cudaFree synchronize the whole device).
//
// Sizes are rounded up (512 bytes below 1 MiB, 2 MiB above) and a freed block
// goes to a free list; a request takes the smallest free block that fits and
// is at most 1/8 larger, else a new block from `raw_alloc`. When `raw_alloc`
// fails, `quiesce` runs (if given), every free block is given back with
// `raw_free` and the request is tried once more. The raw functions are the
// device's (cudaMalloc/cudaFree for the CUDA backend, whose quiesce waits for
// its streams with a deadline: cudaFree waits for the whole device with
// none); tests pass malloc/free.
//
// Blocks are reused in the order of the stream that uses them: a block freed
// while queued work still reads it may go to work queued after that work,
// which is safe on one stream (the CUDA backend's compute stream).
//
// Thread safety: every method may be called from any thread (a tensor's last
// reference can go anywhere).
#ifndef PSTRAIN_NN_CACHING_ALLOCATOR_H_
#define PSTRAIN_NN_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>

#include "common/mutex.h"
#include "nn/backend.h"

namespace pstrain {

class CachingAllocator {
 public:
  // raw_alloc returns nullptr (and may set *error) when the device is out of memory.
  using RawAlloc = std::function<void*(size_t bytes, std::string* error)>;
  using RawFree = std::function<void(void* p)>;
  // `quiesce`: called (under the allocator's lock) before an out-of-memory
  // retry gives the cached blocks back; it may wait, not allocate or free.
  CachingAllocator(RawAlloc raw_alloc, RawFree raw_free, std::function<void()> quiesce = nullptr);
  // Gives every block back. REQUIRES: every block handed out was freed.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (at least 1), or nullptr with the reason in
  // *error when the device has no room even with the cache emptied.
  void* Allocate(size_t bytes, std::string* error);
  // REQUIRES: p came from Allocate and was not freed since.
  void Free(void* p);
  // Gives the free blocks back to the device.
  void ReleaseCached();

  // in_use: rounded bytes handed out; reserved: in_use plus the free blocks.
  MemoryStats stats() const;
  // Calls of raw_alloc so far (tests check that a loop stops making them).
  size_t raw_allocations() const;

  static size_t RoundSize(size_t bytes);

 private:
  void ReleaseCachedLocked() REQUIRES(mu_);

  const RawAlloc raw_alloc_;
  const RawFree raw_free_;
  const std::function<void()> quiesce_;
  mutable Mutex mu_;
  std::multimap<size_t, void*> free_ GUARDED_BY(mu_);       // size -> block
  std::unordered_map<void*, size_t> used_ GUARDED_BY(mu_);  // block -> size
  size_t in_use_ GUARDED_BY(mu_) = 0;
  size_t peak_ GUARDED_BY(mu_) = 0;
  size_t cached_ GUARDED_BY(mu_) = 0;
  size_t raw_allocations_ GUARDED_BY(mu_) = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_CACHING_ALLOCATOR_H_
