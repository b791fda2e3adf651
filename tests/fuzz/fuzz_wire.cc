// Messages as a node receives them, on either transport: decoding
// (DecodeFrames for ZeroMQ frames, DecodeBatch for a batch frame of small messages;
// DecodeQueued for a shared-memory queue entry), the frames' agreement with the header, and a
// server's validation of a data request, and what a server then reads of a valid 2-bit
// compressed push (each part's codes, dequantized). Nothing may crash, read out of bounds
// or loop.
#include <cstdint>
#include <vector>

#include "common/gradient_compression.h"
#include "net/message.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// The server's walk over a DTYPE_2BIT push (KVServer::HandleMessage, then each
// shard's DequantizeTwoBit), for a request ValidateDataRequest passed.
void ReadCompressedParts(const pstrain::Message& msg) {
  std::vector<float> out;
  size_t frame = 0, used = 0;
  for (size_t i = 0; i < msg.header.num_keys(); ++i) {
    while (used == msg.values[frame].size()) {
      ++frame;
      used = 0;
    }
    const uint32_t n = msg.len(i);
    out.resize(n);
    pstrain::DequantizeTwoBit(reinterpret_cast<const uint32_t*>(msg.values[frame].data() + used), n,
                              0.5f, out.data());
    used += pstrain::TwoBitBytes(n);
  }
}

void ValidateAsServers(const pstrain::Message& msg) {
  for (int rank : {0, 1, 7}) {
    if (pstrain::ValidateDataRequest(msg, rank).ok() && msg.header.dtype() == pstrain::DTYPE_2BIT) {
      ReadCompressedParts(msg);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pstrain;
  if (size == 0) return 0;
  Decoded d;
  if (data[0] & 1) {
    // A queue entry: 8-byte aligned, as blocks of the ring are.
    Blob env = Blob::Copy(data + 1, size - 1);
    d = DecodeQueued(env);
  } else {
    std::vector<Blob> frames;
    for (std::string_view part : fuzz::SplitParts(data + 1, size - 1)) {
      frames.push_back(Blob::Copy(part.data(), part.size()));
    }
    if (IsBatch(frames)) {
      for (const Decoded& one : DecodeBatch(frames)) {
        if (one.error.empty() && one.msg.header.cmd() == CMD_DATA && ValidateFrames(one.msg).ok()) {
          ValidateAsServers(one.msg);
        }
      }
      return 0;
    }
    d = DecodeFrames(frames);
  }
  if (!d.error.empty() || d.msg.header.cmd() != CMD_DATA) return 0;
  if (!ValidateFrames(d.msg).ok()) return 0;
  ValidateAsServers(d.msg);
  return 0;
}
