// Validation of received messages: frames against the header, requests
// against the receiving server.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "net/message.h"

namespace pstrain {
namespace {

// A push of `lens` (elements) to server `server` from worker rank 1.
Message MakePush(int server, const std::vector<uint32_t>& lens, size_t frames = 1) {
  Message m;
  PsHeader& h = m.header;
  h.set_version(PROTOCOL_VERSION_CURRENT);
  h.set_cmd(CMD_DATA);
  h.set_sender(WorkerId(1));
  h.set_push(true);
  h.set_dtype(DTYPE_FLOAT32);
  h.set_num_keys(lens.size());
  std::vector<uint64_t> keys;
  uint64_t total = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    keys.push_back(WireKey(server, 10 + i, 0));
    total += lens[i];
  }
  m.keys = Blob::Copy(keys.data(), keys.size() * 8);
  m.lens = Blob::Copy(lens.data(), lens.size() * 4);
  std::vector<float> vals(total, 1.0f);
  if (frames == 1) {
    m.values.push_back(Blob::Copy(vals.data(), total * 4));
  } else {
    // One frame per part.
    uint64_t off = 0;
    for (uint32_t n : lens) {
      m.values.push_back(Blob::Copy(vals.data() + off, n * 4));
      off += n;
    }
  }
  h.set_num_value_frames(m.values.size());
  h.set_value_bytes(total * 4);
  return m;
}

TEST(MessageTest, WellFormedPushPasses) {
  Message m = MakePush(2, {3, 5, 7});
  EXPECT_TRUE(ValidateFrames(m).ok());
  EXPECT_TRUE(ValidateDataRequest(m, 2).ok());
  Message multi = MakePush(2, {3, 5, 7}, 3);
  EXPECT_TRUE(ValidateFrames(multi).ok());
}

TEST(MessageTest, KeysOrLensFrameOfWrongSizeIsRejected) {
  Message m = MakePush(0, {3, 5});
  m.keys = m.keys.Slice(0, 12);
  Status s = ValidateFrames(m);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("keys frame has 12 bytes, expected 16"), std::string::npos) << s;
  Message l = MakePush(0, {3, 5});
  l.lens = l.lens.Slice(0, 4);
  EXPECT_FALSE(ValidateFrames(l).ok());
}

TEST(MessageTest, ValueBytesMustMatchHeaderAndLengths) {
  Message m = MakePush(0, {3, 5});
  m.header.set_value_bytes(100);
  EXPECT_FALSE(ValidateFrames(m).ok());
  Message t = MakePush(0, {3, 5});  // truncated values
  t.values[0] = t.values[0].Slice(0, 16);
  t.header.set_value_bytes(16);
  Status s = ValidateFrames(t);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("does not fit"), std::string::npos) << s;
  Message extra = MakePush(0, {3});
  std::vector<float> v(4, 0.0f);
  extra.values[0] = Blob::Copy(v.data(), 16);
  extra.header.set_value_bytes(16);
  EXPECT_FALSE(ValidateFrames(extra).ok());
  Message frames = MakePush(0, {3});
  frames.header.set_num_value_frames(2);
  EXPECT_FALSE(ValidateFrames(frames).ok());
}

TEST(MessageTest, PartStraddlingTwoFramesIsRejected) {
  Message m = MakePush(0, {4, 4});
  std::vector<float> v(8, 1.0f);
  m.values.clear();
  m.values.push_back(Blob::Copy(v.data(), 12));  // 3 floats: part 0 would straddle
  m.values.push_back(Blob::Copy(v.data(), 20));
  m.header.set_num_value_frames(2);
  EXPECT_FALSE(ValidateFrames(m).ok());
}

// In dist_sync the second copy would be taken as the sender's push of the
// next round, shifting every later push of that worker by one.
TEST(MessageTest, AKeyPartTwiceInOneRequestIsRejected) {
  Message m = MakePush(0, {3, 4, 5});
  std::vector<uint64_t> keys = {WireKey(0, 12, 1), WireKey(0, 11, 0), WireKey(0, 12, 1)};
  m.keys = Blob::Copy(keys.data(), keys.size() * 8);
  ASSERT_TRUE(ValidateFrames(m).ok());
  Status s = ValidateDataRequest(m, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("key 12 part 1 appears more than once"), std::string::npos) << s;
  keys = {WireKey(0, 12, 1), WireKey(0, 11, 0), WireKey(0, 12, 0)};  // out of order, no repeat
  m.keys = Blob::Copy(keys.data(), keys.size() * 8);
  EXPECT_TRUE(ValidateDataRequest(m, 0).ok());
  EXPECT_EQ(FirstRepeatedKey(4, [](size_t i) { return uint64_t{7} - i % 3; }), uint64_t{7});
  EXPECT_EQ(FirstRepeatedKey(3, [](size_t i) { return uint64_t{i}; }), std::nullopt);
}

TEST(MessageTest, RequestForAnotherServerIsRejected) {
  Message m = MakePush(1, {3});
  Status s = ValidateDataRequest(m, 0);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("belongs to server rank 1, not to server rank 0"), std::string::npos)
      << s;
}

TEST(MessageTest, BadRequestsAreRejected) {
  Message dtype = MakePush(0, {3});
  dtype.header.set_dtype(DTYPE_UNKNOWN);
  EXPECT_FALSE(ValidateDataRequest(dtype, 0).ok());
  Message none = MakePush(0, {3});
  none.header.set_push(false);
  EXPECT_FALSE(ValidateDataRequest(none, 0).ok());
  Message mixed = MakePush(0, {3});
  mixed.header.set_init(true);
  EXPECT_FALSE(ValidateDataRequest(mixed, 0).ok());
  Message replace_push = MakePush(0, {3});  // replace marks an init only
  replace_push.header.set_replace(true);
  const Status replace = ValidateDataRequest(replace_push, 0);
  EXPECT_NE(replace.message().find("replace without init"), std::string::npos) << replace;
  replace_push.header.set_push(false);
  replace_push.header.set_init(true);
  EXPECT_TRUE(ValidateDataRequest(replace_push, 0).ok());
  Message from_server = MakePush(0, {3});
  from_server.header.set_sender(ServerId(0));
  EXPECT_FALSE(ValidateDataRequest(from_server, 0).ok());
  Message zero = MakePush(0, {0});
  EXPECT_FALSE(ValidateDataRequest(zero, 0).ok());
  Message pull_with_values = MakePush(0, {3});
  pull_with_values.header.set_push(false);
  pull_with_values.header.set_pull(true);
  EXPECT_FALSE(ValidateDataRequest(pull_with_values, 0).ok());
  Message push_without = MakePush(0, {3});
  push_without.values.clear();
  push_without.header.set_num_value_frames(0);
  push_without.header.set_value_bytes(0);
  EXPECT_FALSE(ValidateDataRequest(push_without, 0).ok());
}

// A 2-bit compressed push of `lens` elements: TwoBitBytes(len) per part, in
// one frame.
Message MakeCompressedPush(int server, const std::vector<uint32_t>& lens) {
  Message m = MakePush(server, lens);
  m.header.set_dtype(DTYPE_2BIT);
  uint64_t bytes = 0;
  for (uint32_t n : lens) bytes += TwoBitBytes(n);
  std::vector<uint32_t> words(bytes / 4, 0xC0C0C0C0u);
  m.values = {Blob::Copy(words.data(), bytes)};
  m.header.set_value_bytes(bytes);
  return m;
}

TEST(MessageTest, CompressedPushesHaveCompressedPartSizes) {
  Message m = MakeCompressedPush(0, {3, 16, 17, 1000});  // 4 + 4 + 8 + 252 bytes
  EXPECT_EQ(m.header.value_bytes(), 268u);
  EXPECT_EQ(PartValueBytes(DTYPE_2BIT, 17), 8u);
  EXPECT_EQ(PartValueBytes(DTYPE_FLOAT32, 17), 68u);
  EXPECT_TRUE(ValidateFrames(m).ok()) << ValidateFrames(m);
  EXPECT_TRUE(ValidateDataRequest(m, 0).ok()) << ValidateDataRequest(m, 0);
  // A push+pull is a push too; the reply's values are float32.
  m.header.set_pull(true);
  EXPECT_TRUE(ValidateDataRequest(m, 0).ok()) << ValidateDataRequest(m, 0);
}

// The transport passes a compressed push whose frames agree with its header
// (so that the server can answer it), and the server's check names the key
// part whose codes do not fit, with the bytes it needs and has.
TEST(MessageTest, CompressedPushOfWrongSizeNamesTheKeyAndTheSizes) {
  Message short_push = MakeCompressedPush(0, {16, 40});  // needs 4 + 12 bytes
  short_push.values[0] = short_push.values[0].Slice(0, 12);
  short_push.header.set_value_bytes(12);
  EXPECT_TRUE(ValidateFrames(short_push).ok());
  Status s = ValidateDataRequest(short_push, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("2-bit push of key 11 part 0: 40 elements need 12 bytes of codes, "
                             "its value frame has 8 left (the lens need 16 bytes in all, the "
                             "values hold 12)"),
            std::string::npos)
      << s;
  Message long_push = MakeCompressedPush(0, {16});
  std::vector<uint32_t> words(2, 0);
  long_push.values[0] = Blob::Copy(words.data(), 8);
  long_push.header.set_value_bytes(8);
  s = ValidateDataRequest(long_push, 0);
  EXPECT_NE(s.message().find("the lens need 4 bytes of codes, the values hold 8"),
            std::string::npos)
      << s;
  // Float32 sizes in a 2-bit push: every part is too large for what follows.
  Message as_float = MakePush(0, {16, 16});
  as_float.header.set_dtype(DTYPE_2BIT);
  EXPECT_FALSE(ValidateDataRequest(as_float, 0).ok());
  // Parts straddling two frames are refused as for float32.
  Message split = MakeCompressedPush(0, {32, 32});  // 8 + 8 bytes
  split.values = {split.values[0].Slice(0, 4), split.values[0].Slice(4, 12)};
  split.header.set_num_value_frames(2);
  EXPECT_TRUE(ValidateFrames(split).ok());
  s = ValidateDataRequest(split, 0);
  EXPECT_NE(s.message().find("key 10 part 0: 32 elements need 8 bytes of codes, its value "
                             "frame has 4 left"),
            std::string::npos)
      << s;
}

TEST(MessageTest, CompressedValuesAreForPushesOnly) {
  Message init = MakeCompressedPush(0, {16});
  init.header.set_push(false);
  init.header.set_init(true);
  Status s = ValidateDataRequest(init, 0);
  EXPECT_NE(s.message().find("for pushes only, not init"), std::string::npos) << s;
  Message pull = MakeCompressedPush(0, {16});
  pull.header.set_push(false);
  pull.header.set_pull(true);
  pull.values.clear();
  pull.header.set_num_value_frames(0);
  pull.header.set_value_bytes(0);
  s = ValidateDataRequest(pull, 0);
  EXPECT_NE(s.message().find("not a pull without push"), std::string::npos) << s;
  Message other = MakeCompressedPush(0, {16});
  other.header.set_dtype(DTYPE_UNKNOWN);
  s = ValidateDataRequest(other, 0);
  EXPECT_NE(s.message().find("neither float32 nor 2bit"), std::string::npos) << s;
}

// The envelope of `m` as the Van puts it in a batch frame: values inline, as
// one frame.
std::string Envelope(const Message& m) {
  PsHeader h = m.header;
  const bool inline_values = !m.values.empty();
  if (inline_values) h.set_num_value_frames(1);
  const std::string header = h.SerializeAsString();
  std::string env(EnvelopeBytes(header, m, inline_values), '\0');
  WriteEnvelope(header, m, inline_values, env.data());
  return env;
}

// A batch frame of `msgs` as the Van builds one.
Blob Batch(const std::vector<Message>& msgs) {
  std::string frame(kBatchMagic, sizeof(kBatchMagic));
  const auto count = static_cast<uint32_t>(msgs.size());
  frame.append(reinterpret_cast<const char*>(&count), 4);
  frame.append(4, '\0');
  for (const Message& m : msgs) {
    const std::string env = Envelope(m);
    const uint64_t bytes = env.size();
    frame.append(reinterpret_cast<const char*>(&bytes), 8);
    frame += env;
    frame.append((bytes + 7) / 8 * 8 - bytes, '\0');
  }
  return Blob::Copy(frame.data(), frame.size());
}

std::vector<float> Floats(const std::vector<Blob>& frames) {
  std::vector<float> out;
  for (const Blob& b : frames) {
    const auto* f = reinterpret_cast<const float*>(b.data());
    out.insert(out.end(), f, f + b.size() / 4);
  }
  return out;
}

// The one message of a well-formed batch frame.
Decoded DecodeOne(const Blob& route, const Blob& frame) {
  std::vector<Decoded> d = DecodeBatch({route, frame});
  EXPECT_EQ(d.size(), 1u);
  return d.empty() ? Decoded{} : std::move(d[0]);
}

TEST(MessageTest, ABatchOfOneCarriesTheSameMessage) {
  Message m = MakePush(1, {3, 5, 7}, 3);  // three value frames become one
  float* v = const_cast<float*>(reinterpret_cast<const float*>(m.values[1].data()));
  v[2] = 42.0f;
  const Blob route = Blob::Copy("n0123", 5);
  Decoded d = DecodeOne(route, Batch({m}));
  ASSERT_TRUE(d.error.empty()) << d.error;
  EXPECT_EQ(d.msg.route, "n0123");
  EXPECT_EQ(d.msg.header.num_keys(), 3u);
  EXPECT_EQ(d.msg.header.num_value_frames(), 1u);
  ASSERT_EQ(d.msg.keys.size(), m.keys.size());
  EXPECT_EQ(std::memcmp(d.msg.keys.data(), m.keys.data(), m.keys.size()), 0);
  ASSERT_EQ(d.msg.lens.size(), m.lens.size());
  EXPECT_EQ(std::memcmp(d.msg.lens.data(), m.lens.data(), m.lens.size()), 0);
  EXPECT_EQ(Floats(d.msg.values), Floats(m.values));
  EXPECT_TRUE(ValidateFrames(d.msg).ok()) << ValidateFrames(d.msg);
  EXPECT_TRUE(ValidateDataRequest(d.msg, 1).ok());

  // A pull (no values) and a control message travel the same way.
  Message pull = MakePush(1, {4, 4});
  pull.header.set_push(false);
  pull.header.set_pull(true);
  pull.header.set_num_value_frames(0);
  pull.header.set_value_bytes(0);
  pull.values.clear();
  Decoded p = DecodeOne(route, Batch({pull}));
  ASSERT_TRUE(p.error.empty()) << p.error;
  EXPECT_TRUE(p.msg.values.empty());
  EXPECT_TRUE(ValidateFrames(p.msg).ok());
  Message beat;
  beat.header.set_version(PROTOCOL_VERSION_CURRENT);
  beat.header.set_cmd(CMD_HEARTBEAT);
  Decoded b = DecodeOne(route, Batch({beat}));
  ASSERT_TRUE(b.error.empty()) << b.error;
  EXPECT_EQ(b.msg.header.cmd(), CMD_HEARTBEAT);
}

// Found by review: the frame count a header implies was 4 + num_value_frames
// in 64 bits, so a peer claiming 2^64 - 2 value frames matched a message of
// the header frame alone, and the keys and lengths were read from frames
// that were not there (the receive thread, and so any node, crashed).
TEST(MessageTest, AValueFrameCountThatWrapsTheFrameCountIsRejected) {
  const Blob route = Blob::Copy("n0123", 5);
  for (const uint64_t claimed : {~uint64_t{0} - 1, ~uint64_t{0}, uint64_t{kMaxValueFrames} + 1}) {
    Message m = MakePush(1, {3});
    m.header.set_num_value_frames(claimed);
    const std::string header = m.header.SerializeAsString();
    std::vector<Blob> frames = {route, Blob::Copy(header.data(), header.size())};
    if (claimed == ~uint64_t{0}) frames.push_back(m.keys);  // 4 + 2^64 - 1 wraps to 3 frames
    const Decoded d = DecodeFrames(frames);
    EXPECT_NE(d.error.find(StrCat("claiming ", claimed, " value frames (at most 65536)")),
              std::string::npos)
        << claimed << ": " << d.error;
  }
}

TEST(MessageTest, MalformedBatchesOfOneAreRejected) {
  const Blob route = Blob::Copy("n0123", 5);
  const Blob good = Batch({MakePush(1, {3, 5})});
  ASSERT_TRUE(DecodeOne(route, good).error.empty());
  // The first error of whatever the frames decode to ("" when none).
  auto error = [&](const std::vector<Blob>& frames) -> std::string {
    if (!IsBatch(frames)) return DecodeFrames(frames).error;
    for (const Decoded& d : DecodeBatch(frames)) {
      if (!d.error.empty()) return d.error;
    }
    return "";
  };
  // Cut short anywhere: in the magic, the count, the envelope's length, its
  // header length, its header, the keys or the values.
  for (size_t cut :
       {size_t{3}, size_t{8}, size_t{12}, size_t{20}, size_t{26}, size_t{40}, good.size() - 4}) {
    EXPECT_FALSE(error({route, good.Slice(0, cut)}).empty()) << "cut at " << cut;
  }
  // A header length past the envelope's end.
  std::string bytes(good.data(), good.size());
  const uint32_t huge = 1u << 30;
  std::memcpy(&bytes[24], &huge, 4);
  const std::string e = error({route, Blob::Copy(bytes.data(), bytes.size())});
  EXPECT_NE(e.find("batched message of"), std::string::npos) << e;
  // Trailing bytes after the message.
  std::string longer(good.data(), good.size());
  longer += std::string(8, '\0');
  const std::string t = error({route, Blob::Copy(longer.data(), longer.size())});
  EXPECT_NE(t.find("bytes after its 1 messages"), std::string::npos) << t;
  // A batch frame followed by more frames is an ordinary message whose
  // header frame is not a PsHeader.
  EXPECT_FALSE(IsBatch({route, good, good}));
  EXPECT_FALSE(DecodeFrames({route, good, good}).error.empty());
}

TEST(MessageTest, BatchFrameCarriesItsMessagesInOrder) {
  const Blob route = Blob::Copy("n0123", 5);
  std::vector<Message> msgs = {MakePush(1, {3}), MakePush(1, {5, 7}, 2), MakePush(1, {1})};
  for (size_t i = 0; i < msgs.size(); ++i) msgs[i].header.set_request_id(100 + i);
  const std::vector<Blob> frames = {route, Batch(msgs)};
  ASSERT_TRUE(IsBatch(frames));
  EXPECT_FALSE(IsBatch({route, Blob::Copy(Envelope(msgs[0]).data(), Envelope(msgs[0]).size())}));
  std::vector<Decoded> got = DecodeBatch(frames);
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].error.empty()) << got[i].error;
    EXPECT_EQ(got[i].msg.header.request_id(), 100 + i);
    EXPECT_EQ(got[i].msg.route, "n0123");
    EXPECT_EQ(Floats(got[i].msg.values), Floats(msgs[i].values));
    EXPECT_TRUE(ValidateFrames(got[i].msg).ok()) << ValidateFrames(got[i].msg);
  }
}

TEST(MessageTest, MalformedBatchFramesAreRejectedWithoutReadingPastThem) {
  const Blob route = Blob::Copy("n0123", 5);
  std::vector<Message> msgs = {MakePush(1, {3}), MakePush(1, {5}), MakePush(1, {7})};
  const Blob good = Batch(msgs);
  auto decode = [&](const std::string& bytes) {
    return DecodeBatch({route, Blob::Copy(bytes.data(), bytes.size())});
  };
  std::string bytes(good.data(), good.size());
  // A count of 0 or past the limit.
  for (uint32_t count : {0u, kMaxBatch + 1}) {
    std::string b = bytes;
    std::memcpy(&b[8], &count, 4);
    std::vector<Decoded> d = decode(b);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_NE(d[0].error.find("says it holds"), std::string::npos) << d[0].error;
  }
  // A count larger than what follows: the three, then an overrun.
  {
    std::string b = bytes;
    const uint32_t count = 4;
    std::memcpy(&b[8], &count, 4);
    std::vector<Decoded> d = decode(b);
    ASSERT_EQ(d.size(), 4u);
    EXPECT_TRUE(d[2].error.empty());
    EXPECT_NE(d[3].error.find("overruns"), std::string::npos) << d[3].error;
  }
  // The second message's length pointing past the end: the first arrives,
  // nothing after the bad one is read.
  {
    std::string b = bytes;
    uint64_t first = 0;
    std::memcpy(&first, &b[16], 8);
    const uint64_t huge = uint64_t{1} << 40;
    std::memcpy(&b[16 + 8 + (first + 7) / 8 * 8], &huge, 8);
    std::vector<Decoded> d = decode(b);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_TRUE(d[0].error.empty()) << d[0].error;
    EXPECT_NE(d[1].error.find("message 1 of a batch of 3 overruns"), std::string::npos)
        << d[1].error;
  }
  // A garbled envelope in the middle: its error in its place, none after.
  {
    std::string b = bytes;
    uint64_t first = 0;
    std::memcpy(&first, &b[16], 8);
    const size_t second = 16 + 8 + (first + 7) / 8 * 8;
    const uint32_t hlen = 1u << 30;
    std::memcpy(&b[second + 8], &hlen, 4);
    std::vector<Decoded> d = decode(b);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_FALSE(d[1].error.empty());
  }
  // Bytes after the last message.
  {
    std::vector<Decoded> d = decode(bytes + std::string(8, '\0'));
    ASSERT_EQ(d.size(), 4u);
    EXPECT_NE(d[3].error.find("bytes after its 3 messages"), std::string::npos) << d[3].error;
  }
  // Too short for its count.
  std::vector<Decoded> d = decode(bytes.substr(0, 12));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_FALSE(d[0].error.empty());
}

TEST(MessageTest, BlobSliceSharesOwnership) {
  std::vector<char> bytes = {1, 2, 3, 4};
  Blob b = Blob::Copy(bytes.data(), bytes.size());
  Blob s = b.Slice(1, 2);
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s.data()[0], 2);
  EXPECT_EQ(b.owner().use_count(), 2);
}

}  // namespace
}  // namespace pstrain
