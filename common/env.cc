#include "common/env.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

extern char** environ;  // POSIX: the process environment, read only in this file

namespace pstrain {

Environment::Environment(std::map<std::string, std::string> overrides)
    : overrides_(std::move(overrides)) {}

Environment Environment::Isolated(std::map<std::string, std::string> vars) {
  Environment env(std::move(vars));
  env.isolated_ = true;
  return env;
}

std::optional<std::string> Environment::Get(const std::string& name) const {
  auto it = overrides_.find(name);
  if (it != overrides_.end()) {
    if (it->second.empty()) return std::nullopt;
    return it->second;
  }
  if (isolated_) return std::nullopt;
  const char* v = std::getenv(name.c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

StatusOr<std::string> Environment::Require(const std::string& name) const {
  auto v = Get(name);
  if (!v) return Status::NotFound(StrCat("environment variable ", name, " is not set"));
  return *v;
}

namespace {

StatusOr<int64_t> ParseInt(const std::string& name, const std::string& value, int64_t min,
                           int64_t max) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (errno != 0 || end == value.c_str() || *end != '\0') {
    return Status::InvalidArgument(
        StrCat("environment variable ", name, "='", value, "' is not an integer"));
  }
  if (v < min || v > max) {
    return Status::InvalidArgument(
        StrCat("environment variable ", name, "=", v, " is out of range [", min, ", ", max, "]"));
  }
  return static_cast<int64_t>(v);
}

}  // namespace

StatusOr<int64_t> Environment::GetInt(const std::string& name, int64_t default_value, int64_t min,
                                      int64_t max) const {
  auto v = Get(name);
  if (!v) return default_value;
  return ParseInt(name, *v, min, max);
}

StatusOr<int64_t> Environment::RequireInt(const std::string& name, int64_t min, int64_t max) const {
  ASSIGN_OR_RETURN(std::string v, Require(name));
  return ParseInt(name, v, min, max);
}

StatusOr<bool> Environment::GetBool(const std::string& name, bool default_value) const {
  auto v = Get(name);
  if (!v) return default_value;
  std::string s = *v;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  return Status::InvalidArgument(
      StrCat("environment variable ", name, "='", *v, "' is not a boolean (use 0 or 1)"));
}

StatusOr<double> Environment::GetDouble(const std::string& name, double default_value) const {
  auto v = Get(name);
  if (!v) return default_value;
  errno = 0;
  char* end = nullptr;
  double d = std::strtod(v->c_str(), &end);
  if (errno != 0 || end == v->c_str() || *end != '\0') {
    return Status::InvalidArgument(
        StrCat("environment variable ", name, "='", *v, "' is not a number"));
  }
  return d;
}

std::map<std::string, std::string> Environment::All() const {
  std::map<std::string, std::string> all;
  if (!isolated_) {
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const char* eq = std::strchr(*e, '=');
      if (eq == nullptr) continue;
      all[std::string(*e, eq - *e)] = std::string(eq + 1);
    }
  }
  for (const auto& [name, value] : overrides_) {
    if (value.empty()) {
      all.erase(name);
    } else {
      all[name] = value;
    }
  }
  return all;
}

const char* RoleName(Role role) {
  switch (role) {
    case Role::kScheduler:
      return "scheduler";
    case Role::kServer:
      return "server";
    case Role::kWorker:
      return "worker";
  }
  return "?";
}

StatusOr<Role> ParseRole(const std::string& s) {
  if (s == "scheduler") return Role::kScheduler;
  if (s == "server") return Role::kServer;
  if (s == "worker") return Role::kWorker;
  return Status::InvalidArgument(
      StrCat("role '", s, "' is not one of scheduler, server, worker (DMLC_ROLE or --role)"));
}

StatusOr<JobEnv> ReadJobEnv(const Environment& env, bool cluster_required) {
  JobEnv job;
  if (auto role = env.Get("DMLC_ROLE")) {
    ASSIGN_OR_RETURN(job.role, ParseRole(*role));
  }
  if (cluster_required) {
    ASSIGN_OR_RETURN(job.root_uri, env.Require("DMLC_PS_ROOT_URI"));
    ASSIGN_OR_RETURN(int64_t port, env.RequireInt("DMLC_PS_ROOT_PORT", 1, 65535));
    job.root_port = static_cast<int>(port);
    ASSIGN_OR_RETURN(int64_t ns, env.RequireInt("DMLC_NUM_SERVER", 1, kMaxNodesPerRole));
    ASSIGN_OR_RETURN(int64_t nw, env.RequireInt("DMLC_NUM_WORKER", 1, kMaxNodesPerRole));
    job.num_servers = static_cast<int>(ns);
    job.num_workers = static_cast<int>(nw);
  }
  job.node_host = env.Get("DMLC_NODE_HOST").value_or("");
  job.interface = env.Get("DMLC_INTERFACE").value_or("");
  ASSIGN_OR_RETURN(int64_t port, env.GetInt("PORT", 0, 0, 65535));
  job.port = static_cast<int>(port);
  ASSIGN_OR_RETURN(int64_t verbose, env.GetInt("PS_VERBOSE", 0, 0, 3));
  job.verbose = static_cast<int>(verbose);
  ASSIGN_OR_RETURN(job.bigarray_bound,
                   env.GetInt("MXNET_KVSTORE_BIGARRAY_BOUND", job.bigarray_bound, 1));
  auto read_ms = [&env](const char* name, int* out, int64_t min) -> Status {
    ASSIGN_OR_RETURN(int64_t v, env.GetInt(name, *out, min, INT32_MAX));
    *out = static_cast<int>(v);
    return Status::Ok();
  };
  RETURN_IF_ERROR(read_ms("PSTRAIN_HEARTBEAT_INTERVAL_MS", &job.heartbeat_interval_ms, 0));
  RETURN_IF_ERROR(read_ms("PSTRAIN_HEARTBEAT_TIMEOUT_MS", &job.heartbeat_timeout_ms, 1));
  RETURN_IF_ERROR(read_ms("PSTRAIN_STARTUP_TIMEOUT_MS", &job.startup_timeout_ms, 1));
  RETURN_IF_ERROR(read_ms("PSTRAIN_BARRIER_TIMEOUT_MS", &job.barrier_timeout_ms, 1));
  RETURN_IF_ERROR(read_ms("PSTRAIN_REQUEST_TIMEOUT_MS", &job.request_timeout_ms, 1));
  job.bind_host = env.Get("PSTRAIN_BIND_HOST").value_or(job.bind_host);
  job.job_id = env.Get("PSTRAIN_JOB_ID").value_or("");
  ASSIGN_OR_RETURN(int64_t launch_rank, env.GetInt("PSTRAIN_LAUNCH_RANK", -1, 0, INT32_MAX));
  job.launch_rank = static_cast<int>(launch_rank);
  ASSIGN_OR_RETURN(int64_t restarts, env.GetInt("PSTRAIN_SERVER_RESTARTS", 0, 0, 1000));
  job.server_restarts = static_cast<int>(restarts);
  ASSIGN_OR_RETURN(int64_t restart_timeout,
                   env.GetInt("PSTRAIN_RESTART_TIMEOUT_MS", job.restart_timeout_ms, 1, INT32_MAX));
  job.restart_timeout_ms = static_cast<int>(restart_timeout);
  job.snapshot_dir = env.Get("PSTRAIN_SNAPSHOT_DIR").value_or("");
  ASSIGN_OR_RETURN(int64_t every, env.GetInt("PSTRAIN_SNAPSHOT_EVERY", 1, 1, 1000000));
  job.snapshot_every = static_cast<int>(every);
  ASSIGN_OR_RETURN(job.snapshot_sync, env.GetBool("PSTRAIN_SNAPSHOT_SYNC", false));
  const std::string loss = env.Get("PSTRAIN_WORKER_LOSS").value_or("fail");
  if (loss != "fail" && loss != "continue") {
    return Status::InvalidArgument(
        StrCat("PSTRAIN_WORKER_LOSS='", loss, "': expected fail or continue"));
  }
  job.continue_without_lost_workers = loss == "continue";
  ASSIGN_OR_RETURN(int64_t restart, env.GetInt("PSTRAIN_RESTART", 0, 0, INT32_MAX));
  job.restart = static_cast<int>(restart);
  job.key_file = env.Get("PSTRAIN_KEY_FILE").value_or("");
  const std::string wire = env.Get("PSTRAIN_WIRE_SECURITY").value_or("curve");
  if (wire != "curve" && wire != "auth") {
    return Status::InvalidArgument(
        StrCat("environment variable PSTRAIN_WIRE_SECURITY='", wire, "' must be curve or auth"));
  }
  job.encrypt = wire == "curve";
  ASSIGN_OR_RETURN(job.max_message_bytes,
                   env.GetInt("PSTRAIN_MAX_MESSAGE_BYTES", job.max_message_bytes, 1024));
  ASSIGN_OR_RETURN(int64_t threads,
                   env.GetInt("PSTRAIN_SERVER_THREADS", job.server_threads, 1, 64));
  job.server_threads = static_cast<int>(threads);
  const std::string nonfinite = env.Get("PSTRAIN_NONFINITE").value_or("fail");
  if (nonfinite != "fail" && nonfinite != "skip") {
    return Status::InvalidArgument(
        StrCat("environment variable PSTRAIN_NONFINITE='", nonfinite, "' must be fail or skip"));
  }
  job.skip_nonfinite = nonfinite == "skip";
  ASSIGN_OR_RETURN(job.round_timeout_ms,
                   env.GetInt("PSTRAIN_ROUND_TIMEOUT_MS", job.round_timeout_ms, 0));
  job.placement = env.Get("PSTRAIN_PLACEMENT").value_or(job.placement);
  if (job.placement != "balanced" && job.placement != "mxnet") {
    return Status::InvalidArgument(StrCat("environment variable PSTRAIN_PLACEMENT='", job.placement,
                                          "' is not balanced or mxnet"));
  }
  ASSIGN_OR_RETURN(job.chunk_elems, env.GetInt("PSTRAIN_CHUNK_ELEMS", job.chunk_elems, 1));
  ASSIGN_OR_RETURN(job.shm_bytes, env.GetInt("PSTRAIN_SHM_BYTES", job.shm_bytes, 0));
  if (job.shm_bytes > 0 && job.shm_bytes < (int64_t{1} << 20)) {
    return Status::InvalidArgument(StrCat("environment variable PSTRAIN_SHM_BYTES=", job.shm_bytes,
                                          " is below 1048576 (use 0 to turn shared memory off)"));
  }
  ASSIGN_OR_RETURN(job.shm_store_bytes,
                   env.GetInt("PSTRAIN_SHM_STORE_BYTES", job.shm_store_bytes, 0));
  return job;
}

StatusOr<LaunchInfo> ReadLaunchInfo(const Environment& env) {
  LaunchInfo info;
  ASSIGN_OR_RETURN(int64_t rank, env.GetInt("PSTRAIN_LAUNCH_RANK", -1, 0, INT32_MAX));
  info.role_rank = static_cast<int>(rank);
  ASSIGN_OR_RETURN(int64_t task, env.GetInt("DMLC_TASK_ID", -1, 0, INT32_MAX));
  info.task_id = static_cast<int>(task);
  info.cluster = env.Get("DMLC_JOB_CLUSTER").value_or("");
  info.job_id = env.Get("PSTRAIN_JOB_ID").value_or("");
  return info;
}

StatusOr<DataEnv> ReadDataEnv(const Environment& env) {
  DataEnv out;
  out.data_root = env.Get("PSTRAIN_DATA").value_or("");
  out.mnist_dir = env.Get("PSTRAIN_MNIST_DIR").value_or("");
  const std::string list = env.Get("PSTRAIN_DATA_MIRRORS").value_or("");
  size_t start = 0;
  while (start < list.size()) {
    size_t end = list.find_first_of(", \t\n", start);
    if (end == std::string::npos) end = list.size();
    std::string url = list.substr(start, end - start);
    start = end + 1;
    if (url.empty()) continue;
    if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0 &&
        url.rfind("file://", 0) != 0) {
      return Status::InvalidArgument(
          StrCat("PSTRAIN_DATA_MIRRORS: '", url, "' is not an http://, https:// or file:// URL"));
    }
    out.mirrors.push_back(url);
  }
  return out;
}

}  // namespace pstrain
