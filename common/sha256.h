// SHA-256 (FIPS 180-4), for checking downloaded files against their published
// digests. Small and dependency-free; tests/unit/sha256_test.cc holds the FIPS
// and NIST test vectors.
#ifndef PSTRAIN_COMMON_SHA256_H_
#define PSTRAIN_COMMON_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace pstrain {

// Streaming digest: Update any number of times, then Final once.
// Not thread-safe; one object per stream.
class Sha256 {
 public:
  using Digest = std::array<uint8_t, 32>;

  Sha256() { Reset(); }
  void Reset();
  void Update(const void* data, size_t size);
  void Update(std::string_view bytes) { Update(bytes.data(), bytes.size()); }
  // The digest of everything passed to Update since the last Reset.
  // REQUIRES: not called twice without a Reset in between.
  Digest Final();
  // Final() as 64 lower-case hex digits.
  std::string FinalHex();

 private:
  void Compress(const uint8_t* block);

  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// Lower-case hex of `digest`.
std::string DigestHex(const Sha256::Digest& digest);
// The digest of `bytes` in lower-case hex.
std::string Sha256Hex(std::string_view bytes);
// The digest of the file at `path` in lower-case hex; IOError naming the file.
StatusOr<std::string> Sha256FileHex(const std::string& path);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_SHA256_H_
