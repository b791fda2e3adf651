// Messages as a node receives them, on either transport: decoding
// (DecodeFrames for ZeroMQ frames, DecodeBatch for a batch frame of small messages;
// DecodeQueued for a shared-memory queue entry), the frames' agreement with the header, and a
// server's validation of a data request. Nothing may crash, read out of bounds or loop.
#include <cstdint>

#include "net/message.h"
#include "tests/fuzz/fuzz_util.h"

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
          for (int rank : {0, 1, 7}) (void)ValidateDataRequest(one.msg, rank);
        }
      }
      return 0;
    }
    d = DecodeFrames(frames);
  }
  if (!d.error.empty() || d.msg.header.cmd() != CMD_DATA) return 0;
  if (!ValidateFrames(d.msg).ok()) return 0;
  for (int rank : {0, 1, 7}) (void)ValidateDataRequest(d.msg, rank);
  return 0;
}
