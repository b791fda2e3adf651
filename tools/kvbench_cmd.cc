// `pstrain kvbench`: push/pull throughput of the parameter server, run on every
// worker of a job (the scheduler and servers run the same command; see
// tools/cluster_role.h). For each configuration (tensor size x tensors per step
// x mode) it prints one table row and one `kvbench: key=value ...` line, next to
// the same transfer over a raw ZeroMQ DEALER/ROUTER pair measured in the same
// run (the ceiling). --verify runs MXNet's dist_sync conformance check
// (mxnet_facts.md 1.11) on a small and a sharded key, and a dist_async check
// that every push is applied exactly once; any mismatch exits 1.
// --shapes-of MODEL moves exactly the parameter arrays of a zoo model instead,
// one call per array as a training loop issues them (MXNet's workers push and
// pull each parameter by itself), so the figures are those training sees.
#include <gflags/gflags.h>
#include <zmq.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "models/models.h"
#include "net/cluster_node.h"
#include "tools/cluster_role.h"
#include "tools/commands.h"
#include "worker/kv_client.h"

DEFINE_string(tensor_bytes, "4096,1048576",
              "comma list: bytes per tensor, one per configuration (paired with --tensors)");
DEFINE_string(tensors, "64,16", "comma list: tensors per step, paired with --tensor-bytes");
DEFINE_string(mode, "pushpull,sync",
              "comma list of modes: sync (dist_sync push then pull), async (dist_async push "
              "then pull), pushpull (dist_sync, one round trip)");
DEFINE_int32(iters, 300, "timed steps per configuration, over all rounds (plus 10% warm-up)");
DEFINE_string(calls, "auto",
              "KV calls per step: step (one call with every tensor), tensor (one call per "
              "tensor, all issued, then all waited), auto (tensor for tensors of 64 KB or more)");
DEFINE_int32(rounds, 3,
             "the ceiling and the KV store alternate this many times; each reports its best");
DEFINE_int32(ceiling_iters, -1, "round trips of the raw ZeroMQ ceiling per round (-1: as KV)");
DEFINE_bool(verify, false,
            "run MXNet's dist_sync conformance check and a dist_async exactly-once check "
            "instead of the benchmark; exit 1 on a mismatch");
DEFINE_int32(verify_rounds, 5, "rounds of the --verify checks");
DEFINE_string(shapes_of, "",
              "comma list of zoo models (mlp, lenet, inception-bn-28-small, inception-bn, "
              "resnet-50, inception-v3, ...): one configuration per model and mode that pushes "
              "and pulls exactly its parameter arrays, one call per array; replaces "
              "--tensor-bytes and --tensors");

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

StatusOr<std::vector<int64_t>> ParseList(const std::string& flag, const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0) {
      return Status::InvalidArgument(
          StrCat("--", flag, ": '", item, "' is not a positive integer"));
    }
    out.push_back(v);
  }
  if (out.empty()) return Status::InvalidArgument(StrCat("--", flag, " is empty"));
  return out;
}

struct Config {
  int64_t tensor_bytes = 0;
  int64_t tensors = 0;
  std::string mode;
  int64_t calls = 1;  // KV calls per step; tensors are split evenly over them
  // --shapes-of: the model, and its arrays' sizes in elements (tensor_bytes is
  // then their mean, tensors their count, one call per array).
  std::string model;
  std::vector<int64_t> sizes;
};

// The parameter arrays (elements each, in key order) of zoo model `spec`:
// a model name, with "-<layers>" for resnet ("resnet-50").
StatusOr<std::vector<int64_t>> ModelArraySizes(const std::string& spec) {
  ModelOptions mo;
  mo.name = spec;
  const size_t dash = spec.rfind('-');
  if (spec.rfind("resnet-", 0) == 0 && dash != std::string::npos) {
    mo.name = "resnet";
    char* end = nullptr;
    const long layers = std::strtol(spec.c_str() + dash + 1, &end, 10);
    if (*end != '\0' || layers <= 0) {
      return Status::InvalidArgument(StrCat("--shapes-of: '", spec, "': expected resnet-<layers>"));
    }
    mo.num_layers = static_cast<int>(layers);
  }
  auto graph = BuildModel(mo);
  if (!graph.ok()) return graph.status().WithContext(StrCat("--shapes-of ", spec));
  std::vector<int64_t> sizes;
  for (const ParamInfo& p : graph->params()) sizes.push_back(p.shape.num_elements());
  if (sizes.empty())
    return Status::InvalidArgument(StrCat("--shapes-of: ", spec, " has no parameters"));
  return sizes;
}

struct Result {
  Config cfg;
  double steps_per_s = 0;
  double pairs_per_s = 0;
  double payload_gbps = 0;
  double ceiling_gbps = 0;
  // How this worker's values travelled: "shm" (shared memory with co-located
  // servers, net/shm_arena.h), "tcp", or "shm(1/3)+tcp" (the servers on this
  // host, here 1 of 3, in shared memory, the others over TCP).
  std::string transport = "tcp";
};

// Round trips of one step's values over a raw DEALER -> ROUTER echo on
// 127.0.0.1 in `calls` messages, framed as the KV store frames them (a small
// header, then one frame per tensor of 64 KB or more, else one frame for all),
// zero-copy both ways and without the copy into the caller's buffer that a
// pull does. Returns GB/s of
// payload (both directions). Stops early with the job's failure if `node`
// learns of one.
StatusOr<double> MeasureCeiling(int64_t tensor_bytes, int64_t tensors, int64_t calls, int iters,
                                const ClusterNode& node) {
  // `calls` messages per step, each with tensors / calls tensors, all sent
  // before the replies are read (as the KV store's calls are issued).
  const int64_t per_call = tensors / calls;
  const int64_t frame_bytes = tensor_bytes >= 64 * 1024 ? tensor_bytes : tensor_bytes * per_call;
  const int64_t frames = tensor_bytes * per_call / frame_bytes;
  void* ctx = zmq_ctx_new();
  void* router = zmq_socket(ctx, ZMQ_ROUTER);
  int linger = 0;
  zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof(linger));
  if (zmq_bind(router, "tcp://127.0.0.1:*") != 0) {
    zmq_close(router);
    zmq_ctx_term(ctx);
    return Status::IOError(StrCat("ceiling: bind failed: ", zmq_strerror(zmq_errno())));
  }
  char endpoint[256] = {0};
  size_t len = sizeof(endpoint);
  zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, endpoint, &len);
  const int total = iters + std::max(1, iters / 10);
  std::thread echo([router, total = total * calls, frames] {
    // Routing id, header, payload frames: forwarded back as received (no copy).
    std::vector<zmq_msg_t> parts(static_cast<size_t>(frames) + 2);
    for (int i = 0; i < total; ++i) {
      for (zmq_msg_t& m : parts) zmq_msg_init(&m);
      bool ok = true;
      for (zmq_msg_t& m : parts) ok = ok && zmq_msg_recv(&m, router, 0) >= 0;
      for (size_t p = 0; p < parts.size() && ok; ++p) {
        ok = zmq_msg_send(&parts[p], router, p + 1 < parts.size() ? ZMQ_SNDMORE : 0) >= 0;
      }
      for (zmq_msg_t& m : parts) zmq_msg_close(&m);
      if (!ok) return;
    }
  });
  void* dealer = zmq_socket(ctx, ZMQ_DEALER);
  zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof(linger));
  int timeout = 30000;
  zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
  zmq_connect(dealer, endpoint);
  std::vector<char> payload(static_cast<size_t>(tensor_bytes * tensors), 1);
  char header[64] = {0};
  Clock::time_point start;
  bool ok = true;
  Status health;
  for (int i = 0; i < total && ok; ++i) {
    if (i == total - iters) start = Clock::now();
    if (i % 64 == 0 && !(health = node.health()).ok()) {
      ok = false;
      break;
    }
    for (int64_t c = 0; c < calls; ++c) {
      zmq_msg_t m;
      zmq_msg_init_size(&m, sizeof(header));
      std::memcpy(zmq_msg_data(&m), header, sizeof(header));
      zmq_msg_send(&m, dealer, ZMQ_SNDMORE);
      for (int64_t f = 0; f < frames; ++f) {
        char* at = payload.data() + (c * frames + f) * frame_bytes;
        zmq_msg_init_data(&m, at, frame_bytes, nullptr, nullptr);
        zmq_msg_send(&m, dealer, f + 1 < frames ? ZMQ_SNDMORE : 0);
      }
    }
    for (int64_t c = 0; c < calls && ok; ++c) {
      for (;;) {
        zmq_msg_t r;
        zmq_msg_init(&r);
        if (zmq_msg_recv(&r, dealer, 0) < 0) {
          ok = false;
          zmq_msg_close(&r);
          break;
        }
        const bool more = zmq_msg_more(&r);
        zmq_msg_close(&r);
        if (!more) break;
      }
    }
  }
  const double secs = Seconds(start, Clock::now());
  zmq_close(dealer);
  if (!ok) {
    // The echo thread may be blocked in recv: shutting the context down wakes it.
    zmq_ctx_shutdown(ctx);
  }
  echo.join();
  zmq_close(router);
  zmq_ctx_term(ctx);
  if (!health.ok()) return health;
  if (!ok) return Status::DeadlineExceeded("ceiling: echo did not answer within 30 s");
  return 2.0 * static_cast<double>(tensor_bytes * tensors) * iters / secs / 1e9;
}

// Each configuration of one kvbench job gets the next generation (servers
// refuse a different configuration of the same generation).
ServerConfig MakeConfig(bool sync, float rescale, uint32_t* generation) {
  ServerConfig c;
  c.set_generation((*generation)++);
  c.set_sync_mode(sync);
  c.mutable_optimizer()->set_type(OptimizerConfig::TEST);
  c.mutable_optimizer()->set_rescale_grad(rescale);
  return c;
}

Deadline BarrierDeadline(const ClusterOptions& o) {
  return Deadline::InMillis(o.barrier_timeout_ms);
}
Deadline RequestDeadline(const ClusterOptions& o) {
  return Deadline::InMillis(o.request_timeout_ms);
}

StatusOr<Result> RunConfig(KVClient* kv, const Config& cfg, uint64_t key_base, int iters,
                           uint32_t* generation) {
  const ClusterOptions& o = kv->node()->options();
  const int64_t elems = std::max<int64_t>(1, cfg.tensor_bytes / 4);
  std::vector<KVClient::Key> keys;
  std::vector<int64_t> lens;
  for (int64_t i = 0; i < cfg.tensors; ++i) {
    keys.push_back(key_base + i);
    lens.push_back(cfg.sizes.empty() ? elems : cfg.sizes[static_cast<size_t>(i)]);
  }
  int64_t total_elems = 0;
  for (int64_t n : lens) total_elems += n;
  const size_t total = static_cast<size_t>(total_elems);
  std::vector<float> weights(total, 1.0f), grads(total, 0.001f);
  RETURN_IF_ERROR(kv->Barrier(BarrierDeadline(o)));
  RETURN_IF_ERROR(
      kv->SetServerConfig(MakeConfig(cfg.mode != "async", 1e-3f, generation), RequestDeadline(o)));
  RETURN_IF_ERROR(kv->Wait(kv->Init(keys, lens, weights.data()), RequestDeadline(o)));
  RETURN_IF_ERROR(kv->Barrier(BarrierDeadline(o)));

  Result r;
  r.cfg = cfg;
  // Ceiling and KV store alternate in rounds (the machine may be shared and
  // noisy); each reports its best round.
  const int rounds = std::max(1, FLAGS_rounds);
  const int per_round = std::max(1, iters / rounds);
  const int ceiling_iters = FLAGS_ceiling_iters > 0 ? FLAGS_ceiling_iters : per_round;
  const int warmup = std::max(1, per_round / 10);
  // One call per step with every tensor, or (big tensors) one call per tensor,
  // as a training loop pushes each parameter when its gradient is ready.
  const int64_t calls = cfg.calls;
  const int64_t per_call = cfg.tensors / calls;
  std::vector<std::vector<KVClient::Key>> call_keys(calls);
  std::vector<std::vector<int64_t>> call_lens(calls);
  std::vector<size_t> call_at(calls);  // where each call's values start
  size_t at = 0;
  for (int64_t c = 0; c < calls; ++c) {
    call_keys[c].assign(keys.begin() + c * per_call, keys.begin() + (c + 1) * per_call);
    call_lens[c].assign(lens.begin() + c * per_call, lens.begin() + (c + 1) * per_call);
    call_at[c] = at;
    for (int64_t n : call_lens[c]) at += static_cast<size_t>(n);
  }
  std::vector<KVClient::Ticket> tickets;
  const int64_t shm_before = kv->node()->shm_messages();
  for (int round = 0; round < rounds; ++round) {
    // The ceiling is the better of two raw framings: one message per step, and
    // one per call as the KV store sends them.
    // A model's mix: the ceiling moves the same bytes as one message per step.
    ASSIGN_OR_RETURN(double ceiling,
                     cfg.sizes.empty()
                         ? MeasureCeiling(elems * 4, cfg.tensors, 1, ceiling_iters, *kv->node())
                         : MeasureCeiling(total_elems * 4, 1, 1, ceiling_iters, *kv->node()));
    if (calls > 1 && cfg.sizes.empty()) {
      ASSIGN_OR_RETURN(double per_call,
                       MeasureCeiling(elems * 4, cfg.tensors, calls, ceiling_iters, *kv->node()));
      ceiling = std::max(ceiling, per_call);
    }
    r.ceiling_gbps = std::max(r.ceiling_gbps, ceiling);
    RETURN_IF_ERROR(kv->Barrier(BarrierDeadline(o)));
    Clock::time_point start;
    for (int step = 0; step < warmup + per_round; ++step) {
      if (step == warmup) start = Clock::now();
      tickets.clear();
      for (int64_t c = 0; c < calls; ++c) {
        const size_t at = call_at[c];
        if (cfg.mode == "pushpull") {
          tickets.push_back(
              kv->PushPull(call_keys[c], call_lens[c], grads.data() + at, weights.data() + at));
        } else {
          tickets.push_back(kv->Push(call_keys[c], call_lens[c], grads.data() + at));
          tickets.push_back(kv->Pull(call_keys[c], call_lens[c], weights.data() + at));
        }
      }
      for (auto t : tickets) RETURN_IF_ERROR(kv->Wait(t, RequestDeadline(o)));
    }
    r.steps_per_s = std::max(r.steps_per_s, per_round / Seconds(start, Clock::now()));
    RETURN_IF_ERROR(kv->Barrier(BarrierDeadline(o)));
  }
  if (kv->node()->shm_messages() > shm_before) {
    // Values take shared memory only to servers on this host (ThisHost in
    // net/shm_arena.h); the others are reached over TCP.
    int shared = 0;
    const int servers = kv->num_servers();
    for (int s = 0; s < servers; ++s) shared += kv->node()->SharesMemoryWith(ServerId(s)) ? 1 : 0;
    r.transport = shared == servers ? "shm" : StrCat("shm(", shared, "/", servers, ")+tcp");
  }
  r.pairs_per_s = r.steps_per_s * cfg.tensors;
  r.payload_gbps = 2.0 * static_cast<double>(total_elems * 4) * r.steps_per_s / 1e9;
  RETURN_IF_ERROR(kv->Barrier(BarrierDeadline(o)));
  return r;
}

Status CheckAll(const std::vector<float>& v, float expect, const std::string& what) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != expect) {
      return Status::Internal(
          StrCat("verify: ", what, ": element ", i, " is ", v[i], ", expected ", expect));
    }
  }
  return Status::Ok();
}

// mxnet_facts.md 1.11: keys start at 1; TEST optimizer with rate 2; rank r
// pushes (r+1) each round; after round i everyone pulls 1 + 2 * W(W+1)/2 * i.
Status Verify(KVClient* kv, int rounds, uint32_t* generation) {
  const ClusterOptions& o = kv->node()->options();
  const int W = kv->num_workers();
  const float mine = static_cast<float>(kv->rank() + 1);
  const std::vector<KVClient::Key> keys = {900000, 900001};
  const std::vector<int64_t> lens = {2 * 3, 1200 * 1200};
  const size_t total = lens[0] + lens[1];
  std::vector<float> ones(total, 1.0f), grad(total, mine), got(total, 0.0f);

  RETURN_IF_ERROR(kv->Barrier(BarrierDeadline(o)));
  RETURN_IF_ERROR(kv->SetServerConfig(MakeConfig(true, 2.0f, generation), RequestDeadline(o)));
  RETURN_IF_ERROR(kv->Wait(kv->Init(keys, lens, ones.data()), RequestDeadline(o)));
  RETURN_IF_ERROR(kv->Barrier(BarrierDeadline(o)));
  for (int i = 1; i <= rounds; ++i) {
    auto push = kv->Push(keys, lens, grad.data());
    auto pull = kv->Pull(keys, lens, got.data());
    RETURN_IF_ERROR(kv->Wait(push, RequestDeadline(o)));
    RETURN_IF_ERROR(kv->Wait(pull, RequestDeadline(o)));
    const float expect = 1.0f + 2.0f * W * (W + 1) / 2.0f * i;
    RETURN_IF_ERROR(CheckAll(got, expect, StrCat("dist_sync round ", i)));
  }
  std::printf(
      "kvbench: verify dist_sync ok: %d rounds, %d workers, keys of 6 and 1440000 "
      "elements, final value %g\n",
      rounds, W, got[0]);

  // dist_async: every push applied exactly once (TEST optimizer, rate 1).
  const std::vector<KVClient::Key> akeys = {900002, 900003};
  RETURN_IF_ERROR(kv->Barrier(BarrierDeadline(o)));
  RETURN_IF_ERROR(kv->SetServerConfig(MakeConfig(false, 1.0f, generation), RequestDeadline(o)));
  RETURN_IF_ERROR(kv->Wait(kv->Init(akeys, lens, ones.data()), RequestDeadline(o)));
  RETURN_IF_ERROR(kv->Barrier(BarrierDeadline(o)));
  for (int i = 0; i < rounds; ++i) {
    RETURN_IF_ERROR(kv->Wait(kv->Push(akeys, lens, grad.data()), RequestDeadline(o)));
  }
  RETURN_IF_ERROR(kv->Barrier(BarrierDeadline(o)));
  RETURN_IF_ERROR(kv->Wait(kv->Pull(akeys, lens, got.data()), RequestDeadline(o)));
  const float expect = 1.0f + static_cast<float>(rounds) * W * (W + 1) / 2.0f;
  RETURN_IF_ERROR(CheckAll(got, expect, "dist_async"));
  std::printf(
      "kvbench: verify dist_async ok: %d pushes per worker applied exactly once, "
      "final value %g\n",
      rounds, got[0]);
  return kv->Barrier(BarrierDeadline(o));
}

// What the flags ask for, checked before the job starts: a typo fails every
// process at once, not after all have registered.
struct BenchPlan {
  std::vector<int64_t> bytes, counts;  // --tensor-bytes, --tensors
  std::vector<std::string> modes;
  std::vector<std::pair<std::string, std::vector<int64_t>>> models;  // --shapes-of
};

StatusOr<BenchPlan> PlanFromFlags() {
  BenchPlan plan;
  ASSIGN_OR_RETURN(plan.bytes, ParseList("tensor-bytes", FLAGS_tensor_bytes));
  ASSIGN_OR_RETURN(plan.counts, ParseList("tensors", FLAGS_tensors));
  if (plan.bytes.size() != plan.counts.size()) {
    return Status::InvalidArgument(StrCat("--tensor-bytes has ", plan.bytes.size(),
                                          " entries and --tensors ", plan.counts.size(),
                                          ": they need as many"));
  }
  for (int64_t b : plan.bytes) {
    if (b % 4 != 0) {  // float32 tensors: the table would show bytes never sent
      return Status::InvalidArgument(
          StrCat("--tensor-bytes: ", b, " is not a whole number of float32 values"));
    }
  }
  std::stringstream ss(FLAGS_mode);
  std::string m;
  while (std::getline(ss, m, ',')) {
    if (m != "sync" && m != "async" && m != "pushpull") {
      return Status::InvalidArgument(StrCat("--mode: '", m, "' is not sync, async or pushpull"));
    }
    plan.modes.push_back(m);
  }
  if (plan.modes.empty()) {
    return Status::InvalidArgument("--mode is empty: give sync, async and/or pushpull");
  }
  if (FLAGS_verify && FLAGS_verify_rounds < 1) {
    return Status::InvalidArgument(StrCat("--verify-rounds=", FLAGS_verify_rounds,
                                          " must be >= 1 (a check of no round checks nothing)"));
  }
  if (FLAGS_calls != "step" && FLAGS_calls != "tensor" && FLAGS_calls != "auto") {
    return Status::InvalidArgument(
        StrCat("--calls: '", FLAGS_calls, "' is not step, tensor or auto"));
  }
  if (!FLAGS_shapes_of.empty()) {
    std::stringstream ms(FLAGS_shapes_of);
    std::string name;
    while (std::getline(ms, name, ',')) {
      ASSIGN_OR_RETURN(std::vector<int64_t> sizes, ModelArraySizes(name));
      plan.models.emplace_back(name, std::move(sizes));
    }
  }
  return plan;
}

int RunWorker(const JobEnv& env, const BenchPlan& plan) {
  auto node = ClusterNode::Create(ClusterOptionsFromJobEnv(env));
  if (!node.ok()) {
    LOG(ERROR) << "worker: " << node.status();
    return 1;
  }
  KVClient kv(node->get(), KVClientOptionsFromJobEnv(env));
  auto fail = [&](const Status& s) {
    LOG(ERROR) << (*node)->Self() << ": " << s;
    (*node)->Fail(s);
    return 1;
  };
  Status s = kv.Start();
  if (!s.ok()) return fail(s);
  uint32_t generation = 0;
  if (FLAGS_verify) {
    s = Verify(&kv, FLAGS_verify_rounds, &generation);
    if (!s.ok()) return fail(s);
  } else {
    const std::vector<std::string>& modes = plan.modes;
    const auto& models = plan.models;
    std::vector<Result> results;
    uint64_t key_base = 0;
    for (const auto& [name, sizes] : models) {
      int64_t total = 0;
      for (int64_t n : sizes) total += n;
      for (const std::string& mode : modes) {
        Config cfg;
        cfg.tensor_bytes = total * 4 / static_cast<int64_t>(sizes.size());
        cfg.tensors = static_cast<int64_t>(sizes.size());
        cfg.mode = mode;
        cfg.calls = cfg.tensors;  // one call per array, as training issues them
        cfg.model = name;
        cfg.sizes = sizes;
        auto r = RunConfig(&kv, cfg, key_base, std::max(1, FLAGS_iters), &generation);
        if (!r.ok()) return fail(r.status());
        results.push_back(*r);
        key_base += 100000;
      }
    }
    for (size_t c = 0; c < plan.bytes.size() && models.empty(); ++c) {
      for (const std::string& mode : modes) {
        Config cfg;
        cfg.tensor_bytes = plan.bytes[c];
        cfg.tensors = plan.counts[c];
        cfg.mode = mode;
        if (FLAGS_calls == "tensor" || (FLAGS_calls == "auto" && cfg.tensor_bytes >= 64 * 1024)) {
          cfg.calls = cfg.tensors;
        }
        auto r = RunConfig(&kv, cfg, key_base, std::max(1, FLAGS_iters), &generation);
        if (!r.ok()) return fail(r.status());
        results.push_back(*r);
        key_base += 100000;
      }
    }
    std::printf("\nkvbench (worker rank %d of %d, %d servers, placement %s, %d iters)\n", kv.rank(),
                kv.num_workers(), kv.num_servers(), env.placement.c_str(), FLAGS_iters);
    std::printf(
        "| tensor bytes | tensors/step | calls/step | mode | transport | steps/s | push+pull "
        "pairs/s/worker | payload GB/s | raw ZeroMQ GB/s | of raw |\n");
    std::printf("|---:|---:|---:|---|---|---:|---:|---:|---:|---:|\n");
    for (const Result& r : results) {
      const std::string bytes_col = r.cfg.model.empty()
                                        ? std::to_string(r.cfg.tensor_bytes)
                                        : StrCat(r.cfg.model, " (mean ", r.cfg.tensor_bytes, ")");
      std::printf("| %s | %lld | %lld | %s | %s | %.1f | %.0f | %.3f | %.3f | %.0f%% |\n",
                  bytes_col.c_str(), static_cast<long long>(r.cfg.tensors),
                  static_cast<long long>(r.cfg.calls), r.cfg.mode.c_str(), r.transport.c_str(),
                  r.steps_per_s, r.pairs_per_s, r.payload_gbps, r.ceiling_gbps,
                  100.0 * r.payload_gbps / r.ceiling_gbps);
    }
    for (const Result& r : results) {
      std::printf(
          "kvbench: %stensor_bytes=%lld tensors=%lld servers=%d workers=%d mode=%s "
          "steps_per_s=%.2f pairs_per_s=%.0f payload_gbps=%.4f ceiling_gbps=%.4f transport=%s\n",
          r.cfg.model.empty() ? "" : StrCat("model=", r.cfg.model, " ").c_str(),
          static_cast<long long>(r.cfg.tensor_bytes), static_cast<long long>(r.cfg.tensors),
          kv.num_servers(), kv.num_workers(), r.cfg.mode.c_str(), r.steps_per_s, r.pairs_per_s,
          r.payload_gbps, r.ceiling_gbps, r.transport.c_str());
    }
    std::fflush(stdout);
  }
  s = kv.Finish(BarrierDeadline((*node)->options()));
  if (!s.ok()) return fail(s);
  return 0;
}

}  // namespace

int RunKvbench(int /*argc*/, char** /*argv*/) {
  auto plan = PlanFromFlags();
  if (!plan.ok()) {
    LOG(ERROR) << "kvbench: " << plan.status();
    return 2;
  }
  if (auto code = RunClusterRole()) return *code;
  auto env = ReadClusterEnv();
  if (!env.ok()) {
    LOG(ERROR) << env.status();
    return 2;
  }
  return RunWorker(*env, *plan);
}

}  // namespace pstrain
