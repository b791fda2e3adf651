// The caching allocator over malloc/free: size classes, reuse without new raw
// allocations, the out-of-memory retry, and its figures.
#include "nn/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace pstrain {
namespace {

struct Raw {
  size_t limit = SIZE_MAX;  // bytes the fake device has
  size_t live = 0;
  int frees = 0;
  std::map<void*, size_t> sizes;
};

// `quiesced`, when given, counts the allocator's calls to wait for the
// device before it frees its cache.
CachingAllocator MakeAllocator(Raw* raw, std::vector<int>* quiesced = nullptr) {
  return CachingAllocator(
      [raw](size_t bytes, std::string* error) -> void* {
        if (raw->live + bytes > raw->limit) {
          *error = "fake device full";
          return nullptr;
        }
        raw->live += bytes;
        void* p = std::malloc(bytes);
        raw->sizes[p] = bytes;
        return p;
      },
      [raw](void* p) {
        ++raw->frees;
        raw->live -= raw->sizes[p];
        raw->sizes.erase(p);
        std::free(p);
      },
      quiesced == nullptr ? std::function<void()>()
                          : [raw, quiesced] { quiesced->push_back(raw->frees); });
}

TEST(CachingAllocatorTest, RoundsToSizeClasses) {
  EXPECT_EQ(CachingAllocator::RoundSize(0), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundSize((1u << 20) - 1), 1u << 20);
  EXPECT_EQ(CachingAllocator::RoundSize((1u << 20) + 1), 2u << 20);
  EXPECT_EQ(CachingAllocator::RoundSize((3u << 20) + 1), 4u << 20);
}

TEST(CachingAllocatorTest, AStepLoopReusesItsBlocks) {
  Raw raw;
  CachingAllocator a = MakeAllocator(&raw);
  const std::vector<size_t> sizes = {100, 4096, 70000, 3 << 20, 4096};
  for (int step = 0; step < 5; ++step) {
    std::vector<void*> blocks;
    for (size_t s : sizes) {
      std::string error;
      void* p = a.Allocate(s, &error);
      ASSERT_NE(p, nullptr) << error;
      blocks.push_back(p);
    }
    for (void* p : blocks) a.Free(p);
  }
  EXPECT_EQ(a.raw_allocations(), sizes.size()) << "only the first step allocates";
  const MemoryStats s = a.stats();
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.peak, 512u + 4096u + 70144u + (4u << 20) + 4096u);
  EXPECT_EQ(s.reserved, s.peak);
}

TEST(CachingAllocatorTest, AFarLargerCachedBlockIsNotHandedOutForASmallRequest) {
  Raw raw;
  CachingAllocator a = MakeAllocator(&raw);
  std::string error;
  void* big = a.Allocate(8 << 20, &error);
  a.Free(big);
  void* small = a.Allocate(4096, &error);
  EXPECT_NE(small, big);
  EXPECT_EQ(a.raw_allocations(), 2u);
  void* again = a.Allocate((8 << 20) - 100, &error);
  EXPECT_EQ(again, big) << "a block of the same class is reused";
  a.Free(small);
  a.Free(again);
}

TEST(CachingAllocatorTest, OutOfMemoryEmptiesTheCacheAndRetriesThenSaysWhy) {
  Raw raw;
  raw.limit = 6 << 20;
  std::vector<int> quiesced;  // raw frees made when each wait for the device ran
  CachingAllocator a = MakeAllocator(&raw, &quiesced);
  std::string error;
  void* p = a.Allocate(4 << 20, &error);
  ASSERT_NE(p, nullptr);
  a.Free(p);                              // cached: 4 MiB of the 6 the device has
  EXPECT_TRUE(quiesced.empty());          // no retry yet
  void* q = a.Allocate(6 << 20, &error);  // fits only once the cache is given back
  ASSERT_NE(q, nullptr) << error;
  EXPECT_EQ(raw.frees, 1);
  // The device was waited for (with the backend's deadline) before the cache
  // went back: cudaFree would wait for it with none.
  EXPECT_EQ(quiesced, std::vector<int>{0});
  void* r = a.Allocate(1 << 10, &error);  // the device is full, the cache empty
  EXPECT_EQ(r, nullptr);
  EXPECT_NE(error.find("out of device memory"), std::string::npos) << error;
  EXPECT_NE(error.find("fake device full"), std::string::npos) << error;
  a.Free(q);
}

}  // namespace
}  // namespace pstrain
