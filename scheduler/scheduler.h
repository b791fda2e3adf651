// Scheduler: the rendezvous and referee of a job (../shared/design.md 6).
//
// It registers S servers and W workers, assigns ranks deterministically (sorted
// by advertised host, port, then a random nonce), broadcasts the node table,
// runs barriers per group with generation numbers, answers heartbeats, declares
// a node dead when it is silent past the heartbeat timeout and tells everyone
// (CMD_ABORT naming it), and broadcasts SHUTDOWN once every worker finished.
// A worker that finishes before the others cannot be waited for: a barrier
// that needs it ends the job, and the servers that never restarted hear of it
// (CMD_WORKER_FINISHED); a replacement keeps the round timeout.
//
// Server recovery (ClusterOptions::server_restarts > 0): a server declared
// dead does not end the job at once. The scheduler waits restart_timeout_ms
// for a restarted process to register (one with PSTRAIN_RESTART set, or any
// server while one is dead); it takes the dead one's rank and id, every
// worker hears of it (CMD_NODE_REPLACED), connects and re-sends what the lost
// rounds need, and once every worker answered, the replacement gets the node
// table and serves. No replacement in time, or no restarts left: the job ends.
//
// Lost workers (ClusterOptions::continue_without_lost_workers): a worker
// declared dead is dropped from the job (CMD_WORKER_LOST to everyone): the
// servers close its rounds with the others' pushes and rescale, barriers and
// the job's end count only the workers left. The last worker lost ends the job.
#ifndef PSTRAIN_SCHEDULER_SCHEDULER_H_
#define PSTRAIN_SCHEDULER_SCHEDULER_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "net/cluster_node.h"
#include "net/van.h"

namespace pstrain {

class Scheduler {
 public:
  // Binds options.bind_host (empty: options.root_host) : options.root_port
  // (root_port 0: any free port, for tests).
  static StatusOr<std::unique_ptr<Scheduler>> Create(const ClusterOptions& options);
  ~Scheduler();

  int port() const { return port_; }

  // Runs the job to its end. OK when every worker finished (SHUTDOWN sent);
  // DeadlineExceeded when not every node registered within startup_timeout_ms;
  // Unavailable when a node died or reported a fatal error. Every other node
  // has been told before it returns. Thread-safe; call once.
  Status Run();

 private:
  struct Node {
    NodeInfo info;
    SteadyClock::time_point last_seen;
  };
  // A server declared dead, waiting for its replacement.
  struct Dead {
    SteadyClock::time_point since;
    std::string why;
  };
  // A replacement waiting for every worker to be ready for it.
  struct Replacing {
    Message table;          // what it gets once they are
    std::set<int> waiting;  // workers that have not answered yet
    SteadyClock::time_point since;
  };
  struct BarrierState {
    uint64_t generation = 0;  // last completed
    std::set<int> arrived;
  };

  explicit Scheduler(const ClusterOptions& options) : options_(options) {}
  void Handle(Message&& msg);
  void Register(const Message& msg) REQUIRES(mu_);
  // Tells node `n` (not a member) why it may not join, and logs it.
  void Refuse(const NodeInfo& n, const std::string& why) REQUIRES(mu_);
  // A server registering while the job runs: the replacement of a dead one.
  void Replace(const Message& msg) REQUIRES(mu_);
  // A server silent past the heartbeat timeout: ends the job, or (restarts
  // left) waits for its replacement.
  void ServerSilent(int id, const std::string& why) REQUIRES(mu_);
  // Runs from Run(): replacements that did not come, or workers that did not answer, in time.
  void CheckReplacements() REQUIRES(mu_);
  // Every worker is ready for the replacement `id`: it gets its table (and its
  // heartbeats, which start then, are watched from now on).
  void SendReplacementTable(int id, const Message& table) REQUIRES(mu_);
  Message NodeTable() const REQUIRES(mu_);
  // A worker silent past the heartbeat timeout with PSTRAIN_WORKER_LOSS=continue:
  // everyone hears that the job goes on without it (or it ends, if it was the last).
  void LoseWorker(int id, const std::string& why) REQUIRES(mu_);
  // Members of barrier `group` still in the job.
  int BarrierMembers(int group) const REQUIRES(mu_);
  // Completes barrier `group` if every member still in the job arrived.
  void MaybeReleaseBarrier(int group) REQUIRES(mu_);
  // Every worker still in the job finished: SHUTDOWN. Otherwise a barrier
  // that waits for worker `id` ends the job, and the servers that never
  // restarted hear of it (CMD_WORKER_FINISHED: a dist_sync round waiting for
  // its push ends the job).
  void WorkerFinished(int id) REQUIRES(mu_);
  // Every worker still in the job finished: SHUTDOWN.
  void MaybeShutdown() REQUIRES(mu_);
  // Why a registering node is not part of this job (protocol, S and W, job
  // id, build), or "" when it is.
  std::string JobMismatch(const PsHeader& h) const;
  void EnterBarrier(const Message& msg) REQUIRES(mu_);
  void Broadcast(const Message& msg, int except) REQUIRES(mu_);
  // Ends the job: every node but `except` gets CMD_ABORT with `why`. With a
  // `culprit` (a node id) the log line names it for the launcher
  // (common/job_cause.h).
  void Abort(const std::string& why, int except, int culprit = -1) REQUIRES(mu_);
  std::string Describe(int id) const REQUIRES(mu_);
  // "; barrier of group 4 generation 3 is still waiting for worker rank 2 at ..." per open barrier.
  std::string OpenBarriers() const REQUIRES(mu_);
  PsHeader Header(PsCommand cmd) const;

  ClusterOptions options_;
  std::unique_ptr<Van> van_;
  int port_ = 0;
  uint64_t nonce_ = 0;  // names the scheduler's connections (SchedulerRoute)

  Mutex mu_;
  CondVar cv_{&mu_};
  std::vector<NodeInfo> pending_ GUARDED_BY(mu_);  // registered before the table went out
  std::map<int, Node> nodes_ GUARDED_BY(mu_);      // by id, once the table went out
  bool started_ GUARDED_BY(mu_) = false;
  std::map<int, BarrierState> barriers_ GUARDED_BY(mu_);
  std::set<int> finished_ GUARDED_BY(mu_);
  std::map<int, Dead> dead_ GUARDED_BY(mu_);            // servers waiting for a replacement
  std::set<int> lost_ GUARDED_BY(mu_);                  // workers the job goes on without
  std::map<int, Replacing> replacing_ GUARDED_BY(mu_);  // replacements waiting for the workers
  std::map<int, int> restarts_used_ GUARDED_BY(mu_);    // per server id
  bool done_ GUARDED_BY(mu_) = false;
  Status failure_ GUARDED_BY(mu_);
};

}  // namespace pstrain

#endif  // PSTRAIN_SCHEDULER_SCHEDULER_H_
