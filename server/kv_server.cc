#include "server/kv_server.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <unordered_map>

namespace pstrain {

struct KVServer::Request {
  Message msg;  // keeps the received frames alive: pushed values are read in place
  int worker = 0;
  std::atomic<int64_t> remaining{0};
  std::vector<const float*> part_values;  // push/init: each part inside the value frames
  // A DTYPE_2BIT push: each part's codes inside the value frames, and where
  // its shard dequantizes it (part_values points there), in one buffer.
  std::vector<const uint32_t*> part_codes;
  std::vector<float*> part_dequantized;
  Blob dequantized;
  // Pull: the reply's value frames. A big part is its own frame referencing the
  // stored value (no copy); runs of small parts are copied into one frame.
  struct Slot {
    Blob blob;
    char* data = nullptr;  // writable bytes of a copied run
  };
  std::vector<Slot> slots;
  std::vector<std::pair<uint32_t, uint64_t>> part_slot;  // part -> (slot, byte offset)
  uint64_t reply_bytes = 0;
  Mutex mu;
  Status error GUARDED_BY(mu);
};

struct KVServer::Op {
  std::shared_ptr<Request> req;
  uint32_t part = 0;
  int worker() const { return req->worker; }
  const PsHeader& header() const { return req->msg.header; }
};

// A stored value shared with in-flight pull replies; an update while a reply
// still references it is written to a fresh buffer that replaces it. It lives in the node's
// shared-memory arena when there is room, so replies to co-located workers reference it.
struct KVServer::KeyState {
  bool initialized = false;
  Blob value;
  float* data = nullptr;
  size_t size = 0;                   // elements
  const int32_t* readers = nullptr;  // peers reading `value` through shared memory
  void Store(ShmArena::Stored s, size_t n) {
    value = std::move(s.blob);
    data = reinterpret_cast<float*>(s.data);
    readers = s.readers;
    size = n;
  }
  // Whether a reply (in this process, or a co-located reader) still holds `value`.
  bool Shared() const {
    if (value.owner().use_count() > 1) return true;
    // Pairs with the release of the last reply's reference.
    std::atomic_thread_fence(std::memory_order_acquire);
    return readers != nullptr && ShmArena::Readers(readers) > 0;
  }
  uint64_t rounds = 0;                     // dist_sync rounds closed (async: updates applied)
  int merged = 0;                          // pushes in the open round
  SteadyClock::time_point opened;          // when the open round's first push arrived
  bool warned = false;                     // the open round was reported as slow
  std::vector<char> in_round;              // per worker rank: pushed in the open round
  std::vector<Op> waiting;                 // pushes of the open round, answered when it closes
  std::deque<Op> deferred;                 // ops that must wait for the open round to close
  SteadyClock::time_point deferred_since;  // when the oldest of them began to wait
  ParamState state;
  // The closed rounds of the key's newest snapshot (written or loaded); -1:
  // none. A value changes at equal rounds only by a replace, which snapshots.
  int64_t snapshot_rounds = -1;
};

struct KVServer::Shard {
  Mutex mu;
  CondVar cv{&mu};
  // What the receive thread handed over, in the order it arrived: a
  // request's ops, or a task (the snapshots a new optimizer waits for).
  struct Work {
    std::vector<Op> ops;
    std::function<void()> task;
  };
  std::deque<Work> queue GUARDED_BY(mu);
  // Someone runs this shard's ops: its thread, or the receive thread inline
  // (small requests to an idle shard). At most one at a time.
  bool busy GUARDED_BY(mu) = false;
  bool stop GUARDED_BY(mu) = false;
  bool check_rounds GUARDED_BY(mu) = false;  // the tick asked for a look at open rounds
  bool remove_lost GUARDED_BY(mu) = false;   // a worker was lost: drop its pushes
  // Touched only by whoever is busy.
  std::unordered_map<uint64_t, KeyState> keys;
};

namespace {

// Requests moving less than this run on the receive thread when their shards
// are idle: a thread hand-off costs more than the work.
constexpr uint64_t kInlineBytes = 256 * 1024;

// Pulled parts at least this big are sent straight from the store.
constexpr uint64_t kZeroCopyReplyBytes = 64 * 1024;

size_t ShardOf(uint64_t wire_key, size_t n) {
  return static_cast<size_t>((wire_key * 0x9E3779B97F4A7C15ull) >> 40) % n;
}

std::string PartName(uint64_t w) {
  return StrCat("key ", WireKeyUser(w), " part ", WireKeyPart(w));
}

// The answer to a push or pull of a key never initialized.
Status NeverInitialized(uint64_t wire, const PsHeader& h) {
  if (h.replace()) {
    return Status::NotFound(StrCat("replace of ", PartName(wire),
                                   ", which holds no value here (never initialized, or the "
                                   "key's length changed, which places its parts elsewhere)"));
  }
  return Status::NotFound(StrCat(PartName(wire), " was never initialized (",
                                 h.push() ? "push" : "pull", " before init)"));
}

}  // namespace

KVServer::KVServer(ClusterNode* node, const KVServerOptions& options)
    : node_(node), options_(options) {
  CHECK(node->role() == Role::kServer);
  const int n = std::max(1, options_.num_threads);
  for (int i = 0; i < n; ++i) shards_.push_back(std::make_unique<Shard>());
  for (int i = 0; i < n; ++i) {
    Shard* s = shards_[i].get();
    threads_.emplace_back([this, s] { ShardLoop(s); });
  }
  live_workers_ = node->num_workers();
  const size_t workers = static_cast<size_t>(std::max(0, node->num_workers()));
  lost_ = std::make_unique<std::atomic<bool>[]>(workers);
  finished_ = std::make_unique<std::atomic<bool>[]>(workers);
  lost_unanswered_ = std::make_unique<std::atomic<bool>[]>(workers);
  for (size_t w = 0; w < workers; ++w) lost_[w] = finished_[w] = lost_unanswered_[w] = false;
  node_->AddLostListener([this](int id) { HandleWorkerLost(id); });
  node_->AddFinishedListener([this](int id) { HandleWorkerFinished(id); });
  node_->SetMessageHandler([this](Message&& m) { HandleMessage(std::move(m)); });
  node_->SetBurstEndHandler([this] { SendHeldReplies(); });
  node_->AddTickListener([this] { RequestRoundCheck(); });
}

KVServer::~KVServer() {
  // Nothing new reaches the shards; then they stop (they send replies until
  // then, so the sockets close only after).
  node_->StopReceiving();
  for (auto& s : shards_) {
    MutexLock l(&s->mu);
    s->stop = true;
    s->cv.SignalAll();
  }
  for (auto& t : threads_) t.join();
  node_->Stop();
}

Status KVServer::Run() {
  RETURN_IF_ERROR(OpenSnapshots());
  RETURN_IF_ERROR(node_->Start());
  if (snapshots_ != nullptr && node_->rank() != options_.snapshot_rank) {
    const Status s = Status::FailedPrecondition(
        StrCat(node_->Self(), ": holds the snapshots of server rank ", options_.snapshot_rank, " (",
               snapshots_->dir(), ") but the scheduler made it rank ", node_->rank(),
               "; every server needs a distinct PSTRAIN_LAUNCH_RANK below DMLC_NUM_SERVER"));
    node_->Fail(s);
    return s;
  }
  // Bounded by the scheduler: it ends the job, or heartbeats declare it dead.
  return node_->WaitShutdown(Deadline::Never());
}

namespace {

std::string ConfigPath(const std::string& dir) { return dir + "/config.pb"; }

}  // namespace

Status KVServer::OpenSnapshots() {
  if (options_.snapshot_dir.empty()) {
    // A replacement with nothing to resume from would register, and every
    // re-sent request would then fail as a push before init.
    if (options_.restart > 0) {
      return Status::FailedPrecondition(
          StrCat("server restart ", options_.restart,
                 " (PSTRAIN_RESTART) has no PSTRAIN_SNAPSHOT_DIR to resume from"));
    }
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(snapshots_, SnapshotStore::Open(options_.snapshot_dir, options_.snapshot_sync));
  const std::string path = ConfigPath(options_.snapshot_dir);
  if (options_.restart <= 0) {
    // A new job: nothing to resume, not even the last job's configuration (a
    // replacement of this server that dies before it is configured would
    // take it up).
    std::error_code ec;
    std::filesystem::remove(path, ec);
    if (ec) return Status::IOError(StrCat("cannot remove ", path, ": ", ec.message()));
    return snapshots_->Clear();
  }
  // A replacement: the job's configuration and every key as last snapshotted.
  std::ifstream in(path, std::ios::binary);
  const bool have_config = static_cast<bool>(in);
  if (have_config) {
    auto cfg = std::make_shared<ServerConfig>();
    if (!cfg->ParseFromIstream(&in)) {
      return Status::Corruption(StrCat(path, ": not a ServerConfig"));
    }
    std::shared_ptr<Optimizer> opt;
    if (cfg->has_optimizer()) {
      ASSIGN_OR_RETURN(opt, MakeOptimizer(*cfg, live_workers_.load()));
    }
    MutexLock l(&config_mu_);
    config_ = std::move(cfg);
    optimizer_ = std::move(opt);
  }
  ASSIGN_OR_RETURN(std::vector<KeySnapshot> keys, snapshots_->LoadAll());
  const int num_workers = node_->num_workers();
  uint64_t floats = 0;
  for (KeySnapshot& k : keys) {
    KeyState& ks = shards_[ShardOf(k.wire_key, shards_.size())]->keys[k.wire_key];
    ++keys_held_;
    const size_t n = k.value.size();
    ShmArena::Stored stored = node_->AllocateStored(n * sizeof(float));
    std::memcpy(stored.data, k.value.data(), n * sizeof(float));
    ks.Store(std::move(stored), n);
    ks.state = std::move(k.state);
    ks.rounds = k.rounds;
    ks.snapshot_rounds = static_cast<int64_t>(k.rounds);
    ks.in_round.assign(num_workers, 0);
    ks.initialized = true;
    floats += n;
    MutexLock l(&config_mu_);
    if (optimizer_ != nullptr) optimizer_->ContinueFrom(ks.state.num_updates);
  }
  LOG(WARNING) << "server (restart " << options_.restart << "): resumed " << keys.size()
               << " keys (" << floats << " floats) from " << options_.snapshot_dir
               << (have_config ? "" : "; no configuration saved yet");
  return Status::Ok();
}

Status KVServer::MaybeSnapshot(uint64_t wire, KeyState* ks, uint64_t every) {
  if (snapshots_ == nullptr || every == 0 || ks->rounds % every != 0) return Status::Ok();
  RETURN_IF_ERROR(snapshots_->Write(wire, ks->rounds, ks->data, ks->size, ks->state)
                      .WithContext(StrCat("snapshot of ", PartName(wire))));
  ks->snapshot_rounds = static_cast<int64_t>(ks->rounds);
  return Status::Ok();
}

bool KVServer::MustWait(const KeyState& ks, const Op& op) {
  if (!ks.initialized || ks.in_round.empty()) return false;
  if (ks.in_round[op.worker()]) return true;
  const PsHeader& h = op.header();
  // A push of a later round than the next one (a worker re-sending to a
  // replacement may deliver them out of order).
  return h.push() && h.push_rounds_size() > static_cast<int>(op.part) &&
         h.push_rounds(static_cast<int>(op.part)) > ks.rounds + 1;
}

StatusOr<std::shared_ptr<Optimizer>> KVServer::MakeOptimizer(const ServerConfig& cfg,
                                                             int live) const {
  OptimizerConfig oc = cfg.optimizer();
  if (cfg.sync_mode() && live > 0 && live < node_->num_workers()) {
    // rescale_grad is 1/(batch * W): the sum of fewer gradients needs more.
    oc.set_rescale_grad(oc.rescale_grad() * static_cast<float>(node_->num_workers()) /
                        static_cast<float>(live));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, Optimizer::Create(oc));
  return std::shared_ptr<Optimizer>(std::move(opt));
}

void KVServer::HandleWorkerLost(int id) {
  const int w = RankOfId(id);
  if (w < 0 || w >= node_->num_workers() || lost_[w].exchange(true)) return;
  int live;
  bool sync;
  {
    MutexLock l(&config_mu_);
    live = --live_workers_;
    sync = config_ != nullptr && config_->sync_mode();
    if (sync && config_->has_optimizer()) {
      auto opt = MakeOptimizer(*config_, live);
      if (opt.ok()) {
        if (optimizer_ != nullptr) (*opt)->ContinueFrom(optimizer_->num_update());
        optimizer_ = *std::move(opt);
      }
    }
  }
  if (sync) {
    LOG(WARNING) << node_->Self() << ": worker rank " << w << " is lost: rounds close with the "
                 << live << " workers left, gradients rescaled by " << node_->num_workers() << "/"
                 << live;
  } else {
    LOG(WARNING) << node_->Self() << ": worker rank " << w << " is lost: " << live
                 << " workers left";
  }
  for (auto& shard : shards_) {
    MutexLock l(&shard->mu);
    shard->remove_lost = true;
    shard->cv.Signal();
  }
}

void KVServer::DropLostPushes(KeyState* ks) const {
  auto gone = [this](const Op& op) { return lost_[op.worker()].load(); };
  for (size_t w = 0; w < ks->in_round.size(); ++w) {
    if (lost_[w].load()) ks->in_round[w] = 0;
  }
  const size_t before = ks->waiting.size();
  ks->waiting.erase(std::remove_if(ks->waiting.begin(), ks->waiting.end(), gone),
                    ks->waiting.end());
  ks->merged -= static_cast<int>(before - ks->waiting.size());
  ks->deferred.erase(std::remove_if(ks->deferred.begin(), ks->deferred.end(), gone),
                     ks->deferred.end());
}

void KVServer::HandleWorkerFinished(int id) {
  const int w = RankOfId(id);
  if (w < 0 || w >= node_->num_workers() || finished_[w].exchange(true)) return;
  ++finished_workers_;
  for (auto& shard : shards_) {
    MutexLock l(&shard->mu);
    shard->check_rounds = true;
    shard->cv.Signal();
  }
}

bool KVServer::FailRoundOfFinished(uint64_t wire, const KeyState& ks) {
  if (ks.merged == 0 || finished_workers_.load() == 0) return false;
  int done = -1;
  for (size_t w = 0; w < ks.in_round.size() && done < 0; ++w) {
    if (!ks.in_round[w] && !lost_[w].load() && finished_[w].load()) done = static_cast<int>(w);
  }
  if (done < 0) return false;
  std::string pushed;
  for (size_t w = 0; w < ks.in_round.size(); ++w) {
    if (ks.in_round[w]) pushed += StrCat(pushed.empty() ? "" : ", ", w);
  }
  node_->Fail(
      Status::FailedPrecondition(StrCat(
          node_->Self(), ": worker rank ", done, " finished after ", ks.rounds,
          " dist_sync rounds of ", PartName(wire), ", but worker rank(s) ", pushed,
          " pushed round ", ks.rounds + 1,
          ", which needs its push and can never close: in dist_sync every worker must push each "
          "key equally often (give every worker the same number of batches), or use dist_async")),
      WorkerId(done));
  return true;
}

void KVServer::RemoveLost(Shard* shard) {
  for (auto& [wire, ks] : shard->keys) {
    if (ks.in_round.empty()) continue;
    DropLostPushes(&ks);
    const uint64_t rounds_before = ks.rounds;
    if (ks.merged > 0 && ks.merged >= live_workers_.load()) {
      // Complete now: the last push runs again and closes the round.
      Op last = ks.waiting.back();
      ks.waiting.pop_back();
      --ks.merged;
      ks.in_round[last.worker()] = 0;
      Execute(shard, &ks, last);
    }
    Drain(shard, &ks, rounds_before);
  }
}

std::shared_ptr<const ServerConfig> KVServer::config() const {
  MutexLock l(&config_mu_);
  return config_;
}

KVServer::UpdateRule KVServer::rule() const {
  MutexLock l(&config_mu_);
  return {config_, optimizer_, live_workers_.load()};
}

void KVServer::ReplyError(const PsHeader& request, const Status& error) {
  if (ShouldWarnAbout(request.sender())) LOG(WARNING) << node_->Self() << ": " << error;
  if (!IsWorkerId(request.sender())) return;  // nobody to tell
  Message reply;
  PsHeader& h = reply.header;
  h.set_version(PROTOCOL_VERSION_CURRENT);
  h.set_cmd(request.cmd());
  h.set_sender(node_->id());
  h.set_receiver(request.sender());
  h.set_request_id(request.request_id());
  h.set_is_reply(true);
  h.set_error_code(static_cast<int>(error.code()));
  h.set_error_message(StrCat(node_->Self(), ": ", error.message()));
  Answer(request.sender(), std::move(reply));
}

void KVServer::Answer(int worker, Message&& reply) {
  // Held only where a batch can form: a co-located worker gets each reply
  // through shared memory at once.
  if (std::this_thread::get_id() == burst_thread_.load(std::memory_order_relaxed) &&
      !node_->SharesMemoryWith(worker)) {
    held_replies_.emplace_back(worker, std::move(reply));
    return;
  }
  Status s = node_->Send(worker, reply);
  if (!s.ok() && ShouldWarnAbout(worker)) LOG(WARNING) << node_->Self() << ": " << s;
}

bool KVServer::ShouldWarnAbout(int worker) {
  // A worker declared lost is refused and has no connection any more: say so
  // once, not for every request it may still send (a falsely lost one keeps
  // sending).
  const int w = IsWorkerId(worker) ? RankOfId(worker) : -1;
  if (w < 0 || w >= node_->num_workers() || !lost_[w].load()) return true;
  if (lost_unanswered_[w].exchange(true)) return false;
  LOG(WARNING) << node_->Self() << ": " << NodeIdName(worker)
               << " was declared lost: requests from it are refused and replies to it dropped "
                  "(said once, not for each)";
  return true;
}

void KVServer::SendHeldReplies() {
  burst_thread_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  if (held_replies_.empty()) return;
  std::vector<std::pair<int, Message>> held;
  held.swap(held_replies_);
  std::vector<bool> done(held.size(), false);
  std::vector<const Message*> batch;
  for (size_t i = 0; i < held.size(); ++i) {
    if (done[i]) continue;
    const int worker = held[i].first;
    batch.clear();
    for (size_t j = i; j < held.size(); ++j) {
      if (held[j].first != worker) continue;
      batch.push_back(&held[j].second);
      done[j] = true;
    }
    Status s = node_->SendBatch(worker, batch);
    if (!s.ok() && ShouldWarnAbout(worker)) LOG(WARNING) << node_->Self() << ": " << s;
  }
}

void KVServer::HandleConfig(const Message& msg) {
  if (!IsWorkerId(msg.header.sender())) {
    LOG(WARNING) << node_->Self() << ": ignoring a config from " << NodeIdName(msg.header.sender())
                 << ": only workers configure the servers";
    return;
  }
  ServerConfig cfg;
  const std::string& body = msg.header.body();
  if (!cfg.ParseFromString(body)) {
    ReplyError(msg.header, Status::InvalidArgument("config body is not a ServerConfig"));
    return;
  }
  if (cfg.gradient_compression().type() != GradientCompressionConfig::NONE) {
    const float t = cfg.gradient_compression().threshold();
    if (cfg.gradient_compression().type() != GradientCompressionConfig::TWO_BIT || !(t > 0) ||
        !std::isfinite(t)) {
      ReplyError(msg.header,
                 Status::InvalidArgument(StrCat("config of ", NodeIdName(msg.header.sender()),
                                                ": gradient compression ",
                                                cfg.gradient_compression().ShortDebugString(),
                                                " is not 2-bit with a finite threshold > 0")));
      return;
    }
  }
  for (const auto* mults : {&cfg.wd_mult(), &cfg.lr_mult()}) {
    for (const auto& [key, mult] : *mults) {
      if (std::isfinite(mult)) continue;
      ReplyError(msg.header, Status::InvalidArgument(
                                 StrCat("config of ", NodeIdName(msg.header.sender()), ": ",
                                        mults == &cfg.wd_mult() ? "wd_mult" : "lr_mult", " of key ",
                                        key, " is ", mult, " (a multiplier must be finite)")));
      return;
    }
  }
  std::shared_ptr<Optimizer> opt;
  if (cfg.has_optimizer()) {
    // (A loss changes live_workers_ on this thread only: the count read here holds.)
    auto created = MakeOptimizer(cfg, live_workers_.load());
    if (!created.ok()) {
      ReplyError(msg.header, created.status());
      return;
    }
    opt = std::move(created).value();
  }
  bool snapshot_first = false;
  {
    MutexLock l(&config_mu_);
    if (pending_config_.has_value()) {
      // The shards are writing the snapshots the last generation waits for:
      // its other senders are answered with the first, once they are done.
      if (cfg.generation() == pending_config_->generation &&
          google::protobuf::util::MessageDifferencer::Equals(*config_, cfg)) {
        pending_config_->waiters.push_back(msg.header);
        return;
      }
      if (cfg.generation() > pending_config_->generation) {
        ReplyError(
            msg.header,
            Status::FailedPrecondition(StrCat(
                "configuration generation ", cfg.generation(), " from ",
                NodeIdName(msg.header.sender()), " while generation ", pending_config_->generation,
                " is still being installed (its snapshots written): a worker sends a new "
                "configuration only after every server answered the last one")));
        return;
      }
    }
    // Set once per generation: every worker sends the same one (compared
    // field by field: map order on the wire is not fixed); another one of the
    // same generation is refused, so the optimizer changes only when every
    // worker asks for it (a higher generation: set_optimizer mid-job).
    if (config_ == nullptr || cfg.generation() > config_->generation()) {
      if (config_ != nullptr) {
        LOG(INFO) << node_->Self() << ": configuration generation " << cfg.generation() << " from "
                  << NodeIdName(msg.header.sender()) << " replaces generation "
                  << config_->generation();
      }
      const bool same_optimizer =
          config_ != nullptr &&
          google::protobuf::util::MessageDifferencer::Equals(config_->optimizer(), cfg.optimizer());
      // A generation that keeps the optimizer (a new gradient compression,
      // say) keeps its schedule's clock too.
      if (opt != nullptr && optimizer_ != nullptr && same_optimizer) {
        opt->ContinueFrom(optimizer_->num_update());
      }
      snapshot_first = snapshots_ != nullptr && config_ != nullptr && !same_optimizer;
      if (snapshot_first) pending_config_ = PendingConfig{cfg.generation(), {msg.header}};
      config_ = std::make_shared<const ServerConfig>(cfg);
      optimizer_ = std::move(opt);
      // Written before the answer: a replacement finds the job's configuration.
      if (snapshots_ != nullptr && !snapshot_first) {
        if (Status s = SaveConfig(cfg); !s.ok()) {
          node_->Fail(s);
          ReplyError(msg.header, s);
          return;
        }
      }
    } else {
      std::string diff;
      google::protobuf::util::MessageDifferencer d;
      d.ReportDifferencesToString(&diff);
      if (!d.Compare(*config_, cfg)) {
        ReplyError(msg.header,
                   Status::FailedPrecondition(StrCat(
                       "refused the configuration of ", NodeIdName(msg.header.sender()),
                       ": the servers run with another one of its generation (every worker must "
                       "send the same; a new one needs a higher generation); differences (ours "
                       "-> theirs): ",
                       diff)));
        return;
      }
    }
  }
  if (snapshot_first) {
    SnapshotThenConfirm(std::move(cfg));
    return;
  }
  ConfirmConfig(msg.header);
}

Status KVServer::SaveConfig(const ServerConfig& cfg) {
  const std::string path = ConfigPath(snapshots_->dir());
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  const bool ok = out && cfg.SerializeToOstream(&out) && (out.close(), !out.fail()) &&
                  std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    return Status::IOError(
        StrCat(node_->Self(), ": cannot write ", path, ": ", std::strerror(errno)));
  }
  return Status::Ok();
}

void KVServer::ConfirmConfig(const PsHeader& request) {
  Message reply;
  reply.header.set_version(PROTOCOL_VERSION_CURRENT);
  reply.header.set_cmd(CMD_CONFIG);
  reply.header.set_sender(node_->id());
  reply.header.set_request_id(request.request_id());
  reply.header.set_is_reply(true);
  Answer(request.sender(), std::move(reply));
}

void KVServer::SnapshotThenConfirm(ServerConfig cfg) {
  struct Pending {
    ServerConfig cfg;
    std::atomic<size_t> shards_left{0};
    Mutex mu;
    Status failure GUARDED_BY(mu);
  };
  auto pending = std::make_shared<Pending>();
  pending->cfg = std::move(cfg);
  pending->shards_left = shards_.size();
  for (auto& owned : shards_) {
    Shard* shard = owned.get();
    auto task = [this, shard, pending] {
      if (options_.test_config_snapshot_delay_ms > 0) {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(options_.test_config_snapshot_delay_ms));
      }
      // Every key as it stands after what arrived before the configuration:
      // the rounds closed under the old optimizer, and its slot layout.
      Status s;
      // (A key whose newest snapshot is of its last round has it already.)
      for (auto& [wire, ks] : shard->keys) {
        if (!ks.initialized || ks.snapshot_rounds == static_cast<int64_t>(ks.rounds)) continue;
        s = snapshots_->Write(wire, ks.rounds, ks.data, ks.size, ks.state)
                .WithContext(StrCat("snapshot of ", PartName(wire), " before a new optimizer"));
        if (!s.ok()) break;
        ks.snapshot_rounds = static_cast<int64_t>(ks.rounds);
      }
      if (!s.ok()) {
        MutexLock l(&pending->mu);
        if (pending->failure.ok()) {
          pending->failure = Status(s.code(), StrCat(node_->Self(), ": ", s.message()));
        }
      }
      if (pending->shards_left.fetch_sub(1) != 1) return;
      // The last shard: save the configuration, then answer every sender.
      Status failure;
      {
        MutexLock l(&pending->mu);
        failure = pending->failure;
      }
      if (failure.ok()) failure = SaveConfig(pending->cfg);
      std::vector<PsHeader> waiters;
      {
        MutexLock l(&config_mu_);
        if (pending_config_.has_value()) waiters = std::move(pending_config_->waiters);
        pending_config_.reset();
      }
      if (!failure.ok()) node_->Fail(failure);
      for (const PsHeader& request : waiters) {
        if (failure.ok()) {
          ConfirmConfig(request);
        } else {
          ReplyError(request, failure);
        }
      }
    };
    MutexLock l(&shard->mu);
    shard->queue.push_back(Shard::Work{{}, std::move(task)});
    shard->cv.Signal();
  }
}

StatusOr<uint64_t> KVServer::CheckCompressedPush(const Message& msg) const {
  const uint64_t w = msg.key(0);
  auto cfg = config();
  if (cfg == nullptr || cfg->gradient_compression().type() != GradientCompressionConfig::TWO_BIT) {
    return Status::FailedPrecondition(
        StrCat("2-bit compressed push of key ", WireKeyUser(w), " part ", WireKeyPart(w), " from ",
               NodeIdName(msg.header.sender()), ", but this job's servers were ",
               cfg == nullptr ? "not configured yet"
                              : "configured without gradient compression (ServerConfig)"));
  }
  uint64_t elems = 0;
  for (size_t i = 0; i < msg.header.num_keys(); ++i) elems += msg.len(i);
  // Each part is checked against its stored shape later; this bounds what a
  // malformed push can make us allocate first (its float32 twin is refused too).
  if (elems * sizeof(float) > static_cast<uint64_t>(node_->options().max_message_bytes)) {
    return Status::InvalidArgument(StrCat("2-bit push of ", elems, " elements (key ",
                                          WireKeyUser(w), " part ", WireKeyPart(w),
                                          " first) exceeds PSTRAIN_MAX_MESSAGE_BYTES as float32"));
  }
  return elems;
}

void KVServer::HandleMessage(Message&& msg) {
  if (msg.header.is_reply()) return;
  if (msg.header.cmd() == CMD_CONFIG) {
    HandleConfig(msg);
    return;
  }
  Status s = ValidateDataRequest(msg, node_->rank());
  if (s.ok() && RankOfId(msg.header.sender()) >= node_->num_workers()) {
    s = Status::InvalidArgument(StrCat("request from ", NodeIdName(msg.header.sender()),
                                       ", but the job has ", node_->num_workers(), " workers"));
  }
  if (s.ok() && lost_[RankOfId(msg.header.sender())].load()) {
    s = Status::FailedPrecondition(
        StrCat(NodeIdName(msg.header.sender()), " was declared lost; the job went on without it"));
  }
  const bool compressed = msg.header.dtype() == DTYPE_2BIT;
  uint64_t compressed_elems = 0;  // the floats a compressed push stands for
  if (s.ok() && compressed) {
    StatusOr<uint64_t> elems = CheckCompressedPush(msg);
    s = elems.status();
    if (s.ok()) compressed_elems = *elems;
  }
  if (!s.ok()) {
    ReplyError(msg.header, s);
    return;
  }
  auto req = std::make_shared<Request>();
  const size_t n = msg.header.num_keys();
  req->worker = RankOfId(msg.header.sender());
  req->remaining = static_cast<int64_t>(n);
  if (msg.header.init() || msg.header.push()) {
    req->part_values.resize(n);
    float* dequantized = nullptr;
    if (compressed) {
      char* bytes = nullptr;
      req->dequantized = Blob::Allocate(compressed_elems * sizeof(float), &bytes);
      dequantized = reinterpret_cast<float*>(bytes);
      req->part_codes.resize(n);
      req->part_dequantized.resize(n);
    }
    size_t frame = 0, used = 0;
    for (size_t i = 0; i < n; ++i) {
      while (used == msg.values[frame].size()) {
        ++frame;
        used = 0;
      }
      const char* at = msg.values[frame].data() + used;
      if (compressed) {
        // Frames are 4-byte aligned (the transports copy a misaligned one)
        // and every part is whole words.
        req->part_codes[i] = reinterpret_cast<const uint32_t*>(at);
        req->part_dequantized[i] = dequantized;
        req->part_values[i] = dequantized;
        dequantized += msg.len(i);
      } else {
        req->part_values[i] = reinterpret_cast<const float*>(at);
      }
      used += PartValueBytes(msg.header.dtype(), msg.len(i));
    }
  }
  if (msg.header.pull()) {
    req->part_slot.resize(n);
    std::vector<uint64_t> run_bytes;  // per slot: bytes of a copied run, 0 for zero-copy
    for (size_t i = 0; i < n; ++i) {
      const uint64_t bytes = uint64_t{msg.len(i)} * sizeof(float);
      req->reply_bytes += bytes;
      if (bytes >= kZeroCopyReplyBytes) {
        req->part_slot[i] = {static_cast<uint32_t>(run_bytes.size()), 0};
        run_bytes.push_back(0);
        continue;
      }
      if (run_bytes.empty() || run_bytes.back() == 0) {  // 0: the last slot is zero-copy
        run_bytes.push_back(0);
        req->part_slot[i] = {static_cast<uint32_t>(run_bytes.size() - 1), 0};
        run_bytes.back() = bytes;
        continue;
      }
      req->part_slot[i] = {static_cast<uint32_t>(run_bytes.size() - 1), run_bytes.back()};
      run_bytes.back() += bytes;
    }
    uint64_t copied = 0;
    for (uint64_t b : run_bytes) copied += b;
    if (copied > static_cast<uint64_t>(node_->options().max_message_bytes)) {
      // Real lengths are checked against the stored shapes later; this bounds
      // what a malformed pull can make us allocate first.
      ReplyError(msg.header, Status::InvalidArgument(StrCat("pull of ", copied,
                                                            " bytes in small parts exceeds "
                                                            "PSTRAIN_MAX_MESSAGE_BYTES")));
      return;
    }
    req->slots.resize(run_bytes.size());
    const bool local = node_->SharesMemoryWith(msg.header.sender());
    for (size_t k = 0; k < run_bytes.size(); ++k) {
      if (run_bytes[k] == 0) continue;
      // For a co-located worker in the arena's ring when there is room: sent
      // without a copy.
      ShmArena::Stored buf = local ? node_->AllocateOutgoing(run_bytes[k])
                                   : AllocateOrHeap(nullptr, run_bytes[k], false);
      req->slots[k].blob = std::move(buf.blob);
      req->slots[k].data = buf.data;
    }
  }
  req->msg = std::move(msg);
  uint64_t elems = 0;
  std::vector<std::vector<Op>> per_shard(shards_.size());
  for (size_t i = 0; i < n; ++i) {
    elems += req->msg.len(i);
    per_shard[ShardOf(req->msg.key(i), shards_.size())].push_back(
        Op{req, static_cast<uint32_t>(i)});
  }
  // Small requests may run here, on the receive thread, while their shard
  // is idle; not a push or init that may write a snapshot (file I/O, with
  // PSTRAIN_SNAPSHOT_SYNC a flush to the device, would hold every message).
  const PsHeader& h = req->msg.header;
  const bool may_snapshot = snapshots_ != nullptr && (h.push() || h.init());
  const bool small = !may_snapshot && elems * sizeof(float) < kInlineBytes;
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (per_shard[s].empty()) continue;
    Shard* shard = shards_[s].get();
    {
      MutexLock l(&shard->mu);
      // Only this thread enqueues requests, so running them here while the
      // shard is idle with an empty queue keeps per-key order.
      if (!small || shard->busy || !shard->queue.empty()) {
        shard->queue.push_back(Shard::Work{std::move(per_shard[s]), nullptr});
        shard->cv.Signal();
        continue;
      }
      shard->busy = true;
    }
    for (const Op& op : per_shard[s]) Submit(shard, op);
    MutexLock l(&shard->mu);
    shard->busy = false;
    // The shard thread may have been asked to look at its rounds meanwhile;
    // otherwise it has nothing to do (waking it for nothing costs a thread switch).
    if (shard->check_rounds || shard->remove_lost) shard->cv.Signal();
  }
}

void KVServer::ShardLoop(Shard* shard) {
  for (;;) {
    Shard::Work work;
    bool check = false;
    bool lost = false;
    {
      MutexLock l(&shard->mu);
      // Woken by new work, a round check or stop; the deadline only re-checks `stop`.
      shard->cv.WaitUntil(Deadline::InMillis(500), [shard]() REQUIRES(shard->mu) {
        return shard->stop || (!shard->busy && (!shard->queue.empty() || shard->check_rounds ||
                                                shard->remove_lost));
      });
      if (shard->stop) return;
      if (shard->busy) continue;
      if (shard->remove_lost) {
        lost = true;
        shard->remove_lost = false;
      } else if (shard->check_rounds) {
        check = true;
        shard->check_rounds = false;
      } else if (!shard->queue.empty()) {
        work = std::move(shard->queue.front());
        shard->queue.pop_front();
      } else {
        continue;
      }
      shard->busy = true;
    }
    if (lost) {
      RemoveLost(shard);
    } else if (check) {
      CheckRounds(shard);
    } else if (work.task) {
      work.task();
    } else {
      for (const Op& op : work.ops) Submit(shard, op);
    }
    MutexLock l(&shard->mu);
    shard->busy = false;
  }
}

void KVServer::RequestRoundCheck() {
  if (options_.round_timeout_ms <= 0) return;
  for (auto& s : shards_) {
    MutexLock l(&s->mu);
    s->check_rounds = true;
    s->cv.Signal();
  }
}

bool KVServer::FailHeldPushOfALostRound(uint64_t wire, const KeyState& ks,
                                        SteadyClock::time_point now) {
  const int64_t held_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now - ks.deferred_since).count();
  if (held_ms < options_.round_timeout_ms) return false;
  // No round is open, so what waits is a push of a later round than the next
  // one: the rounds between never came (a snapshot older than what the
  // workers kept, or a worker's copies lost).
  for (const Op& op : ks.deferred) {
    const PsHeader& h = op.header();
    if (!h.push() || h.push_rounds_size() <= static_cast<int>(op.part)) continue;
    const uint64_t round = h.push_rounds(static_cast<int>(op.part));
    if (round <= ks.rounds + 1) continue;
    node_->Fail(Status::FailedPrecondition(StrCat(
                    node_->Self(), ": worker rank ", op.worker(), " pushed round ", round, " of ",
                    PartName(wire), ", which has waited ", held_ms, " ms for round ", ks.rounds + 1,
                    " that nobody pushed: the rounds between were lost (the snapshot is older "
                    "than what the workers kept; every worker must run with the same "
                    "PSTRAIN_SNAPSHOT_EVERY)")),
                WorkerId(op.worker()));
    return true;
  }
  return false;
}

void KVServer::CheckRounds(Shard* shard) {
  const auto now = SteadyClock::now();
  const int64_t timeout = options_.round_timeout_ms;
  for (auto& [wire, ks] : shard->keys) {
    if (ks.merged == 0) {
      if (timeout > 0 && !ks.deferred.empty() && FailHeldPushOfALostRound(wire, ks, now)) return;
      continue;
    }
    if (FailRoundOfFinished(wire, ks)) return;
    if (timeout <= 0) continue;
    const int64_t open_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - ks.opened).count();
    if (open_ms < timeout / 4) continue;
    std::string missing;
    int first_missing = -1;
    for (size_t w = 0; w < ks.in_round.size(); ++w) {
      if (ks.in_round[w] || lost_[w].load()) continue;
      missing += StrCat(missing.empty() ? "" : ", ", w);
      if (first_missing < 0) first_missing = static_cast<int>(w);
    }
    const std::string what =
        StrCat("the dist_sync round ", ks.rounds + 1, " of ", PartName(wire), " has waited ",
               open_ms, " ms for the push of worker rank(s) ", missing, " (", ks.merged, " of the ",
               live_workers_.load(), " live workers pushed)");
    if (open_ms < timeout) {
      if (!ks.warned) LOG(WARNING) << node_->Self() << ": " << what;
      ks.warned = true;
      continue;
    }
    node_->Fail(
        Status::DeadlineExceeded(StrCat(node_->Self(), ": ", what,
                                        "; a worker that is alive but never pushes stops the "
                                        "job after PSTRAIN_ROUND_TIMEOUT_MS=",
                                        timeout)),
        first_missing >= 0 ? WorkerId(first_missing) : ClusterNode::kBlameSelf);
    return;
  }
}

void KVServer::Submit(Shard* shard, const Op& op) {
  const uint64_t wire = op.req->msg.key(op.part);
  auto it = shard->keys.find(wire);
  if (it == shard->keys.end()) {
    // Only an init makes a key: a push, pull or replace of one never
    // initialized leaves nothing behind (a request may name any key of its
    // server).
    if (!op.header().init() || op.header().replace()) {
      CompletePart(op, nullptr, NeverInitialized(wire, op.header()));
      return;
    }
    it = shard->keys.try_emplace(wire).first;
    ++keys_held_;
  }
  KeyState& ks = it->second;
  const uint64_t rounds_before = ks.rounds;
  const bool blocked = !ks.deferred.empty() || MustWait(ks, op);
  if (!blocked) {
    Execute(shard, &ks, op);
    if (ks.deferred.empty()) return;
  } else {
    if (ks.deferred.empty()) ks.deferred_since = SteadyClock::now();
    ks.deferred.push_back(op);
  }
  Drain(shard, &ks, rounds_before);
}

// Runs the deferred ops that may run now, keeping each worker's order.
void KVServer::Drain(Shard* shard, KeyState* ks, uint64_t rounds_before) {
  bool progress = true;
  while (progress && !ks->deferred.empty()) {
    progress = false;
    std::set<int> skipped;
    std::deque<Op> keep;
    std::deque<Op> todo;
    todo.swap(ks->deferred);
    while (!todo.empty()) {
      Op op = std::move(todo.front());
      todo.pop_front();
      const int w = op.worker();
      if (skipped.count(w) || MustWait(*ks, op)) {
        skipped.insert(w);
        keep.push_back(std::move(op));
        continue;
      }
      Execute(shard, ks, op);
      progress = true;
    }
    // Execute never defers, so ks->deferred is still empty here.
    ks->deferred.swap(keep);
  }
  // What is left waits on a round from now on, if one closed since the
  // caller's `rounds_before` (a pull run in between does not put the
  // deadline off).
  if (ks->rounds != rounds_before) ks->deferred_since = SteadyClock::now();
}

void KVServer::Execute(Shard* shard, KeyState* ks, const Op& op) {
  const PsHeader& h = op.header();
  const uint64_t wire = op.req->msg.key(op.part);
  const size_t n = op.req->msg.len(op.part);
  const int num_workers = node_->num_workers();
  if (h.init()) {
    if (ks->initialized && ks->size != n) {
      CompletePart(
          op, ks,
          Status::InvalidArgument(StrCat(h.replace() ? "replace" : "init", " of ", PartName(wire),
                                         " with ", n, " elements, but it holds ", ks->size)));
      return;
    }
    // A replace from a worker that pushed into the open round waits for it
    // to close (MustWait); from one that did not, it is refused.
    if (ks->initialized && h.replace() && ks->merged > 0) {
      CompletePart(
          op, ks,
          Status::FailedPrecondition(StrCat(
              "replace of ", PartName(wire), " while its dist_sync round is open (", ks->merged,
              " of ", num_workers,
              " pushes in): replace a key once every worker's pushes of it are answered, after a "
              "barrier")));
      return;
    }
    if (!ks->initialized || h.replace()) {
      // A new block: replies may still hold the old one (as an update that
      // finds it shared also makes one).
      ShmArena::Stored fresh = node_->AllocateStored(n * sizeof(float));
      std::memcpy(fresh.data, op.req->part_values[op.part], n * sizeof(float));
      ks->Store(std::move(fresh), n);
      if (!ks->initialized) ks->in_round.assign(num_workers, 0);
      ks->initialized = true;
      // A replacement must find every key, also one never pushed yet.
      if (Status s = MaybeSnapshot(wire, ks, /*every=*/1); !s.ok()) {
        CompletePart(op, ks, s);
        node_->Fail(Status(s.code(), StrCat(node_->Self(), ": ", s.message())));
        return;
      }
    }
    CompletePart(op, ks, Status::Ok());
    return;
  }
  if (!ks->initialized) {
    CompletePart(op, ks, NeverInitialized(wire, h));
    return;
  }
  if (ks->size != n) {
    CompletePart(op, ks,
                 Status::InvalidArgument(StrCat(PartName(wire), ": request has ", n,
                                                " elements, stored value has ", ks->size)));
    return;
  }
  if (!h.push()) {
    CompletePart(op, ks, Status::Ok());
    return;
  }
  // Read before lost_: HandleWorkerLost marks the worker lost before it
  // lowers the count, so a count that went down comes with its mark seen.
  const UpdateRule rule = this->rule();
  const std::shared_ptr<const ServerConfig>& cfg = rule.config;
  const int live = rule.live;
  if (!op.req->part_codes.empty()) {
    // A 2-bit push becomes the float push it stands for, on this key's shard.
    if (cfg == nullptr ||
        cfg->gradient_compression().type() != GradientCompressionConfig::TWO_BIT) {
      CompletePart(op, ks,
                   Status::FailedPrecondition(
                       StrCat("2-bit push of ", PartName(wire),
                              ", but the configuration no longer has gradient compression")));
      return;
    }
    DequantizeTwoBit(op.req->part_codes[op.part], n, cfg->gradient_compression().threshold(),
                     op.req->part_dequantized[op.part]);
  }
  const bool sync = cfg != nullptr && cfg->sync_mode();
  const uint64_t snapshot_every = cfg != nullptr ? cfg->snapshot_every() : 0;
  if (sync && h.push_rounds_size() == static_cast<int>(h.num_keys())) {
    // A tagged push (recovery on): a round closed already is in the value
    // (this is a copy re-sent to a replacement, or its answer was lost).
    const uint64_t round = h.push_rounds(static_cast<int>(op.part));
    if (round <= ks->rounds) {
      CompletePart(op, ks, Status::Ok());
      return;
    }
    if (round != ks->rounds + 1) {
      const Status s = Status::FailedPrecondition(StrCat(
          node_->Self(), ": worker rank ", op.worker(), " pushed round ", round, " of ",
          PartName(wire), " but round ", ks->rounds + 1,
          " is the next one: the rounds between were lost (the snapshot is older than what the "
          "worker kept; every worker must run with the same PSTRAIN_SNAPSHOT_EVERY)"));
      CompletePart(op, ks, s);
      node_->Fail(s, WorkerId(op.worker()));
      return;
    }
  }
  // One update with the sum of the gradients of `ops` (summed in order, never
  // stored). While a reply still reads the stored value, the update goes to a
  // fresh buffer (the same pass, no copy first) that then becomes the value.
  // Returns what the update saw; an error ends the job.
  int blame = ClusterNode::kBlameSelf;  // whose push broke an update
  auto apply = [&](const std::vector<Op>& ops) -> Status {
    std::vector<const float*> g;
    g.reserve(ops.size());
    std::vector<int> from;  // the worker of each gradient in g
    // The round being closed (async: the update), whether or not an
    // optimizer counts updates.
    const uint64_t round = ks->rounds + 1;
    for (const Op& o : ops) {
      const float* v = o.req->part_values[o.part];
      // (An allreduce's values are no model's: NaN and Inf are summed as
      // they are, as Horovod does, and end nothing.)
      if (options_.skip_nonfinite && !h.sum_only() && !AllFinite(v, n)) {
        LOG(WARNING) << node_->Self() << ": skipped the push of worker rank " << o.worker()
                     << " to " << PartName(wire) << " in round " << round
                     << ": it holds NaN or Inf (PSTRAIN_NONFINITE=skip)";
        continue;
      }
      g.push_back(v);
      from.push_back(o.worker());
    }
    if (g.empty()) return Status::Ok();  // every push skipped: no update this round
    if (cfg != nullptr) {
      // Read at every update: a configuration generation may change them.
      auto wd = cfg->wd_mult().find(WireKeyUser(wire));
      ks->state.wd_mult = wd == cfg->wd_mult().end() ? 1.0f : wd->second;
      auto lr = cfg->lr_mult().find(WireKeyUser(wire));
      ks->state.lr_mult = lr == cfg->lr_mult().end() ? 1.0f : lr->second;
    }
    std::optional<ShmArena::Stored> fresh;
    if (ks->Shared()) fresh = node_->AllocateStored(n * sizeof(float));
    float* out = fresh.has_value() ? reinterpret_cast<float*>(fresh->data) : ks->data;
    UpdateCheck check;
    if (rule.optimizer != nullptr && !h.sum_only()) {
      check = rule.optimizer->Update(g.data(), g.size(), ks->data, out, n, &ks->state);
    } else {
      SumInto(g.data(), g.size(), out, n);
      for (size_t k = 0; k < g.size() && check.bad_grad < 0 && !h.sum_only(); ++k) {
        if (!AllFinite(g[k], n)) check.bad_grad = static_cast<int>(k);
      }
      check.bad_weight = !h.sum_only() && !AllFinite(out, n);
    }
    if (fresh.has_value()) ks->Store(*std::move(fresh), n);
    if (check.bad_grad >= 0) {
      blame = WorkerId(from[check.bad_grad]);
      return Status::FailedPrecondition(
          StrCat("worker rank ", from[check.bad_grad], " pushed NaN or Inf in ", PartName(wire),
                 " (round ", round,
                 " of that key); the job stops so that it cannot end with a "
                 "broken model (PSTRAIN_NONFINITE=skip would leave such pushes out)"));
    }
    if (check.bad_weight) {
      return Status::FailedPrecondition(
          StrCat("the update of ", PartName(wire), " in round ", round,
                 " made its weights NaN or Inf although the gradients were finite: the learning "
                 "rate is too large for them (lower --lr, or clip with --clip-gradient)"));
    }
    return Status::Ok();
  };
  // The error of an update: every push of it is answered with it, and the job ends.
  auto finish = [&](const std::vector<Op>& ops, const Status& s) {
    for (const Op& d : ops) CompletePart(d, ks, s);
    if (!s.ok()) node_->Fail(Status(s.code(), StrCat(node_->Self(), ": ", s.message())), blame);
  };
  if (lost_[op.worker()].load()) {
    // Lost after the receive thread took its push (HandleMessage refuses
    // later ones): neither an async update nor a round (of one, where it
    // would be applied at once) takes it; the job went on without it.
    CompletePart(op, ks,
                 Status::FailedPrecondition(StrCat(NodeIdName(WorkerId(op.worker())),
                                                   " was declared lost; its push of ",
                                                   PartName(wire), " is not applied")));
    return;
  }
  if (h.sum_only() && !sync) {
    CompletePart(op, ks,
                 Status::FailedPrecondition(
                     StrCat("allreduce (sum-only push) of ", PartName(wire), " from worker rank ",
                            op.worker(), ", but the servers ",
                            cfg == nullptr ? "were not configured yet (send the config first)"
                                           : "run dist_async, which has no rounds to sum")));
    return;
  }
  if (cfg == nullptr || !cfg->sync_mode()) {
    if (rule.optimizer == nullptr) {
      CompletePart(op, ks,
                   Status::FailedPrecondition(
                       StrCat("async push of ", PartName(wire),
                              " but no optimizer was configured (send the config first)")));
      return;
    }
    Status st = apply({op});
    ++ks->rounds;
    if (st.ok()) st = MaybeSnapshot(wire, ks, snapshot_every);
    finish({op}, st);
    return;
  }
  if (live == 1 && ks->merged == 0) {  // a round of one: apply straight out of the received frame
    Status st = apply({op});
    ++ks->rounds;
    if (st.ok()) st = MaybeSnapshot(wire, ks, snapshot_every);
    finish({op}, st);
    return;
  }
  // Every push of a round is an allreduce's, or none: the round either
  // stores the sum or applies the optimizer.
  if (!ks->waiting.empty() && ks->waiting.front().header().sum_only() != h.sum_only()) {
    const Status mixed = Status::FailedPrecondition(
        StrCat("worker rank ", op.worker(), " pushed ", PartName(wire),
               h.sum_only() ? " as an allreduce" : " as a plain push",
               " into a round that worker rank ", ks->waiting.front().worker(), " opened ",
               h.sum_only() ? "with a plain push" : "as an allreduce",
               ": every worker must push a key the same way in a round"));
    CompletePart(op, ks, mixed);
    node_->Fail(Status(mixed.code(), StrCat(node_->Self(), ": ", mixed.message())),
                WorkerId(op.worker()));
    return;
  }
  // The pushed values stay in their requests (held until the round closes),
  // so the round's update reads them all in one pass, summed in arrival order.
  if (ks->merged == 0) {
    ks->opened = SteadyClock::now();
    ks->warned = false;
  }
  ++ks->merged;
  ks->in_round[op.worker()] = 1;
  ks->waiting.push_back(op);
  // A worker lost since its push was held: its push is not summed, also
  // where this shard has not run RemoveLost yet (the receive thread runs a
  // small push at once, and the loss lowered `live` already).
  if (live < num_workers) DropLostPushes(ks);
  if (ks->merged < live) {
    (void)FailRoundOfFinished(wire, *ks);
    return;
  }
  // Summed in worker-rank order, whatever the arrival order: a deterministic
  // job gives the same bits every time (and after a server's recovery).
  std::sort(ks->waiting.begin(), ks->waiting.end(),
            [](const Op& a, const Op& b) { return a.worker() < b.worker(); });
  Status s = apply(ks->waiting);
  ++ks->rounds;
  // Before the answers: a worker forgets a push once it is answered.
  if (s.ok()) s = MaybeSnapshot(wire, ks, snapshot_every);
  ks->merged = 0;
  std::fill(ks->in_round.begin(), ks->in_round.end(), 0);
  std::vector<Op> done;
  done.swap(ks->waiting);
  finish(done, s);
  (void)shard;
}

void KVServer::SumInto(const float* const* grads, size_t k, float* out, size_t n) {
  std::memcpy(out, grads[0], n * sizeof(float));
  for (size_t j = 1; j < k; ++j) {
    const float* g = grads[j];
    for (size_t i = 0; i < n; ++i) out[i] += g[i];
  }
}

void KVServer::CompletePart(const Op& op, const KeyState* ks, const Status& s) {
  Request* r = op.req.get();
  if (!s.ok()) {
    MutexLock l(&r->mu);
    if (r->error.ok()) r->error = s;
  } else if (r->msg.header.pull()) {
    const auto [slot, offset] = r->part_slot[op.part];
    Request::Slot& dst = r->slots[slot];
    if (dst.data == nullptr) {
      dst.blob = ks->value;  // zero-copy: shares the stored buffer
    } else {
      std::memcpy(dst.data + offset, ks->data, ks->size * sizeof(float));
    }
  }
  if (r->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) SendReply(r);
}

void KVServer::SendReply(Request* r) {
  Status error;
  {
    MutexLock l(&r->mu);
    error = r->error;
  }
  if (!error.ok()) {
    ReplyError(r->msg.header, error);
    return;
  }
  Message reply;
  PsHeader& h = reply.header;
  h.set_version(PROTOCOL_VERSION_CURRENT);
  h.set_cmd(CMD_DATA);
  h.set_sender(node_->id());
  h.set_receiver(r->msg.header.sender());
  h.set_request_id(r->msg.header.request_id());
  h.set_is_reply(true);
  h.set_dtype(DTYPE_FLOAT32);
  if (r->msg.header.pull()) {
    h.set_pull(true);
    h.set_num_value_frames(r->slots.size());
    h.set_value_bytes(r->reply_bytes);
    for (const Request::Slot& slot : r->slots) reply.values.push_back(slot.blob);
  }
  Answer(r->msg.header.sender(), std::move(reply));
  ++served_;
}

}  // namespace pstrain
