#include "scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <tuple>

#include "common/job_cause.h"
#include "net/host_address.h"

namespace pstrain {
namespace {

// Temporary van ids for nodes that registered but have no rank yet.
constexpr int kPendingIdBase = 1 << 20;

int64_t MillisSince(SteadyClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t).count();
}

}  // namespace

StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const ClusterOptions& options) {
  std::unique_ptr<Scheduler> s(new Scheduler(options));
  VanOptions vo;
  // Listen at the address the nodes connect to (DMLC_PS_ROOT_URI), unless told otherwise.
  vo.bind_host = options.bind_host.empty() ? options.root_host : options.bind_host;
  vo.port = options.root_port;
  vo.verbose = options.verbose;
  vo.name = "scheduler";
  vo.max_message_bytes = 1 << 20;  // control messages only
  vo.send_timeout_ms = 1000;
  std::random_device rd;
  s->nonce_ = (uint64_t{rd()} << 32) ^ rd() ^
              static_cast<uint64_t>(SteadyClock::now().time_since_epoch().count());
  vo.routing_id = SchedulerRoute(s->nonce_);
  if (!options.key_file.empty()) {
    ASSIGN_OR_RETURN(JobKeys keys, ReadJobKeys(options.key_file));
    vo.keys = std::make_shared<const JobKeys>(std::move(keys));
    vo.encrypt = options.encrypt;
  } else {
    LOG(WARNING) << "scheduler: this job is not authenticated (no PSTRAIN_KEY_FILE): any process "
                    "that can reach its ports can join it or send to it; `pstrain launch` makes a "
                    "key for every job, `pstrain keygen FILE` makes one for a job started by hand";
  }
  Scheduler* raw = s.get();
  ASSIGN_OR_RETURN(s->van_, Van::Create(vo, [raw](Message&& m) { raw->Handle(std::move(m)); }));
  s->port_ = s->van_->port();
  s->van_->StartReceiving();
  return s;
}

Scheduler::~Scheduler() { van_.reset(); }

PsHeader Scheduler::Header(PsCommand cmd) const {
  PsHeader h;
  h.set_version(PROTOCOL_VERSION_CURRENT);
  h.set_cmd(cmd);
  h.set_sender(kSchedulerId);
  return h;
}

std::string Scheduler::Describe(int id) const {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return NodeIdName(id);
  const NodeInfo& n = it->second.info;
  return StrCat(RoleName(static_cast<Role>(n.role())), " rank ", n.rank(), " at ",
                JoinHostPort(n.host(), n.port()));
}

void Scheduler::Broadcast(const Message& msg, int except) {
  for (const auto& [id, node] : nodes_) {
    if (id == except || lost_.count(id) > 0) continue;
    Status s = van_->Send(id, msg);
    if (!s.ok()) LOG(WARNING) << s;
  }
}

void Scheduler::Abort(const std::string& why, int except, int culprit) {
  if (!failure_.ok() || done_) return;
  failure_ = Status::Unavailable(why);
  std::string cause;
  if (culprit == kSchedulerId) {
    cause = JobProcessName("scheduler", 0);
  } else if (auto it = nodes_.find(culprit); it != nodes_.end()) {
    cause =
        JobProcessName(RoleName(static_cast<Role>(it->second.info.role())), it->second.info.rank());
  }
  if (cause.empty()) {
    LOG(ERROR) << "scheduler: " << why;
  } else {
    LOG(ERROR) << "scheduler: " << kJobCauseMarker << cause << ": " << why;
  }
  Message m;
  m.header = Header(CMD_ABORT);
  m.header.set_error_message(why);
  if (started_) {
    Broadcast(m, except);
  } else {
    for (size_t i = 0; i < pending_.size(); ++i) (void)van_->Send(kPendingIdBase + i, m);
  }
  cv_.SignalAll();
}

void Scheduler::Handle(Message&& msg) {
  MutexLock l(&mu_);
  const PsHeader& h = msg.header;
  if (lost_.count(h.sender()) > 0) {
    if (h.cmd() != CMD_HEARTBEAT) {
      LOG(WARNING) << "scheduler: ignoring " << PsCommand_Name(h.cmd()) << " from "
                   << Describe(h.sender()) << ", which the job went on without";
    }
    return;
  }
  auto it = nodes_.find(h.sender());
  if (it != nodes_.end()) it->second.last_seen = SteadyClock::now();
  if (auto d = dead_.find(h.sender()); d != dead_.end() && replacing_.count(h.sender()) == 0) {
    // Declared dead for its silence, yet it speaks (a stalled host, a pause
    // longer than the heartbeat timeout): no replacement is under way, so the
    // job goes on with it instead of aborting when none comes.
    LOG(WARNING) << "scheduler: " << Describe(h.sender()) << " is heard from again after "
                 << MillisSince(d->second.since)
                 << " ms declared dead; no longer waiting for its replacement";
    dead_.erase(d);
    // What it was not told while dead (WorkerFinished skips dead servers).
    for (int w : finished_) {
      if (lost_.count(w) > 0 || nodes_.count(w) == 0) continue;
      Message notice;
      notice.header = Header(CMD_WORKER_FINISHED);
      *notice.header.mutable_node() = nodes_.at(w).info;
      Status sent = van_->Send(h.sender(), notice);
      if (!sent.ok()) LOG(WARNING) << "scheduler: " << sent;
    }
  }
  switch (h.cmd()) {
    case CMD_REGISTER:
      Register(msg);
      return;
    case CMD_HEARTBEAT:
      if (it != nodes_.end()) {
        Message reply;
        reply.header = Header(CMD_HEARTBEAT);
        (void)van_->Send(h.sender(), reply);
      }
      return;
    case CMD_BARRIER:
      EnterBarrier(msg);
      return;
    case CMD_FINISH:
      if (it == nodes_.end() || !IsWorkerId(h.sender())) return;
      if (finished_.insert(h.sender()).second) WorkerFinished(h.sender());
      return;
    case CMD_NODE_REPLACED: {
      // A worker is ready for a replacement server.
      auto r = replacing_.find(h.node().id());
      if (!h.is_reply() || it == nodes_.end() || !IsWorkerId(h.sender()) || r == replacing_.end()) {
        return;
      }
      r->second.waiting.erase(h.sender());
      if (!r->second.waiting.empty()) return;
      SendReplacementTable(r->first, r->second.table);
      replacing_.erase(r);
      return;
    }
    case CMD_ABORT:
      if (it == nodes_.end()) return;
      Abort(StrCat(Describe(h.sender()), " failed: ", h.error_message(), OpenBarriers()),
            h.sender(), h.has_blame() ? h.blame() : h.sender());
      return;
    default:
      LOG(WARNING) << "scheduler: ignoring command " << PsCommand_Name(h.cmd()) << " from "
                   << NodeIdName(h.sender());
  }
}

std::string Scheduler::JobMismatch(const PsHeader& h) const {
  const NodeInfo& n = h.node();
  if (h.version() != PROTOCOL_VERSION_CURRENT) {
    return StrCat("speaks protocol version ", h.version(), ", the scheduler ",
                  static_cast<int>(PROTOCOL_VERSION_CURRENT));
  }
  if (n.num_servers() != options_.num_servers || n.num_workers() != options_.num_workers) {
    return StrCat("has DMLC_NUM_SERVER=", n.num_servers(), " DMLC_NUM_WORKER=", n.num_workers(),
                  ", the scheduler ", options_.num_servers, " and ", options_.num_workers);
  }
  if (n.job_id() != options_.job_id) {
    return StrCat("belongs to job '", n.job_id(), "' (PSTRAIN_JOB_ID), the scheduler to '",
                  options_.job_id, "'");
  }
  if (n.build() != options_.build) {
    return StrCat("runs build ", n.build(), ", the scheduler ", options_.build);
  }
  return "";
}

void Scheduler::Refuse(const NodeInfo& n, const std::string& why) {
  LOG(WARNING) << "scheduler: refusing the registration of "
               << RoleName(static_cast<Role>(n.role())) << " at "
               << JoinHostPort(n.host(), n.port()) << ": " << why;
  if (van_->Connect(kPendingIdBase - 1, n.host(), n.port()).ok()) {
    Message m;
    m.header = Header(CMD_ABORT);
    m.header.set_error_message(StrCat("scheduler rejected this node: ", why));
    (void)van_->Send(kPendingIdBase - 1, m);
    van_->Disconnect(kPendingIdBase - 1);
  }
}

void Scheduler::Register(const Message& msg) {
  const NodeInfo& n = msg.header.node();
  if (!failure_.ok()) {
    Refuse(n, StrCat("the job has failed: ", failure_.message()));
    return;
  }
  if (started_) {
    if (static_cast<Role>(n.role()) == Role::kServer && options_.server_restarts > 0) {
      Replace(msg);
      return;
    }
    Refuse(n, "the job already has all its nodes");
    return;
  }
  const Role role = static_cast<Role>(n.role());
  if (role != Role::kServer && role != Role::kWorker) {
    Refuse(n, StrCat("role ", n.role(), " cannot register"));
    return;
  }
  // The registration must come on the connection its nonce names: later
  // messages claiming this node's id are taken only from that one.
  if (!msg.route.empty() && msg.route != NodeRoute(n.nonce())) {
    Refuse(n, "its connection does not carry the routing id its nonce implies");
    return;
  }
  // Every node must be part of the same job: one that is not cannot take
  // part, and the job cannot run without it, so it ends here, naming it.
  const std::string mismatch = JobMismatch(msg.header);
  if (!mismatch.empty()) {
    const std::string why =
        StrCat(RoleName(role), " at ", JoinHostPort(n.host(), n.port()), " ", mismatch);
    Refuse(n, why);
    Abort(StrCat(why, "; every node of a job must agree"), -1);
    return;
  }
  // A server restarted before the job started (the launcher restarts one
  // that died at once): it takes the place of its launch rank's registration.
  if (role == Role::kServer && n.restart() > 0 && n.launch_rank() >= 0) {
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (pending_[i].role() != n.role() || pending_[i].launch_rank() != n.launch_rank()) continue;
      Status s = van_->Connect(kPendingIdBase + static_cast<int>(i), n.host(), n.port());
      if (!s.ok()) {
        LOG(WARNING) << "scheduler: " << s;
        return;
      }
      LOG(WARNING) << "scheduler: server launch rank " << n.launch_rank() << " at "
                   << JoinHostPort(n.host(), n.port()) << " (restart " << n.restart()
                   << ") replaces its registration from "
                   << JoinHostPort(pending_[i].host(), pending_[i].port())
                   << ", which died before the job started";
      pending_[i] = n;
      return;
    }
  }
  int have = 0;
  for (const NodeInfo& p : pending_) have += p.role() == n.role();
  const int want = role == Role::kServer ? options_.num_servers : options_.num_workers;
  if (have >= want) {
    Refuse(n, StrCat("already have ", want, " ", RoleName(role), "s (DMLC_NUM_",
                     role == Role::kServer ? "SERVER" : "WORKER", "=", want, ")"));
    return;
  }
  Status s = van_->Connect(kPendingIdBase + static_cast<int>(pending_.size()), n.host(), n.port());
  if (!s.ok()) {
    LOG(WARNING) << "scheduler: " << s;
    return;
  }
  pending_.push_back(n);
  if (options_.verbose >= 1) {
    LOG(INFO) << "scheduler: registered " << RoleName(role) << " at "
              << JoinHostPort(n.host(), n.port()) << " (" << pending_.size() << "/"
              << options_.num_servers + options_.num_workers << ")";
  }
  if (static_cast<int>(pending_.size()) < options_.num_servers + options_.num_workers) return;

  // Everyone is here. Ranks: the launcher's numbers (PSTRAIN_LAUNCH_RANK)
  // for a role whose nodes all have distinct ones in range, so that
  // "server-1" of the launcher's logs is server rank 1; otherwise by (role,
  // host, port, nonce). Neither depends on arrival order.
  auto launch_ranks_usable = [&](int role, int count) REQUIRES(mu_) {
    std::set<int> seen;
    for (const NodeInfo& p : pending_) {
      if (p.role() != role) continue;
      if (p.launch_rank() < 0 || p.launch_rank() >= count || !seen.insert(p.launch_rank()).second) {
        return false;
      }
    }
    return true;
  };
  const bool by_launch[2] = {
      launch_ranks_usable(static_cast<int>(Role::kServer), options_.num_servers),
      launch_ranks_usable(static_cast<int>(Role::kWorker), options_.num_workers)};
  auto order = [&](const NodeInfo& n) {
    const bool use = by_launch[static_cast<Role>(n.role()) == Role::kServer ? 0 : 1];
    return std::make_tuple(n.role(), use ? n.launch_rank() : -1, n.host(), n.port(), n.nonce());
  };
  std::vector<NodeInfo> sorted = pending_;
  std::sort(sorted.begin(), sorted.end(),
            [&](const NodeInfo& a, const NodeInfo& b) { return order(a) < order(b); });
  int server_rank = 0, worker_rank = 0;
  const auto now = SteadyClock::now();
  for (NodeInfo& info : sorted) {
    if (static_cast<Role>(info.role()) == Role::kServer) {
      info.set_rank(server_rank);
      info.set_id(ServerId(server_rank++));
    } else {
      info.set_rank(worker_rank);
      info.set_id(WorkerId(worker_rank++));
    }
    nodes_[info.id()] = Node{info, now};
    van_->ExpectRoute(info.id(), NodeRoute(info.nonce()));
  }
  // The connections opened at registration become the nodes' (a second
  // connection with the same routing id would be refused by the node).
  for (size_t i = 0; i < pending_.size(); ++i) {
    for (const auto& [id, node] : nodes_) {
      if (node.info.nonce() == pending_[i].nonce() && node.info.port() == pending_[i].port()) {
        van_->Rename(kPendingIdBase + static_cast<int>(i), id);
      }
    }
  }
  started_ = true;
  if (options_.verbose >= 1) {
    for (const auto& [id, node] : nodes_) LOG(INFO) << "scheduler: " << Describe(id);
  }
  Broadcast(NodeTable(), -1);
  cv_.SignalAll();
}

Message Scheduler::NodeTable() const {
  Message table;
  table.header = Header(CMD_NODE_TABLE);
  table.header.set_scheduler_route(SchedulerRoute(nonce_));
  for (const auto& [id, node] : nodes_) *table.header.add_nodes() = node.info;
  return table;
}

void Scheduler::ServerSilent(int id, const std::string& why) {
  if (dead_.count(id) > 0) return;
  const int used = restarts_used_[id];
  if (used >= options_.server_restarts) {
    Abort(options_.server_restarts > 0
              ? StrCat(why, "; it was replaced ", used,
                       " time(s) already, as many as allowed (PSTRAIN_SERVER_RESTARTS=",
                       options_.server_restarts, ")")
              : why,
          id, id);
    return;
  }
  LOG(WARNING) << "scheduler: " << why << "; waiting up to " << options_.restart_timeout_ms
               << " ms (PSTRAIN_RESTART_TIMEOUT_MS) for its replacement (restart " << used + 1
               << " of " << options_.server_restarts << ")";
  dead_[id] = Dead{SteadyClock::now(), why};
}

void Scheduler::Replace(const Message& msg) {
  const NodeInfo& n = msg.header.node();
  if (!msg.route.empty() && msg.route != NodeRoute(n.nonce())) {
    Refuse(n, "its connection does not carry the routing id its nonce implies");
    return;
  }
  const std::string mismatch = JobMismatch(msg.header);
  if (!mismatch.empty()) {
    Refuse(n, mismatch);
    return;
  }
  // Which server it replaces: the launcher's rank, else the one dead server.
  int id = -1;
  if (n.launch_rank() >= 0 && n.launch_rank() < options_.num_servers) {
    id = ServerId(n.launch_rank());
  } else if (dead_.size() == 1) {
    id = dead_.begin()->first;
  } else {
    Refuse(n, StrCat("the job has all its servers running and ", dead_.size(),
                     " dead; a replacement must say which rank it takes (PSTRAIN_LAUNCH_RANK)"));
    return;
  }
  if (dead_.count(id) == 0 && n.restart() <= 0) {
    Refuse(n,
           StrCat(Describe(id), " is alive, and this process is not a restart (PSTRAIN_RESTART)"));
    return;
  }
  if (replacing_.count(id) > 0) {
    Refuse(n, StrCat(Describe(id), " is being replaced already"));
    return;
  }
  if (restarts_used_[id] >= options_.server_restarts) {
    Refuse(n, StrCat(Describe(id), " was replaced ", restarts_used_[id],
                     " time(s) already, as many as allowed (PSTRAIN_SERVER_RESTARTS=",
                     options_.server_restarts, ")"));
    return;
  }
  // Its registration connection becomes the one to `id`.
  Status s = van_->Connect(kPendingIdBase - 2, n.host(), n.port());
  if (!s.ok()) {
    LOG(WARNING) << "scheduler: " << s;
    return;
  }
  van_->Rename(kPendingIdBase - 2, id);
  van_->ExpectRoute(id, NodeRoute(n.nonce()));
  const int used = ++restarts_used_[id];
  NodeInfo info = n;
  info.set_rank(RankOfId(id));
  info.set_id(id);
  nodes_[id] = Node{info, SteadyClock::now()};
  dead_.erase(id);
  LOG(WARNING) << "scheduler: " << Describe(id)
               << " replaces the server process that died (restart " << used << " of "
               << options_.server_restarts << "); waiting for every worker to connect to it";
  Replacing& r = replacing_[id];
  r.table = NodeTable();
  r.since = SteadyClock::now();
  Message notice;
  notice.header = Header(CMD_NODE_REPLACED);
  *notice.header.mutable_node() = info;
  for (const auto& [wid, node] : nodes_) {
    if (!IsWorkerId(wid) || lost_.count(wid) > 0) continue;
    r.waiting.insert(wid);
    Status sent = van_->Send(wid, notice);
    if (!sent.ok()) LOG(WARNING) << "scheduler: " << sent;
  }
}

void Scheduler::SendReplacementTable(int id, const Message& table) {
  Status sent = van_->Send(id, table);
  if (!sent.ok()) LOG(WARNING) << "scheduler: " << sent;
  // The workers lost before it came (the others heard as it happened): its
  // rounds close without them. After the table, on the same connection, so
  // it adopts the table first.
  for (int w : lost_) {
    if (finished_.count(w) > 0 || nodes_.count(w) == 0) continue;
    Message notice;
    notice.header = Header(CMD_WORKER_LOST);
    *notice.header.mutable_node() = nodes_.at(w).info;
    sent = van_->Send(id, notice);
    if (!sent.ok()) LOG(WARNING) << "scheduler: " << sent;
  }
  LOG(INFO) << "scheduler: every worker is ready for " << Describe(id)
            << "; it gets the node table";
  nodes_.at(id).last_seen = SteadyClock::now();
}

void Scheduler::CheckReplacements() {
  for (const auto& [id, d] : dead_) {
    const int64_t waited = MillisSince(d.since);
    if (waited > options_.restart_timeout_ms) {
      const int culprit = id;
      const std::string why =
          StrCat(d.why, "; no replacement registered within ", waited,
                 " ms (PSTRAIN_RESTART_TIMEOUT_MS=", options_.restart_timeout_ms, ")");
      Abort(why, culprit, culprit);
      return;
    }
  }
  for (const auto& [id, r] : replacing_) {
    const int64_t waited = MillisSince(r.since);
    if (waited > options_.restart_timeout_ms && !r.waiting.empty()) {
      const int worker = *r.waiting.begin();
      Abort(StrCat(Describe(worker), " did not get ready for the replacement of ", Describe(id),
                   " within ", waited,
                   " ms (PSTRAIN_RESTART_TIMEOUT_MS=", options_.restart_timeout_ms, ")"),
            -1, worker);
      return;
    }
  }
}

std::string Scheduler::OpenBarriers() const {
  std::string out;
  for (const auto& [group, b] : barriers_) {
    if (b.arrived.empty()) continue;
    std::string missing;
    for (const auto& [id, node] : nodes_) {
      const bool member =
          (IsServerId(id) && (group & kServerGroup)) || (IsWorkerId(id) && (group & kWorkerGroup));
      if (member && b.arrived.count(id) == 0 && lost_.count(id) == 0)
        missing += StrCat(missing.empty() ? "" : ", ", Describe(id));
    }
    out += StrCat("; barrier of group ", group, " generation ", b.generation + 1,
                  " is still waiting for ", missing);
  }
  return out;
}

void Scheduler::EnterBarrier(const Message& msg) {
  const PsHeader& h = msg.header;
  if (nodes_.count(h.sender()) == 0) return;
  const int group = h.group();
  Message reply;
  reply.header = Header(CMD_BARRIER);
  reply.header.set_group(group);
  const bool in_group = (IsServerId(h.sender()) && (group & kServerGroup)) ||
                        (IsWorkerId(h.sender()) && (group & kWorkerGroup));
  BarrierState& b = barriers_[group];
  if (!in_group || h.generation() != b.generation + 1) {
    reply.header.set_error_code(static_cast<int>(StatusCode::kFailedPrecondition));
    reply.header.set_error_message(
        StrCat("scheduler: ", Describe(h.sender()), " entered barrier of group ", group,
               " generation ", h.generation(),
               in_group ? StrCat(", expected generation ", b.generation + 1)
                        : std::string(", but it is not a member of that group")));
    LOG(ERROR) << reply.header.error_message();
    (void)van_->Send(h.sender(), reply);
    return;
  }
  b.arrived.insert(h.sender());
  if (group & kWorkerGroup) {
    for (int id : finished_) {
      if (lost_.count(id) > 0) continue;
      Abort(StrCat(Describe(h.sender()), " entered the barrier of group ", group, " generation ",
                   b.generation + 1, ", which needs ", Describe(id),
                   ", but that worker finished: every worker must enter the same barriers"),
            -1, id);
      return;
    }
  }
  MaybeReleaseBarrier(group);
}

int Scheduler::BarrierMembers(int group) const {
  int members = 0;
  for (const auto& [id, node] : nodes_) {
    if (lost_.count(id) > 0) continue;
    if ((IsServerId(id) && (group & kServerGroup)) || (IsWorkerId(id) && (group & kWorkerGroup))) {
      ++members;
    }
  }
  return members;
}

void Scheduler::MaybeReleaseBarrier(int group) {
  BarrierState& b = barriers_[group];
  for (int id : lost_) b.arrived.erase(id);
  if (b.arrived.empty() || static_cast<int>(b.arrived.size()) < BarrierMembers(group)) return;
  ++b.generation;
  Message reply;
  reply.header = Header(CMD_BARRIER);
  reply.header.set_group(group);
  reply.header.set_generation(b.generation);
  for (int id : b.arrived) (void)van_->Send(id, reply);
  b.arrived.clear();
}

void Scheduler::MaybeShutdown() {
  int finished = 0;
  for (int id : finished_) finished += lost_.count(id) == 0;
  const int left = options_.num_workers - static_cast<int>(lost_.size());
  if (finished < left || !failure_.ok() || done_) return;
  Message m;
  m.header = Header(CMD_SHUTDOWN);
  Broadcast(m, -1);
  done_ = true;
  cv_.SignalAll();
}

void Scheduler::WorkerFinished(int id) {
  MaybeShutdown();
  if (done_ || !failure_.ok()) return;
  for (const auto& [group, b] : barriers_) {
    if (!(group & kWorkerGroup) || b.arrived.empty() || b.arrived.count(id) > 0) continue;
    std::string waiting;
    for (int a : b.arrived) waiting += StrCat(waiting.empty() ? "" : ", ", Describe(a));
    Abort(StrCat(Describe(id), " finished while ", waiting, " wait(s) in the barrier of group ",
                 group, " generation ", b.generation + 1,
                 ", which needs it: every worker must enter the same barriers"),
          -1, id);
    return;
  }
  // The servers fail a dist_sync round that waits for its push at once. Not
  // a replacement server (dead, waiting, or ever restarted): the finished
  // worker re-sends it the pushes of its last rounds (PSTRAIN_SNAPSHOT_EVERY
  // > 1), so a round may rightly wait for it there; the round timeout stays.
  Message notice;
  notice.header = Header(CMD_WORKER_FINISHED);
  *notice.header.mutable_node() = nodes_.at(id).info;
  for (const auto& [sid, node] : nodes_) {
    auto restarts = restarts_used_.find(sid);
    if (!IsServerId(sid) || dead_.count(sid) > 0 || replacing_.count(sid) > 0 ||
        (restarts != restarts_used_.end() && restarts->second > 0)) {
      continue;
    }
    Status sent = van_->Send(sid, notice);
    if (!sent.ok()) LOG(WARNING) << "scheduler: " << sent;
  }
}

void Scheduler::LoseWorker(int id, const std::string& why) {
  if (finished_.count(id) > 0) {
    // It said it was done: its silence now (an exit before the shutdown) harms nobody.
    lost_.insert(id);
    MaybeShutdown();
    return;
  }
  const int left = options_.num_workers - static_cast<int>(lost_.size()) - 1;
  if (left <= 0) {
    Abort(StrCat(why, "; it was the last worker of the job"), id, id);
    return;
  }
  Message notice;
  notice.header = Header(CMD_WORKER_LOST);
  *notice.header.mutable_node() = nodes_.at(id).info;
  LOG(WARNING) << "scheduler: " << why << "; the job goes on with " << left << " of "
               << options_.num_workers << " workers (PSTRAIN_WORKER_LOSS=continue)";
  lost_.insert(id);
  Broadcast(notice, -1);
  // The worker itself, if alive (a stall longer than the heartbeat timeout),
  // learns why nobody answers it any more; else it would fail later saying
  // the scheduler went silent.
  Message abort;
  abort.header = Header(CMD_ABORT);
  abort.header.set_error_message(
      StrCat("the job went on without this worker: ", why, " (PSTRAIN_WORKER_LOSS=continue)"));
  (void)van_->Send(id, abort);
  van_->Disconnect(id);  // nothing more goes to it (Broadcast skips it)
  for (auto& [group, b] : barriers_) MaybeReleaseBarrier(group);
  for (auto it = replacing_.begin(); it != replacing_.end();) {
    it->second.waiting.erase(id);
    if (!it->second.waiting.empty()) {
      ++it;
      continue;
    }
    SendReplacementTable(it->first, it->second.table);
    it = replacing_.erase(it);
  }
  MaybeShutdown();
}

Status Scheduler::Run() {
  const auto start = SteadyClock::now();
  const Deadline startup = Deadline::InMillis(options_.startup_timeout_ms);
  MutexLock l(&mu_);
  auto last_look = SteadyClock::now();
  for (;;) {
    cv_.WaitUntil(Deadline::InMillis(100),
                  [this]() REQUIRES(mu_) { return done_ || !failure_.ok(); });
    if (!failure_.ok()) return failure_;
    if (done_) return Status::Ok();
    // Woken far too late: the scheduler itself did not run (SIGSTOP, a frozen
    // host). The nodes' silence meanwhile proves nothing, and their
    // heartbeats may still be unread: every node gets a fresh timeout.
    const int64_t late_ms = MillisSince(last_look) - 100;
    last_look = SteadyClock::now();
    if (started_ && late_ms > options_.heartbeat_timeout_ms / 2) {
      LOG(WARNING) << "scheduler: did not run for " << late_ms
                   << " ms (stopped or starved); every node gets a fresh heartbeat timeout";
      for (auto& [id, node] : nodes_) node.last_seen = last_look;
    }
    if (!started_ && startup.Expired()) {
      int servers = 0, workers = 0;
      std::string who;
      for (const NodeInfo& p : pending_) {
        (static_cast<Role>(p.role()) == Role::kServer ? servers : workers)++;
        who += StrCat(" ", RoleName(static_cast<Role>(p.role())), "@",
                      JoinHostPort(p.host(), p.port()));
      }
      Abort(StrCat("startup timed out after ", MillisSince(start),
                   " ms (PSTRAIN_STARTUP_TIMEOUT_MS): registered ", servers, "/",
                   options_.num_servers, " servers and ", workers, "/", options_.num_workers,
                   " workers; missing ", options_.num_servers - servers, " server(s) and ",
                   options_.num_workers - workers,
                   " worker(s); registered:", who.empty() ? " none" : who),
            -1);
      return Status::DeadlineExceeded(failure_.message());
    }
    if (started_ && options_.heartbeat_interval_ms > 0) {
      for (const auto& [id, node] : nodes_) {
        const int64_t silent = MillisSince(node.last_seen);
        // A replacement sends no heartbeat before its table (CheckReplacements
        // watches the wait for it).
        if (silent <= options_.heartbeat_timeout_ms || dead_.count(id) > 0 || lost_.count(id) > 0 ||
            replacing_.count(id) > 0) {
          continue;
        }
        const std::string why =
            StrCat(Describe(id), " sent no heartbeat for ", silent,
                   " ms (PSTRAIN_HEARTBEAT_TIMEOUT_MS=", options_.heartbeat_timeout_ms,
                   "); declared dead");
        if (IsServerId(id) && options_.server_restarts > 0) {
          ServerSilent(id, why);
          continue;
        }
        if (IsWorkerId(id) && options_.continue_without_lost_workers) {
          LoseWorker(id, why);
          break;  // lost_ changed: look again at the next tick
        }
        Abort(why, id, id);
        break;
      }
      if (failure_.ok()) CheckReplacements();
    }
  }
}

}  // namespace pstrain
