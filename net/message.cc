#include "net/message.h"

#include <cstdio>
#include <cstdlib>

namespace pstrain {

// Keys, lengths and values go on the wire in this host's byte order.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is little-endian");

namespace {
std::string Route(char kind, uint64_t nonce) {
  char buf[18];
  std::snprintf(buf, sizeof(buf), "%c%016llx", kind, static_cast<unsigned long long>(nonce));
  return buf;
}
}  // namespace

std::string NodeRoute(uint64_t nonce) { return Route('n', nonce); }
std::string SchedulerRoute(uint64_t nonce) { return Route('s', nonce); }
bool IsSchedulerRoute(const std::string& route) { return route.size() == 17 && route[0] == 's'; }

Blob Blob::Copy(const void* data, size_t size) {
  char* dst = nullptr;
  Blob b = Allocate(size, &dst);
  if (size > 0) std::memcpy(dst, data, size);
  return b;
}

Blob Blob::Allocate(size_t size, char** writable) {
  // 64-byte alignment keeps float loops vectorizable; new[] of a size 0 is fine.
  std::shared_ptr<char> buf(static_cast<char*>(std::aligned_alloc(64, (size + 63) / 64 * 64 + 64)),
                            [](char* p) { std::free(p); });
  CHECK(buf != nullptr) << "out of memory allocating " << size << " bytes";
  *writable = buf.get();
  return Blob(std::shared_ptr<const void>(buf, buf.get()), buf.get(), size);
}

Blob Blob::Slice(size_t offset, size_t n) const {
  CHECK_LE(offset + n, size_);
  return Blob(owner_, data_ + offset, n);
}

std::string NodeIdName(int id) {
  if (id == kSchedulerId) return "scheduler";
  if (IsServerId(id)) return StrCat("server rank ", RankOfId(id), " (id ", id, ")");
  if (IsWorkerId(id)) return StrCat("worker rank ", RankOfId(id), " (id ", id, ")");
  return StrCat("unknown node id ", id);
}

Status ValidateFrames(const Message& msg) {
  const PsHeader& h = msg.header;
  // The message is built only for an error: this runs for every message.
  auto bad = [&h](const auto&... parts) {
    return Status::InvalidArgument(StrCat("message from ", NodeIdName(h.sender()), " request ",
                                          h.request_id(), ": ", parts...));
  };
  const uint64_t n = h.num_keys();
  if (n > (uint64_t{1} << 32)) {
    return bad("num_keys ", n, " is absurd");
  }
  if (msg.keys.size() != n * sizeof(uint64_t)) {
    return bad("keys frame has ", msg.keys.size(), " bytes, expected ", n * sizeof(uint64_t),
               " for num_keys=", n);
  }
  if (msg.lens.size() != n * sizeof(uint32_t)) {
    return bad("lens frame has ", msg.lens.size(), " bytes, expected ", n * sizeof(uint32_t));
  }
  if (msg.values.size() != h.num_value_frames()) {
    return bad("has ", msg.values.size(), " value frames, header says ", h.num_value_frames());
  }
  uint64_t total = 0;
  for (const Blob& v : msg.values) total += v.size();
  if (total != h.value_bytes()) {
    return bad("value frames hold ", total, " bytes, header says ", h.value_bytes());
  }
  if (n == 0 || msg.values.empty()) return Status::Ok();
  // Compressed parts: ValidateDataRequest, which the server answers with an error.
  if (h.dtype() == DTYPE_2BIT) return Status::Ok();
  // Parts must fill the value frames exactly, in order, none straddling two.
  size_t frame = 0;
  uint64_t used = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t bytes = uint64_t{msg.len(i)} * sizeof(float);
    while (frame < msg.values.size() && used == msg.values[frame].size()) {
      ++frame;
      used = 0;
    }
    if (frame >= msg.values.size() || used + bytes > msg.values[frame].size()) {
      return bad("part ", i, " (", msg.len(i), " elements) does not fit in the value frames");
    }
    used += bytes;
  }
  if (frame + 1 != msg.values.size() || used != msg.values[frame].size()) {
    return bad("value frames hold more bytes than the parts' lengths");
  }
  return Status::Ok();
}

Status ValidateDataRequest(const Message& msg, int server_rank) {
  const PsHeader& h = msg.header;
  // The message is built only for an error: this runs for every request.
  auto bad = [&h](const auto&... parts) {
    return Status::InvalidArgument(
        StrCat("data request ", h.request_id(), " from ", NodeIdName(h.sender()), ": ", parts...));
  };
  if (!IsWorkerId(h.sender())) return bad("not from a worker");
  const bool compressed = h.dtype() == DTYPE_2BIT;
  if (h.dtype() != DTYPE_FLOAT32 && !compressed) {
    return bad("dtype ", h.dtype(), " is neither float32 nor 2bit");
  }
  if (compressed && !h.push()) {
    return bad("2-bit compressed values are for pushes only, not ",
               h.init() ? "init" : "a pull without push");
  }
  if (!h.init() && !h.push() && !h.pull()) {
    return bad("neither init, push nor pull");
  }
  if (h.init() && (h.push() || h.pull())) {
    return bad("init cannot be combined with push or pull");
  }
  if (h.replace() && !h.init()) return bad("replace without init");
  if (h.sum_only() && (!h.push() || compressed)) {
    return bad("sum_only (an allreduce) on ", compressed ? "2-bit values" : "no push");
  }
  if (h.num_keys() == 0) return bad("has no keys");
  const bool want_values = h.init() || h.push();
  if (want_values != (h.value_bytes() > 0)) {
    return bad(want_values ? "push without values" : "pull carries values");
  }
  for (uint64_t i = 0; i < h.num_keys(); ++i) {
    const uint64_t w = msg.key(i);
    if (WireKeyServer(w) != server_rank) {
      return bad("key ", WireKeyUser(w), " part ", WireKeyPart(w), " belongs to server rank ",
                 WireKeyServer(w), ", not to server rank ", server_rank);
    }
    if (msg.len(i) == 0) {
      return bad("key ", WireKeyUser(w), " part ", WireKeyPart(w), " has length 0");
    }
  }
  // A key twice in one request would count its sender twice in a round.
  if (const auto w = FirstRepeatedKey(h.num_keys(), [&msg](size_t i) { return msg.key(i); })) {
    return bad("key ", WireKeyUser(*w), " part ", WireKeyPart(*w), " appears more than once");
  }
  if (compressed) {
    // As ValidateFrames does for float32, with each part's compressed size.
    uint64_t need = 0;
    for (uint64_t i = 0; i < h.num_keys(); ++i) need += TwoBitBytes(msg.len(i));
    size_t frame = 0;
    uint64_t used = 0;
    for (uint64_t i = 0; i < h.num_keys(); ++i) {
      const uint64_t bytes = TwoBitBytes(msg.len(i));
      while (frame < msg.values.size() && used == msg.values[frame].size()) {
        ++frame;
        used = 0;
      }
      const uint64_t left = frame < msg.values.size() ? msg.values[frame].size() - used : 0;
      if (bytes > left) {
        const uint64_t w = msg.key(i);
        return bad("2-bit push of key ", WireKeyUser(w), " part ", WireKeyPart(w), ": ", msg.len(i),
                   " elements need ", bytes, " bytes of codes, its value frame has ", left,
                   " left (the lens need ", need, " bytes in all, the values hold ",
                   h.value_bytes(), ")");
      }
      used += bytes;
    }
    if (need != h.value_bytes()) {
      return bad("2-bit push: the lens need ", need, " bytes of codes, the values hold ",
                 h.value_bytes());
    }
  }
  return Status::Ok();
}

uint64_t EnvelopeBytes(const std::string& header, const Message& msg, bool inline_values) {
  const bool data = msg.header.cmd() == CMD_DATA;
  const uint64_t keys_at = QueuedKeysAt(header.size());
  if (!data) return keys_at;
  const uint64_t values_at = (keys_at + msg.keys.size() + msg.lens.size() + 7) / 8 * 8;
  uint64_t values = 0;
  if (inline_values) {
    for (const Blob& v : msg.values) values += v.size();
  }
  return values_at + values;
}

void WriteEnvelope(const std::string& header, const Message& msg, bool inline_values, char* dst) {
  const auto hlen = static_cast<uint32_t>(header.size());
  std::memcpy(dst, &hlen, sizeof(hlen));
  std::memcpy(dst + 4, header.data(), header.size());
  const uint64_t keys_at = QueuedKeysAt(header.size());
  std::memset(dst + 4 + hlen, 0, keys_at - 4 - hlen);  // padding: no stray bytes on the wire
  if (msg.header.cmd() != CMD_DATA) return;
  char* at = dst + keys_at;
  std::memcpy(at, msg.keys.data(), msg.keys.size());
  at += msg.keys.size();
  std::memcpy(at, msg.lens.data(), msg.lens.size());
  at += msg.lens.size();
  const uint64_t values_at = (keys_at + msg.keys.size() + msg.lens.size() + 7) / 8 * 8;
  std::memset(at, 0, dst + values_at - at);
  if (!inline_values) return;
  at = dst + values_at;
  for (const Blob& v : msg.values) {
    std::memcpy(at, v.data(), v.size());
    at += v.size();
  }
}

namespace {

// The envelope's parts; `own`: the bytes are ours to keep (a ZeroMQ frame),
// else copied out where the sender may still write (its arena).
Decoded DecodeEnvelope(const Blob& env, bool own) {
  Decoded d;
  Message& msg = d.msg;
  uint32_t hlen = 0;
  if (env.size() >= sizeof(hlen)) std::memcpy(&hlen, env.data(), sizeof(hlen));
  if (env.size() < 4 + uint64_t{hlen} || hlen > kMaxHeaderBytes ||
      !msg.header.ParseFromArray(env.data() + 4, static_cast<int>(hlen))) {
    d.error =
        StrCat(own ? "batched" : "queued", " message of ", env.size(), " bytes has no PsHeader");
    return d;
  }
  d.header_ok = true;
  if (msg.header.cmd() != CMD_DATA) return d;
  const PsHeader& h = msg.header;
  const uint64_t keys_at = QueuedKeysAt(hlen);
  const uint64_t n = h.num_keys();
  const uint64_t values_at = (keys_at + n * 12 + 7) / 8 * 8;
  const bool inline_values = h.shm_frame_offset_size() == 0 && h.num_value_frames() > 0;
  const uint64_t values = inline_values ? h.value_bytes() : 0;
  if (n > (env.size() >> 3) || values > env.size() ||
      (inline_values && h.num_value_frames() != 1) || values_at + values != env.size()) {
    d.error = StrCat(own ? "batched " : "queued ", env.size(), " bytes for ", n, " keys and ",
                     values, " bytes of values");
    return d;
  }
  if (own) {
    msg.keys = env.Slice(keys_at, n * 8);
    msg.lens = env.Slice(keys_at + n * 8, n * 4);
  } else {
    msg.keys = Blob::Copy(env.data() + keys_at, n * 8);
    msg.lens = Blob::Copy(env.data() + keys_at + n * 8, n * 4);
  }
  if (inline_values) {
    Blob v = env.Slice(values_at, values);
    // Values are read as floats in place; copy the rare misaligned frame.
    if (reinterpret_cast<uintptr_t>(v.data()) % alignof(float) != 0) {
      v = Blob::Copy(v.data(), v.size());
    }
    msg.values.push_back(std::move(v));
  }
  return d;
}

}  // namespace

Decoded DecodeFrames(const std::vector<Blob>& frames) {
  Decoded d;
  if (frames.size() > kMaxValueFrames + 4) {
    d.error = StrCat("more than ", kMaxValueFrames + 4, " frames");
    return d;
  }
  if (frames.size() < 2) {
    d.error = "no header frame";
    return d;
  }
  const Blob& header = frames[1];
  Message& msg = d.msg;
  if (header.size() > kMaxHeaderBytes ||
      !msg.header.ParseFromArray(header.data(), static_cast<int>(header.size()))) {
    d.error = StrCat("header frame of ", header.size(), " bytes is not a PsHeader");
    return d;
  }
  d.header_ok = true;
  // The connection it came on, before anything can fail: a message dropped
  // as malformed is still checked against the sender it claims.
  msg.route.assign(frames[0].data(), frames[0].size());
  const bool data = msg.header.cmd() == CMD_DATA;
  const bool in_shm = data && msg.header.shm_frame_offset_size() > 0;
  // (A peer's count is bounded before it is added to: near 2^64 the sum wraps.)
  const uint64_t value_frames = in_shm ? 0 : msg.header.num_value_frames();
  if (value_frames > kMaxValueFrames) {
    d.error = StrCat(NodeIdName(msg.header.sender()), " sent a header claiming ", value_frames,
                     " value frames (at most ", kMaxValueFrames, ")");
    return d;
  }
  const uint64_t expect = data ? 4 + value_frames : 2;
  if (frames.size() != expect) {
    d.error =
        StrCat(NodeIdName(msg.header.sender()), " sent ", frames.size() - 1, " frames for command ",
               PsCommand_Name(msg.header.cmd()), ", header implies ", expect - 1);
    return d;
  }
  if (data) {
    msg.keys = frames[2];
    msg.lens = frames[3];
    msg.values.reserve(frames.size() - 4);
    for (size_t i = 4; i < frames.size(); ++i) {
      Blob b = frames[i];
      // Values are read as floats in place; copy the rare misaligned frame.
      if (reinterpret_cast<uintptr_t>(b.data()) % alignof(float) != 0) {
        b = Blob::Copy(b.data(), b.size());
      }
      msg.values.push_back(std::move(b));
    }
  }
  return d;
}

bool IsBatch(const std::vector<Blob>& frames) {
  return frames.size() == 2 && frames[1].size() >= sizeof(kBatchMagic) &&
         std::memcmp(frames[1].data(), kBatchMagic, sizeof(kBatchMagic)) == 0;
}

std::vector<Decoded> DecodeBatch(const std::vector<Blob>& frames) {
  std::vector<Decoded> out;
  const Blob& frame = frames[1];
  const std::string route(frames[0].data(), frames[0].size());
  uint32_t count = 0;
  if (frame.size() >= 16) std::memcpy(&count, frame.data() + 8, sizeof(count));
  if (frame.size() < 16 || count == 0 || count > kMaxBatch) {
    out.emplace_back();
    out.back().error = StrCat("batch frame of ", frame.size(), " bytes says it holds ", count,
                              " messages (1 to ", kMaxBatch, ")");
    return out;
  }
  out.reserve(count);
  uint64_t at = 16;
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t bytes = 0;
    if (frame.size() - at >= 8) std::memcpy(&bytes, frame.data() + at, sizeof(bytes));
    if (frame.size() - at < 8 || bytes > frame.size() - at - 8 ||
        (bytes + 7) / 8 * 8 > frame.size() - at - 8) {
      out.emplace_back();
      out.back().error = StrCat("message ", i, " of a batch of ", count, " overruns its ",
                                frame.size(), "-byte frame at byte ", at);
      return out;
    }
    out.push_back(DecodeEnvelope(frame.Slice(at + 8, bytes), /*own=*/true));
    out.back().msg.route = route;
    if (!out.back().error.empty()) return out;
    at += 8 + (bytes + 7) / 8 * 8;
  }
  if (at != frame.size()) {
    out.emplace_back();
    out.back().error =
        StrCat("batch frame has ", frame.size() - at, " bytes after its ", count, " messages");
  }
  return out;
}

Decoded DecodeQueued(const Blob& env) { return DecodeEnvelope(env, /*own=*/false); }

}  // namespace pstrain
