#include "net/cluster_node.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "common/job_cause.h"
#include "net/host_address.h"

namespace pstrain {

ClusterOptions ClusterOptionsFromJobEnv(const JobEnv& env) {
  ClusterOptions o;
  o.role = env.role;
  o.root_host = env.root_uri;
  o.root_port = env.root_port;
  o.num_servers = env.num_servers;
  o.num_workers = env.num_workers;
  o.advertise_host = env.node_host;
  o.interface = env.interface;
  o.bind_host = env.bind_host;
  o.port = env.port;
  o.heartbeat_interval_ms = env.heartbeat_interval_ms;
  o.heartbeat_timeout_ms = env.heartbeat_timeout_ms;
  o.startup_timeout_ms = env.startup_timeout_ms;
  o.barrier_timeout_ms = env.barrier_timeout_ms;
  o.request_timeout_ms = env.request_timeout_ms;
  o.max_message_bytes = env.max_message_bytes;
  o.shm_bytes = env.shm_bytes;
  o.shm_store_bytes = env.role == Role::kServer ? env.shm_store_bytes : 0;
  o.verbose = env.verbose;
  o.job_id = env.job_id;
  o.key_file = env.key_file;
  o.encrypt = env.encrypt;
  o.launch_rank = env.launch_rank;
  o.server_restarts = env.server_restarts;
  o.restart_timeout_ms = env.restart_timeout_ms;
  o.restart = env.restart;
  o.continue_without_lost_workers = env.continue_without_lost_workers;
  return o;
}

ClusterNode::ClusterNode(const ClusterOptions& options) : options_(options) {}

StatusOr<std::unique_ptr<ClusterNode>> ClusterNode::Create(const ClusterOptions& options) {
  CHECK(options.role != Role::kScheduler) << "the scheduler is scheduler/scheduler.h";
  std::unique_ptr<ClusterNode> node(new ClusterNode(options));
  ASSIGN_OR_RETURN(node->host_,
                   AdvertisedHost(options.advertise_host, options.interface, options.root_host));
  std::random_device rd;
  node->nonce_ = (uint64_t{rd()} << 32) ^ rd() ^
                 static_cast<uint64_t>(SteadyClock::now().time_since_epoch().count());
  VanOptions vo;
  // Listen where peers are told to connect, not on every interface (unless
  // that is a loopback address here while the job spans hosts).
  vo.bind_host = options.bind_host;
  if (vo.bind_host.empty()) {
    vo.bind_host = DefaultBindHost(node->host_, options.root_host);
    if (vo.bind_host != node->host_) {
      LOG(WARNING) << RoleName(options.role) << ": DMLC_NODE_HOST '" << node->host_
                   << "' is a loopback address on this host, which the others cannot reach; "
                      "listening on every interface (PSTRAIN_BIND_HOST chooses one)";
    }
  }
  vo.port = options.port;
  vo.max_message_bytes = options.max_message_bytes;
  vo.shm_bytes = static_cast<uint64_t>(std::max<int64_t>(0, options.shm_bytes));
  vo.shm_store_bytes = static_cast<uint64_t>(std::max<int64_t>(0, options.shm_store_bytes));
  vo.verbose = options.verbose;
  vo.name = RoleName(options.role);
  vo.send_timeout_ms = std::max(1000, options.heartbeat_timeout_ms);
  vo.routing_id = NodeRoute(node->nonce_);
  if (!options.key_file.empty()) {
    ASSIGN_OR_RETURN(JobKeys keys, ReadJobKeys(options.key_file));
    vo.keys = std::make_shared<const JobKeys>(std::move(keys));
    vo.encrypt = options.encrypt;
  }
  ClusterNode* raw = node.get();
  ASSIGN_OR_RETURN(node->van_, Van::Create(vo, [raw](Message&& m) { raw->Handle(std::move(m)); }));
  node->port_ = node->van_->port();
  node->arena_ = node->van_->arena();
  node->van_->SetBurstEnd([raw] {
    if (raw->burst_end_) raw->burst_end_();
  });
  node->van_->StartReceiving();
  RETURN_IF_ERROR(
      node->van_->Connect(kSchedulerId, options.root_host, options.root_port)
          .WithContext(StrCat(RoleName(options.role), " ", JoinHostPort(node->host_, node->port_),
                              ": scheduler DMLC_PS_ROOT_URI")));
  return node;
}

ClusterNode::~ClusterNode() { Stop(); }

void ClusterNode::StopReceiving() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  if (replacer_.joinable()) replacer_.join();
  // Handlers may still send while the receive thread winds down.
  if (van_ != nullptr) van_->StopReceiving();
}

void ClusterNode::Stop() {
  StopReceiving();
  std::unique_ptr<Van> van;
  {
    std::unique_lock<std::shared_mutex> l(van_mu_);
    van.swap(van_);
  }
}

Status ClusterNode::Send(int id, const Message& msg) {
  std::shared_lock<std::shared_mutex> l(van_mu_);
  if (van_ == nullptr) return Status::Cancelled("node stopped");
  return van_->Send(id, msg);
}

Status ClusterNode::SendBatch(int id, const std::vector<const Message*>& msgs, size_t* sent) {
  if (sent != nullptr) *sent = 0;
  std::shared_lock<std::shared_mutex> l(van_mu_);
  if (van_ == nullptr) return Status::Cancelled("node stopped");
  return van_->SendBatch(id, msgs, sent);
}

ConnectionReport ClusterNode::DescribeConnection(int id) const {
  std::shared_lock<std::shared_mutex> l(van_mu_);
  if (van_ == nullptr) return {ConnectionReport::kNone, "the node stopped"};
  return van_->DescribeConnection(id);
}

int64_t ClusterNode::shm_messages() const {
  std::shared_lock<std::shared_mutex> l(van_mu_);
  return van_ != nullptr ? van_->shm_sent() + van_->shm_queued() : 0;
}

void ClusterNode::SetMessageHandler(MessageHandler handler) { handler_ = std::move(handler); }
void ClusterNode::SetBurstEndHandler(std::function<void()> handler) {
  burst_end_ = std::move(handler);
}
void ClusterNode::AddFailureListener(FailureListener l) {
  failure_listeners_.push_back(std::move(l));
}
void ClusterNode::AddTickListener(TickListener l) { tick_listeners_.push_back(std::move(l)); }
void ClusterNode::AddLostListener(LostListener l) { lost_listeners_.push_back(std::move(l)); }
void ClusterNode::AddFinishedListener(FinishedListener l) {
  finished_listeners_.push_back(std::move(l));
}
void ClusterNode::AddReplacedListener(ReplacedListener l) {
  replaced_listeners_.push_back(std::move(l));
}

int ClusterNode::id() const {
  MutexLock l(&mu_);
  return id_;
}
int ClusterNode::rank() const {
  MutexLock l(&mu_);
  return rank_;
}
Status ClusterNode::health() const {
  MutexLock l(&mu_);
  return health_;
}

std::string ClusterNode::Describe(int id) const {
  MutexLock l(&mu_);
  if (id == kSchedulerId) {
    return StrCat("scheduler at ", JoinHostPort(options_.root_host, options_.root_port));
  }
  auto it = table_.find(id);
  if (it == table_.end()) {
    if (id == id_ || id < 0)
      return StrCat(RoleName(options_.role), " at ", JoinHostPort(host_, port_));
    return NodeIdName(id);
  }
  return StrCat(RoleName(static_cast<Role>(it->second.role())), " rank ", it->second.rank(), " at ",
                JoinHostPort(it->second.host(), it->second.port()));
}

PsHeader ClusterNode::Header(PsCommand cmd) const {
  PsHeader h;
  h.set_version(PROTOCOL_VERSION_CURRENT);
  h.set_cmd(cmd);
  h.set_sender(id());
  h.set_receiver(kSchedulerId);
  return h;
}

Status ClusterNode::Start() {
  Message reg;
  reg.header = Header(CMD_REGISTER);
  NodeInfo* me = reg.header.mutable_node();
  me->set_role(static_cast<int>(options_.role));
  me->set_host(host_);
  me->set_port(port_);
  me->set_nonce(nonce_);
  me->set_num_servers(options_.num_servers);
  me->set_num_workers(options_.num_workers);
  me->set_job_id(options_.job_id);
  me->set_build(options_.build);
  if (options_.launch_rank >= 0) me->set_launch_rank(options_.launch_rank);
  if (options_.restart > 0) me->set_restart(options_.restart);
  if (const ShmInfo* shm = van_->shm_info()) *me->mutable_shm() = *shm;
  if (options_.verbose >= 1) {
    LOG(INFO) << RoleName(options_.role) << " at " << JoinHostPort(host_, port_)
              << " registering with the scheduler at "
              << JoinHostPort(options_.root_host, options_.root_port);
  }
  RETURN_IF_ERROR(Send(kSchedulerId, reg));
  // A replacement gets its table once every worker is ready for it, which
  // the scheduler waits for up to restart_timeout_ms.
  const int table_wait_ms = options_.restart > 0
                                ? std::max(options_.startup_timeout_ms, options_.restart_timeout_ms)
                                : options_.startup_timeout_ms;
  const Deadline deadline = Deadline::InMillis(table_wait_ms);
  // Past this without the table, say what the connection to the scheduler
  // looks like (refused, unanswered, our key refused) and keep waiting.
  const Deadline warn = Deadline::InMillis(std::min(5000, options_.startup_timeout_ms / 2));
  bool warned = false;
  PsHeader table;
  for (;;) {
    {
      MutexLock l(&mu_);
      cv_.WaitUntil(warned ? deadline : warn.Min(deadline),
                    [this]() REQUIRES(mu_) { return table_arrived_ || !health_.ok(); });
      if (!health_.ok()) return health_;
      if (table_arrived_) {
        table.Swap(&table_header_);
        break;
      }
    }
    const ConnectionReport report = van_->DescribeConnection(kSchedulerId);
    const std::string& link = report.text;
    const bool connected = report.kind == ConnectionReport::kConnected;
    const bool unreachable =
        report.kind == ConnectionReport::kRefused || report.kind == ConnectionReport::kNoAnswer;
    if (deadline.Expired()) {
      return Status::DeadlineExceeded(StrCat(
          RoleName(options_.role), " at ", JoinHostPort(host_, port_),
          ": no node table from the scheduler at ",
          JoinHostPort(options_.root_host, options_.root_port), " within ", table_wait_ms, " ms (",
          options_.restart > 0 ? "PSTRAIN_RESTART_TIMEOUT_MS" : "PSTRAIN_STARTUP_TIMEOUT_MS",
          "): ", link,
          connected     ? StrCat("; did all ", options_.num_servers, " servers and ",
                                 options_.num_workers, " workers start?")
          : unreachable ? "; is the scheduler running there?"
                        : ""));
    }
    if (!warned && !connected) {
      LOG(WARNING) << RoleName(options_.role) << " at " << JoinHostPort(host_, port_)
                   << ": no answer from the scheduler at "
                   << JoinHostPort(options_.root_host, options_.root_port) << " yet: " << link
                   << "; still trying for " << deadline.RemainingMillis() << " ms";
    }
    warned = true;
  }
  // Name lookups, connections and arena mappings happen here, on the caller's
  // thread: the receive thread goes on reading (heartbeats, an abort) meanwhile.
  RETURN_IF_ERROR(AdoptTable(table));
  {
    MutexLock l(&mu_);
    last_scheduler_contact_ = SteadyClock::now();
  }
  if (options_.heartbeat_interval_ms > 0) {
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  }
  if (options_.role == Role::kWorker) replacer_ = std::thread([this] { ReplacementLoop(); });
  if (options_.verbose >= 1) LOG(INFO) << "started as " << Self();
  return Status::Ok();
}

Status ClusterNode::AdoptTable(const PsHeader& h) {
  std::map<int, NodeInfo> table;
  {
    MutexLock l(&mu_);
    for (const NodeInfo& n : h.nodes()) {
      table_[n.id()] = n;
      if (n.nonce() == nonce_ && n.port() == port_) {
        id_ = n.id();
        rank_ = n.rank();
      }
    }
    if (id_ < 0) {
      health_ = Status::Internal("the scheduler's node table does not list this node");
      cv_.SignalAll();
      return health_;
    }
    table = table_;
  }
  // Messages claiming a member's id are taken only from that member's
  // connection from now on.
  for (const auto& [id, info] : table) van_->ExpectRoute(id, NodeRoute(info.nonce()));
  if (h.has_scheduler_route()) van_->ExpectRoute(kSchedulerId, h.scheduler_route());
  // Workers talk to every server, servers answer every worker.
  van_->SetSelfId(id());
  for (const auto& [id, info] : table) {
    const bool peer = options_.role == Role::kWorker ? IsServerId(id) : IsWorkerId(id);
    if (!peer) continue;
    Status connected =
        van_->Connect(id, info.host(), info.port(), info.has_shm() ? &info.shm() : nullptr);
    if (!connected.ok()) {
      MutexLock l(&mu_);
      if (health_.ok()) health_ = connected;
      cv_.SignalAll();
      return connected;
    }
  }
  // Hand on what arrived before the table, in order; what arrives meanwhile
  // joins the backlog until it is empty (the handler never runs on two
  // threads at once, and a peer's messages keep their order).
  for (;;) {
    std::vector<Message> early;
    {
      MutexLock l(&mu_);
      if (early_.empty()) {
        have_table_.store(true, std::memory_order_release);
        cv_.SignalAll();
        return health_;
      }
      early.swap(early_);
    }
    for (Message& m : early) {
      // They arrived before the routes were known: check them now.
      const int sender = m.header.sender();
      auto it = table.find(sender);
      std::string expected;
      if (sender == kSchedulerId) {
        expected = h.has_scheduler_route() ? h.scheduler_route() : m.route;
      } else if (it != table.end()) {
        expected = NodeRoute(it->second.nonce());
      }
      if (!m.route.empty() && m.route != expected) {
        LOG(WARNING) << Self() << ": dropped an early message claiming to come from "
                     << NodeIdName(sender)
                     << " that arrived on another node's connection: forged sender";
        continue;
      }
      Dispatch(std::move(m));
    }
  }
}

namespace {
// What a node keeps of the messages that come before its table (a peer may
// get its table, and talk to us, before ours arrives): about one round of a
// large model's pushes from every worker; more is a member flooding us.
constexpr size_t kMaxEarlyMessages = 1 << 16;
}  // namespace

ClusterNode::BeforeTable ClusterNode::SortBeforeTable(const Message& msg) {
  const PsHeader& h = msg.header;
  const bool from_scheduler_itself =
      h.cmd() == CMD_NODE_TABLE || h.cmd() == CMD_ABORT || h.cmd() == CMD_HEARTBEAT;
  if (h.sender() == kSchedulerId && from_scheduler_itself) {
    const bool route_ok =
        msg.route.empty() ||
        (scheduler_route_.empty() ? IsSchedulerRoute(msg.route) : msg.route == scheduler_route_);
    const bool table_ok = h.cmd() != CMD_NODE_TABLE || msg.route.empty() ||
                          !h.has_scheduler_route() || h.scheduler_route() == msg.route;
    if (route_ok && table_ok) return BeforeTable::kTake;
    LOG(WARNING) << "node on port " << port_ << ": dropped a " << PsCommand_Name(h.cmd())
                 << " claiming to come from the scheduler that arrived on another node's"
                 << " connection before this node's table: forged sender";
    return BeforeTable::kDrop;
  }
  if (early_.size() >= kMaxEarlyMessages) {
    LOG_EVERY_N(WARNING, 1000) << "node on port " << port_ << ": dropped a "
                               << PsCommand_Name(h.cmd()) << " from " << NodeIdName(h.sender())
                               << ": " << kMaxEarlyMessages
                               << " messages wait already for this node's table";
    return BeforeTable::kDrop;
  }
  return BeforeTable::kHold;
}

void ClusterNode::Handle(Message&& msg) {
  if (!have_table_.load(std::memory_order_acquire)) {
    MutexLock l(&mu_);
    if (!have_table_.load(std::memory_order_relaxed)) {
      switch (SortBeforeTable(msg)) {
        case BeforeTable::kTake:
          break;
        case BeforeTable::kHold:
          early_.push_back(std::move(msg));
          return;
        case BeforeTable::kDrop:
          return;
      }
    }
  }
  Dispatch(std::move(msg));
}

void ClusterNode::Dispatch(Message&& msg) {
  const PsHeader& h = msg.header;
  if (h.sender() == kSchedulerId) {
    MutexLock l(&mu_);
    last_scheduler_contact_ = SteadyClock::now();
  }
  const bool schedulers_own = h.cmd() == CMD_NODE_TABLE || h.cmd() == CMD_BARRIER ||
                              h.cmd() == CMD_ABORT || h.cmd() == CMD_SHUTDOWN;
  if (schedulers_own && h.sender() != kSchedulerId) {
    // Only the scheduler tables, releases barriers, aborts and shuts down a
    // node (a member's own messages of these kinds go to the scheduler).
    LOG(WARNING) << Self() << ": ignoring a " << PsCommand_Name(h.cmd()) << " from "
                 << NodeIdName(h.sender()) << ": only the scheduler sends those";
    return;
  }
  switch (h.cmd()) {
    case CMD_DATA:
    case CMD_CONFIG:
      if (handler_) handler_(std::move(msg));
      return;
    case CMD_NODE_TABLE: {
      // Adopted by Start() on its own thread (connecting may block).
      MutexLock l(&mu_);
      if (table_arrived_) return;
      table_arrived_ = true;
      table_header_ = h;
      scheduler_route_ = msg.route.empty() ? h.scheduler_route() : msg.route;
      cv_.SignalAll();
      return;
    }
    case CMD_HEARTBEAT:
      return;
    case CMD_NODE_REPLACED: {
      // Connecting and the listeners may block: the replacement thread does it.
      if (options_.role != Role::kWorker || h.sender() != kSchedulerId ||
          !IsServerId(h.node().id()) || RankOfId(h.node().id()) >= options_.num_servers) {
        LOG(WARNING) << Self() << ": ignoring a replacement notice from " << NodeIdName(h.sender());
        return;
      }
      MutexLock l(&mu_);
      replaced_.push_back(h.node());
      cv_.SignalAll();
      return;
    }
    case CMD_WORKER_LOST: {
      const int lost = h.node().id();
      if (h.sender() != kSchedulerId || !IsWorkerId(lost) ||
          RankOfId(lost) >= options_.num_workers) {
        LOG(WARNING) << Self() << ": ignoring a lost-worker notice from " << NodeIdName(h.sender());
        return;
      }
      LOG(WARNING) << Self() << ": " << NodeIdName(lost)
                   << " is lost; the job goes on without it (PSTRAIN_WORKER_LOSS=continue)";
      for (const auto& listener : lost_listeners_) listener(lost);
      // A server lets the dead worker's connection go (ZeroMQ would try to
      // reach it for the rest of the job) and with it the mapping of its
      // arena, whose memory lives on while a process maps it.
      van_->Disconnect(lost);
      return;
    }
    case CMD_WORKER_FINISHED: {
      const int done = h.node().id();
      if (h.sender() != kSchedulerId || !IsWorkerId(done) ||
          RankOfId(done) >= options_.num_workers) {
        LOG(WARNING) << Self() << ": ignoring a finished-worker notice from "
                     << NodeIdName(h.sender());
        return;
      }
      for (const auto& listener : finished_listeners_) listener(done);
      return;
    }
    case CMD_BARRIER: {
      MutexLock l(&mu_);
      if (h.error_code() != 0) {
        if (health_.ok()) {
          health_ = Status(static_cast<StatusCode>(h.error_code()), h.error_message());
        }
      } else {
        uint64_t& done = barrier_done_[h.group()];
        done = std::max<uint64_t>(done, h.generation());
      }
      cv_.SignalAll();
      return;
    }
    case CMD_ABORT:
      if (test_ignore_aborts_.load()) return;
      // The scheduler knows already: nothing to send back (from the receive thread).
      Failed(Status::Unavailable(h.error_message()), /*tell_scheduler=*/false, kBlameSelf);
      return;
    case CMD_SHUTDOWN: {
      MutexLock l(&mu_);
      shutdown_ = true;
      cv_.SignalAll();
      return;
    }
    default:
      LOG(WARNING) << Self() << ": ignoring command " << PsCommand_Name(h.cmd()) << " from "
                   << NodeIdName(h.sender());
  }
}

void ClusterNode::Fail(const Status& error, int blame) {
  Failed(error, /*tell_scheduler=*/true, blame);
}

void ClusterNode::Failed(const Status& error, bool tell_scheduler, int blame) {
  {
    MutexLock l(&mu_);
    if (failing_ || !health_.ok() || shutdown_) return;
    failing_ = true;  // the first failure is the one reported
  }
  std::string cause;  // the launcher's name of the node to blame (common/job_cause.h)
  if (blame == kSchedulerId) {
    cause = JobProcessName("scheduler", 0);
  } else if (blame != kBlameSelf && (IsServerId(blame) || IsWorkerId(blame))) {
    cause = JobProcessName(IsServerId(blame) ? "server" : "worker", RankOfId(blame));
  }
  if (cause.empty()) {
    LOG(ERROR) << Self() << ": " << error;
  } else {
    LOG(ERROR) << Self() << ": " << kJobCauseMarker << cause << ": " << error;
  }
  if (tell_scheduler) {
    Message abort;
    abort.header = Header(CMD_ABORT);
    abort.header.set_error_message(error.message());
    if (blame != kBlameSelf) abort.header.set_blame(blame);
    (void)Send(kSchedulerId, abort);  // best effort: the scheduler may be the one that is gone
  }
  // Only now do waiters see the failure: a process that ends as soon as they
  // do (a server's Run returns) has handed the report to its socket already,
  // whose linger delivers it.
  {
    MutexLock l(&mu_);
    health_ = error;
    cv_.SignalAll();
  }
  for (const auto& l : failure_listeners_) l(error);
}

Status ClusterNode::Barrier(int group, Deadline deadline) {
  uint64_t gen;
  {
    MutexLock l(&mu_);
    if (!health_.ok()) return health_;
    gen = ++barrier_sent_[group];
  }
  Message m;
  m.header = Header(CMD_BARRIER);
  m.header.set_group(group);
  m.header.set_generation(gen);
  RETURN_IF_ERROR(Send(kSchedulerId, m));
  MutexLock l(&mu_);
  cv_.WaitUntil(deadline, [&]() REQUIRES(mu_) {
    return barrier_done_[group] >= gen || !health_.ok() || stopping_;
  });
  if (!health_.ok()) return health_;
  if (barrier_done_[group] < gen && stopping_) {
    return Status::Cancelled(StrCat(RoleName(options_.role), " rank ", rank_, ": barrier of group ",
                                    group, " generation ", gen, " cut short: the node stopped"));
  }
  if (barrier_done_[group] < gen) {
    return Status::DeadlineExceeded(StrCat(
        RoleName(options_.role), " rank ", rank_, ": barrier of group ", group, " generation ", gen,
        " did not complete in time; some node of the group never arrived"));
  }
  return Status::Ok();
}

Status ClusterNode::Finish(Deadline deadline) {
  Message m;
  m.header = Header(CMD_FINISH);
  RETURN_IF_ERROR(Send(kSchedulerId, m));
  return WaitShutdown(deadline);
}

Status ClusterNode::WaitShutdown(Deadline deadline) {
  MutexLock l(&mu_);
  cv_.WaitUntil(deadline,
                [this]() REQUIRES(mu_) { return shutdown_ || !health_.ok() || stopping_; });
  if (!health_.ok()) return health_;
  if (!shutdown_ && stopping_)
    return Status::Cancelled(StrCat(RoleName(options_.role), " stopped"));
  if (!shutdown_) {
    return Status::DeadlineExceeded(StrCat(RoleName(options_.role), " rank ", rank_,
                                           ": no shutdown from the scheduler in time"));
  }
  return Status::Ok();
}

void ClusterNode::AdoptReplacement(const NodeInfo& info) {
  const int id = info.id();
  for (const auto& listener : replaced_listeners_) listener(id, /*connected=*/false);
  // Its route first: once its arena is mapped its numbers count, and only its
  // own connection may move them.
  van_->ExpectRoute(id, NodeRoute(info.nonce()));
  Status s = van_->Connect(id, info.host(), info.port(), info.has_shm() ? &info.shm() : nullptr);
  if (!s.ok()) {
    Fail(s.WithContext(StrCat("connecting to the replacement of ", NodeIdName(id))), id);
    return;
  }
  {
    MutexLock l(&mu_);
    table_[id] = info;
  }
  LOG(WARNING) << Self() << ": " << Describe(id) << " replaces the server process that died"
               << " (restart " << info.restart() << "); sending it what it has not answered";
  for (const auto& listener : replaced_listeners_) listener(id, /*connected=*/true);
  Message ready;
  ready.header = Header(CMD_NODE_REPLACED);
  ready.header.set_is_reply(true);
  *ready.header.mutable_node() = info;
  (void)Send(kSchedulerId, ready);
}

void ClusterNode::HeartbeatLoop() {
  const auto interval = std::chrono::milliseconds(std::min(options_.heartbeat_interval_ms, 1000));
  auto last_beat = SteadyClock::now();
  for (;;) {
    {
      MutexLock l(&mu_);
      cv_.WaitUntil(Deadline::In(interval), [this]() REQUIRES(mu_) { return stopping_; });
      if (stopping_) return;
      if (const int64_t stall = test_stall_ms_.exchange(0); stall > 0) {
        cv_.WaitUntil(Deadline::InMillis(stall), [this]() REQUIRES(mu_) { return stopping_; });
        if (stopping_) return;
      }
    }
    // Woken far too late: this process was not running (SIGSTOP, a frozen
    // host), so the scheduler's silence meanwhile says nothing about it;
    // what it sent is still to be read. A fresh timeout.
    const auto now = SteadyClock::now();
    const int64_t late_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - last_beat - interval).count();
    last_beat = now;
    if (late_ms > options_.heartbeat_timeout_ms / 2) {
      {
        MutexLock l(&mu_);
        last_scheduler_contact_ = now;
      }
      LOG(WARNING) << Self() << ": this process did not run for " << late_ms
                   << " ms (stopped or starved); the scheduler gets a fresh heartbeat timeout";
    }
    Message hb;
    hb.header = Header(CMD_HEARTBEAT);
    (void)Send(kSchedulerId, hb);
    int64_t silent_ms = 0;
    bool done = false;
    {
      MutexLock l(&mu_);
      silent_ms = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() -
                                                                        last_scheduler_contact_)
                      .count();
      done = shutdown_ || !health_.ok();
    }
    if (!done && silent_ms > options_.heartbeat_timeout_ms) {
      Fail(Status::Unavailable(
               StrCat("scheduler at ", JoinHostPort(options_.root_host, options_.root_port),
                      " silent for ", silent_ms, " ms (PSTRAIN_HEARTBEAT_TIMEOUT_MS=",
                      options_.heartbeat_timeout_ms, "); declared dead")),
           kSchedulerId);
    }
    for (const auto& t : tick_listeners_) t();
  }
}

void ClusterNode::ReplacementLoop() {
  for (;;) {
    std::vector<NodeInfo> replaced;
    {
      MutexLock l(&mu_);
      // The deadline only bounds the wait: a notice or Stop wakes it sooner.
      cv_.WaitUntil(Deadline::InMillis(1000),
                    [this]() REQUIRES(mu_) { return stopping_ || !replaced_.empty(); });
      if (stopping_) return;
      replaced.swap(replaced_);
    }
    for (const NodeInfo& info : replaced) AdoptReplacement(info);
  }
}

}  // namespace pstrain
