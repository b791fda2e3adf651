#include "tracker/launcher.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "common/env.h"
#include "net/job_keys.h"
#include "tracker/process.h"
#include "tracker/shell.h"
#include "tracker/slurm.h"

namespace pstrain::tracker {
namespace {

// How many hosts --sync-dst-dir copies to at once.
constexpr int kParallelCopies = 16;

// Variables the ssh launcher forwards from the launcher's environment, as
// dmlc-core's ssh tracker does, plus our own and MXNet's knobs.
bool Forwarded(const std::string& name) {
  static const char* const kNames[] = {"OMP_NUM_THREADS", "KMP_AFFINITY", "LD_LIBRARY_PATH",
                                       "DMLC_INTERFACE", "PS_VERBOSE"};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  // Not the launcher's key file path: each ssh host gets its own copy.
  if (name == "PSTRAIN_KEY_FILE") return false;
  return name.rfind("PSTRAIN_", 0) == 0 || name.rfind("MXNET_", 0) == 0;
}

bool ValidEnvName(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

StatusOr<int> ParseCount(const std::string& flag, const std::string& value, int min,
                         int max = 100000) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || v < min || v > max) {
    return Status::InvalidArgument(
        StrCat(flag, " '", value, "' is not an integer from ", min, " to ", max));
  }
  return static_cast<int>(v);
}

std::string DefaultJobId() {
  time_t now = time(nullptr);
  struct tm tm_utc;
  gmtime_r(&now, &tm_utc);
  char buf[32];
  strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm_utc);
  return StrCat(buf, "-", getpid());
}

std::string CurrentDir();

std::string AbsolutePath(const std::string& path) {
  return !path.empty() && path[0] == '/' ? path : CurrentDir() + "/" + path;
}

// Where `path` lies in `folder`, relative to it: as written, and with every
// symbolic link resolved (the key file named through a link to the folder,
// or the folder through one to the file's); none where it lies outside.
std::vector<std::string> PathsInFolder(const std::string& path, const std::string& folder) {
  namespace fs = std::filesystem;
  std::vector<std::string> inside;
  if (path.empty()) return inside;
  const auto add = [&inside](const fs::path& p, const fs::path& dir) {
    const fs::path rel = p.lexically_normal().lexically_relative(dir.lexically_normal());
    if (rel.empty() || *rel.begin() == ".." || rel == ".") return;
    if (std::find(inside.begin(), inside.end(), rel.generic_string()) == inside.end()) {
      inside.push_back(rel.generic_string());
    }
  };
  add(fs::path(AbsolutePath(path)), fs::path(folder));
  std::error_code e1, e2;
  const fs::path real = fs::weakly_canonical(AbsolutePath(path), e1);
  const fs::path real_folder = fs::weakly_canonical(folder, e2);
  if (!e1 && !e2) add(real, real_folder);
  return inside;
}

// `path` as an rsync filter pattern that matches it alone: its wildcards
// (*, ?, [) and, where it has one, its backslashes escaped (rsync reads a
// backslash as an escape only in a pattern with a wildcard).
std::string RsyncLiteral(const std::string& path) {
  if (path.find_first_of("*?[") == std::string::npos) return path;
  std::string out;
  for (char c : path) {
    if (c == '*' || c == '?' || c == '[' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string CurrentDir() {
  char buf[4096];
  if (getcwd(buf, sizeof(buf)) == nullptr) return ".";
  return buf;
}

enum class MpiFlavour { kOpenMpi, kMpich };

struct MpiVersion {
  MpiFlavour flavour = MpiFlavour::kOpenMpi;
  std::string version;  // "4.1.4" as `--version` printed it; empty if it printed none
  int major = 0;        // 0: unknown
};

// The first "N.N..." word of `text` ("mpirun (Open MPI) 4.1.4", Hydra's
// "Version:   4.0.2"); empty if none.
std::string FirstVersion(const std::string& text) {
  std::istringstream words(text);
  for (std::string word; words >> word;) {
    if (std::isdigit(static_cast<unsigned char>(word[0])) && word.find('.') != std::string::npos) {
      return word;
    }
  }
  return "";
}

StatusOr<MpiVersion> DetectMpi(const std::string& mpirun,
                               const std::map<std::string, std::string>& env) {
  std::string out;
  int status = 0;
  Status s = RunAndCapture({mpirun, "--version"}, env, 10000, &out, &status);
  if (!s.ok()) return s.WithContext("detecting the MPI flavour");
  MpiVersion v;
  // The version on the line that names it ("mpirun (Open MPI) 4.1.4"; a
  // warning may come first).
  const auto line_of = [&out](size_t at) {
    const size_t start = out.rfind('\n', at);
    const size_t from = start == std::string::npos ? 0 : start + 1;
    return out.substr(from, out.find('\n', at) - from);
  };
  size_t named = out.find("Open MPI");
  if (named == std::string::npos) named = out.find("OpenRTE");
  if (named != std::string::npos) {
    v.flavour = MpiFlavour::kOpenMpi;
    v.version = FirstVersion(line_of(named));
    v.major = std::atoi(v.version.c_str());
    return v;
  }
  std::string lower = out;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.find("mpich") != std::string::npos || lower.find("hydra") != std::string::npos) {
    v.flavour = MpiFlavour::kMpich;
    if (const size_t at = out.find("Version:"); at != std::string::npos) {
      const std::string line = line_of(at);
      v.version = FirstVersion(line.substr(line.find("Version:") + 8));
      v.major = std::atoi(v.version.c_str());
    }
    return v;
  }
  return Status::FailedPrecondition(
      StrCat("'", mpirun, " --version' names neither Open MPI nor MPICH: ", out.substr(0, 200)));
}

// --restart-servers: a count, and not under mpirun or srun, which start and
// end every rank themselves and cannot start one of them again.
Status CheckRestarts(const LaunchOptions& o) {
  if (o.restart_servers < 0) {
    return Status::InvalidArgument(
        StrCat("--restart-servers ", o.restart_servers, " must be >= 0"));
  }
  if (o.continue_without_lost_workers && o.launcher == LauncherKind::kSlurm) {
    return Status::InvalidArgument(
        "--worker-loss continue works only with the local and ssh launchers: srun ends the "
        "whole step when one task fails (--kill-on-bad-exit)");
  }
  if (o.restart_servers > 0 && o.launcher == LauncherKind::kSlurm) {
    return Status::InvalidArgument(
        "--restart-servers works only with the local and ssh launchers: srun owns the tasks "
        "of its step and cannot restart one of them");
  }
  if (o.continue_without_lost_workers && o.launcher == LauncherKind::kMpi) {
    return Status::InvalidArgument(
        "--worker-loss continue works only with the local and ssh launchers: mpirun ends the "
        "whole job when one rank fails");
  }
  if (o.restart_servers > 0 && o.launcher == LauncherKind::kMpi) {
    return Status::InvalidArgument(
        "--restart-servers works only with the local and ssh launchers: mpirun owns its "
        "processes and cannot restart one rank");
  }
  return Status::Ok();
}

}  // namespace

const char* LauncherName(LauncherKind kind) {
  switch (kind) {
    case LauncherKind::kLocal:
      return "local";
    case LauncherKind::kSsh:
      return "ssh";
    case LauncherKind::kMpi:
      return "mpi";
    case LauncherKind::kSlurm:
      return "slurm";
  }
  return "?";
}

std::string NewJobId() { return DefaultJobId(); }

std::string LaunchUsage() {
  return R"(usage: pstrain launch -n W [-s S] [--launcher local|ssh|mpi|slurm] [-H HOSTFILE]
                      [--sync-dst-dir DIR] [--log-dir DIR] [--env K[=V] ...] [options]
                      [--] COMMAND [ARGS...]

Starts 1 scheduler (on this host), S servers and W workers, each running COMMAND
with MXNet's environment (DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT,
DMLC_NUM_SERVER, DMLC_NUM_WORKER, DMLC_NODE_HOST, ...), like MXNet's launch.py.
Each process's output is prefixed "[role-rank]" here (on a terminal: a live
view instead, see --live) and written to LOG_DIR/<role>-<rank>.log; starts
and exits go to LOG_DIR/launch.log. If one process fails, all are stopped and
the launcher exits non-zero naming it; Ctrl-C stops every process on every
host.

  -n, --num-workers W     number of workers (required)
  -s, --num-servers S     number of servers (default: W)
  --launcher KIND         local, ssh, mpi or slurm (default: ssh with -H, else local)
  -H, --hostfile FILE     hosts, one per line, optional :port (ssh, mpi); IPv6
                          addresses in brackets: [fd00::11] or [fd00::11]:port
                          (mpi: Open MPI 4 takes names only: list names that
                          resolve to the hosts' IPv6 addresses; MPICH 4's
                          Hydra needs IPv4 for itself)
  --sync-dst-dir DIR      ssh: rsync the working directory to DIR on every host
                          first and run there (default: the same path as here)
  --sync-timeout SECONDS  ssh: how long one host's copy may take (default 600);
                          up to 16 hosts are copied to at once
  --log-dir DIR           where the logs go (default: logs/<job-id>)
  --job-id ID             name of the job: letters, digits, '.', '_', '-' (default: UTC
                          time and launcher pid)
  --env K=V | K:V | K     set K for every process (K alone: its value here);
                          repeatable. DMLC_PS_ROOT_PORT=P fixes the scheduler's
                          port (default: a free one in 9091..9998)
  --host-ip IP            scheduler address the others connect to
                          (default: auto-detected)
  --ssh-option OPT        pass -o OPT to ssh and rsync (repeatable)
  --no-host-key-check     ssh: StrictHostKeyChecking=no (checking is on by default)
  --mpi-option ARG        extra mpirun argument, e.g. --oversubscribe (repeatable)
  --mpirun PATH           mpirun to use (default: mpirun; Open MPI or MPICH)
  --srun-option ARG       slurm: extra srun argument for the server and the worker
                          step, e.g. --cpus-per-task=8 (repeatable)
  --nodes N               slurm, outside an allocation: nodes to ask for
                          (default: max(S, W), one server and one worker per node)
  --partition P           slurm, outside an allocation: salloc --partition
  --time T                slurm, outside an allocation: salloc --time (job time limit)
  --salloc-option ARG     slurm, outside an allocation: extra salloc argument
                          (repeatable)
  --alloc-timeout SECONDS slurm: how long to wait for the allocation (default 600)
  --key-file FILE         the job's keys (pstrain keygen); default: new keys per job
                          in <log-dir>/job.key, or the launcher's PSTRAIN_KEY_FILE
  --no-keys               no authentication or encryption (anyone who reaches the
                          job's ports can join it or send to it)
  --timeout SECONDS       stop the job after this long (default: no limit)
  --restart-servers K     server recovery (local and ssh launchers): a server
                          that exits non-zero or is killed is started again with
                          the same rank, up to K times per server, and reloads
                          its snapshot from PSTRAIN_SNAPSHOT_DIR (default:
                          <log-dir>/snapshots); the scheduler waits for the
                          replacement. Default 0: a dead server fails the job
  --worker-loss fail|continue
                          a worker that dies ends the job (fail, the default),
                          or the job goes on with the workers left, the servers
                          rescaling their gradients (continue; local and ssh
                          launchers; the dead worker's data is not trained on)
  --quiet                 write output only to the log files
  --live, --no-live       the live view: one status line per process (host,
                          state, epoch, batch, samples/s, last metric, epoch
                          ETA) redrawn in place, the processes' stdout and
                          their errors above it, everything in the logs
                          (default: when stdout is a terminal, unless --quiet;
                          `pstrain top LOG_DIR` shows the same view)
  -h, --help              this text
)";
}

StatusOr<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args) {
  LaunchOptions o;
  std::string slurm_only;  // the last Slurm option given
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.empty() || a[0] != '-' || a == "-") break;
    std::string name = a, value;
    bool has_value = false;
    size_t eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_value = true;
    } else if (a.size() > 2 && a[1] != '-' &&
               (a[1] == 'n' || a[1] == 's' || a[1] == 'H')) {  // -n2, -Hhosts
      name = a.substr(0, 2);
      value = a.substr(2);
      has_value = true;
    }
    auto take = [&](std::string* out) -> Status {
      if (has_value) {
        *out = value;
        return Status::Ok();
      }
      if (i + 1 >= args.size()) return Status::InvalidArgument(StrCat(name, " needs a value"));
      *out = args[++i];
      return Status::Ok();
    };
    auto no_value = [&]() -> Status {
      if (has_value) return Status::InvalidArgument(StrCat(name, " takes no value"));
      return Status::Ok();
    };
    std::string v;
    if (name == "-h" || name == "--help") {
      RETURN_IF_ERROR(no_value());
      o.help = true;
    } else if (name == "-n" || name == "--num-workers") {
      RETURN_IF_ERROR(take(&v));
      ASSIGN_OR_RETURN(o.num_workers, ParseCount(name, v, 1, kMaxNodesPerRole));
    } else if (name == "-s" || name == "--num-servers") {
      RETURN_IF_ERROR(take(&v));
      ASSIGN_OR_RETURN(o.num_servers, ParseCount(name, v, 1, kMaxNodesPerRole));
    } else if (name == "-H" || name == "--hostfile" || name == "--host-file") {
      RETURN_IF_ERROR(take(&o.hostfile));
    } else if (name == "--launcher" || name == "--cluster") {
      RETURN_IF_ERROR(take(&v));
      if (v == "local") {
        o.launcher = LauncherKind::kLocal;
      } else if (v == "ssh") {
        o.launcher = LauncherKind::kSsh;
      } else if (v == "mpi" || v == "mpirun") {
        o.launcher = LauncherKind::kMpi;
      } else if (v == "slurm") {
        o.launcher = LauncherKind::kSlurm;
      } else {
        return Status::InvalidArgument(
            StrCat("--launcher '", v, "' is not one of local, ssh, mpi, slurm"));
      }
    } else if (name == "--sync-dst-dir" || name == "--sync-dir") {
      RETURN_IF_ERROR(take(&o.sync_dst_dir));
    } else if (name == "--log-dir") {
      RETURN_IF_ERROR(take(&o.log_dir));
    } else if (name == "--job-id") {
      RETURN_IF_ERROR(take(&o.job_id));
      // A folder name, part of Slurm step names (read back split on spaces)
      // and of log lines: letters, digits, '.', '_' and '-'.
      const bool plain =
          !o.job_id.empty() && o.job_id != "." && o.job_id != ".." &&
          std::all_of(o.job_id.begin(), o.job_id.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
          });
      if (!plain) {
        return Status::InvalidArgument(StrCat(
            "--job-id '", o.job_id, "' must be a plain name (letters, digits, '.', '_', '-')"));
      }
    } else if (name == "--host-ip") {
      RETURN_IF_ERROR(take(&o.host_ip));
    } else if (name == "--env") {
      RETURN_IF_ERROR(take(&v));
      // NAME=VALUE or NAME:VALUE (dmlc-core's form), split at whichever comes
      // first: the value may hold the other ("OPTS:--a=b").
      const size_t sep = v.find_first_of("=:");
      std::string key = v.substr(0, sep);
      if (!ValidEnvName(key)) {
        return Status::InvalidArgument(
            StrCat("--env '", v, "': '", key, "' is not a variable name"));
      }
      if (sep == std::string::npos) {
        o.env.emplace_back(key, std::nullopt);
      } else {
        o.env.emplace_back(key, v.substr(sep + 1));
      }
    } else if (name == "--ssh-option") {
      RETURN_IF_ERROR(take(&v));
      o.ssh_options.push_back(v);
    } else if (name == "--no-host-key-check") {
      RETURN_IF_ERROR(no_value());
      o.no_host_key_check = true;
    } else if (name == "--mpi-option") {
      RETURN_IF_ERROR(take(&v));
      o.mpi_options.push_back(v);
    } else if (name == "--mpirun") {
      RETURN_IF_ERROR(take(&o.mpirun));
    } else if (name == "--srun-option") {
      RETURN_IF_ERROR(take(&v));
      o.srun_options.push_back(v);
      slurm_only = name;
    } else if (name == "--salloc-option") {
      RETURN_IF_ERROR(take(&v));
      o.salloc_options.push_back(v);
      slurm_only = name;
    } else if (name == "--partition") {
      RETURN_IF_ERROR(take(&o.partition));
      slurm_only = name;
    } else if (name == "--time") {
      RETURN_IF_ERROR(take(&o.time_limit));
      slurm_only = name;
    } else if (name == "--nodes") {
      RETURN_IF_ERROR(take(&v));
      ASSIGN_OR_RETURN(o.nodes, ParseCount(name, v, 1));
      slurm_only = name;
    } else if (name == "--alloc-timeout") {
      RETURN_IF_ERROR(take(&v));
      ASSIGN_OR_RETURN(o.alloc_timeout_s, ParseCount(name, v, 1));
      slurm_only = name;
    } else if (name == "--sync-timeout") {
      RETURN_IF_ERROR(take(&v));
      ASSIGN_OR_RETURN(o.sync_timeout_s, ParseCount(name, v, 1));
    } else if (name == "--timeout") {
      RETURN_IF_ERROR(take(&v));
      ASSIGN_OR_RETURN(o.timeout_s, ParseCount(name, v, 0));
    } else if (name == "--restart-servers") {
      RETURN_IF_ERROR(take(&v));
      ASSIGN_OR_RETURN(o.restart_servers, ParseCount(name, v, 0));
    } else if (name == "--worker-loss") {
      RETURN_IF_ERROR(take(&v));
      if (v != "fail" && v != "continue") {
        return Status::InvalidArgument(
            StrCat("--worker-loss '", v, "': expected fail or continue"));
      }
      o.continue_without_lost_workers = v == "continue";
    } else if (name == "--quiet") {
      RETURN_IF_ERROR(no_value());
      o.quiet = true;
    } else if (name == "--live" || name == "--no-live") {
      RETURN_IF_ERROR(no_value());
      o.live = name == "--live";
    } else if (name == "--key-file") {
      RETURN_IF_ERROR(take(&o.key_file));
    } else if (name == "--no-keys") {
      RETURN_IF_ERROR(no_value());
      o.no_keys = true;
    } else {
      return Status::InvalidArgument(
          StrCat("unknown option '", a, "' (see pstrain launch --help; put the command after --)"));
    }
  }
  for (; i < args.size(); ++i) o.command.push_back(args[i]);
  if (o.help) return o;
  if (o.num_workers < 1) return Status::InvalidArgument("-n/--num-workers is required");
  if (o.num_servers < 0) o.num_servers = o.num_workers;
  if (o.command.empty()) return Status::InvalidArgument("no command to launch (give it after --)");
  if (!o.launcher) o.launcher = o.hostfile.empty() ? LauncherKind::kLocal : LauncherKind::kSsh;
  if (*o.launcher == LauncherKind::kSsh && o.hostfile.empty()) {
    return Status::InvalidArgument("--launcher ssh needs a host file (-H FILE)");
  }
  if (!o.sync_dst_dir.empty() && *o.launcher != LauncherKind::kSsh) {
    return Status::InvalidArgument("--sync-dst-dir works only with --launcher ssh");
  }
  if (!slurm_only.empty() && *o.launcher != LauncherKind::kSlurm) {
    return Status::InvalidArgument(StrCat(slurm_only, " works only with --launcher slurm"));
  }
  if (*o.launcher == LauncherKind::kSlurm && !o.hostfile.empty()) {
    return Status::InvalidArgument(
        "--launcher slurm takes no host file: Slurm places the processes on the allocation's "
        "nodes (choose them with --nodes or --salloc-option=--nodelist=...)");
  }
  RETURN_IF_ERROR(CheckRestarts(o));
  return o;
}

std::string RemoteShellPath(const std::string& dir) {
  if (dir == "~") return dir;
  if (dir.rfind("~/", 0) == 0) return "~/" + ShellQuote(dir.substr(2));
  return ShellQuote(dir);
}

std::string RemoteCommand(const std::string& dir, const std::map<std::string, std::string>& vars,
                          const std::vector<std::string>& command) {
  // $1 is the directory (a leading "~/" is the remote home, as rsync takes
  // it); the rest is "K=V ... COMMAND ARGS" for env(1). The job
  // leads its own process group; the watcher kills that group when the ssh
  // session's stdin ends (launcher stopped or gone): SIGTERM, then SIGKILL
  // after 5 s. The wrapper kills whatever the job left in its group when the
  // job ends, removes the key file, and exits with the job's status. Once the
  // job runs (so that it does not inherit them) the wrapper ignores SIGPIPE
  // and SIGHUP: a session that died under it must not kill it on a write to
  // the gone channel (the shell's report of the killed job) before the key
  // file is removed.
  static const char kScript[] =
      "d=$1; shift; case $d in \"~\") d=$HOME ;; \"~/\"*) d=$HOME/${d#\"~/\"} ;; esac; "
      "cd \"$d\" || exit 127; "
      "k=$(mktemp) || exit 127; n=0; "
      "while IFS= read -r l && [ \"$l\" != pstrain-keys-end ]; do printf '%s\\n' \"$l\"; "
      "n=$((n+1)); done >\"$k\"; "
      "if [ $n -gt 0 ]; then set -- PSTRAIN_KEY_FILE=\"$k\" \"$@\"; fi; exec 3<&0; "
      "setsid env -- \"$@\" </dev/null & p=$!; "
      "( while read -r _ <&3; do :; done; kill -TERM -\"$p\"; i=0; "
      "while [ $i -lt 50 ] && kill -0 -\"$p\"; do sleep 0.1; i=$((i+1)); done; "
      "kill -KILL -\"$p\" ) "
      ">/dev/null 2>&1 & w=$!; exec 3<&-; trap '' PIPE HUP; "
      "wait \"$p\"; r=$?; kill -KILL -\"$p\" 2>/dev/null; kill \"$w\" 2>/dev/null; rm -f \"$k\"; "
      "exit \"$r\"";
  std::vector<std::string> words = {"/bin/sh", "-c", kScript, "pstrain-remote", dir};
  for (const auto& [k, v] : vars) words.push_back(k + "=" + v);
  for (const std::string& c : command) words.push_back(c);
  return "exec " + ShellJoin(words);
}

namespace {

// "[v6addr]" -> "v6addr", as host files and --host-ip may write it.
std::string Unbracketed(const std::string& host) {
  return host.size() > 2 && host.front() == '[' && host.back() == ']'
             ? host.substr(1, host.size() - 2)
             : host;
}

// The numeric form of a socket address ("10.0.0.1", "fd00::11"); empty if
// none, or if it is a loopback or (IPv6) link-local one, which other hosts
// cannot use.
std::string ReachableAddress(const sockaddr* a, socklen_t len) {
  if (a->sa_family == AF_INET6 &&
      IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr)) {
    return "";
  }
  char buf[NI_MAXHOST] = {0};
  if (getnameinfo(a, len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return IsLoopbackHost(buf) ? "" : buf;
}

// The address of this host that routing picks towards `dst` (a UDP
// connect: no packet is sent); empty if none.
std::string SourceAddressTowards(const sockaddr* dst, socklen_t len) {
  const int fd = socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_storage self{};
  socklen_t self_len = sizeof(self);
  std::string found;
  if (connect(fd, dst, len) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) == 0) {
    found = ReachableAddress(reinterpret_cast<sockaddr*>(&self), self_len);
  }
  close(fd);
  return found;
}

}  // namespace

StatusOr<std::string> DetectHostIp(const std::vector<Host>& hosts) {
  bool all_loopback = true;
  for (const Host& h : hosts) all_loopback = all_loopback && IsLoopbackHost(h.address());
  if (all_loopback) return std::string("127.0.0.1");
  // The address this host's routing picks towards the job's hosts: the one
  // they can reach us at, also where the host name resolves to another
  // network (a network namespace, a second interface). A host of IPv6
  // addresses only (or an IPv6 literal) gets an IPv6 one.
  for (const Host& h : hosts) {
    if (IsLoopbackHost(h.address())) continue;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(h.address().c_str(), "1", &hints, &res) != 0) continue;
    std::string found;
    for (int family : {AF_INET, AF_INET6}) {
      for (addrinfo* a = res; a != nullptr && found.empty(); a = a->ai_next) {
        if (a->ai_family == family) found = SourceAddressTowards(a->ai_addr, a->ai_addrlen);
      }
    }
    freeaddrinfo(res);
    if (!found.empty()) return found;
  }
  // Else: this host name's IPv4 address, the IPv4 address routing would use
  // towards the outside (no packet is sent), this host name's IPv6 address
  // (IPv6 only where IPv4 has nothing: the hosts may be IPv4 only).
  char name[256] = {0};
  const bool named = gethostname(name, sizeof(name) - 1) == 0;
  auto named_address = [&name, named](int family) {
    std::string found;
    addrinfo hints{};
    hints.ai_family = family;
    hints.ai_socktype = SOCK_DGRAM;
    addrinfo* res = nullptr;
    if (named && getaddrinfo(name, nullptr, &hints, &res) == 0) {
      for (addrinfo* a = res; a != nullptr && found.empty(); a = a->ai_next) {
        found = ReachableAddress(a->ai_addr, a->ai_addrlen);
      }
      freeaddrinfo(res);
    }
    return found;
  };
  std::string found = named_address(AF_INET);
  if (!found.empty()) return found;
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(1);
  inet_pton(AF_INET, "10.255.255.255", &dst.sin_addr);
  found = SourceAddressTowards(reinterpret_cast<sockaddr*>(&dst), sizeof(dst));
  if (!found.empty()) return found;
  found = named_address(AF_INET6);
  if (!found.empty()) return found;
  return Status::NotFound(
      "cannot find an address of this host that other hosts can reach; pass --host-ip");
}

StatusOr<int> FindFreePort(const std::string& given, int wanted) {
  // "[v6]" as well as "v6"; "::" (every interface, IPv6) as well as "0.0.0.0".
  const std::string ip = Unbracketed(given);
  if (ip.find('%') != std::string::npos) {
    return Status::InvalidArgument(
        StrCat("scheduler address '", given,
               "' is a link-local IPv6 address with a scope: not supported (the other hosts would "
               "need this host's interface name); give a global or unique-local address"));
  }
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    addr_len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    addr_len = sizeof(sockaddr_in6);
  } else {
    return Status::InvalidArgument(
        StrCat("scheduler address '", given, "' is not an IPv4 or IPv6 address"));
  }
  // dmlc-core's range, 9091..9998: outside the kernel's ephemeral range, so no
  // outgoing connection of this host can take the port between this check and
  // the scheduler's bind (a port from bind(0) could). A random start keeps two
  // launchers on one host apart.
  constexpr int kFirst = 9091, kCount = 908;
  const int start = static_cast<int>(
      (static_cast<unsigned>(getpid()) * 2654435761u + static_cast<unsigned>(time(nullptr))) %
      kCount);
  int last_errno = 0;
  for (int i = 0; i < (wanted > 0 ? 1 : kCount); ++i) {
    const int port = wanted > 0 ? wanted : kFirst + (start + i) % kCount;
    int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::IOError(StrCat("socket: ", strerror(errno)));
    // As the scheduler's listener (ZeroMQ sets it): a port whose last job's
    // connections linger in TIME_WAIT is free to it; one that a socket
    // listens on is not (Linux refuses that bind all the same).
    const int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (addr.ss_family == AF_INET) {
      v4->sin_port = htons(static_cast<uint16_t>(port));
    } else {
      v6->sin6_port = htons(static_cast<uint16_t>(port));
    }
    const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) == 0;
    last_errno = errno;
    close(fd);
    if (ok) return port;
    if (last_errno == EADDRNOTAVAIL) {
      return Status::InvalidArgument(
          StrCat("scheduler address ", given,
                 " is not an address of this host: give one of its own, or behind NAT, "
                 "where the others reach it at an address it does not have, set "
                 "PSTRAIN_BIND_HOST=",
                 addr.ss_family == AF_INET6 ? "::" : "0.0.0.0"));
    }
  }
  if (wanted > 0) {
    return Status::Unavailable(
        StrCat("port ", wanted, " on ", given, " cannot be bound: ", strerror(last_errno)));
  }
  return Status::IOError(StrCat("no free port in ", kFirst, "..", kFirst + kCount - 1, " on ",
                                given, ": ", strerror(last_errno)));
}

namespace {

// The first word of each line of a host or machine file ('#' starts a
// comment), less any ":N": mpirun's formats differ past it (slots=,
// max_slots=, :N).
std::string FirstWords(std::istream& lines) {
  std::string out;
  std::string line;
  while (std::getline(lines, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string word;
    if (!(words >> word)) continue;
    // "[v6addr]:N" or "[v6addr]": the address with its brackets. A bare IPv6
    // address stays whole, so that reading it says to bracket it.
    if (word[0] == '[' && word.find(']') != std::string::npos) {
      out += word.substr(0, word.find(']') + 1) + "\n";
    } else if (std::count(word.begin(), word.end(), ':') > 1) {
      out += word + "\n";
    } else {
      out += word.substr(0, word.find(':')) + "\n";
    }
  }
  return out;
}

// The host lists and host files among the --mpi-option words, each with
// where it came from and its text (a list with one host per line).
struct HostSource {
  std::string origin;  // "--mpi-option --hostfile FILE", "--mpi-option --host"
  std::string text;
  bool is_file = false;  // its lines are a file's lines
};

// A host file as a HostSource named `origin`.
StatusOr<HostSource> ReadHostSource(const std::string& origin, const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(StrCat(origin, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  return HostSource{origin, text.str(), true};
}

StatusOr<std::vector<HostSource>> MpiOptionHosts(const LaunchOptions& o) {
  std::vector<HostSource> sources;
  const std::vector<std::string>& w = o.mpi_options;
  for (size_t i = 0; i < w.size(); ++i) {
    std::string name = w[i], value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos && name.rfind("--", 0) == 0) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const bool list = name == "--host" || name == "-host" || name == "-H" || name == "-hosts";
    const bool file = name == "--hostfile" || name == "-hostfile" || name == "--machinefile" ||
                      name == "-machinefile" || name == "--default-hostfile" || name == "-f";
    if (!list && !file) continue;
    if (!has_value) {
      if (i + 1 >= w.size()) break;
      value = w[++i];
    }
    if (list) {
      std::replace(value.begin(), value.end(), ',', '\n');
      sources.push_back({StrCat("--mpi-option ", name), value, false});
      continue;
    }
    ASSIGN_OR_RETURN(HostSource read,
                     ReadHostSource(StrCat("--mpi-option ", name, " ", value), value));
    sources.push_back(std::move(read));
  }
  return sources;
}

// mpirun without -H: the hosts its ranks may run on, as far as the launcher
// can tell, for the scheduler's address (127.0.0.1 is right only when every
// rank runs here): the --host lists and host files among the --mpi-option
// words, else the resource manager's allocation (Slurm over one node, PBS).
// Empty: this host only.
StatusOr<std::vector<Host>> MpiHosts(const LaunchOptions& o, const Environment& env) {
  ASSIGN_OR_RETURN(std::vector<HostSource> sources, MpiOptionHosts(o));
  std::string names;
  for (const HostSource& source : sources) {
    std::istringstream lines(source.text);
    names += FirstWords(lines);
  }
  if (names.empty()) {
    if (StatusOr<SlurmJob> job = SlurmJobFromEnvironment(env); job.ok() && job->num_nodes > 1) {
      return SlurmNodeAddresses(job->nodelist, env.All());
    }
    if (std::optional<std::string> pbs = env.Get("PBS_NODEFILE")) {
      std::ifstream in(*pbs);
      names = FirstWords(in);
    }
  }
  if (names.empty()) return std::vector<Host>{};
  return ParseHostList(names, "mpirun's hosts");
}

// An IPv6 address for a host breaks the mpiruns we know: Open MPI 4's
// host-file parser stops at the '[' and its check of node names refuses the
// ':' (the daemon on the other host then crashes); MPICH 4's Hydra reads a
// host up to its first ':' (ssh is asked for host "fd0a"). A name that
// resolves to the host's IPv6 address works with Open MPI, so that is what
// the error asks for. Hydra's own connections are IPv4 only, which no name
// mends. Later major versions, unchecked here, are left to mpirun.
Status CheckMpiHosts(const LaunchOptions& o, const MpiVersion& mpi) {
  if (mpi.major < 1 || mpi.major > 4) return Status::Ok();
  const std::string which =
      mpi.flavour == MpiFlavour::kOpenMpi
          ? StrCat("Open MPI ", mpi.version,
                   "'s mpirun takes host names only (its host files and its check of node "
                   "names refuse IPv6 addresses): give each host a name that resolves to its "
                   "IPv6 address (DNS or /etc/hosts on every host) and list the names")
          : StrCat("MPICH ", mpi.version,
                   "'s mpiexec (Hydra) reads a host up to its first ':': list host names, on "
                   "hosts with IPv4 addresses too (its proxies reach mpiexec over IPv4 only), "
                   "or use the ssh launcher");
  ASSIGN_OR_RETURN(std::vector<HostSource> sources, MpiOptionHosts(o));
  if (!o.hostfile.empty()) {
    ASSIGN_OR_RETURN(HostSource file, ReadHostSource(StrCat("-H ", o.hostfile), o.hostfile));
    sources.insert(sources.begin(), std::move(file));
  }
  for (const HostSource& source : sources) {
    std::istringstream lines(source.text);
    std::string line;
    for (int n = 1; std::getline(lines, line); ++n) {
      std::istringstream words(line.substr(0, line.find('#')));
      std::string word;
      if (!(words >> word)) continue;
      const std::string host = word.substr(word.rfind('@') + 1);
      if (host[0] != '[' && std::count(host.begin(), host.end(), ':') < 2) continue;
      return Status::InvalidArgument(
          StrCat(source.is_file ? StrCat(source.origin, ":", n) : source.origin, ": '", word,
                 "' is an IPv6 address, and ", which));
    }
  }
  return Status::Ok();
}

// The variables the launcher sets for every process, and what sets each
// instead: an --env naming one would be overwritten without a word.
constexpr std::pair<const char*, const char*> kLauncherVariables[] = {
    {"DMLC_ROLE", "the launcher gives each process its role"},
    {"DMLC_PS_ROOT_URI", "give --host-ip"},
    {"DMLC_NUM_SERVER", "give -s"},
    {"DMLC_NUM_WORKER", "give -n"},
    {"DMLC_JOB_CLUSTER", "give --launcher"},
    {"PSTRAIN_JOB_ID", "give --job-id"},
    {"PSTRAIN_SERVER_RESTARTS", "give --restart-servers"},
    {"PSTRAIN_WORKER_LOSS", "give --worker-loss"},
    {"PSTRAIN_LAUNCH_RANK", "the launcher numbers the processes"},
    {"DMLC_TASK_ID", "the launcher numbers the processes"},
    {"DMLC_NODE_HOST",
     "the launcher gives each process its host's address (--host-ip sets the "
     "scheduler's)"},
    {"PSTRAIN_KEY_FILE", "give --key-file (or --no-keys)"},
    {"PSTRAIN_RESTART", "the launcher counts a server's restarts"},
    {"PSTRAIN_LOCAL_RANK", "the launcher numbers the workers of each host"},
    {"PSTRAIN_LOCAL_SIZE", "the launcher counts the workers of each host"},
};

// --env's variables with their values (K alone: the launcher's). One that the
// launcher sets itself is refused, naming the flag that sets it.
StatusOr<std::map<std::string, std::string>> UserVariables(
    const LaunchOptions& o, const std::map<std::string, std::string>& local_env) {
  std::map<std::string, std::string> vars;
  for (const auto& [k, v] : o.env) {
    for (const auto& [name, instead] : kLauncherVariables) {
      if (k == name) {
        return Status::InvalidArgument(
            StrCat("--env ", k, ": the launcher sets ", k, " for every process; ", instead));
      }
    }
    if (v) {
      vars[k] = *v;
      continue;
    }
    auto it = local_env.find(k);
    if (it == local_env.end()) {
      return Status::InvalidArgument(
          StrCat("--env ", k, ": ", k, " is not set in the launcher's environment"));
    }
    vars[k] = it->second;
  }
  return vars;
}

}  // namespace

StatusOr<LaunchPlan> PlanLaunch(const LaunchOptions& o, const Environment& env) {
  RETURN_IF_ERROR(CheckRestarts(o));
  LaunchPlan plan;
  plan.launcher = o.launcher.value_or(LauncherKind::kLocal);
  plan.job_id = o.job_id.empty() ? DefaultJobId() : o.job_id;
  plan.log_dir = o.log_dir.empty() ? "logs/" + plan.job_id : o.log_dir;
  std::optional<MpiVersion> mpi;
  if (plan.launcher == LauncherKind::kMpi) {
    ASSIGN_OR_RETURN(mpi, DetectMpi(o.mpirun, env.All()));
    RETURN_IF_ERROR(CheckMpiHosts(o, *mpi));
  }
  if (plan.launcher == LauncherKind::kSsh) {
    ASSIGN_OR_RETURN(plan.hosts, ReadHostFile(o.hostfile));
  } else if (plan.launcher == LauncherKind::kMpi && !o.hostfile.empty()) {
    // mpirun reads the file itself; read it here for the scheduler address only.
    ASSIGN_OR_RETURN(std::vector<Host> hosts, ReadHostFile(o.hostfile));
    for (const Host& h : hosts) plan.hosts.push_back(h);
  } else if (plan.launcher == LauncherKind::kMpi && o.host_ip.empty()) {
    ASSIGN_OR_RETURN(plan.hosts, MpiHosts(o, env));
  }
  SlurmJob slurm_job;
  if (plan.launcher == LauncherKind::kSlurm) {
    ASSIGN_OR_RETURN(slurm_job, SlurmJobFromEnvironment(env));
    plan.slurm_job_id = slurm_job.id;
    // The scheduler runs here: an address the allocated nodes reach.
    if (o.host_ip.empty()) {
      ASSIGN_OR_RETURN(plan.hosts, SlurmNodeAddresses(slurm_job.nodelist, env.All()));
    }
  }
  if (!o.host_ip.empty()) {
    plan.root_uri = Unbracketed(o.host_ip);
  } else {
    ASSIGN_OR_RETURN(plan.root_uri, DetectHostIp(plan.hosts));
  }
  // The port is probed where the scheduler will bind: its address, or with
  // PSTRAIN_BIND_HOST set (0.0.0.0, '*' or '::' behind NAT, where --host-ip
  // is not this host's; a name) on every interface, which holds for any of
  // them.
  std::string probe = plan.root_uri;
  const char* probe_source = o.host_ip.empty() ? "address" : "--host-ip";
  if (std::optional<std::string> bind = env.Get("PSTRAIN_BIND_HOST"); bind && !bind->empty()) {
    probe = *bind == "::" || *bind == "[::]" ? "::" : "0.0.0.0";
    probe_source = "PSTRAIN_BIND_HOST";
  }
  const std::map<std::string, std::string> local_env = env.All();
  auto user_vars_or = UserVariables(o, local_env);
  if (!user_vars_or.ok()) return user_vars_or.status();
  std::map<std::string, std::string> user_vars = std::move(user_vars_or).value();
  // --env DMLC_PS_ROOT_PORT=P: the scheduler's port is P, not one picked free.
  int wanted_port = 0;
  if (auto it = user_vars.find("DMLC_PS_ROOT_PORT"); it != user_vars.end()) {
    ASSIGN_OR_RETURN(wanted_port, ParseCount("--env DMLC_PS_ROOT_PORT", it->second, 1, 65535));
  }
  StatusOr<int> port = FindFreePort(probe, wanted_port);
  if (!port.ok()) {
    return port.status().WithContext(StrCat("the scheduler's ", probe_source,
                                            wanted_port > 0 ? " (--env DMLC_PS_ROOT_PORT)" : ""));
  }
  plan.root_port = *port;

  if (!o.no_keys) {
    std::string given = o.key_file;
    if (given.empty()) {
      auto it = local_env.find("PSTRAIN_KEY_FILE");
      if (it != local_env.end()) given = it->second;
    }
    if (!given.empty()) {
      ASSIGN_OR_RETURN(plan.keys, ReadJobKeys(given));
      plan.key_file = AbsolutePath(given);
    } else {
      ASSIGN_OR_RETURN(plan.keys, GenerateJobKeys());
      plan.key_file = AbsolutePath(plan.log_dir + "/job.key");
      plan.write_key = true;
    }
    plan.key_text = FormatJobKeys(plan.keys);
  }
  // Server recovery: the scheduler, servers and workers all learn how many
  // times a server may be replaced (0 too, so that a value left in the
  // user's environment cannot make the scheduler wait for a replacement that
  // never comes); the servers keep their snapshots in one folder per rank
  // below PSTRAIN_SNAPSHOT_DIR, by default in the job's log folder (on ssh
  // hosts the same absolute path, which the servers create).
  if (o.restart_servers > 0 && local_env.count("PSTRAIN_SNAPSHOT_DIR") == 0 &&
      user_vars.count("PSTRAIN_SNAPSHOT_DIR") == 0) {
    user_vars["PSTRAIN_SNAPSHOT_DIR"] = AbsolutePath(plan.log_dir) + "/snapshots";
  }
  // What processes started here inherit: the launcher's environment, less
  // PORT (the port a node binds: many shells and platforms set it, and one
  // value for every process of a host makes all but the first fail to bind),
  // unless --env names it, and less a key file with --no-keys.
  std::map<std::string, std::string> inherited = local_env;
  if (user_vars.count("PORT") == 0) inherited.erase("PORT");
  // --no-keys: nobody runs with a key file left in the environment (ssh hosts
  // would get none while the scheduler required it).
  if (o.no_keys) inherited.erase("PSTRAIN_KEY_FILE");
  const char* cluster = LauncherName(plan.launcher);
  auto job_vars = [&](const std::string& role) {
    std::map<std::string, std::string> v = user_vars;
    v["DMLC_ROLE"] = role;
    v["DMLC_PS_ROOT_URI"] = plan.root_uri;
    v["DMLC_PS_ROOT_PORT"] = std::to_string(plan.root_port);
    v["DMLC_NUM_SERVER"] = std::to_string(o.num_servers);
    v["DMLC_NUM_WORKER"] = std::to_string(o.num_workers);
    v["DMLC_JOB_CLUSTER"] = cluster;
    v["PSTRAIN_JOB_ID"] = plan.job_id;
    v["PSTRAIN_SERVER_RESTARTS"] = std::to_string(o.restart_servers);
    v["PSTRAIN_WORKER_LOSS"] = o.continue_without_lost_workers ? "continue" : "fail";
    // Local and mpi processes (and the scheduler, always here) read the
    // launcher's file; ssh sessions get their own copy through stdin
    // (RemoteCommand).
    if (!plan.key_file.empty() && (plan.launcher != LauncherKind::kSsh || role == "scheduler")) {
      v["PSTRAIN_KEY_FILE"] = plan.key_file;
    }
    return v;
  };
  auto merged = [&](std::map<std::string, std::string> base,
                    const std::map<std::string, std::string>& top) {
    for (const auto& [k, v] : top) base[k] = v;
    return base;
  };

  // The scheduler: always here, as in dmlc-core's tracker.
  Task sched;
  sched.role = "scheduler";
  sched.rank = 0;
  sched.host = plan.root_uri;
  auto sched_vars = job_vars("scheduler");
  sched_vars["DMLC_NODE_HOST"] = plan.root_uri;
  sched_vars["PSTRAIN_LAUNCH_RANK"] = "0";
  sched.spec.argv = o.command;
  sched.spec.env = merged(inherited, sched_vars);
  plan.tasks.push_back(std::move(sched));

  const int total = o.num_servers + o.num_workers;
  if (plan.launcher == LauncherKind::kLocal) {
    // Every process shares this host's cores. Unless the user chose otherwise,
    // each worker's OpenMP team gets an equal share (at least 1) and idle
    // OpenMP threads sleep instead of spinning on cores the others need.
    const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    if (local_env.count("OMP_NUM_THREADS") == 0 && user_vars.count("OMP_NUM_THREADS") == 0) {
      user_vars["OMP_NUM_THREADS"] = std::to_string(std::max(1L, cores / o.num_workers));
    }
    if (local_env.count("OMP_WAIT_POLICY") == 0 && user_vars.count("OMP_WAIT_POLICY") == 0) {
      user_vars["OMP_WAIT_POLICY"] = "passive";
    }
    // dmlc-core's local tracker numbers workers first: task i < W is a worker.
    for (int i = 0; i < total; ++i) {
      bool server = i < o.num_servers;
      int rank = server ? i : i - o.num_servers;
      int task_id = server ? o.num_workers + rank : rank;
      Task t;
      t.role = server ? "server" : "worker";
      t.rank = rank;
      t.host = plan.root_uri;
      auto vars = job_vars(t.role);
      vars["DMLC_NODE_HOST"] = plan.root_uri;
      vars["DMLC_TASK_ID"] = std::to_string(task_id);
      vars["PSTRAIN_LAUNCH_RANK"] = std::to_string(rank);
      if (!server) {  // every worker on this host
        vars["PSTRAIN_LOCAL_RANK"] = std::to_string(rank);
        vars["PSTRAIN_LOCAL_SIZE"] = std::to_string(o.num_workers);
      }
      t.spec.argv = o.command;
      t.spec.env = merged(inherited, vars);
      if (server) t.max_restarts = o.restart_servers;
      t.may_be_lost = !server && o.continue_without_lost_workers;
      plan.tasks.push_back(std::move(t));
    }
    return plan;
  }

  if (plan.launcher == LauncherKind::kSsh) {
    // ssh keeps the first value it gets for an option: the user's come first,
    // then ours. BatchMode: never prompt; the keep-alives end the session (and
    // so fail the job) within a minute when a host dies.
    std::vector<std::string> ssh_base = {o.ssh, "-T"};
    std::vector<std::string> opts = o.ssh_options;
    if (o.no_host_key_check) {
      opts.insert(opts.end(),
                  {"StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", "LogLevel=ERROR"});
    }
    opts.insert(opts.end(), {"BatchMode=yes", "ConnectTimeout=30", "ServerAliveInterval=15",
                             "ServerAliveCountMax=4"});
    for (const std::string& opt : opts) {
      ssh_base.push_back("-o");
      ssh_base.push_back(opt);
    }
    std::map<std::string, std::string> forwarded;
    for (const auto& [k, v] : local_env) {
      if (Forwarded(k)) forwarded[k] = v;
    }
    // An address of this host is none of theirs (--env still sends it).
    if (auto b = forwarded.find("PSTRAIN_BIND_HOST"); b != forwarded.end() &&
                                                      b->second != "0.0.0.0" && b->second != "*" &&
                                                      b->second != "::" && b->second != "[::]") {
      forwarded.erase(b);
    }
    const std::string dir = o.sync_dst_dir.empty() ? CurrentDir() : o.sync_dst_dir;
    if (!o.sync_dst_dir.empty()) {
      std::set<std::pair<std::string, int>> seen;
      for (const Host& h : plan.hosts) {
        if (!seen.insert({h.name, h.port}).second) continue;
        // rsync splits -e on spaces and honours quotes (not backslashes).
        std::string rsh;
        for (size_t k = 0; k < ssh_base.size(); ++k) {
          const std::string& w = ssh_base[k];
          if (w.find_first_of(" \t'\"") == std::string::npos) {
            rsh += w;
          } else if (w.find('\'') == std::string::npos) {
            rsh += "'" + w + "'";
          } else if (w.find('"') == std::string::npos) {
            rsh += "\"" + w + "\"";
          } else {
            return Status::InvalidArgument(
                StrCat("ssh argument '", w, "' has both quote kinds; rsync -e cannot carry it"));
          }
          rsh += " ";
        }
        rsh += "-p " + std::to_string(h.port);
        const std::string target = h.bracketed();
        // The folder is made by the remote shell, not with --mkpath (rsync
        // 3.2.3 and later on both ends; Ubuntu 20.04 and RHEL 8 have older).
        // -s: the destination reaches the remote rsync as it is, not split
        // on spaces or expanded by its shell (rsync before 3.2.4 did); so
        // a leading "~/" is given as relative to the home the remote rsync
        // starts in. No key file travels: the job's (and every earlier
        // job's, in the log folders) are named job.key, and a given one may
        // lie in this folder too; ssh hosts get theirs on stdin.
        std::vector<std::string> copy = {
            o.rsync,
            "-azs",
            "--rsync-path",
            "mkdir -p " + RemoteShellPath(o.sync_dst_dir) + " && rsync",
            "-e",
            rsh,
            "--exclude=job.key"};
        for (const std::string& in_folder : PathsInFolder(plan.key_file, CurrentDir())) {
          copy.push_back("--exclude=/" + RsyncLiteral(in_folder));
        }
        std::string dst = o.sync_dst_dir;
        if (dst == "~") dst = ".";
        if (dst.rfind("~/", 0) == 0) dst = dst.size() > 2 ? dst.substr(2) : ".";
        copy.push_back(CurrentDir() + "/");
        copy.push_back(target + ":" + dst + "/");
        plan.sync_commands.push_back(std::move(copy));
      }
    }
    // MXNet placement: task i < S is server i, else worker i - S; host i mod H.
    // A loopback name ("localhost") in a job that spans hosts is this host:
    // the others reach it at the scheduler's address, not at their own
    // loopback.
    auto node_host = [&](int i) {
      const Host& h = plan.hosts[static_cast<size_t>(i) % plan.hosts.size()];
      return IsLoopbackHost(h.address()) && !IsLoopbackHost(plan.root_uri) ? plan.root_uri
                                                                           : h.address();
    };
    // Each worker's rank among the workers on its host, and their count.
    std::map<std::string, int> workers_on;
    for (int i = o.num_servers; i < total; ++i) ++workers_on[node_host(i)];
    std::map<std::string, int> placed;
    for (int i = 0; i < total; ++i) {
      const Host& h = plan.hosts[static_cast<size_t>(i) % plan.hosts.size()];
      bool server = i < o.num_servers;
      Task t;
      t.role = server ? "server" : "worker";
      t.rank = server ? i : i - o.num_servers;
      t.host = h.port != 22 ? h.bracketed() + ":" + std::to_string(h.port) : h.name;
      auto vars = merged(forwarded, job_vars(t.role));
      vars["DMLC_NODE_HOST"] = node_host(i);
      if (!server) {
        vars["PSTRAIN_LOCAL_RANK"] = std::to_string(placed[node_host(i)]++);
        vars["PSTRAIN_LOCAL_SIZE"] = std::to_string(workers_on[node_host(i)]);
      }
      vars["DMLC_TASK_ID"] = std::to_string(i);
      vars["PSTRAIN_LAUNCH_RANK"] = std::to_string(t.rank);
      t.spec.argv = ssh_base;
      t.spec.argv.push_back("-p");
      t.spec.argv.push_back(std::to_string(h.port));
      t.spec.argv.push_back(h.name);
      t.spec.argv.push_back(RemoteCommand(dir, vars, o.command));
      t.spec.env = local_env;
      t.spec.pipe_stdin = true;
      t.spec.stdin_data = plan.key_text + kRemoteKeysEnd + "\n";
      t.stop_by_closing_stdin = true;
      t.may_be_lost = !server && o.continue_without_lost_workers;
      if (server) {
        // The remote process's environment travels in the remote command, so
        // each restart has its own, naming PSTRAIN_RESTART.
        t.max_restarts = o.restart_servers;
        for (int n = 1; n <= o.restart_servers; ++n) {
          ProcessSpec again = t.spec;
          vars["PSTRAIN_RESTART"] = std::to_string(n);
          again.argv.back() = RemoteCommand(dir, vars, o.command);
          t.restart_specs.push_back(std::move(again));
        }
      }
      plan.tasks.push_back(std::move(t));
    }
    return plan;
  }

  if (plan.launcher == LauncherKind::kSlurm) {
    // Two srun steps in the allocation, servers then workers (tracker/slurm.h);
    // srun hands its environment to the tasks, and the wrapper adds each
    // task's rank.
    for (const std::string role : {"server", "worker"}) {
      const bool server = role == "server";
      const int count = server ? o.num_servers : o.num_workers;
      const std::string step = SlurmStepName(plan.job_id, role);
      Task t;
      t.role = "srun-" + role + "s";
      t.rank = 0;
      t.host = "Slurm job " + slurm_job.id;
      t.spec.argv = SrunCommand(o, slurm_job, step, count, server ? 0 : o.num_servers, o.command);
      t.spec.env = merged(inherited, job_vars(role));
      t.tags = OutputTags::kSlurm;
      for (int r = 0; r < count; ++r) t.rank_names.push_back(StrCat(role, "-", r));
      plan.slurm_steps.push_back(step);
      plan.tasks.push_back(std::move(t));
    }
    return plan;
  }

  // mpi: one mpirun for all servers and workers; a constant /bin/sh wrapper
  // turns the MPI rank into the role (rank r < S is server r, else worker
  // r - S). Two concurrent mpiruns, as dmlc-core's mpi tracker starts, race
  // on Open MPI's session directory on a shared host, so there is one.
  const MpiFlavour flavour = mpi->flavour;
  static const std::string kRoleScript =
      "r=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-}}; s=$1; shift; "
      "[ -n \"$r\" ] || { echo 'pstrain launch: no MPI rank in the environment' >&2; exit 127; }; "
      "if [ \"$r\" -lt \"$s\" ]; then DMLC_ROLE=server; PSTRAIN_LAUNCH_RANK=$r; "
      "else DMLC_ROLE=worker; PSTRAIN_LAUNCH_RANK=$((r - s)); fi; DMLC_TASK_ID=$r; "
      "export DMLC_ROLE PSTRAIN_LAUNCH_RANK DMLC_TASK_ID; ";
  // Open MPI's mpirun ends the job when a rank exits non-zero, so the rank
  // becomes the command. MPICH's Hydra waits for every rank of a program that
  // is not an MPI program, so there the wrapper stays, forwards TERM/INT/HUP,
  // and announces a failed exit with kMpiRankFailedMarker on stderr; the
  // supervisor reads it from the rank-tagged output and stops the job.
  static const std::string kOpenMpiRun = "exec \"$@\"";
  static const std::string kMpichRun =
      StrCat("\"$@\" & p=$!; trap 'kill -TERM \"$p\" 2>/dev/null' TERM INT HUP; ",
             "while :; do wait \"$p\"; c=$?; kill -0 \"$p\" 2>/dev/null || break; done; ",
             "[ \"$c\" -eq 0 ] || echo \"", kMpiRankFailedMarker, "$c\" >&2; exit \"$c\"");
  Task t;
  t.role = "mpirun";
  t.rank = 0;
  t.host = o.hostfile.empty() ? "this host" : "-H " + o.hostfile;
  t.spec.argv = {o.mpirun, "-n", std::to_string(total)};
  if (!o.hostfile.empty()) {
    t.spec.argv.push_back(flavour == MpiFlavour::kOpenMpi ? "--hostfile" : "-f");
    t.spec.argv.push_back(o.hostfile);
  }
  t.spec.argv.push_back(flavour == MpiFlavour::kOpenMpi ? "--tag-output" : "-prepend-rank");
  auto vars = job_vars("");
  vars.erase("DMLC_ROLE");
  for (const auto& [k, v] : vars) {
    if (flavour == MpiFlavour::kOpenMpi) {
      t.spec.argv.push_back("-x");
      t.spec.argv.push_back(k + "=" + v);
    } else {
      t.spec.argv.insert(t.spec.argv.end(), {"-env", k, v});
    }
  }
  for (const std::string& a : o.mpi_options) t.spec.argv.push_back(a);
  t.spec.argv.insert(
      t.spec.argv.end(),
      {"/bin/sh", "-c", kRoleScript + (flavour == MpiFlavour::kOpenMpi ? kOpenMpiRun : kMpichRun),
       "pstrain-mpi", std::to_string(o.num_servers)});
  for (const std::string& c : o.command) t.spec.argv.push_back(c);
  t.spec.env = inherited;  // mpirun's environment reaches the ranks
  // MPICH's mpiexec forwards its stdin to rank 0's proxy. From /dev/null the
  // EOF goes out at once, and when a quick job's proxy has already exited
  // that write fails (SIGPIPE, or exit 255 with "error writing to control
  // socket"), and the ranks' output still queued is lost with it: about one
  // job in fifteen on a loaded 2-core host. A pipe we hold open and never
  // write to gives it nothing to forward.
  t.spec.pipe_stdin = flavour == MpiFlavour::kMpich;
  t.tags = flavour == MpiFlavour::kOpenMpi ? OutputTags::kOpenMpi : OutputTags::kMpich;
  for (int r = 0; r < total; ++r) {
    t.rank_names.push_back(r < o.num_servers ? StrCat("server-", r)
                                             : StrCat("worker-", r - o.num_servers));
  }
  plan.tasks.push_back(std::move(t));
  return plan;
}

StatusOr<JobResult> ExecutePlan(LaunchPlan plan, const LaunchOptions& options,
                                const SupervisorOptions& supervisor) {
  if (plan.write_key) {
    std::error_code ec;
    std::filesystem::create_directories(plan.log_dir, ec);
    // A log folder used again holds an earlier job's key: each job gets new ones.
    std::filesystem::remove(plan.key_file, ec);
    RETURN_IF_ERROR(WriteJobKeys(plan.keys, plan.key_file).WithContext("the job's key file"));
  }
  if (!plan.sync_commands.empty()) {
    // One copy per host, several hosts at once (ssh and rsync wait on the
    // network, not on this host's cores).
    std::vector<CapturedRun> copies;
    int stop_signal = 0;
    Status s = RunAllAndCapture(plan.sync_commands, plan.tasks.front().spec.env,
                                options.sync_timeout_s * 1000, kParallelCopies, &copies,
                                supervisor.stop_fd, &stop_signal);
    if (s.code() == StatusCode::kCancelled) {
      // Ctrl-C while copying: the job is not started (as a stop during it).
      JobResult stopped;
      stopped.exit_code = stop_signal != 0 ? 128 + stop_signal : 1;
      stopped.reason = StrCat(stop_signal != 0 ? "interrupted by " + SignalName(stop_signal)
                                               : std::string("stop requested"),
                              " during --sync-dst-dir, before the job started");
      return stopped;
    }
    RETURN_IF_ERROR(s.WithContext("--sync-dst-dir"));
    std::string failed;
    int failures = 0;
    for (size_t i = 0; i < copies.size(); ++i) {
      const CapturedRun& copy = copies[i];
      const std::string what = ShellJoin(plan.sync_commands[i]);
      std::string why;
      if (!copy.status.ok()) {
        why = StrCat(what, ": ", copy.status.message());
      } else if (!WIFEXITED(copy.wait_status) || WEXITSTATUS(copy.wait_status) != 0) {
        std::string said = copy.output;
        while (!said.empty() && std::isspace(static_cast<unsigned char>(said.back()))) {
          said.pop_back();
        }
        why = StrCat(what, " failed (status ", copy.wait_status, "): ", said);
      }
      if (why.empty()) continue;
      failed += StrCat(failures++ == 0 ? "" : "; ", why);
    }
    if (failures > 0) {
      return Status::Unavailable(
          StrCat("--sync-dst-dir: ", failures, " of ", copies.size(), " copies failed: ", failed));
    }
  }
  SupervisorOptions sup = supervisor;
  if (sup.log_dir.empty()) sup.log_dir = plan.log_dir;
  if (options.timeout_s > 0) sup.deadline = Deadline::In(std::chrono::seconds(options.timeout_s));
  sup.echo = sup.echo && !options.quiet;
  // The launcher's environment (the scheduler's, here): Slurm's clients need it.
  const std::map<std::string, std::string> env =
      plan.tasks.empty() ? std::map<std::string, std::string>() : plan.tasks.front().spec.env;
  auto result = RunJob(std::move(plan.tasks), sup);
  if (plan.launcher == LauncherKind::kSlurm) {
    // A srun that had to be killed leaves its step running for a while.
    auto cancelled = CancelSlurmSteps(plan.slurm_job_id, plan.slurm_steps, env);
    std::string said;
    if (!cancelled.ok()) {
      said = StrCat("pstrain launch: cannot check for steps left in Slurm job ", plan.slurm_job_id,
                    ": ", cancelled.status().message(), "\n");
    } else if (!cancelled->empty()) {
      std::string ids;
      for (const std::string& id : *cancelled) ids += (ids.empty() ? "" : " ") + id;
      said = StrCat("pstrain launch: cancelled the Slurm steps left behind: ", ids, "\n");
    }
    if (!said.empty() && write(sup.terminal_err_fd, said.data(), said.size()) < 0) {
      // Nothing more to do when the terminal is gone.
    }
  }
  return result;
}

}  // namespace pstrain::tracker
