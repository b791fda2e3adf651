// MXNet's 2-bit gradient compression through whole in-process jobs: the
// workers quantize every push with their residuals, each part a server gets
// on its own, the servers dequantize and apply exactly as a float push, and
// malformed compressed pushes get error replies from a server that goes on.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <random>
#include <vector>

#include "tests/test_util.h"
#include "tests/unit/inproc_job.h"
#include "worker/kv_client.h"

namespace pstrain {
namespace {

using testing::ExpectAllOk;
using testing::JobResult;
using testing::RunJob;
using testing::Soon;

constexpr float kThreshold = 0.5f;

ServerConfig CompressedConfig(bool sync) {
  ServerConfig c = testing::Config(sync, 1.0f);  // the test optimizer: w += sum of the pushes
  c.mutable_gradient_compression()->set_type(GradientCompressionConfig::TWO_BIT);
  c.mutable_gradient_compression()->set_threshold(kThreshold);
  return c;
}

// Worker w's gradient in round `round`: every worker can work out the others'.
std::vector<float> Gradient(int w, int round, size_t n) {
  std::mt19937 rng(1000 * w + round);
  std::normal_distribution<float> normal(0.0f, 0.6f);
  std::vector<float> g(n);
  for (float& x : g) x = normal(rng);
  return g;
}

// What MXNet's rule sends for `g` (+t, -t or 0 per element), moving the
// residual: written here from the rule, element by element, so that the
// expected sums do not depend on the codec under test.
std::vector<float> Sent(const std::vector<float>& g, std::vector<float>* residual) {
  std::vector<float> out(g.size(), 0.0f);
  for (size_t i = 0; i < g.size(); ++i) {
    float& r = (*residual)[i];
    r += g[i];
    if (r >= kThreshold) {
      out[i] = kThreshold;
      r -= kThreshold;
    } else if (r <= -kThreshold) {
      out[i] = -kThreshold;
      r += kThreshold;
    }
  }
  return out;
}

// The keys: a small one, one over MXNET_KVSTORE_BIGARRAY_BOUND (split over
// both servers at element 733261, not a multiple of 16: each part is
// quantized from its own start) and one of 1000.
const std::vector<KVClient::Key> kKeys = {5, 6, 7};
const std::vector<int64_t> kLens = {37, 1211 * 1211, 1000};

size_t Total() {
  size_t n = 0;
  for (int64_t l : kLens) n += static_cast<size_t>(l);
  return n;
}

std::vector<float> InitialValues() {
  std::vector<float> v(Total());
  for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(j % 7);
  return v;
}

// Every value equals `want` (sums of +-0.5 and small integers are exact).
Status ExpectValues(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  for (size_t j = 0; j < want.size(); ++j) {
    if (got[j] != want[j]) {
      return Status::Internal(
          StrCat(what, ": element ", j, " is ", got[j], ", expected ", want[j]));
    }
  }
  return Status::Ok();
}

// dist_sync, 3 rounds: push then pull, push+pull in one call, push then pull.
// After round i every worker pulls init + the sum over rounds <= i and over
// workers of what each worker's quantization sent.
Status SyncRounds(KVClient& kv) {
  const int W = kv.num_workers();
  const size_t n = Total();
  RETURN_IF_ERROR(kv.SetServerConfig(CompressedConfig(true), Soon()));
  if (!kv.gradient_compression().enabled() || kv.gradient_compression().threshold != kThreshold) {
    return Status::Internal("the client does not compress after SetServerConfig");
  }
  std::vector<float> expect = InitialValues(), got(n);
  RETURN_IF_ERROR(kv.Wait(kv.Init(kKeys, kLens, expect.data()), Soon()));
  RETURN_IF_ERROR(kv.Barrier(Soon()));
  std::vector<std::vector<float>> residuals(W, std::vector<float>(n, 0.0f));
  for (int round = 1; round <= 3; ++round) {
    for (int w = 0; w < W; ++w) {
      const std::vector<float> sent = Sent(Gradient(w, round, n), &residuals[w]);
      for (size_t j = 0; j < n; ++j) expect[j] += sent[j];
    }
    const std::vector<float> grad = Gradient(kv.rank(), round, n);
    if (round == 2) {
      RETURN_IF_ERROR(kv.Wait(kv.PushPull(kKeys, kLens, grad.data(), got.data()), Soon()));
    } else {
      auto push = kv.Push(kKeys, kLens, grad.data());
      auto pull = kv.Pull(kKeys, kLens, got.data());
      RETURN_IF_ERROR(kv.Wait(push, Soon()));
      RETURN_IF_ERROR(kv.Wait(pull, Soon()));
    }
    RETURN_IF_ERROR(ExpectValues(got, expect, StrCat("round ", round)));
  }
  return Status::Ok();
}

TEST(CompressionClusterTest, DistSyncAppliesTheDequantizedSumOverTcpAndSharedMemory) {
  for (int64_t shm : {int64_t{0}, int64_t{16} << 20}) {
    SCOPED_TRACE(shm > 0 ? "shared memory" : "tcp");
    ExpectAllOk(RunJob(2, 2, SyncRounds, {}, nullptr, -1, "127.0.0.1", shm));
  }
}

// Balanced placement cuts the big key into chunks of 1000 elements or so
// (999 or 1000 per chunk: most parts start off multiples of 16, on both servers).
TEST(CompressionClusterTest, DistSyncWithManyPartsPerKey) {
  KVClientOptions ko;
  ko.placement = Placement::kBalanced;
  ko.chunk_elems = 1000;
  ExpectAllOk(RunJob(2, 2, SyncRounds, ko));
}

// dist_async: every push applied at once. Each worker pushes 4 gradients
// (its residual carried across them); in the end everyone pulls init + all.
TEST(CompressionClusterTest, DistAsyncAppliesEveryDequantizedPush) {
  ExpectAllOk(RunJob(2, 2, [](KVClient& kv) -> Status {
    const int W = kv.num_workers();
    const size_t n = Total();
    RETURN_IF_ERROR(kv.SetServerConfig(CompressedConfig(false), Soon()));
    std::vector<float> expect = InitialValues(), got(n);
    RETURN_IF_ERROR(kv.Wait(kv.Init(kKeys, kLens, expect.data()), Soon()));
    RETURN_IF_ERROR(kv.Barrier(Soon()));
    constexpr int kPushes = 4;
    std::vector<std::vector<float>> grads;
    std::vector<KVClient::Ticket> tickets;
    for (int i = 1; i <= kPushes; ++i) {
      grads.push_back(Gradient(kv.rank(), i, n));  // kept until the pushes are answered
      tickets.push_back(kv.Push(kKeys, kLens, grads.back().data()));
    }
    for (auto t : tickets) RETURN_IF_ERROR(kv.Wait(t, Soon()));
    RETURN_IF_ERROR(kv.Barrier(Soon()));
    for (int w = 0; w < W; ++w) {
      std::vector<float> residual(n, 0.0f);
      for (int i = 1; i <= kPushes; ++i) {
        const std::vector<float> sent = Sent(Gradient(w, i, n), &residual);
        for (size_t j = 0; j < n; ++j) expect[j] += sent[j];
      }
    }
    RETURN_IF_ERROR(kv.Wait(kv.Pull(kKeys, kLens, got.data()), Soon()));
    return ExpectValues(got, expect, "after every async push");
  }));
}

// A CMD_DATA request built by hand: one part of key `key` on `server`.
Message RawRequest(int server, uint64_t key, uint32_t len, size_t value_bytes, bool init = false) {
  Message m;
  PsHeader& h = m.header;
  h.set_init(init);
  h.set_push(!init);
  h.set_dtype(DTYPE_2BIT);
  h.set_num_keys(1);
  const uint64_t wire = WireKey(server, key, 0);
  m.keys = Blob::Copy(&wire, sizeof(wire));
  m.lens = Blob::Copy(&len, sizeof(len));
  std::vector<uint32_t> words((value_bytes + 3) / 4, 0xC0C0C0C0u);
  m.values.push_back(Blob::Copy(words.data(), value_bytes));
  h.set_num_value_frames(1);
  h.set_value_bytes(value_bytes);
  return m;
}

Status ExpectError(KVClient& kv, int server, Message msg, StatusCode code,
                   const std::string& text) {
  const Status s = kv.Wait(kv.TEST_SendRaw(server, std::move(msg)), Soon());
  if (s.code() != code || s.message().find(text) == std::string::npos) {
    return Status::Internal(
        StrCat("expected ", StatusCodeName(code), " with '", text, "', got: ", s.ToString()));
  }
  return Status::Ok();
}

// Malformed compressed pushes get error replies naming the key and the sizes;
// the server keeps serving both workers' compressed rounds correctly.
TEST(CompressionClusterTest, MalformedCompressedPushesGetErrorsAndTheServerGoesOn) {
  ExpectAllOk(RunJob(2, 2, [](KVClient& kv) -> Status {
    const int W = kv.num_workers();
    const uint64_t key = 9;
    const uint32_t n = 100;  // 7 words: 28 bytes of codes
    const int server = static_cast<int>((key * 9973) % 2);
    RETURN_IF_ERROR(kv.SetServerConfig(CompressedConfig(true), Soon()));
    std::vector<float> expect(n, 1.0f), got(n);
    RETURN_IF_ERROR(kv.Wait(kv.Init({key}, {n}, expect.data()), Soon()));
    RETURN_IF_ERROR(kv.Barrier(Soon()));
    if (kv.rank() == 0) {
      RETURN_IF_ERROR(ExpectError(kv, server, RawRequest(server, key, n, 24),
                                  StatusCode::kInvalidArgument,
                                  "2-bit push of key 9 part 0: 100 elements need 28 bytes of "
                                  "codes, its value frame has 24 left"));
      RETURN_IF_ERROR(ExpectError(kv, server, RawRequest(server, key, n, 32),
                                  StatusCode::kInvalidArgument,
                                  "the lens need 28 bytes of codes, the values hold 32"));
      RETURN_IF_ERROR(ExpectError(kv, server, RawRequest(server, key, n, 28, /*init=*/true),
                                  StatusCode::kInvalidArgument, "for pushes only, not init"));
      // Well formed, but not the stored length.
      RETURN_IF_ERROR(ExpectError(kv, server, RawRequest(server, key, 64, 16),
                                  StatusCode::kInvalidArgument,
                                  "key 9 part 0: request has 64 elements, stored value has 100"));
      // A key of the other server.
      RETURN_IF_ERROR(ExpectError(kv, server, RawRequest(1 - server, key, n, 28),
                                  StatusCode::kInvalidArgument, "belongs to server rank"));
    }
    RETURN_IF_ERROR(kv.Barrier(Soon()));
    std::vector<std::vector<float>> residuals(W, std::vector<float>(n, 0.0f));
    for (int round = 1; round <= 2; ++round) {
      for (int w = 0; w < W; ++w) {
        const std::vector<float> sent = Sent(Gradient(w, round, n), &residuals[w]);
        for (uint32_t j = 0; j < n; ++j) expect[j] += sent[j];
      }
      const std::vector<float> grad = Gradient(kv.rank(), round, n);
      RETURN_IF_ERROR(kv.Wait(kv.PushPull({key}, {n}, grad.data(), got.data()), Soon()));
      RETURN_IF_ERROR(ExpectValues(got, expect, StrCat("round ", round, " after the bad pushes")));
    }
    return Status::Ok();
  }));
}

// Servers configured without compression refuse a compressed push by name
// and go on with float32 ones.
TEST(CompressionClusterTest, ACompressedPushToServersWithoutCompressionIsRefused) {
  ExpectAllOk(RunJob(1, 1, [](KVClient& kv) -> Status {
    RETURN_IF_ERROR(kv.SetServerConfig(testing::Config(true, 1.0f), Soon()));
    if (kv.gradient_compression().enabled()) return Status::Internal("compressing unasked");
    std::vector<float> v(32, 1.0f), got(32);
    RETURN_IF_ERROR(kv.Wait(kv.Init({4}, {32}, v.data()), Soon()));
    RETURN_IF_ERROR(ExpectError(kv, 0, RawRequest(0, 4, 32, 8), StatusCode::kFailedPrecondition,
                                "2-bit compressed push of key 4 part 0 from worker rank 0 (id 9), "
                                "but this job's servers were configured without gradient "
                                "compression"));
    RETURN_IF_ERROR(kv.Wait(kv.PushPull({4}, {32}, v.data(), got.data()), Soon()));
    return got[31] == 2.0f ? Status::Ok() : Status::Internal(StrCat("got ", got[31]));
  }));
}

// Callbacks may push again (they run on the calling, receive or sender
// thread, never under the residuals' lock): a chain of compressed pushes, each
// issued by the previous one's callback, all applied once.
TEST(CompressionClusterTest, CallbacksMayIssueCompressedPushes) {
  ExpectAllOk(RunJob(1, 1, [](KVClient& kv) -> Status {
    RETURN_IF_ERROR(kv.SetServerConfig(CompressedConfig(false), Soon()));
    const size_t n = 50;
    std::vector<float> expect(n, 0.0f), got(n);
    RETURN_IF_ERROR(kv.Wait(kv.Init({3}, {50}, expect.data()), Soon()));
    constexpr int kPushes = 30;
    const std::vector<float> grad = Gradient(0, 1, n);
    std::mutex mu;
    std::condition_variable cv;
    int left = kPushes;
    Status chain;
    std::function<void(const Status&)> next = [&](const Status& s) {
      {
        std::lock_guard<std::mutex> l(mu);
        if (!s.ok()) chain = s;
        if (--left == 0 || !s.ok()) {
          left = 0;
          cv.notify_all();
          return;
        }
      }
      kv.Push({3}, {50}, grad.data(), 0, next);
    };
    kv.Push({3}, {50}, grad.data(), 0, next);
    {
      std::unique_lock<std::mutex> l(mu);
      if (!cv.wait_for(l, std::chrono::seconds(20), [&] { return left == 0; })) {
        return Status::DeadlineExceeded("the callback chain stalled");
      }
    }
    RETURN_IF_ERROR(chain);
    std::vector<float> residual(n, 0.0f);
    for (int i = 0; i < kPushes; ++i) {
      const std::vector<float> sent = Sent(grad, &residual);
      for (size_t j = 0; j < n; ++j) expect[j] += sent[j];
    }
    RETURN_IF_ERROR(kv.Wait(kv.Pull({3}, {50}, got.data()), Soon()));
    return ExpectValues(got, expect, "after the chain");
  }));
}

// Quantized, a NaN would reach the servers as 0 and stay in the residual:
// the push fails on the worker, naming the key.
TEST(CompressionClusterTest, ANanGradientFailsTheCompressedPushNamingTheKey) {
  ExpectAllOk(RunJob(1, 1, [](KVClient& kv) -> Status {
    RETURN_IF_ERROR(kv.SetServerConfig(CompressedConfig(true), Soon()));
    std::vector<float> v(64, 1.0f), got(64);
    RETURN_IF_ERROR(kv.Wait(kv.Init({12, 13}, {32, 32}, v.data()), Soon()));
    v[40] = std::nanf("");
    const Status s = kv.Wait(kv.PushPull({12, 13}, {32, 32}, v.data(), got.data()), Soon());
    if (s.code() != StatusCode::kFailedPrecondition ||
        s.message().find("the gradient pushed for key 13 (plus its 2-bit compression residual) "
                         "holds NaN or Inf") == std::string::npos) {
      return Status::Internal(StrCat("NaN push: ", s.ToString()));
    }
    return Status::Ok();
  }));
}

// Found by review: a 2-bit push sends all of a call's codes for a server as
// one frame, so a call of many keys could pass a frame over
// PSTRAIN_MAX_MESSAGE_BYTES (dropped with the connection, silently) though
// every part was within it. Refused before any residual moves; a smaller
// call still goes through.
TEST(CompressionClusterTest, A2BitPushOverTheFrameLimitIsRefusedBeforeItsResidualsMove) {
  testing::JobSpec spec;
  spec.tweak_all = [](ClusterOptions* o) { o->max_message_bytes = 65536; };
  JobResult r = testing::RunJobWith(
      1, 1,
      [](KVClient& kv) -> Status {
        RETURN_IF_ERROR(kv.SetServerConfig(CompressedConfig(true), Soon()));
        std::vector<uint64_t> keys;
        std::vector<int64_t> lens;
        for (int k = 0; k < 20; ++k) {  // 20 x 16000 floats: 20 x 4000 bytes of codes
          keys.push_back(100 + k);
          lens.push_back(16000);
        }
        std::vector<float> zeros(20 * 16000, 0.0f), grad(20 * 16000, 0.3f), got(20 * 16000);
        RETURN_IF_ERROR(kv.Wait(kv.Init(keys, lens, zeros.data()), Soon()));
        Status s = kv.Wait(kv.Push(keys, lens, grad.data()), Soon());
        if (s.code() != StatusCode::kInvalidArgument ||
            s.message().find("has 80000 bytes of codes for server rank 0, over "
                             "PSTRAIN_MAX_MESSAGE_BYTES=65536") == std::string::npos) {
          return Status::Internal(StrCat("an oversized 2-bit push: ", s.ToString()));
        }
        // 0.3 is under the threshold: had the refused push moved the
        // residuals, this one (0.3 + 0.3) would send +t.
        std::vector<uint64_t> one = {keys[0]};
        RETURN_IF_ERROR(kv.Wait(kv.PushPull(one, {16000}, grad.data(), got.data()), Soon()));
        return ExpectValues(std::vector<float>(got.begin(), got.begin() + 16000),
                            std::vector<float>(16000, 0.0f), "after one push of 0.3");
      },
      spec);
  ExpectAllOk(r);
}

}  // namespace
}  // namespace pstrain
