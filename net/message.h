// Messages between pstrain nodes: a PsHeader plus raw frames (../shared/design.md 5).
//
// A data message carries three kinds of raw frames after the header:
//   keys   uint64 wire key per part (see WireKey below)
//   lens   uint32 number of float32 elements per part
//   values zero or more frames of float32 (DTYPE_2BIT pushes: each part's
//          TwoBitWords(len) uint32 words of 2-bit codes); the parts fill them in
//          key order and a part never straddles two frames (so each frame can
//          reference the sender's own buffer without a copy).
// Blob is the ref-counted byte view that makes this zero-copy on both ends.
#ifndef PSTRAIN_NET_MESSAGE_H_
#define PSTRAIN_NET_MESSAGE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/gradient_compression.h"
#include "common/status.h"
#include "proto/ps.pb.h"

namespace pstrain {

// A read-only view of bytes kept alive by `owner` (which may be null for memory
// the caller promises to keep valid, see KVClient). Copying a Blob shares the bytes.
class Blob {
 public:
  Blob() = default;
  Blob(std::shared_ptr<const void> owner, const void* data, size_t size)
      : owner_(std::move(owner)), data_(static_cast<const char*>(data)), size_(size) {}
  // A Blob that owns a fresh copy of `size` bytes at `data`.
  static Blob Copy(const void* data, size_t size);
  // A Blob owning an uninitialized writable buffer of `size` bytes (64-byte
  // aligned); *writable points at it.
  static Blob Allocate(size_t size, char** writable);

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const std::shared_ptr<const void>& owner() const { return owner_; }
  // Bytes [offset, offset + n) sharing ownership. REQUIRES: offset + n <= size().
  Blob Slice(size_t offset, size_t n) const;

 private:
  std::shared_ptr<const void> owner_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

struct Message {
  PsHeader header;
  Blob keys;                 // uint64 per part
  Blob lens;                 // uint32 per part
  std::vector<Blob> values;  // float32 parts
  // Receiver only: the ZeroMQ routing id of the connection it came on (empty
  // for messages from a shared-memory queue, whose sender the queue fixes).
  std::string route;

  uint64_t key(size_t i) const {
    uint64_t k;
    std::memcpy(&k, keys.data() + i * sizeof(k), sizeof(k));
    return k;
  }
  uint32_t len(size_t i) const {
    uint32_t n;
    std::memcpy(&n, lens.data() + i * sizeof(n), sizeof(n));
    return n;
  }
};

// ---- decoding what arrives (both transports), before anything uses it ----

// Most value frames one message may carry; more is treated as garbage.
inline constexpr size_t kMaxValueFrames = 1 << 16;
// A header larger than this is garbage.
inline constexpr size_t kMaxHeaderBytes = 1 << 20;
// Where the keys start in a queued message whose header has `hlen` bytes:
// the envelope is uint32 header bytes, the header, padding to 8, keys, lens,
// (padding to 8, inline values).
inline uint64_t QueuedKeysAt(uint64_t hlen) { return (4 + hlen + 7) / 8 * 8; }
// The envelope of `msg` with the serialized header `header` (whose
// num_value_frames is 1 when `inline_values`): its size, and writing it to
// `dst` (8-byte aligned, EnvelopeBytes long). Data messages carry keys and
// lens, and with `inline_values` every value frame, back to back.
uint64_t EnvelopeBytes(const std::string& header, const Message& msg, bool inline_values);
void WriteEnvelope(const std::string& header, const Message& msg, bool inline_values, char* dst);

// Small data messages cross ZeroMQ as one frame, not four (each frame costs
// more than copying a few KB), and a burst of them to one peer (a sender's
// requests, a server's replies to them) as one frame together: these 8
// bytes, uint32 count, uint32 0, then per message uint64 envelope bytes and
// the envelope (values inline), padded to 8. No serialized PsHeader starts
// with a 0 byte (a field number is never 0), so a receiver tells a batch
// from a header frame by the first byte.
inline constexpr char kBatchMagic[8] = {'\0', 'p', 's', 'b', 'a', 't', 'c', 'h'};
inline constexpr uint32_t kMaxBatch = 4096;
// Whether received ZeroMQ frames (routing id first) are one batch frame.
bool IsBatch(const std::vector<Blob>& frames);

// A received message as far as it could be read: `error` empty when it is
// well formed as far as these checks go (the data frames' agreement with the
// header is ValidateFrames'); `header_ok` when msg.header was parsed (a
// dropped message's header still tells whose numbered stream it was in).
struct Decoded {
  Message msg;
  bool header_ok = false;
  std::string error;
};
// ZeroMQ: frames[0] the sender's routing id, frames[1] the header, then (data
// messages) keys, lens and the value frames (a batch frame is DecodeBatch's).
// Copies a misaligned value frame (floats are read in place).
Decoded DecodeFrames(const std::vector<Blob>& frames);
// A batch frame's messages in order. A malformed frame gives one Decoded
// with the error; a malformed envelope inside gives its error in its place,
// and none after it is read (their bounds are not trusted).
std::vector<Decoded> DecodeBatch(const std::vector<Blob>& frames);
// A shared-memory queue entry (one ring block): the header and, for data
// messages, keys and lens (copied: the sender can still write its arena) and
// the values inline or named by offsets in the sender's arena.
Decoded DecodeQueued(const Blob& envelope);

// The ZeroMQ routing id a node connects with, from its registration nonce
// ("n" + 16 hex digits), and the scheduler's ("s" + 16 hex digits).
std::string NodeRoute(uint64_t nonce);
std::string SchedulerRoute(uint64_t nonce);
// Whether `route` has the form SchedulerRoute gives.
bool IsSchedulerRoute(const std::string& route);

// ps-lite's node ids: scheduler 1, server rank r -> 8 + 2r, worker rank r -> 9 + 2r.
constexpr int kSchedulerId = 1;
constexpr int kServerGroup = 2;
constexpr int kWorkerGroup = 4;
constexpr int kAllGroup = 1 | 2 | 4;
inline int ServerId(int rank) { return 8 + 2 * rank; }
inline int WorkerId(int rank) { return 9 + 2 * rank; }
inline bool IsServerId(int id) { return id >= 8 && id % 2 == 0; }
inline bool IsWorkerId(int id) { return id >= 9 && id % 2 == 1; }
inline int RankOfId(int id) { return id < 8 ? 0 : (id - 8) / 2; }

// A wire key names one part of one user key on one server:
//   bits 63..48 server rank, 47..16 user key, 15..0 part index.
constexpr uint64_t kMaxUserKey = (uint64_t{1} << 32) - 1;
constexpr int kMaxParts = 1 << 16;
inline uint64_t WireKey(int server, uint64_t key, int part) {
  return (static_cast<uint64_t>(server) << 48) | (key << 16) | static_cast<uint64_t>(part);
}
inline int WireKeyServer(uint64_t w) { return static_cast<int>(w >> 48); }
inline uint64_t WireKeyUser(uint64_t w) { return (w >> 16) & kMaxUserKey; }
inline int WireKeyPart(uint64_t w) { return static_cast<int>(w & 0xffff); }

// Bytes of one part of `elems` elements in a value frame of `dtype`: 4 per
// element for float32, TwoBitBytes(elems) for DTYPE_2BIT.
inline uint64_t PartValueBytes(DataType dtype, uint64_t elems) {
  return dtype == DTYPE_2BIT ? TwoBitBytes(elems) : elems * sizeof(float);
}

// Checks that a received message's frames agree with its header (the transport
// calls this before a message reaches any handler): a data message has
// num_keys * 8 bytes of keys, num_keys * 4 of lens, num_value_frames value frames
// totalling value_bytes, and every value frame holds whole parts (float32).
// Returns InvalidArgument naming the first disagreement. The parts of a
// DTYPE_2BIT message are ValidateDataRequest's to check, so that the worker
// gets an error reply naming the key.
Status ValidateFrames(const Message& msg);

// For data requests to server `server_rank`: the version and dtype are right,
// every key belongs to this server, no key part appears twice, every length
// is > 0, and values are present
// exactly when the request pushes or initializes. DTYPE_2BIT is for pushes
// only (not init), and its parts must fill the value frames exactly
// (PartValueBytes each, none straddling two frames): else the error names the
// first key part that does not fit, the bytes its length needs and the bytes
// there are.
Status ValidateDataRequest(const Message& msg, int server_rank);

// The smallest key that keys(0..n-1) holds more than once, or none. Linear
// for keys in increasing order (as the KV client sends them), else a sort of
// a copy.
template <typename KeyAt>
std::optional<uint64_t> FirstRepeatedKey(size_t n, const KeyAt& key) {
  bool increasing = true;
  for (size_t i = 1; i < n && increasing; ++i) increasing = key(i - 1) < key(i);
  if (increasing) return std::nullopt;
  std::vector<uint64_t> sorted(n);
  for (size_t i = 0; i < n; ++i) sorted[i] = key(i);
  std::sort(sorted.begin(), sorted.end());
  const auto it = std::adjacent_find(sorted.begin(), sorted.end());
  if (it == sorted.end()) return std::nullopt;
  return *it;
}

// "worker rank 2 (id 13)" style name of a node id for error messages.
std::string NodeIdName(int id);

}  // namespace pstrain

#endif  // PSTRAIN_NET_MESSAGE_H_
