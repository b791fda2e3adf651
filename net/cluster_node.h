// ClusterNode: a server's or worker's membership in a job.
//
// It owns the node's Van, registers with the scheduler, receives the node table
// (ranks and addresses), connects to the peers it talks to (workers to every
// server, servers to every worker), sends heartbeats, runs barriers and learns
// of dead nodes and of the job's end. Data and config messages (CMD_DATA,
// CMD_CONFIG) go to the handler the KV server or client installs.
//
// Failure model: every wait has a deadline. Once the node learns that the job
// cannot go on (a peer declared dead, the scheduler silent past the heartbeat
// timeout, a local error reported with Fail), health() turns into that error
// for good, every waiter wakes with it and the failure listeners run once.
// Threads: all methods are thread-safe. Handlers and listeners run on the
// receive or heartbeat thread and must not block (replaced listeners run on a
// worker's replacement thread of their own); nothing that can block (name
// lookups, connecting, mapping arenas) runs on the receive thread.
#ifndef PSTRAIN_NET_CLUSTER_NODE_H_
#define PSTRAIN_NET_CLUSTER_NODE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/build_info.h"
#include "common/deadline.h"
#include "common/env.h"
#include "common/mutex.h"
#include "common/status.h"
#include "net/message.h"
#include "net/van.h"

namespace pstrain {

struct ClusterOptions {
  Role role = Role::kWorker;
  std::string root_host = "127.0.0.1";  // scheduler host name or IP
  int root_port = 0;
  int num_servers = 1;
  int num_workers = 1;
  std::string advertise_host;        // empty: see AdvertisedHost (van.h)
  std::string interface;             // DMLC_INTERFACE
  std::string bind_host;             // empty: advertise_host's address (or the one chosen for it)
  int port = 0;                      // 0: any free port
  int heartbeat_interval_ms = 1000;  // 0: no heartbeats
  int heartbeat_timeout_ms = 10000;
  int startup_timeout_ms = 30000;
  int barrier_timeout_ms = 600000;
  int request_timeout_ms = 600000;
  int64_t max_message_bytes = int64_t{1} << 31;
  int64_t shm_bytes = 0;        // shared-memory ring for co-located peers (0: TCP only)
  int64_t shm_store_bytes = 0;  // servers: room for stored values in the arena
  int verbose = 0;
  std::string job_id;  // PSTRAIN_JOB_ID: every node of a job must say the same
  // PSTRAIN_KEY_FILE: the job's CURVE keys (net/job_keys.h); empty: no
  // authentication and no encryption.
  std::string key_file;
  // PSTRAIN_WIRE_SECURITY: with keys, true = curve (authenticate and encrypt),
  // false = auth (authenticate connections only; VanOptions::encrypt).
  bool encrypt = true;
  std::string build = BuildId();  // this binary's (tests set another)
  int launch_rank = -1;           // PSTRAIN_LAUNCH_RANK (-1: none)
  // Server recovery: how many times a dead server may be replaced
  // (PSTRAIN_SERVER_RESTARTS; the scheduler waits restart_timeout_ms for
  // each), and this process's restart count (PSTRAIN_RESTART).
  int server_restarts = 0;
  int restart_timeout_ms = 60000;
  int restart = 0;
  // PSTRAIN_WORKER_LOSS=continue: the scheduler lets the job go on when a
  // worker dies (servers rescale to the workers left).
  bool continue_without_lost_workers = false;
};

// The options a process gets from its environment (common/env.h).
ClusterOptions ClusterOptionsFromJobEnv(const JobEnv& env);

class ClusterNode {
 public:
  using MessageHandler = std::function<void(Message&&)>;
  using FailureListener = std::function<void(const Status&)>;
  using TickListener = std::function<void()>;
  // A worker's server `id` is replaced by a restarted process (same rank and
  // id). Each listener runs twice on the replacement thread (which may wait:
  // heartbeats go on meanwhile): with `connected`
  // false before the connection is replaced (stop sending to it), then true
  // (send it what it has not answered). The scheduler hears that this worker
  // is ready for the replacement once every listener returned.
  using ReplacedListener = std::function<void(int id, bool connected)>;
  // Worker `id` died and the job goes on without it (CMD_WORKER_LOST). Runs on
  // the receive thread; must not block.
  using LostListener = std::function<void(int id)>;
  // Server: worker `id` finished while others go on (CMD_WORKER_FINISHED).
  // Runs on the receive thread; must not block.
  using FinishedListener = std::function<void(int id)>;

  // Binds this node's socket. REQUIRES: options.role is server or worker.
  static StatusOr<std::unique_ptr<ClusterNode>> Create(const ClusterOptions& options);
  ~ClusterNode();

  // Install before Start(). The handler receives CMD_DATA and CMD_CONFIG
  // messages (requests on servers, replies on workers) in arrival order, one
  // at a time: on the receive thread, or (those that came before the node
  // table) on the thread in Start().
  void SetMessageHandler(MessageHandler handler);
  // Install before Start(): runs on the receive thread after each pass of
  // messages it handed on (Van::SetBurstEnd).
  void SetBurstEndHandler(std::function<void()> handler);
  // Listeners are never removed: their owner must outlive the node's
  // receiving, and every Fail on the node (the KV client and server stop
  // receiving in their destructors; a failure listener runs on the thread
  // that calls Fail, so nothing may call Fail once its owner is gone).
  void AddFailureListener(FailureListener listener);
  // Runs on the heartbeat thread about every heartbeat interval (at most 1 s).
  void AddTickListener(TickListener listener);
  void AddReplacedListener(ReplacedListener listener);
  void AddLostListener(LostListener listener);
  void AddFinishedListener(FinishedListener listener);

  // Registers and waits (startup_timeout_ms) for the node table, then (on this
  // thread) connects to peers, hands on the messages that came early and
  // starts heartbeats.
  Status Start();
  // Waits until every member of `group` (kServerGroup, kWorkerGroup or both)
  // entered the same barrier generation.
  Status Barrier(int group, Deadline deadline);
  // Worker: tells the scheduler this worker is done and waits for the job's end.
  Status Finish(Deadline deadline);
  // Server: waits for the job's end (SHUTDOWN) or a failure. Bounded by the
  // scheduler's liveness (heartbeats) and `deadline`.
  Status WaitShutdown(Deadline deadline);
  // Records a local fatal error, tells the scheduler (which tells everyone) and
  // wakes every waiter. The first error wins. `blame`: the node whose fault it
  // is, when it is not this one (the launcher's summary names it).
  void Fail(const Status& error, int blame = kBlameSelf);

  // Tests only: the heartbeat thread stops for `ms` once, as in a process
  // that did not run for that long (no heartbeats, no tick listeners).
  void TEST_StallHeartbeats(int64_t ms) { test_stall_ms_ = ms; }
  // Tests only: an abort from the scheduler is ignored (a node it cannot reach).
  void TEST_IgnoreAborts() { test_ignore_aborts_ = true; }
  static constexpr int kBlameSelf = -1;

  // Stops heartbeats and the receive thread: no message handler, tick or
  // replacement listener runs after it returns (a failure listener still runs
  // when a thread calls Fail), and Send still works (an owner's own threads
  // may still send while it stops them). Idempotent.
  void StopReceiving();
  // StopReceiving, then closes the sockets once the sends in progress on
  // other threads are done (each is bounded by the send timeout): Send fails
  // from then on. Idempotent. The KV server and client call it in their
  // destructors.
  void Stop();

  Status Send(int id, const Message& msg);
  // The state of the connection to node `id` (Van::DescribeConnection): kNone
  // when there is none (never opened; let go, as a lost worker's; stopped).
  ConnectionReport DescribeConnection(int id) const;
  // Van::SendBatch.
  Status SendBatch(int id, const std::vector<const Message*>& msgs, size_t* sent = nullptr);
  // Buffers for values this node sends, in its shared-memory arena when it has
  // room (co-located peers then get them without a copy; see
  // net/shm_arena.h), else on the heap. Contents undefined. A stored buffer
  // (a server's value, sent again and again) may be written in place only
  // while ShmArena::Readers(readers) is 0 (readers null: heap) and no local
  // Blob shares it; an outgoing one is built, sent and dropped.
  ShmArena::Stored AllocateStored(uint64_t bytes) {
    return AllocateOrHeap(arena_.get(), bytes, /*outgoing=*/false);
  }
  // Whether node `id` reads this node's arena (so an outgoing buffer is worth
  // taking from it).
  bool SharesMemoryWith(int id) {
    std::shared_lock<std::shared_mutex> l(van_mu_);
    return van_ != nullptr && van_->PeerMapsOurArena(id);
  }
  ShmArena::Stored AllocateOutgoing(uint64_t bytes) {
    return AllocateOrHeap(arena_.get(), bytes, /*outgoing=*/true);
  }
  Status health() const EXCLUDES(mu_);
  // Messages this node sent through shared memory (values in its arena, or the
  // whole message through a peer's queue; a message may count twice).
  int64_t shm_messages() const;
  // Messages this node sent inside batch frames over TCP (Van::SendBatch).
  int64_t batched_messages() const {
    std::shared_lock<std::shared_mutex> l(van_mu_);
    return van_ != nullptr ? van_->batched() : 0;
  }

  Role role() const { return options_.role; }
  int id() const EXCLUDES(mu_);
  int rank() const EXCLUDES(mu_);
  int num_servers() const { return options_.num_servers; }
  int num_workers() const { return options_.num_workers; }
  int port() const { return port_; }
  const std::string& host() const { return host_; }  // the address it advertises
  const ClusterOptions& options() const { return options_; }
  // "server rank 1 at 127.0.0.1:40001".
  std::string Describe(int id) const EXCLUDES(mu_);
  std::string Self() const EXCLUDES(mu_) { return Describe(id()); }

 private:
  explicit ClusterNode(const ClusterOptions& options);
  // Receive thread: holds or drops what comes before the table, then Dispatch.
  void Handle(Message&& msg);
  void Dispatch(Message&& msg);
  // Before the table no member's route is known, so a message claiming one
  // could come from any member's connection. The scheduler's own (its table,
  // an abort, heartbeats) are taken from a connection with the scheduler's
  // form of route (its table's, once the table came); the rest wait in early_
  // for AdoptTable, which checks them against the table.
  enum class BeforeTable { kTake, kHold, kDrop };
  BeforeTable SortBeforeTable(const Message& msg) REQUIRES(mu_);
  // Start(): takes the node table (ids, routes), connects to the peers and
  // hands on the early messages.
  Status AdoptTable(const PsHeader& table) EXCLUDES(mu_);
  // Fail(), telling the scheduler or not (not when the news came from it).
  void Failed(const Status& error, bool tell_scheduler, int blame) EXCLUDES(mu_);
  void HeartbeatLoop();
  // A worker's replacement thread: adopts the replacements CMD_NODE_REPLACED
  // announces, off the heartbeat thread (a listener may wait for a send to
  // the dead server, and the scheduler must go on hearing from this worker).
  void ReplacementLoop();
  // Replacement thread: connects to the replacement of a server,
  // runs the listeners and tells the scheduler this worker is ready for it.
  void AdoptReplacement(const NodeInfo& info) EXCLUDES(mu_);
  PsHeader Header(PsCommand cmd) const;

  ClusterOptions options_;
  // Reset only by Stop(), after which Send fails. Senders hold van_mu_ shared
  // while they use it, Stop exclusively while it resets it (the threads that
  // set it up, Create's and Start's, and the heartbeat, replacement and
  // receive threads, which Stop joins first, use it without).
  mutable std::shared_mutex van_mu_;
  std::unique_ptr<Van> van_;
  std::shared_ptr<ShmArena> arena_;  // the Van's (null: none); set by Create
  uint64_t nonce_ = 0;
  int port_ = 0;
  std::string host_;  // advertised
  MessageHandler handler_;
  std::function<void()> burst_end_;
  std::vector<FailureListener> failure_listeners_;
  std::vector<TickListener> tick_listeners_;
  std::vector<ReplacedListener> replaced_listeners_;
  std::vector<LostListener> lost_listeners_;
  std::vector<FinishedListener> finished_listeners_;

  mutable Mutex mu_;
  CondVar cv_{&mu_};
  int id_ GUARDED_BY(mu_) = -1;
  int rank_ GUARDED_BY(mu_) = -1;
  std::map<int, NodeInfo> table_ GUARDED_BY(mu_);
  bool table_arrived_ GUARDED_BY(mu_) = false;   // the scheduler's CMD_NODE_TABLE came
  PsHeader table_header_ GUARDED_BY(mu_);        // it, until Start() takes it
  std::string scheduler_route_ GUARDED_BY(mu_);  // the table's route of the scheduler
  // Adopted, connected, early messages handed on. Set under mu_ (with early_
  // empty), never cleared: once true, data messages skip the lock.
  std::atomic<bool> have_table_{false};
  std::vector<Message> early_ GUARDED_BY(mu_);      // what arrived before the table
  std::vector<NodeInfo> replaced_ GUARDED_BY(mu_);  // replacements the replacer_ adopts
  bool shutdown_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  Status health_ GUARDED_BY(mu_);
  bool failing_ GUARDED_BY(mu_) = false;  // Failed() is reporting; health_ set once it did
  std::map<int, uint64_t> barrier_sent_ GUARDED_BY(mu_);
  std::map<int, uint64_t> barrier_done_ GUARDED_BY(mu_);
  SteadyClock::time_point last_scheduler_contact_ GUARDED_BY(mu_);
  std::atomic<int64_t> test_stall_ms_{0};
  std::atomic<bool> test_ignore_aborts_{false};
  std::thread heartbeat_;
  std::thread replacer_;  // a worker's ReplacementLoop
};

}  // namespace pstrain

#endif  // PSTRAIN_NET_CLUSTER_NODE_H_
