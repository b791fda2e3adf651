// The one place where pstrain reads environment variables.
//
// Environment wraps getenv with an override map, so a test can build several
// nodes with different variables inside one process (no setenv). Every
// variable we read is parsed by a function in env.cc and listed in
// docs/env.md; a malformed value is an InvalidArgument naming the variable.
#ifndef PSTRAIN_COMMON_ENV_H_
#define PSTRAIN_COMMON_ENV_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain {

// Most servers, and most workers, one job may have (DMLC_NUM_SERVER and
// DMLC_NUM_WORKER; the launcher's -s and -n).
constexpr int kMaxNodesPerRole = 4096;

class Environment {
 public:
  // Reads the process environment; `overrides` take precedence over it.
  explicit Environment(std::map<std::string, std::string> overrides = {});
  // Reads only `vars`, never the process environment (for tests).
  static Environment Isolated(std::map<std::string, std::string> vars);

  // The raw value, or nullopt when unset. An empty string counts as unset.
  std::optional<std::string> Get(const std::string& name) const;
  // Unset: NotFound naming the variable.
  StatusOr<std::string> Require(const std::string& name) const;
  // Unset: `default_value`; set but not an integer in [min, max]: InvalidArgument.
  StatusOr<int64_t> GetInt(const std::string& name, int64_t default_value, int64_t min = INT64_MIN,
                           int64_t max = INT64_MAX) const;
  StatusOr<int64_t> RequireInt(const std::string& name, int64_t min = INT64_MIN,
                               int64_t max = INT64_MAX) const;
  // Accepts 0/1/true/false/yes/no/on/off (any case).
  StatusOr<bool> GetBool(const std::string& name, bool default_value) const;
  StatusOr<double> GetDouble(const std::string& name, double default_value) const;

  // Every variable: the process environment (unless isolated) with the
  // overrides applied on top; an override with an empty value removes the
  // variable. For launchers that start child processes with this environment.
  std::map<std::string, std::string> All() const;

 private:
  std::map<std::string, std::string> overrides_;
  bool isolated_ = false;
};

enum class Role { kScheduler, kServer, kWorker };
const char* RoleName(Role role);  // "scheduler", "server", "worker"
StatusOr<Role> ParseRole(const std::string& s);

// The DMLC_* / PS_* contract of MXNet and ps-lite (../shared/reference/mxnet_facts.md 1.10),
// plus our PSTRAIN_* timeouts. Read once per node by ReadJobEnv.
struct JobEnv {
  Role role = Role::kWorker;         // DMLC_ROLE (unset: worker, as in MXNet)
  std::string root_uri;              // DMLC_PS_ROOT_URI: scheduler host name or IP
  int root_port = 0;                 // DMLC_PS_ROOT_PORT
  int num_servers = 0;               // DMLC_NUM_SERVER
  int num_workers = 0;               // DMLC_NUM_WORKER
  std::string node_host;             // DMLC_NODE_HOST: address this node advertises
  std::string interface;             // DMLC_INTERFACE: NIC whose IP to advertise
  int port = 0;                      // PORT: this node's port (0: pick a free one)
  int verbose = 0;                   // PS_VERBOSE: 0, 1 (connections), 2 (every message)
  std::string job_id;                // PSTRAIN_JOB_ID: the same on every node of a job
  int launch_rank = -1;              // PSTRAIN_LAUNCH_RANK: the launcher's number (-1: none)
  std::string key_file;              // PSTRAIN_KEY_FILE: the job's CURVE keys; empty: none
  bool encrypt = true;               // PSTRAIN_WIRE_SECURITY: curve (true) | auth (false)
  int64_t bigarray_bound = 1000000;  // MXNET_KVSTORE_BIGARRAY_BOUND (elements)
  int heartbeat_interval_ms = 1000;  // PSTRAIN_HEARTBEAT_INTERVAL_MS (0: off)
  int heartbeat_timeout_ms = 10000;  // PSTRAIN_HEARTBEAT_TIMEOUT_MS
  int startup_timeout_ms = 30000;    // PSTRAIN_STARTUP_TIMEOUT_MS: registration deadline
  int barrier_timeout_ms = 600000;   // PSTRAIN_BARRIER_TIMEOUT_MS
  int request_timeout_ms = 600000;   // PSTRAIN_REQUEST_TIMEOUT_MS: one push/pull
  // Parameter server (net/, server/, worker/ KV client):
  // PSTRAIN_BIND_HOST: address to bind; empty: the advertised one (the
  // scheduler: DMLC_PS_ROOT_URI); 0.0.0.0: every interface (IPv4), "::":
  // every interface (IPv6 and IPv4).
  std::string bind_host;
  int64_t max_message_bytes = int64_t{1} << 31;  // PSTRAIN_MAX_MESSAGE_BYTES: per frame
  int server_threads = 2;             // PSTRAIN_SERVER_THREADS: request shards per server
  bool skip_nonfinite = false;        // PSTRAIN_NONFINITE: fail (false) | skip (true)
  int64_t round_timeout_ms = 120000;  // PSTRAIN_ROUND_TIMEOUT_MS: a dist_sync round's wait
  std::string placement = "mxnet";    // PSTRAIN_PLACEMENT: mxnet | balanced
  int64_t chunk_elems = 262144;       // PSTRAIN_CHUNK_ELEMS: balanced placement chunk size
  // PSTRAIN_SHM_BYTES: each server's and worker's shared-memory arena for
  // co-located peers (net/shm_arena.h); 0: TCP only.
  int64_t shm_bytes = int64_t{128} << 20;
  // PSTRAIN_SHM_STORE_BYTES: a server's stored values live in its arena up to
  // this much (address space; pages cost only once used), so co-located
  // workers pull them without a copy on the server.
  int64_t shm_store_bytes = int64_t{4} << 30;
  // Server recovery. PSTRAIN_SERVER_RESTARTS: how many times a dead server
  // may be replaced by a restarted process (0: a dead server ends the job).
  int server_restarts = 0;
  // PSTRAIN_RESTART_TIMEOUT_MS: how long the job waits for a replacement.
  int restart_timeout_ms = 60000;
  // PSTRAIN_SNAPSHOT_DIR: servers keep their snapshots in <dir>/server-<rank>
  // (empty: no snapshots).
  std::string snapshot_dir;
  // PSTRAIN_SNAPSHOT_EVERY: rounds between a key's snapshots (workers send it
  // to the servers, and keep that many pushes to re-send).
  int snapshot_every = 1;
  // PSTRAIN_SNAPSHOT_SYNC: fdatasync every snapshot (survive a host crash).
  bool snapshot_sync = false;
  // PSTRAIN_WORKER_LOSS: a dead worker ends the job (fail, false) or the job
  // goes on with the others (continue, true).
  bool continue_without_lost_workers = false;
  // PSTRAIN_RESTART: set by the launcher on a restarted process (its count).
  int restart = 0;
};

// Parses the variables above. When `role_required` is true a missing
// DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER or DMLC_NUM_WORKER is an
// error naming the variable.
StatusOr<JobEnv> ReadJobEnv(const Environment& env, bool cluster_required = true);

// What `pstrain launch` told this process about its place in the job (all
// launchers set these; a job started by hand may not).
struct LaunchInfo {
  int role_rank = -1;   // PSTRAIN_LAUNCH_RANK: rank among the processes of its role
  int task_id = -1;     // DMLC_TASK_ID: index of the task in the job (-1: unset)
  std::string cluster;  // DMLC_JOB_CLUSTER: local, ssh, mpi or slurm ("" when unset)
  std::string job_id;   // PSTRAIN_JOB_ID: the launcher's job id ("" when unset)
};
StatusOr<LaunchInfo> ReadLaunchInfo(const Environment& env);

// Where data sets are found and fetched from (`pstrain data`, `train --dataset`;
// data/dataset_get.h has the search order).
struct DataEnv {
  std::string data_root;  // PSTRAIN_DATA: data sets live in <root>/<name> (searched, fetched into)
  // PSTRAIN_DATA_MIRRORS: base URLs, separated by commas or spaces, tried in
  // order instead of a data set's own mirrors; "{name}" in one stands for the
  // data set's name. Each must be http://, https:// or file://.
  std::vector<std::string> mirrors;
  std::string mnist_dir;  // PSTRAIN_MNIST_DIR: a folder holding MNIST (searched first for mnist)
};
StatusOr<DataEnv> ReadDataEnv(const Environment& env);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_ENV_H_
