#include "server/snapshot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

namespace pstrain {

// The format stores native floats and integers and says they are little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "snapshot files are little-endian");

namespace {

constexpr char kMagic[8] = {'P', 'S', 'S', 'N', 'A', 'P', '0', '1'};
// Written: version 2. Read: 1 (no slot layout, no earlier updates) and 2.
constexpr uint32_t kVersion = 2;
constexpr uint64_t kHeaderSize = 104;   // version 2
constexpr uint64_t kHeaderSizeV1 = 88;  // version 1: the shortest header
// A value's optimizer state is 0 to this many arrays of its size.
constexpr uint64_t kMaxSlots = Optimizer::kMaxSlots;
constexpr uint64_t kStrideAlign = 4096;
constexpr char kPrefix[] = "key-";
constexpr char kSuffix[] = ".snap";
constexpr char kTmpSuffix[] = ".snap.tmp";
constexpr size_t kKeyDigits = 16;

// ---- CRC-32C ----

using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

// tables[s][b]: the CRC register after byte b followed by s zero bytes
// (slicing-by-8).
const CrcTables& Crc32cTables() {
  static const CrcTables tables = [] {
    CrcTables t{};
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[0][b] = c;
    }
    for (size_t s = 1; s < 8; ++s) {
      for (uint32_t b = 0; b < 256; ++b) t[s][b] = (t[s - 1][b] >> 8) ^ t[0][t[s - 1][b] & 0xff];
    }
    return t;
  }();
  return tables;
}

// ---- the header ----

struct SlotHeader {
  uint32_t version = kVersion;
  uint32_t slot = 0;
  uint64_t wire_key = 0;
  uint64_t rounds = 0;
  uint64_t sequence = 0;
  uint64_t stride = 0;
  uint64_t n = 0;
  uint64_t state_n = 0;
  int64_t num_updates = 0;
  float lr_mult = 1.0f;
  float wd_mult = 1.0f;
  int32_t slot_layout = -1;     // version 2
  int64_t earlier_updates = 0;  // version 2
  uint32_t payload_crc = 0;

  uint64_t payload_bytes() const { return (n + state_n) * sizeof(float); }
  uint64_t header_size() const { return HeaderSizeOf(version); }
  // Where the payload's CRC and the header's own are.
  static uint64_t HeaderSizeOf(uint32_t version) {
    return version == 1 ? kHeaderSizeV1 : kHeaderSize;
  }
  static uint64_t PayloadCrcOffset(uint32_t version) { return HeaderSizeOf(version) - 8; }
  static uint64_t HeaderCrcOffset(uint32_t version) { return HeaderSizeOf(version) - 4; }
};

template <typename T>
void PutAt(uint8_t* b, size_t offset, T v) {
  std::memcpy(b + offset, &v, sizeof(v));
}
template <typename T>
T GetAt(const uint8_t* b, size_t offset) {
  T v;
  std::memcpy(&v, b + offset, sizeof(v));
  return v;
}

// Writes the current version's header (kHeaderSize bytes).
void EncodeHeader(const SlotHeader& h, uint8_t* b) {
  CHECK_EQ(h.version, kVersion);
  std::memcpy(b, kMagic, sizeof(kMagic));
  PutAt(b, 8, h.version);
  PutAt(b, 12, h.slot);
  PutAt(b, 16, h.wire_key);
  PutAt(b, 24, h.rounds);
  PutAt(b, 32, h.sequence);
  PutAt(b, 40, h.stride);
  PutAt(b, 48, h.n);
  PutAt(b, 56, h.state_n);
  PutAt(b, 64, h.num_updates);
  PutAt(b, 72, h.lr_mult);
  PutAt(b, 76, h.wd_mult);
  PutAt(b, 80, h.slot_layout);
  PutAt(b, 84, uint32_t{0});
  PutAt(b, 88, h.earlier_updates);
  PutAt(b, 96, h.payload_crc);
  PutAt(b, 100, Crc32c(0, b, 100));
}

void DecodeHeader(const uint8_t* b, SlotHeader* h) {
  h->version = GetAt<uint32_t>(b, 8);
  h->slot = GetAt<uint32_t>(b, 12);
  h->wire_key = GetAt<uint64_t>(b, 16);
  h->rounds = GetAt<uint64_t>(b, 24);
  h->sequence = GetAt<uint64_t>(b, 32);
  h->stride = GetAt<uint64_t>(b, 40);
  h->n = GetAt<uint64_t>(b, 48);
  h->state_n = GetAt<uint64_t>(b, 56);
  h->num_updates = GetAt<int64_t>(b, 64);
  h->lr_mult = GetAt<float>(b, 72);
  h->wd_mult = GetAt<float>(b, 76);
  if (h->version >= 2) {
    h->slot_layout = GetAt<int32_t>(b, 80);
    h->earlier_updates = GetAt<int64_t>(b, 88);
  }
  h->payload_crc = GetAt<uint32_t>(b, SlotHeader::PayloadCrcOffset(h->version));
}

// Room for a header, a value of n floats and state_n floats of optimizer
// state, and at least a momentum's (n floats), rounded up: the stride of a
// key with momentum never changes, and one with more state (Adam's two
// arrays) is re-created once, when it first has them.
uint64_t StrideFor(size_t n, size_t state_n) {
  CHECK_LE(n, (uint64_t{1} << 58) / sizeof(float)) << "snapshot value of " << n << " floats";
  CHECK_LE(state_n, uint64_t{kMaxSlots} * n) << "snapshot state of " << state_n << " floats";
  const uint64_t bytes = kHeaderSize + (n + std::max(n, state_n)) * sizeof(float);
  return (bytes + kStrideAlign - 1) / kStrideAlign * kStrideAlign;
}

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08" PRIx32, v);
  return buf;
}

// ---- file names ----

std::string FileName(uint64_t wire_key) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%s%016" PRIx64 "%s", kPrefix, wire_key, kSuffix);
  return buf;
}

bool StartsWith(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}
bool EndsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// A name of the form key-*.snap: false unless it is exactly FileName(*key).
bool ParseFileName(const std::string& name, uint64_t* key) {
  const size_t prefix = std::strlen(kPrefix);
  if (name.size() != prefix + kKeyDigits + std::strlen(kSuffix)) return false;
  uint64_t k = 0;
  for (size_t i = prefix; i < prefix + kKeyDigits; ++i) {
    const char c = name[i];
    uint64_t d = 0;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    k = k << 4 | d;
  }
  *key = k;
  return true;
}

// ---- system calls ----

std::string ErrnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

// Closes the descriptor it holds when it goes away.
class ScopedFd {
 public:
  explicit ScopedFd(int fd = -1) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Reads exactly `size` bytes at `offset`; the message names the path and offset.
Status ReadAt(int fd, void* dst, uint64_t size, uint64_t offset, const std::string& path) {
  uint8_t* p = static_cast<uint8_t*>(dst);
  while (size > 0) {
    const ssize_t r = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      return Status::IOError(
          StrCat(path, ": read of ", size, " bytes at offset ", offset, ": ", ErrnoText(errno)));
    }
    if (r == 0) {
      return Status::Corruption(StrCat(path, ": the file ends at offset ", offset, ", ", size,
                                       " bytes short (it shrank while being read)"));
    }
    p += r;
    size -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

// Writes the header and payload of one slot at `offset` with pwritev (no copy
// of the value), resuming after short writes.
Status WriteSlotAt(int fd, const uint8_t* header, const float* value, size_t n,
                   const std::vector<float>& slots, uint64_t offset, const std::string& path,
                   uint64_t wire_key) {
  std::array<iovec, 3> iov;
  int count = 0;
  iov[count++] = {const_cast<uint8_t*>(header), kHeaderSize};
  if (n > 0) iov[count++] = {const_cast<float*>(value), n * sizeof(float)};
  if (!slots.empty()) {
    iov[count++] = {const_cast<float*>(slots.data()), slots.size() * sizeof(float)};
  }
  int first = 0;
  while (first < count) {
    const ssize_t w = ::pwritev(fd, &iov[first], count - first, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      size_t left = 0;
      for (int i = first; i < count; ++i) left += iov[i].iov_len;
      return Status::IOError(StrCat(path, " (key ", wire_key, "): write of ", left,
                                    " bytes at offset ", offset, ": ",
                                    w < 0 ? ErrnoText(errno) : "no progress"));
    }
    offset += static_cast<uint64_t>(w);
    size_t done = static_cast<size_t>(w);
    while (first < count && done >= iov[first].iov_len) done -= iov[first++].iov_len;
    if (first < count) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + done;
      iov[first].iov_len -= done;
    }
  }
  return Status::Ok();
}

// ---- reading a file ----

// Reads and checks the header of slot `slot` at `offset`: everything but the
// payload CRC. The message (no path) says what is wrong and where.
Status ReadSlotHeader(int fd, const std::string& path, uint64_t file_size, uint32_t slot,
                      uint64_t offset, uint64_t wire_key, SlotHeader* h) {
  auto past_the_end = [&](uint64_t size) {
    return Status::Corruption(StrCat("header [", offset, ", ", offset + size,
                                     ") runs past the end of the file (size ", file_size, ")"));
  };
  if (offset > file_size || file_size - offset < kHeaderSizeV1) return past_the_end(kHeaderSizeV1);
  uint8_t b[kHeaderSize];
  RETURN_IF_ERROR(ReadAt(fd, b, kHeaderSizeV1, offset, path));
  if (std::memcmp(b, kMagic, sizeof(kMagic)) != 0) {
    if (std::all_of(b, b + kHeaderSizeV1, [](uint8_t c) { return c == 0; })) {
      return Status::Corruption(StrCat("never written (zeros at offset ", offset, ")"));
    }
    return Status::Corruption(StrCat("bad magic at offset ", offset));
  }
  // The version says how long the header is and where its CRC is; a damaged
  // version is refused here or fails that CRC.
  const uint32_t version = GetAt<uint32_t>(b, 8);
  if (version != 1 && version != 2) {
    return Status::Corruption(StrCat("format version ", version, " at offset ", offset + 8,
                                     " (this build reads 1 and 2)"));
  }
  const uint64_t size = SlotHeader::HeaderSizeOf(version);
  if (file_size - offset < size) return past_the_end(size);
  if (size > kHeaderSizeV1) {
    RETURN_IF_ERROR(
        ReadAt(fd, b + kHeaderSizeV1, size - kHeaderSizeV1, offset + kHeaderSizeV1, path));
  }
  const uint64_t crc_offset = SlotHeader::HeaderCrcOffset(version);
  const uint32_t stored = GetAt<uint32_t>(b, crc_offset);
  const uint32_t computed = Crc32c(0, b, crc_offset);
  if (stored != computed) {
    return Status::Corruption(StrCat("header CRC-32C mismatch at offset ", offset + crc_offset,
                                     " (stored ", Hex32(stored), ", computed ", Hex32(computed),
                                     ")"));
  }
  DecodeHeader(b, h);
  if (h->slot != slot) {
    return Status::Corruption(
        StrCat("slot index ", h->slot, " at offset ", offset + 12, " (expected ", slot, ")"));
  }
  if (h->wire_key != wire_key) {
    return Status::Corruption(StrCat("wire key ", h->wire_key, " at offset ", offset + 16,
                                     " disagrees with the file name (key ", wire_key, ")"));
  }
  if (slot == 1 && h->stride != offset) {
    return Status::Corruption(StrCat("stride ", h->stride, " at offset ", offset + 40,
                                     " disagrees with the slot's place ", offset));
  }
  // n is capped by the file before anything is multiplied or allocated.
  if (h->n > file_size / sizeof(float)) {
    return Status::Corruption(StrCat("value length ", h->n, " at offset ", offset + 48,
                                     " does not fit the file (size ", file_size, ")"));
  }
  if (h->state_n > kMaxSlots * h->n || (h->n > 0 && h->state_n % h->n != 0)) {
    return Status::Corruption(StrCat("optimizer state length ", h->state_n, " at offset ",
                                     offset + 56, " is not 0 to ", kMaxSlots,
                                     " times the value length ", h->n));
  }
  if (h->num_updates < 0) {
    return Status::Corruption(
        StrCat("num_updates ", h->num_updates, " at offset ", offset + 64, " is negative"));
  }
  if (h->version >= 2 && GetAt<uint32_t>(b, 84) != 0) {
    return Status::Corruption(StrCat("reserved field at offset ", offset + 84, " is ",
                                     GetAt<uint32_t>(b, 84), ", not 0"));
  }
  if (h->slot_layout < -1) {
    return Status::Corruption(StrCat("slot layout ", h->slot_layout, " at offset ", offset + 80,
                                     " is less than -1 (unknown)"));
  }
  // Minus the updates before an optimizer of another layout took the state
  // over at the least: ADAM's count t is never negative (nor past 2^62, so
  // that the sum cannot overflow).
  constexpr int64_t kMaxCount = int64_t{1} << 62;
  if (h->num_updates > kMaxCount || h->earlier_updates > kMaxCount) {
    return Status::Corruption(StrCat("update counts ", h->num_updates, " and ", h->earlier_updates,
                                     " at offsets ", offset + 64, " and ", offset + 88,
                                     " exceed 2^62"));
  }
  if (h->earlier_updates < -h->num_updates) {
    return Status::Corruption(StrCat("earlier updates ", h->earlier_updates, " at offset ",
                                     offset + 88, " make the update count negative (num_updates ",
                                     h->num_updates, ")"));
  }
  const uint64_t slot_bytes = h->header_size() + h->payload_bytes();
  if (h->stride < slot_bytes) {
    return Status::Corruption(StrCat("slot of ", slot_bytes, " bytes (n ", h->n, ", state ",
                                     h->state_n, ") exceeds the stride ", h->stride, " at offset ",
                                     offset + 40));
  }
  if (file_size - offset < slot_bytes) {
    return Status::Corruption(StrCat("slot [", offset, ", ", offset + slot_bytes,
                                     ") runs past the end of the file (size ", file_size,
                                     "): truncated"));
  }
  return Status::Ok();
}

// Reads the payload of a slot whose header checked out and checks its CRC.
Status ReadSlotPayload(int fd, const std::string& path, uint64_t offset, const SlotHeader& h,
                       KeySnapshot* out) {
  const uint64_t begin = offset + h.header_size();
  out->value.resize(h.n);
  out->state.slots.resize(h.state_n);
  RETURN_IF_ERROR(ReadAt(fd, out->value.data(), h.n * sizeof(float), begin, path));
  RETURN_IF_ERROR(ReadAt(fd, out->state.slots.data(), h.state_n * sizeof(float),
                         begin + h.n * sizeof(float), path));
  uint32_t crc = Crc32c(0, out->value.data(), h.n * sizeof(float));
  crc = Crc32c(crc, out->state.slots.data(), h.state_n * sizeof(float));
  if (crc != h.payload_crc) {
    return Status::Corruption(StrCat("payload CRC-32C mismatch over bytes [", begin, ", ",
                                     begin + h.payload_bytes(), ") (stored ", Hex32(h.payload_crc),
                                     ", computed ", Hex32(crc), ")"));
  }
  out->wire_key = h.wire_key;
  out->rounds = h.rounds;
  out->state.num_updates = h.num_updates;
  out->state.lr_mult = h.lr_mult;
  out->state.wd_mult = h.wd_mult;
  out->state.slot_layout = h.slot_layout;
  out->state.earlier_updates = h.earlier_updates;
  return Status::Ok();
}

// What a key's file holds.
struct FileScan {
  KeySnapshot newest;  // the newest valid snapshot
  uint32_t newest_slot = 0;
  uint64_t stride = 0;
  uint64_t max_sequence = 0;  // over the slots whose headers are valid
};

StatusOr<FileScan> ScanFile(int fd, const std::string& path, uint64_t wire_key) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return Status::IOError(StrCat(path, ": stat: ", ErrnoText(errno)));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::array<SlotHeader, 2> h;
  std::array<Status, 2> why;
  std::array<uint64_t, 2> offset = {0, 0};
  why[0] = ReadSlotHeader(fd, path, size, 0, 0, wire_key, &h[0]);
  if (why[0].ok()) {
    offset[1] = h[0].stride;
  } else if (size % 2 == 0 && size / 2 >= kHeaderSizeV1) {
    offset[1] = size / 2;  // files are created 2 * stride long
  }
  if (offset[1] == 0) {
    why[1] = Status::Corruption(
        StrCat("not found: slot 0 is invalid and the file size ", size, " is not twice a stride"));
  } else {
    why[1] = ReadSlotHeader(fd, path, size, 1, offset[1], wire_key, &h[1]);
  }
  for (const Status& s : why) {
    if (s.code() == StatusCode::kIOError) return s;
  }

  FileScan scan;
  std::vector<uint32_t> order;
  for (uint32_t s : {0u, 1u}) {
    if (!why[s].ok()) continue;
    order.push_back(s);
    scan.max_sequence = std::max(scan.max_sequence, h[s].sequence);
  }
  std::sort(order.begin(), order.end(), [&h](uint32_t a, uint32_t b) {
    return std::make_pair(h[a].rounds, h[a].sequence) > std::make_pair(h[b].rounds, h[b].sequence);
  });
  for (uint32_t s : order) {
    why[s] = ReadSlotPayload(fd, path, offset[s], h[s], &scan.newest);
    if (why[s].code() == StatusCode::kIOError) return why[s];
    if (why[s].ok()) {
      scan.newest_slot = s;
      scan.stride = h[s].stride;
      return scan;
    }
  }
  return Status::Corruption(StrCat(path, " (key ", wire_key, "): no valid snapshot: slot 0: ",
                                   why[0].message(), "; slot 1: ", why[1].message()));
}

Status SyncFolder(int dir_fd, const std::string& dir) {
  if (::fsync(dir_fd) != 0) {
    return Status::IOError(StrCat("fsync of snapshot folder ", dir, ": ", ErrnoText(errno)));
  }
  return Status::Ok();
}

// Creates `dir` and its missing parents with mode 0700.
Status MakeDirs(const std::string& dir) {
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string part = dir.substr(0, end);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
      return Status::IOError(
          StrCat("cannot create snapshot folder ", part, ": ", ErrnoText(errno)));
    }
    if (end == std::string::npos) break;
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::IOError(StrCat("snapshot folder ", dir, " is not a folder"));
  }
  return Status::Ok();
}

}  // namespace

// ---- CRC-32C ----

namespace internal {
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n) {
  const CrcTables& t = Crc32cTables();
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    const uint64_t w = GetAt<uint64_t>(p, 0) ^ c;
    c = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
        t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
  }
  for (; n > 0; --n, ++p) c = t[0][(c ^ *p) & 0xff] ^ (c >> 8);
  return ~c;
}
}  // namespace internal

uint32_t Crc32c(uint32_t crc, const void* data, size_t n) {
#if defined(__SSE4_2__)
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, GetAt<uint64_t>(p, 0));
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
#else
  return internal::Crc32cPortable(crc, data, n);
#endif
}

// ---- one key's file ----

class SnapshotStore::KeyFile {
 public:
  KeyFile(std::string path, uint64_t wire_key, int dir_fd, const std::string& dir, bool sync)
      : path_(std::move(path)), wire_key_(wire_key), dir_fd_(dir_fd), dir_(dir), sync_(sync) {}
  ~KeyFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  Status Write(uint64_t rounds, const float* value, size_t n, const ParamState& state)
      EXCLUDES(mu_) {
    const std::vector<float>& slots = state.slots;
    if (slots.size() > kMaxSlots * n || (n > 0 && slots.size() % n != 0)) {
      return Status::InvalidArgument(StrCat("snapshot of key ", wire_key_, ": optimizer state of ",
                                            slots.size(), " floats for a value of ", n));
    }
    MutexLock lock(&mu_);
    if (!looked_) {
      RETURN_IF_ERROR(OpenExisting());
      looked_ = true;
    }
    if (has_snapshot_ && rounds < newest_rounds_) {
      return Status::FailedPrecondition(
          StrCat(path_, " (key ", wire_key_, "): rounds ", rounds, " is less than the ",
                 newest_rounds_, " of the newest snapshot (a fresh job clears the store first)"));
    }
    SlotHeader h;
    h.wire_key = wire_key_;
    h.rounds = rounds;
    h.sequence = sequence_ + 1;
    h.n = n;
    h.state_n = slots.size();
    h.num_updates = state.num_updates;
    h.lr_mult = state.lr_mult;
    h.wd_mult = state.wd_mult;
    h.slot_layout = state.slot_layout;
    h.earlier_updates = state.earlier_updates;
    h.payload_crc =
        Crc32c(Crc32c(0, value, n * sizeof(float)), slots.data(), slots.size() * sizeof(float));
    if (fd_ < 0 || kHeaderSize + h.payload_bytes() > stride_) return Create(&h, value, slots);

    h.slot = next_slot_;
    h.stride = stride_;
    uint8_t header[kHeaderSize];
    EncodeHeader(h, header);
    RETURN_IF_ERROR(
        WriteSlotAt(fd_, header, value, n, slots, next_slot_ * stride_, path_, wire_key_));
    if (sync_ && ::fdatasync(fd_) != 0) {
      return Status::IOError(StrCat(path_, " (key ", wire_key_,
                                    "): fdatasync after the write at offset ", next_slot_ * stride_,
                                    ": ", ErrnoText(errno)));
    }
    Written(h);
    return Status::Ok();
  }

 private:
  // Opens the key's file if there is one and finds its newest valid snapshot,
  // so the write goes to the other slot. A file without one is replaced by the
  // next write (with a warning): the write holds the key's whole state.
  Status OpenExisting() REQUIRES(mu_) {
    ScopedFd fd(::open(path_.c_str(), O_RDWR | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == ENOENT) return Status::Ok();
      return Status::IOError(
          StrCat("cannot open snapshot ", path_, " (key ", wire_key_, "): ", ErrnoText(errno)));
    }
    StatusOr<FileScan> scan = ScanFile(fd.get(), path_, wire_key_);
    if (!scan.ok()) {
      if (scan.status().code() != StatusCode::kCorruption) return scan.status();
      LOG(WARNING) << scan.status() << "; the next write replaces the file";
      return Status::Ok();
    }
    fd_ = fd.release();
    stride_ = scan->stride;
    next_slot_ = 1 - scan->newest_slot;
    newest_rounds_ = scan->newest.rounds;
    sequence_ = scan->max_sequence;
    has_snapshot_ = true;
    return Status::Ok();
  }

  // Writes a file holding only this snapshot (slot 0, and room for slot 1) as
  // "<path>.tmp", then renames it over the key's file.
  Status Create(SlotHeader* h, const float* value, const std::vector<float>& slots) REQUIRES(mu_) {
    const std::string tmp = path_ + ".tmp";
    ScopedFd fd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (fd.get() < 0) {
      return Status::IOError(
          StrCat("cannot create snapshot ", tmp, " (key ", wire_key_, "): ", ErrnoText(errno)));
    }
    h->slot = 0;
    h->stride = StrideFor(h->n, h->state_n);
    uint8_t header[kHeaderSize];
    EncodeHeader(*h, header);
    Status s = WriteSlotAt(fd.get(), header, value, h->n, slots, 0, tmp, wire_key_);
    if (s.ok() && ::ftruncate(fd.get(), static_cast<off_t>(2 * h->stride)) != 0) {
      s = Status::IOError(StrCat(tmp, " (key ", wire_key_, "): extending to ", 2 * h->stride,
                                 " bytes: ", ErrnoText(errno)));
    }
    if (s.ok() && sync_ && ::fdatasync(fd.get()) != 0) {
      s = Status::IOError(StrCat(tmp, " (key ", wire_key_, "): fdatasync: ", ErrnoText(errno)));
    }
    if (s.ok() && ::rename(tmp.c_str(), path_.c_str()) != 0) {
      s = Status::IOError(StrCat("cannot rename ", tmp, " to ", path_, " (key ", wire_key_,
                                 "): ", ErrnoText(errno)));
    }
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
    // The file is in place: use it even if syncing the folder fails, so later
    // writes never go to the replaced file's descriptor.
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd.release();
    stride_ = h->stride;
    next_slot_ = 0;  // Written() flips it to 1
    Written(*h);
    return sync_ ? SyncFolder(dir_fd_, dir_) : Status::Ok();
  }

  // Bookkeeping after header `h` and its payload are in the file.
  void Written(const SlotHeader& h) REQUIRES(mu_) {
    CHECK_EQ(h.slot, next_slot_);
    next_slot_ = 1 - next_slot_;
    newest_rounds_ = h.rounds;
    sequence_ = h.sequence;
    has_snapshot_ = true;
  }

  const std::string path_;
  const uint64_t wire_key_;
  const int dir_fd_;
  const std::string dir_;
  const bool sync_;

  Mutex mu_;
  bool looked_ GUARDED_BY(mu_) = false;  // OpenExisting ran
  int fd_ GUARDED_BY(mu_) = -1;
  uint64_t stride_ GUARDED_BY(mu_) = 0;
  uint32_t next_slot_ GUARDED_BY(mu_) = 0;
  bool has_snapshot_ GUARDED_BY(mu_) = false;  // the file holds a valid snapshot
  uint64_t newest_rounds_ GUARDED_BY(mu_) = 0;
  uint64_t sequence_ GUARDED_BY(mu_) = 0;  // of the last write
};

// ---- the store ----

StatusOr<std::unique_ptr<SnapshotStore>> SnapshotStore::Open(const std::string& dir, bool sync) {
  if (dir.empty()) return Status::InvalidArgument("snapshot folder: empty path");
  RETURN_IF_ERROR(MakeDirs(dir));
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    return Status::IOError(StrCat("cannot open snapshot folder ", dir, ": ", ErrnoText(errno)));
  }
  return std::unique_ptr<SnapshotStore>(new SnapshotStore(dir, dir_fd, sync));
}

SnapshotStore::~SnapshotStore() {
  files_.clear();
  ::close(dir_fd_);
}

Status SnapshotStore::Write(uint64_t wire_key, uint64_t rounds, const float* value, size_t n,
                            const ParamState& state) {
  std::shared_ptr<KeyFile> file;
  {
    MutexLock lock(&mu_);
    std::shared_ptr<KeyFile>& f = files_[wire_key];
    if (f == nullptr) {
      f = std::make_shared<KeyFile>(dir_ + "/" + FileName(wire_key), wire_key, dir_fd_, dir_,
                                    sync_);
    }
    file = f;
  }
  return file->Write(rounds, value, n, state);
}

StatusOr<std::vector<KeySnapshot>> SnapshotStore::LoadAll() const {
  std::vector<std::pair<uint64_t, std::string>> files;  // wire key, path
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!StartsWith(name, kPrefix) || !EndsWith(name, kSuffix)) continue;
    uint64_t key = 0;
    if (!ParseFileName(name, &key)) {
      return Status::Corruption(StrCat(dir_, "/", name, ": not a snapshot file name (expected ",
                                       kPrefix, "<16 lowercase hex digits>", kSuffix, ")"));
    }
    files.emplace_back(key, dir_ + "/" + name);
  }
  if (ec) return Status::IOError(StrCat("cannot list snapshot folder ", dir_, ": ", ec.message()));
  std::sort(files.begin(), files.end());

  std::vector<KeySnapshot> snapshots;
  snapshots.reserve(files.size());
  for (const auto& [key, path] : files) {
    ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      return Status::IOError(StrCat("cannot open snapshot ", path, ": ", ErrnoText(errno)));
    }
    ASSIGN_OR_RETURN(FileScan scan, ScanFile(fd.get(), path, key));
    snapshots.push_back(std::move(scan.newest));
  }
  return snapshots;
}

Status SnapshotStore::Clear() {
  std::unordered_map<uint64_t, std::shared_ptr<KeyFile>> open_files;
  {
    MutexLock lock(&mu_);
    open_files.swap(files_);
  }
  open_files.clear();  // closes the descriptors
  std::error_code ec;
  std::vector<std::string> doomed;
  for (std::filesystem::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (StartsWith(name, kPrefix) && (EndsWith(name, kSuffix) || EndsWith(name, kTmpSuffix))) {
      doomed.push_back(dir_ + "/" + name);
    }
  }
  if (ec) return Status::IOError(StrCat("cannot list snapshot folder ", dir_, ": ", ec.message()));
  for (const std::string& path : doomed) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::IOError(StrCat("cannot remove snapshot ", path, ": ", ErrnoText(errno)));
    }
  }
  if (sync_ && !doomed.empty()) RETURN_IF_ERROR(SyncFolder(dir_fd_, dir_));
  return Status::Ok();
}

}  // namespace pstrain
