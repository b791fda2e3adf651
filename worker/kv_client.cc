#include "worker/kv_client.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_set>

namespace pstrain {
namespace {

// Parts at least this big get a value frame of their own (the server does the same).
constexpr uint64_t kOwnFrameBytes = 64 * 1024;

}  // namespace

struct KVClient::Sub {
  uint64_t id = 0;
  Ticket ticket = 0;
  int server = 0;
  int priority = 0;
  Message msg;
  std::vector<std::pair<float*, uint64_t>> outs;  // pull: destination of each part
  uint64_t expect_bytes = 0;
  Deadline deadline = Deadline::Never();
};

KVClientOptions KVClientOptionsFromJobEnv(const JobEnv& env) {
  KVClientOptions ko;
  ko.placement = env.placement == "balanced" ? Placement::kBalanced : Placement::kMxnet;
  ko.bigarray_bound = env.bigarray_bound;
  ko.chunk_elems = env.chunk_elems;
  ko.request_timeout_ms = env.request_timeout_ms;
  ko.recover = env.server_restarts > 0;
  ko.snapshot_every = env.snapshot_every;
  return ko;
}

KVClient::KVClient(ClusterNode* node, const KVClientOptions& options)
    : node_(node),
      options_(options),
      max_frame_bytes_(static_cast<uint64_t>(node->options().max_message_bytes)) {
  CHECK(node->role() == Role::kWorker);
  {
    MutexLock l(&mu_);
    queued_.resize(node->num_servers());
    inflight_count_.assign(node->num_servers(), 0);
    outbox_.resize(node->num_servers());
    flushing_.assign(node->num_servers(), false);
    paused_.assign(node->num_servers(), false);
  }
  if (options_.recover) {
    node_->AddReplacedListener([this](int id, bool connected) { ServerReplaced(id, connected); });
  }
  node_->SetMessageHandler([this](Message&& m) { HandleReply(std::move(m)); });
  node_->AddFailureListener([this](const Status& s) { FailAll(s); });
  node_->AddTickListener([this] { ExpireRequests(); });
  sender_ = std::thread([this] { SenderLoop(); });
}

KVClient::~KVClient() {
  // No reply handler runs once the node stops receiving; then the sender
  // thread stops, and only then do the sockets it sends on close.
  node_->StopReceiving();
  {
    MutexLock l(&mu_);
    sender_stop_ = true;
    sender_cv_.SignalAll();
  }
  sender_.join();
  node_->Stop();
}

StatusOr<const std::vector<PartPlan>*> KVClient::Parts(Key key, int64_t len) {
  auto it = plans_.find(key);
  if (it != plans_.end() && it->second.first == len) return &it->second.second;
  PlacementOptions po;
  po.policy = options_.placement;
  po.num_servers = node_->num_servers();
  po.bigarray_bound = options_.bigarray_bound;
  po.chunk_elems = options_.chunk_elems;
  ASSIGN_OR_RETURN(auto parts, PlaceKey(key, static_cast<uint64_t>(len), po));
  for (const PartPlan& p : parts) {
    if (p.len > int64_t{UINT32_MAX}) {
      // A message names each part's length in 32 bits.
      return Status::InvalidArgument(StrCat("key ", key, " of length ", len, " has a part of ",
                                            p.len, " floats on server rank ", p.server,
                                            "; a part holds at most ", UINT32_MAX,
                                            " (run more servers, or split the key)"));
    }
    if (p.len * sizeof(float) > max_frame_bytes_) {
      // Sent (and pulled back) as one frame, which the receiving node's
      // ZeroMQ would drop with the connection, silently.
      return Status::InvalidArgument(StrCat("key ", key, " of length ", len, " has a part of ",
                                            p.len, " floats (", p.len * int64_t{sizeof(float)},
                                            " bytes) on server rank ", p.server,
                                            ", over PSTRAIN_MAX_MESSAGE_BYTES=", max_frame_bytes_,
                                            " (raise it on every node, or run more servers)"));
    }
  }
  auto& slot = plans_[key];
  slot = {len, std::move(parts)};
  return &slot.second;
}

std::unique_ptr<KVClient::Sub> KVClient::NewSub(Ticket ticket, int server, int priority,
                                                PsCommand cmd) {
  auto sub = std::make_unique<Sub>();
  sub->id = next_request_++;
  sub->ticket = ticket;
  sub->server = server;
  sub->priority = priority;
  PsHeader& h = sub->msg.header;
  h.set_version(PROTOCOL_VERSION_CURRENT);
  h.set_cmd(cmd);
  h.set_sender(node_->id());
  h.set_receiver(ServerId(server));
  h.set_request_id(sub->id);
  return sub;
}

KVClient::Ticket KVClient::Issue(Kind kind, const std::vector<Key>& keys,
                                 const std::vector<int64_t>& lens, const float* vals, float* out,
                                 int priority, Callback cb) {
  bool flush_here = false;
  const Ticket ticket = Queue(kind, keys, lens, vals, out, priority, std::move(cb), nullptr,
                              Status::Ok(), &flush_here);
  if (flush_here) Flush();
  RunCallbacks();
  return ticket;
}

namespace {

Status CheckNoRepeatedKey(const std::vector<KVClient::Key>& keys) {
  if (const auto k = FirstRepeatedKey(keys.size(), [&keys](size_t i) { return keys[i]; })) {
    return Status::InvalidArgument(
        StrCat("key ", *k, " appears more than once in one request (sum its values first)"));
  }
  return Status::Ok();
}

}  // namespace

KVClient::Ticket KVClient::Queue(Kind kind, const std::vector<Key>& keys,
                                 const std::vector<int64_t>& lens, const float* vals, float* out,
                                 int priority, Callback cb, const CompressedValues* compressed,
                                 const Status& pre, bool* flush_here) {
  Ticket ticket;
  {
    MutexLock l(&mu_);
    ticket = next_ticket_++;
    TicketState& t = tickets_[ticket];
    t.cb = std::move(cb);
    auto finish_now = [&](const Status& s) REQUIRES(mu_) {
      t.remaining = 1;
      if (Callback c = FinishSub(ticket, s)) to_run_.emplace_back(std::move(c), s);
    };
    Status bad;
    if (!failure_.ok()) {
      bad = failure_;
    } else if (!pre.ok()) {
      bad = pre;
    } else if (keys.size() != lens.size()) {
      bad = Status::InvalidArgument(
          StrCat(keys.size(), " keys but ", lens.size(), " lengths in one request"));
    }
    if (bad.ok()) bad = CheckNoRepeatedKey(keys);
    const bool has_vals = kind != kPull;
    const bool has_out = kind == kPull || kind == kPushPull || kind == kAllReduce;
    if (bad.ok() && ((has_vals && vals == nullptr) || (has_out && out == nullptr))) {
      bad = Status::InvalidArgument("null value buffer");
    }
    if (!bad.ok() || keys.empty() || ((kind == kInit || kind == kReplace) && node_->rank() != 0)) {
      finish_now(bad);
    } else {
      struct Build {
        std::vector<uint64_t> keys;
        std::vector<uint32_t> lens;
        std::vector<std::pair<const float*, uint64_t>> runs;  // value frames: start, floats
        std::vector<std::pair<float*, uint64_t>> outs;
        uint64_t floats = 0;
        bool last_big = false;
      };
      std::vector<Build> builds(node_->num_servers());
      uint64_t offset = 0;
      for (size_t i = 0; i < keys.size() && bad.ok(); ++i) {
        if (lens[i] <= 0 || lens[i] > int64_t{1} << 40) {
          bad = Status::InvalidArgument(StrCat("key ", keys[i], " has length ", lens[i]));
          break;
        }
        if (kind == kReplace) {
          // Another length places the key's parts elsewhere (other wire keys,
          // other servers): the servers would keep the old parts.
          auto known = plans_.find(keys[i]);
          if (known != plans_.end() && known->second.first != lens[i]) {
            bad = Status::InvalidArgument(StrCat("replace of key ", keys[i], " with ", lens[i],
                                                 " elements, but it holds ", known->second.first,
                                                 " (a key keeps its length)"));
            break;
          }
        }
        auto parts = Parts(keys[i], lens[i]);
        if (!parts.ok()) {
          bad = parts.status();
          break;
        }
        for (const PartPlan& p : **parts) {
          Build& b = builds[p.server];
          b.keys.push_back(WireKey(p.server, keys[i], p.part));
          b.lens.push_back(static_cast<uint32_t>(p.len));
          b.floats += p.len;
          if (has_vals && compressed == nullptr) {
            // Big parts travel as their own frame (ZeroMQ moves several
            // MB-sized frames faster than one huge one); small neighbours share one.
            const float* start = vals + offset + p.offset;
            const bool big = p.len * sizeof(float) >= kOwnFrameBytes;
            if (!big && !b.runs.empty() && !b.last_big &&
                b.runs.back().first + b.runs.back().second == start &&
                (b.runs.back().second + p.len) * sizeof(float) <= max_frame_bytes_) {
              b.runs.back().second += p.len;
            } else {
              b.runs.emplace_back(start, p.len);
            }
            b.last_big = big;
          }
          if (has_out) b.outs.emplace_back(out + offset + p.offset, p.len);
        }
        offset += static_cast<uint64_t>(lens[i]);
      }
      if (!bad.ok()) {
        finish_now(bad);
      } else {
        for (const Build& b : builds) t.remaining += b.keys.empty() ? 0 : 1;
        for (int s = 0; s < node_->num_servers(); ++s) {
          Build& b = builds[s];
          if (b.keys.empty()) continue;
          std::unique_ptr<Sub> sub = NewSub(ticket, s, priority, CMD_DATA);
          PsHeader& h = sub->msg.header;
          h.set_init(kind == kInit || kind == kReplace);
          if (kind == kReplace) h.set_replace(true);
          h.set_push(kind == kPush || kind == kPushPull || kind == kAllReduce);
          if (kind == kAllReduce) h.set_sum_only(true);
          h.set_pull(has_out);
          h.set_priority(priority);
          h.set_dtype(compressed != nullptr ? DTYPE_2BIT : DTYPE_FLOAT32);
          h.set_num_keys(b.keys.size());
          sub->msg.keys = Blob::Copy(b.keys.data(), b.keys.size() * sizeof(uint64_t));
          sub->msg.lens = Blob::Copy(b.lens.data(), b.lens.size() * sizeof(uint32_t));
          if (compressed != nullptr) {
            const Blob& codes = compressed->frames[s];
            uint64_t bytes = 0;
            for (uint32_t len : b.lens) bytes += TwoBitBytes(len);
            CHECK_EQ(codes.size(), bytes) << "2-bit codes for server rank " << s;
            sub->msg.values.push_back(codes);
            h.set_num_value_frames(1);
            h.set_value_bytes(codes.size());
          } else if (has_vals) {
            AddValueFrames(s, b.runs, &sub->msg.values);
            h.set_num_value_frames(sub->msg.values.size());
            h.set_value_bytes(b.floats * sizeof(float));
          }
          if (options_.recover && h.push()) {
            size_t run = 0;
            uint64_t used = 0;   // floats of runs[run] before this part
            uint64_t words = 0;  // compressed: words of the parts before this one
            for (size_t i = 0; i < b.keys.size(); ++i) {
              const uint64_t round = ++pushes_[b.keys[i]];
              h.add_push_rounds(round);
              if (options_.snapshot_every <= 1) continue;
              // A copy: the caller reuses its buffer once this is answered,
              // and a replacement may need it until the next snapshot.
              auto& kept = kept_[b.keys[i]];
              Kept k;
              if (kept.size() >= static_cast<size_t>(options_.snapshot_every)) {
                k = std::move(kept.front());  // its buffer is reused: no allocation per push
                kept.pop_front();
              }
              k.round = round;
              k.sum_only = kind == kAllReduce;
              if (compressed != nullptr) {
                // What the server applies: the dequantized push, re-sent as float32.
                const auto* codes =
                    reinterpret_cast<const uint32_t*>(compressed->frames[s].data()) + words;
                words += TwoBitWords(b.lens[i]);
                k.values.resize(b.lens[i]);
                DequantizeTwoBit(codes, b.lens[i], compressed->threshold, k.values.data());
              } else {
                while (used == b.runs[run].second) {
                  ++run;
                  used = 0;
                }
                const float* v = b.runs[run].first + used;
                used += b.lens[i];
                k.values.assign(v, v + b.lens[i]);
              }
              kept.push_back(std::move(k));
            }
          }
          sub->outs = std::move(b.outs);
          sub->expect_bytes = has_out ? b.floats * sizeof(float) : 0;
          Enqueue(std::move(sub));
        }
      }
    }
    for (size_t s = 0; s < outbox_.size() && !*flush_here; ++s) {
      if (outbox_[s].empty() || flushing_[s] || paused_[s]) continue;
      if (Deferrable(static_cast<int>(s))) {
        WakeSender();
      } else {
        *flush_here = true;
      }
    }
  }
  return ticket;
}

bool KVClient::Deferrable(int server) {
  const auto& out = outbox_[server];
  // Replies are still to come (the connection is busy) and the newest message
  // may join a batch (earlier ones were judged when they came).
  return inflight_count_[server] > static_cast<int>(out.size()) &&
         Van::IsBatchable(out.back().second) && !node_->SharesMemoryWith(ServerId(server));
}

void KVClient::WakeSender() {
  if (sender_wanted_) return;
  sender_wanted_ = true;
  sender_cv_.Signal();
}

KVClient::Ticket KVClient::Init(const std::vector<Key>& keys, const std::vector<int64_t>& lens,
                                const float* vals, Callback cb) {
  return Issue(kInit, keys, lens, vals, nullptr, 0, std::move(cb));
}
KVClient::Ticket KVClient::Replace(const std::vector<Key>& keys, const std::vector<int64_t>& lens,
                                   const float* vals, Callback cb) {
  return Issue(kReplace, keys, lens, vals, nullptr, 0, std::move(cb));
}
KVClient::Ticket KVClient::Push(const std::vector<Key>& keys, const std::vector<int64_t>& lens,
                                const float* vals, int priority, Callback cb) {
  return IssuePush(kPush, keys, lens, vals, nullptr, priority, std::move(cb));
}
KVClient::Ticket KVClient::Pull(const std::vector<Key>& keys, const std::vector<int64_t>& lens,
                                float* out, int priority, Callback cb) {
  return Issue(kPull, keys, lens, nullptr, out, priority, std::move(cb));
}
KVClient::Ticket KVClient::PushPull(const std::vector<Key>& keys, const std::vector<int64_t>& lens,
                                    const float* vals, float* out, int priority, Callback cb) {
  return IssuePush(kPushPull, keys, lens, vals, out, priority, std::move(cb));
}

KVClient::Ticket KVClient::AllReduce(const std::vector<Key>& keys, const std::vector<int64_t>& lens,
                                     const float* vals, float* out, int priority, Callback cb) {
  // (Float32 always: a sum of quantized values would not be the sum.)
  return Issue(kAllReduce, keys, lens, vals, out, priority, std::move(cb));
}

KVClient::Ticket KVClient::IssuePush(Kind kind, const std::vector<Key>& keys,
                                     const std::vector<int64_t>& lens, const float* vals,
                                     float* out, int priority, Callback cb) {
  Ticket ticket = 0;
  bool flush_here = false;
  {
    MutexLock g(&gc_mu_);
    if (gc_.enabled()) {
      // Held until the push is queued: the residuals and the order in which
      // compressed pushes of a key leave stay in step. Not while sending or
      // running callbacks (which may push again).
      CompressedValues compressed;
      const Status s = Compress(keys, lens, vals, &compressed);
      ticket =
          Queue(kind, keys, lens, vals, out, priority, std::move(cb), &compressed, s, &flush_here);
    }
  }
  if (ticket == 0) return Issue(kind, keys, lens, vals, out, priority, std::move(cb));
  if (flush_here) Flush();
  RunCallbacks();
  return ticket;
}

GradientCompression KVClient::gradient_compression() const {
  MutexLock g(&gc_mu_);
  return gc_;
}

Status KVClient::Compress(const std::vector<Key>& keys, const std::vector<int64_t>& lens,
                          const float* vals, CompressedValues* out) {
  // Issue checks the same and reports these; here they only stop the work.
  if (keys.size() != lens.size() || vals == nullptr) {
    return Status::InvalidArgument(StrCat("push of ", keys.size(), " keys with ", lens.size(),
                                          " lengths", vals == nullptr ? " and no values" : ""));
  }
  // Before any residual moves: a refused push must leave them as they were.
  RETURN_IF_ERROR(CheckNoRepeatedKey(keys));
  // Pass 1: each key's parts (copies of the plans Issue lays the message out
  // by) and the bytes each server's frame takes.
  std::vector<std::vector<PartPlan>> plans(keys.size());
  std::vector<uint64_t> bytes(node_->num_servers(), 0);
  {
    MutexLock l(&mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (lens[i] <= 0 || lens[i] > int64_t{1} << 40) {
        return Status::InvalidArgument(StrCat("key ", keys[i], " has length ", lens[i]));
      }
      ASSIGN_OR_RETURN(const std::vector<PartPlan>* parts, Parts(keys[i], lens[i]));
      plans[i] = *parts;
      for (const PartPlan& p : plans[i]) bytes[p.server] += TwoBitBytes(p.len);
    }
  }
  // Each server's codes travel as one frame: within what its ZeroMQ takes
  // (checked before any residual moves, as above).
  for (int s = 0; s < node_->num_servers(); ++s) {
    if (bytes[s] > max_frame_bytes_) {
      return Status::InvalidArgument(StrCat(
          "a 2-bit push of ", keys.size(), " keys (key ", keys.front(), " first) has ", bytes[s],
          " bytes of codes for server rank ", s, ", over PSTRAIN_MAX_MESSAGE_BYTES=",
          max_frame_bytes_, " (push fewer keys per call, or raise it on every node)"));
    }
  }
  out->threshold = gc_.threshold;
  out->frames.assign(node_->num_servers(), Blob());
  std::vector<uint32_t*> at(node_->num_servers(), nullptr);
  for (int s = 0; s < node_->num_servers(); ++s) {
    if (bytes[s] == 0) continue;
    // For a co-located server in the arena's ring, where it is sent without a copy.
    ShmArena::Stored buf = node_->SharesMemoryWith(ServerId(s))
                               ? node_->AllocateOutgoing(bytes[s])
                               : AllocateOrHeap(nullptr, bytes[s], false);
    at[s] = reinterpret_cast<uint32_t*>(buf.data);
    out->frames[s] = std::move(buf.blob);
  }
  // Pass 2: quantize every part straight into its server's frame, in the
  // order Issue lays the parts out (keys in call order, parts in order).
  const float* v = vals;
  for (size_t i = 0; i < keys.size(); ++i) {
    std::vector<float>& r = residuals_[keys[i]];
    if (r.size() != static_cast<size_t>(lens[i])) r.assign(static_cast<size_t>(lens[i]), 0.0f);
    bool finite = true;
    for (const PartPlan& p : plans[i]) {
      finite &=
          QuantizeTwoBit(v + p.offset, r.data() + p.offset, p.len, gc_.threshold, at[p.server]);
      at[p.server] += TwoBitWords(p.len);
    }
    if (!finite) {
      // Quantized, it would be 0 on the servers, who could not tell, and stay
      // in the residual for good.
      return Status::FailedPrecondition(
          StrCat(node_->Self(), ": the gradient pushed for key ", keys[i],
                 " (plus its 2-bit compression residual) holds NaN or Inf; the job stops so "
                 "that it cannot end with a broken model"));
    }
    v += lens[i];
  }
  return Status::Ok();
}

KVClient::Ticket KVClient::TEST_SendRaw(int server, Message msg, Callback cb) {
  Ticket ticket;
  {
    MutexLock l(&mu_);
    ticket = next_ticket_++;
    TicketState& t = tickets_[ticket];
    t.cb = std::move(cb);
    t.remaining = 1;
    std::unique_ptr<Sub> sub = NewSub(ticket, server, 0, CMD_DATA);
    const PsHeader ids = sub->msg.header;
    sub->msg = std::move(msg);
    sub->msg.header.set_version(ids.version());
    sub->msg.header.set_cmd(CMD_DATA);
    sub->msg.header.set_sender(ids.sender());
    sub->msg.header.set_receiver(ids.receiver());
    sub->msg.header.set_request_id(ids.request_id());
    Enqueue(std::move(sub));
  }
  FlushAndRunCallbacks(/*may_block=*/true);
  return ticket;
}

void KVClient::AddValueFrames(int server,
                              const std::vector<std::pair<const float*, uint64_t>>& runs,
                              std::vector<Blob>* frames) {
  const auto small = [](uint64_t floats) { return floats * sizeof(float) < kOwnFrameBytes; };
  // A gathered frame stays within the frame size the server's ZeroMQ takes.
  const uint64_t max_floats = max_frame_bytes_ / sizeof(float);
  for (size_t i = 0; i < runs.size();) {
    size_t end = i + 1;
    uint64_t floats = runs[i].second;
    if (small(runs[i].second)) {
      while (end < runs.size() && small(runs[end].second) &&
             floats + runs[end].second <= max_floats) {
        floats += runs[end++].second;
      }
    }
    if (end == i + 1) {  // one run: referenced where it lies
      frames->emplace_back(nullptr, runs[i].first, runs[i].second * sizeof(float));
      i = end;
      continue;
    }
    // Small parts scattered over the caller's buffer (a call's keys alternate
    // between servers) are gathered into one frame: a copy costs less than a
    // ZeroMQ frame each. For a co-located server in the arena, where it is
    // sent without a further copy.
    const uint64_t bytes = floats * sizeof(float);
    ShmArena::Stored buf = node_->SharesMemoryWith(ServerId(server))
                               ? node_->AllocateOutgoing(bytes)
                               : AllocateOrHeap(nullptr, bytes, false);
    char* at = buf.data;
    for (; i < end; ++i) {
      std::memcpy(at, runs[i].first, runs[i].second * sizeof(float));
      at += runs[i].second * sizeof(float);
    }
    frames->push_back(std::move(buf.blob));
  }
}

void KVClient::Enqueue(std::unique_ptr<Sub> sub) {
  auto& q = queued_[sub->server];
  if (q.empty() && inflight_count_[sub->server] < options_.max_inflight_per_server) {
    SendSub(std::move(sub));
    return;
  }
  // A request may not overtake a queued one that shares a key: cap its priority.
  std::unordered_set<uint64_t> mine;
  for (size_t i = 0; i < sub->msg.header.num_keys(); ++i) mine.insert(sub->msg.key(i));
  for (const auto& other : q) {
    if (other->priority >= sub->priority) continue;
    for (size_t i = 0; i < other->msg.header.num_keys(); ++i) {
      if (mine.count(other->msg.key(i))) {
        sub->priority = other->priority;
        break;
      }
    }
  }
  auto pos = std::find_if(q.begin(), q.end(), [&](const std::unique_ptr<Sub>& o) {
    return o->priority < sub->priority;
  });
  q.insert(pos, std::move(sub));
}

void KVClient::SendSub(std::unique_ptr<Sub> sub) {
  sub->deadline = Deadline::InMillis(options_.request_timeout_ms);
  ++inflight_count_[sub->server];
  const uint64_t id = sub->id;
  // In flight before it is sent: the reply may come before Send returns.
  // With recovery the request keeps its message, to send it again to a replacement.
  outbox_[sub->server].emplace_back(id, options_.recover ? sub->msg : std::move(sub->msg));
  inflight_[id] = std::move(sub);
}

void KVClient::Flush() {
  MutexLock l(&mu_);
  for (size_t s = 0; s < outbox_.size(); ++s) {
    if (flushing_[s] || paused_[s] || outbox_[s].empty()) continue;
    flushing_[s] = true;
    // Once the client stops, what is left is dropped, not sent (each failed
    // send refills the outbox and could block for the send timeout).
    while (!outbox_[s].empty() && !sender_stop_) {
      std::deque<std::pair<uint64_t, Message>> out;
      out.swap(outbox_[s]);
      std::vector<std::pair<uint64_t, Status>> failed;  // request, why
      {
        // Unlocked: a send may block (a full connection) for up to the
        // send timeout, and replies must get through meanwhile.
        mu_.Unlock();
        failed = SendInOrder(static_cast<int>(s), out);
        mu_.Lock();
      }
      for (const auto& [id, why] : failed) {
        auto it = inflight_.find(id);
        if (it == inflight_.end()) continue;  // the job failed meanwhile
        const Ticket ticket = it->second->ticket;
        inflight_.erase(it);
        --inflight_count_[s];
        if (Callback c = FinishSub(ticket, why)) to_run_.emplace_back(std::move(c), why);
      }
      if (!failed.empty()) Pump(static_cast<int>(s));
    }
    flushing_[s] = false;
    if (paused_[s]) flushed_cv_.SignalAll();  // ServerReplaced waits for this
  }
}

std::vector<std::pair<uint64_t, Status>> KVClient::SendInOrder(
    int server, const std::deque<std::pair<uint64_t, Message>>& out) {
  std::vector<const Message*> msgs;
  msgs.reserve(out.size());
  for (const auto& [id, msg] : out) msgs.push_back(&msg);
  size_t sent = 0;
  const Status st = node_->SendBatch(ServerId(server), msgs, &sent);
  std::vector<std::pair<uint64_t, Status>> failed;
  for (size_t i = sent; !st.ok() && i < out.size(); ++i) failed.emplace_back(out[i].first, st);
  return failed;
}

void KVClient::FlushAndRunCallbacks(bool may_block) {
  if (may_block) {
    Flush();
  } else {
    MutexLock l(&mu_);
    for (size_t s = 0; s < outbox_.size(); ++s) {
      if (!flushing_[s] && !paused_[s] && !outbox_[s].empty()) WakeSender();
    }
  }
  RunCallbacks();
}

void KVClient::SenderLoop() {
  for (;;) {
    {
      MutexLock l(&mu_);
      sender_cv_.WaitUntil(Deadline::Never(),
                           [this]() REQUIRES(mu_) { return sender_wanted_ || sender_stop_; });
      if (sender_stop_) return;
      sender_wanted_ = false;
    }
    Flush();
    RunCallbacks();
  }
}

void KVClient::Pump(int server) {
  auto& q = queued_[server];
  while (!q.empty() && inflight_count_[server] < options_.max_inflight_per_server) {
    std::unique_ptr<Sub> sub = std::move(q.front());
    q.pop_front();
    SendSub(std::move(sub));
  }
}

KVClient::Callback KVClient::FinishSub(Ticket ticket, const Status& s) {
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) return nullptr;
  TicketState& t = it->second;
  if (!s.ok() && t.status.ok()) t.status = s;
  if (--t.remaining > 0) return nullptr;
  t.done = true;
  cv_.SignalAll();  // a Wait for it (one for a ticket with a callback ends too)
  if (!t.cb) return nullptr;
  // A ticket with a callback is reported through it and forgotten.
  Callback cb = std::move(t.cb);
  Status st = t.status;
  tickets_.erase(it);
  return [cb = std::move(cb), st](const Status&) { cb(st); };
}

void KVClient::RunCallbacks() {
  std::vector<std::pair<Callback, Status>> run;
  {
    MutexLock l(&mu_);
    run.swap(to_run_);
  }
  for (auto& [cb, s] : run) cb(s);
}

void KVClient::HandleReply(Message&& msg) {
  const PsHeader& h = msg.header;
  if (!h.is_reply()) return;
  std::unique_ptr<Sub> sub;
  {
    MutexLock l(&mu_);
    auto it = inflight_.find(h.request_id());
    if (it == inflight_.end() || ServerId(it->second->server) != h.sender()) {
      LOG(WARNING) << node_->Self() << ": dropping a reply to unknown request " << h.request_id()
                   << " from " << NodeIdName(h.sender());
      return;
    }
    sub = std::move(it->second);
    inflight_.erase(it);
    // Answered, in the same step as it leaves inflight_: a replacement of the
    // server (ServerReplaced) in between would re-send it neither as kept nor
    // as unanswered. (A reply found malformed below fails its request.)
    const PsHeader& sent = sub->msg.header;
    if (h.error_code() == 0 && options_.snapshot_every > 1 && sent.push_rounds_size() > 0) {
      for (int i = 0; i < sent.push_rounds_size(); ++i) {
        uint64_t& a = answered_[sub->msg.key(static_cast<size_t>(i))];
        a = std::max<uint64_t>(a, sent.push_rounds(i));
      }
    }
  }
  Status st;
  if (h.error_code() != 0) {
    st = Status(static_cast<StatusCode>(h.error_code()), h.error_message());
  } else if (h.value_bytes() != sub->expect_bytes) {
    st = Status::Corruption(StrCat(node_->Describe(h.sender()), " answered request ",
                                   h.request_id(), " with ", h.value_bytes(),
                                   " value bytes, expected ", sub->expect_bytes));
  } else if (!sub->outs.empty()) {
    // Copy each part out of the received frame(s) into the caller's buffer.
    size_t frame = 0, used = 0;
    for (const auto& [dst, n] : sub->outs) {
      const size_t bytes = n * sizeof(float);
      while (frame < msg.values.size() && used == msg.values[frame].size()) {
        ++frame;
        used = 0;
      }
      if (frame >= msg.values.size() || used + bytes > msg.values[frame].size()) {
        st = Status::Corruption(StrCat(node_->Describe(h.sender()), " answered request ",
                                       h.request_id(), " with a part split across frames"));
        break;
      }
      std::memcpy(dst, msg.values[frame].data() + used, bytes);
      used += bytes;
    }
  }
  {
    MutexLock l(&mu_);
    --inflight_count_[sub->server];
    if (Callback c = FinishSub(sub->ticket, st)) to_run_.emplace_back(std::move(c), st);
    Pump(sub->server);
  }
  FlushAndRunCallbacks(/*may_block=*/false);  // the receive thread: the sender thread sends
}

Status KVClient::Wait(Ticket ticket, Deadline deadline) {
  MutexLock l(&mu_);
  auto done = [&]() REQUIRES(mu_) {
    auto it = tickets_.find(ticket);
    return it == tickets_.end() || it->second.done || !failure_.ok();
  };
  cv_.WaitUntil(deadline, done);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) return failure_;
  if (it->second.done) {
    Status s = it->second.status;
    tickets_.erase(it);
    return s;
  }
  if (!failure_.ok()) return failure_;
  std::set<int> owing;
  for (const auto& [id, sub] : inflight_) {
    if (sub->ticket == ticket) owing.insert(sub->server);
  }
  for (const auto& q : queued_) {
    for (const auto& sub : q) {
      if (sub->ticket == ticket) owing.insert(sub->server);
    }
  }
  std::string who;
  for (int s : owing) who += " " + node_->Describe(ServerId(s));
  return Status::DeadlineExceeded(StrCat(node_->Self(), ": request ticket ", ticket,
                                         " not done by its deadline; waiting on",
                                         who.empty() ? " nothing" : who));
}

Status KVClient::SetServerConfig(const ServerConfig& config, Deadline deadline) {
  Ticket ticket;
  {
    MutexLock l(&mu_);
    if (!failure_.ok()) return failure_;
    ticket = next_ticket_++;
    TicketState& t = tickets_[ticket];
    t.remaining = node_->num_servers();
    for (int s = 0; s < node_->num_servers(); ++s) {
      std::unique_ptr<Sub> sub = NewSub(ticket, s, INT32_MAX, CMD_CONFIG);
      ServerConfig sent = config;
      if (options_.recover) sent.set_snapshot_every(static_cast<uint32_t>(options_.snapshot_every));
      sub->msg.header.set_body(sent.SerializeAsString());
      Enqueue(std::move(sub));
    }
  }
  FlushAndRunCallbacks(/*may_block=*/true);
  RETURN_IF_ERROR(Wait(ticket, deadline));
  // Every server takes it: pushes from now on are compressed as it says.
  GradientCompression gc;
  if (config.gradient_compression().type() == GradientCompressionConfig::TWO_BIT) {
    gc.type = GradientCompressionType::kTwoBit;
    gc.threshold = config.gradient_compression().threshold();
  }
  MutexLock g(&gc_mu_);
  gc_ = gc;
  // What compression left unsent is not carried into a later one.
  if (!gc.enabled()) residuals_.clear();
  return Status::Ok();
}

void KVClient::FailAll(const Status& s) {
  {
    MutexLock l(&mu_);
    if (failure_.ok()) failure_ = s;
    std::vector<Ticket> affected;
    for (auto& [id, sub] : inflight_) affected.push_back(sub->ticket);
    for (auto& q : queued_) {
      for (auto& sub : q) affected.push_back(sub->ticket);
      q.clear();
    }
    for (auto& o : outbox_) o.clear();
    // Abandoned: ZeroMQ may still hold their frames until the node stops.
    inflight_.clear();
    std::fill(inflight_count_.begin(), inflight_count_.end(), 0);
    for (Ticket t : affected) {
      if (Callback c = FinishSub(t, s)) to_run_.emplace_back(std::move(c), s);
    }
    cv_.SignalAll();
    flushed_cv_.SignalAll();
  }
  RunCallbacks();
}

void KVClient::ServerReplaced(int id, bool connected) {
  if (!IsServerId(id) || RankOfId(id) >= node_->num_servers()) return;
  const int server = RankOfId(id);
  {
    MutexLock l(&mu_);
    if (!connected) {
      // Nothing may reach the new process before what it lacks: wait for a
      // send in progress (bounded by the send timeout) and hold the rest.
      paused_[server] = true;
      flushed_cv_.WaitUntil(Deadline::InMillis(60000),
                            [&]() REQUIRES(mu_) { return !flushing_[server] || !failure_.ok(); });
      return;
    }
    std::deque<std::pair<uint64_t, Message>>& out = outbox_[server];
    out.clear();  // every message in it belongs to a request in flight, sent again below
    // 1. Answered pushes the replacement may have lost (after its last
    // snapshot; it skips the rounds it holds), oldest round first.
    std::vector<std::pair<uint64_t, uint64_t>> kept;  // (round, wire key)
    for (const auto& [wire, copies] : kept_) {
      if (WireKeyServer(wire) != server) continue;
      const uint64_t answered = answered_.count(wire) > 0 ? answered_.at(wire) : 0;
      for (const Kept& k : copies) {
        if (k.round <= answered) kept.emplace_back(k.round, wire);
      }
    }
    std::sort(kept.begin(), kept.end());
    const uint64_t first_kept = next_request_;  // requests made here are the kept pushes
    if (!kept.empty()) {
      const Ticket ticket = next_ticket_++;
      TicketState& t = tickets_[ticket];
      t.remaining = static_cast<int>(kept.size());
      t.cb = [this](const Status& s) {
        if (!s.ok()) node_->Fail(s.WithContext("re-sending pushes to a replaced server"));
      };
      for (const auto& [round, wire] : kept) {
        const Kept* k = nullptr;
        for (const Kept& c : kept_[wire]) {
          if (c.round == round) k = &c;
        }
        std::unique_ptr<Sub> sub = NewSub(ticket, server, INT32_MAX, CMD_DATA);
        PsHeader& h = sub->msg.header;
        h.set_push(true);
        if (k->sum_only) h.set_sum_only(true);
        h.set_dtype(DTYPE_FLOAT32);
        h.set_num_keys(1);
        h.add_push_rounds(round);
        h.set_num_value_frames(1);
        h.set_value_bytes(k->values.size() * sizeof(float));
        sub->msg.keys = Blob::Copy(&wire, sizeof(wire));
        const uint32_t len = static_cast<uint32_t>(k->values.size());
        sub->msg.lens = Blob::Copy(&len, sizeof(len));
        sub->msg.values.push_back(Blob::Copy(k->values.data(), k->values.size() * sizeof(float)));
        sub->deadline = Deadline::InMillis(options_.request_timeout_ms);
        ++inflight_count_[server];
        out.emplace_back(sub->id, sub->msg);
        inflight_[sub->id] = std::move(sub);
      }
    }
    // 2. Every request it has not answered, in the order they were made.
    const size_t resent = out.size();
    std::vector<Sub*> unanswered;
    for (auto& [rid, sub] : inflight_) {
      if (sub->server == server && rid < first_kept) unanswered.push_back(sub.get());
    }
    std::sort(unanswered.begin(), unanswered.end(),
              [](const Sub* a, const Sub* b) { return a->id < b->id; });
    for (Sub* sub : unanswered) {
      sub->deadline = Deadline::InMillis(options_.request_timeout_ms);
      out.emplace_back(sub->id, sub->msg);
    }
    LOG(WARNING) << node_->Self() << ": sending the replacement of server rank " << server << " "
                 << resent << " kept push(es) and " << unanswered.size()
                 << " unanswered request(s)";
    paused_[server] = false;
  }
  FlushAndRunCallbacks(/*may_block=*/false);  // the sender thread sends them
}

void KVClient::ExpireRequests() {
  std::string late;
  int server = -1;
  {
    MutexLock l(&mu_);
    for (const auto& [id, sub] : inflight_) {
      if (sub->deadline.Expired()) {
        server = ServerId(sub->server);
        late = StrCat("no reply from ", node_->Describe(ServerId(sub->server)), " to request ", id,
                      " within ", options_.request_timeout_ms, " ms (PSTRAIN_REQUEST_TIMEOUT_MS)");
        break;
      }
    }
  }
  if (!late.empty()) node_->Fail(Status::DeadlineExceeded(late), server);
}

}  // namespace pstrain
