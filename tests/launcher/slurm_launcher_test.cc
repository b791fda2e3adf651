// The slurm launcher against a real one-node Slurm cluster (Debian's
// slurm-wlm 22.05) that the test starts in a temporary folder: munged with a
// throw-away key on its own socket, slurmctld and slurmd on free ports with
// their state, spool, logs and pid files in the folder, each started and
// stopped by its PID; SLURM_CONF points the launcher's Slurm clients at it.
//
// The node has this machine's CPUs (2 in CI) and the jobs have 5 processes,
// so the allocations and steps overcommit (--overcommit: more tasks than
// CPUs), as a user on a small cluster would ask for.
//
// slurmd runs tasks as their user only as root: without root the tests skip.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>

#include "tests/launcher/launch_test_util.h"
#include "tracker/launcher.h"

namespace pstrain::testing {
namespace {

constexpr char kNodeName[] = "pstrainnode";

// The first of `dirs` holding an executable `name`, or "".
std::string FindProgram(const std::string& name) {
  std::vector<std::string> dirs;
  const char* path = std::getenv("PATH");
  std::string p = path != nullptr ? path : "";
  for (size_t start = 0; start <= p.size();) {
    size_t colon = p.find(':', start);
    if (colon == std::string::npos) colon = p.size();
    if (colon > start) dirs.push_back(p.substr(start, colon - start));
    start = colon + 1;
  }
  dirs.insert(dirs.end(), {"/usr/sbin", "/usr/bin", "/sbin", "/bin"});
  for (const std::string& d : dirs) {
    const std::string f = d + "/" + name;
    if (access(f.c_str(), X_OK) == 0) return f;
  }
  return "";
}

// `n` distinct TCP ports free on 127.0.0.1 now (the kernel's picks).
std::vector<int> FreePorts(int n) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      break;
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) close(fd);
  return ports;
}

// Runs `argv` to its end; its output, with the exit code (-1: did not exit).
struct CommandRun {
  int exit_code = -1;
  std::string output;
};
CommandRun RunCommand(const std::vector<std::string>& argv,
                      const std::map<std::string, std::string>& env, int timeout_ms) {
  CommandRun run;
  int status = 0;
  Status s = tracker::RunAndCapture(argv, env, timeout_ms, &run.output, &status);
  if (!s.ok()) {
    run.output += "\n" + s.ToString();
    return run;
  }
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  return run;
}

// A one-node Slurm cluster in a temporary folder.
class SlurmCluster {
 public:
  // Starts munged, slurmctld and slurmd and waits for the node to be idle.
  // Returns "" when it is, else why not; `*skip` says the machine lacks what
  // the cluster needs (not an error of the launcher).
  std::string Start(bool* skip) {
    *skip = true;
    if (geteuid() != 0) {
      return "slurmd runs job steps as their user only as root; run the test as root";
    }
    for (const char* name :
         {"munged", "slurmctld", "slurmd", "srun", "salloc", "sinfo", "squeue", "scancel"}) {
      programs_[name] = FindProgram(name);
      if (programs_[name].empty()) {
        return StrCat("'", name,
                      "' is not installed (Debian's slurm-wlm and munge: "
                      "scripts/install-deps.sh installs them)");
      }
    }
    *skip = false;
    const std::string& d = dir_.path();
    if (d.empty()) return "cannot make a temporary folder";
    for (const char* sub : {"munge", "state", "spool"}) {
      if (mkdir((d + "/" + sub).c_str(), 0755) != 0) return StrCat("mkdir ", d, "/", sub);
    }
    // munged wants a key it alone can read, of at least 32 bytes.
    {
      std::ifstream random("/dev/urandom", std::ios::binary);
      std::string key(1024, '\0');
      random.read(key.data(), static_cast<std::streamsize>(key.size()));
      if (!random) return "cannot read /dev/urandom";
      WriteFile(d + "/munge/munge.key", key);
      chmod((d + "/munge/munge.key").c_str(), 0400);
    }
    const std::string socket = d + "/munge/munge.sock";
    std::string err = StartDaemon(
        &munged_, "munged",
        {"--foreground", "--force", "--socket=" + socket, "--key-file=" + d + "/munge/munge.key",
         "--pid-file=" + d + "/munge/munged.pid", "--log-file=" + d + "/munge/munged.log",
         "--seed-file=" + d + "/munge/munged.seed"});
    if (!err.empty()) return err;
    Deadline munge_up = Deadline::InMillis(20000);
    while (access(socket.c_str(), F_OK) != 0) {
      if (munge_up.Expired() || munged_->Poll()) {
        return "munged did not come up: " + ReadFile(d + "/munge/munged.log") +
               ReadFile(d + "/munged.out");
      }
      usleep(50000);
    }
    std::vector<int> ports = FreePorts(2);
    if (ports.size() != 2) return "no free TCP ports on 127.0.0.1";
    const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    conf_ = d + "/slurm.conf";
    WriteFile(conf_,
              StrCat("ClusterName=pstraintest\n"
                     "SlurmctldHost=localhost(127.0.0.1)\n"
                     "SlurmctldPort=",
                     ports[0], "\nSlurmdPort=", ports[1],
                     "\nAuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=", socket,
                     "\nSlurmUser=root\nSlurmdUser=root\n"
                     "StateSaveLocation=",
                     d, "/state\nSlurmdSpoolDir=", d, "/spool\nSlurmctldPidFile=", d,
                     "/slurmctld.pid\nSlurmdPidFile=", d, "/slurmd.pid\nSlurmctldLogFile=", d,
                     "/slurmctld.log\nSlurmdLogFile=", d,
                     "/slurmd.log\n"
                     // No cgroups, no systemd: processes tracked through /proc.
                     "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
                     "JobAcctGatherType=jobacct_gather/none\n"
                     "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n"
                     "MpiDefault=none\nMailProg=/bin/true\n"
                     "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
                     "SchedulerType=sched/builtin\nReturnToService=2\nKillWait=5\n"
                     // The configured CPUs count even where hwloc sees no /sys (a chroot).
                     "SlurmdParameters=config_overrides\n"
                     "NodeName=",
                     kNodeName, " NodeAddr=127.0.0.1 CPUs=", cpus,
                     " State=UNKNOWN\n"
                     "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"));
    // slurmd always starts a cgroup plugin; cgroup/v1 needs no cgroup file
    // system until a plugin uses it (none here), where "autodetect" fails
    // without /sys/fs/cgroup (a chroot).
    WriteFile(d + "/cgroup.conf", "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n");
    err = StartDaemon(&slurmctld_, "slurmctld", {"-D", "-f", conf_});
    if (err.empty()) err = StartDaemon(&slurmd_, "slurmd", {"-D", "-f", conf_, "-N", kNodeName});
    if (!err.empty()) return err;
    // Ready when the node is idle.
    Deadline deadline = Deadline::InMillis(45000);
    std::string state;
    while (!deadline.Expired()) {
      CommandRun run =
          RunCommand({programs_["sinfo"], "--noheader", "--Node", "--format=%T"}, Env(), 10000);
      state = run.output;
      if (run.exit_code == 0 && state.rfind("idle", 0) == 0) return "";
      if (slurmctld_->Poll() || slurmd_->Poll()) break;
      usleep(200000);
    }
    return StrCat("the Slurm node did not become idle (sinfo: '", state, "'); slurmctld.log:\n",
                  ReadFile(d + "/slurmctld.log"), ReadFile(d + "/slurmctld.out"), "\nslurmd.log:\n",
                  ReadFile(d + "/slurmd.log"), ReadFile(d + "/slurmd.out"));
  }

  // PIDs of Slurm client processes (salloc, srun, sbatch) started with this
  // cluster's configuration: children of the launchers the tests started.
  std::vector<pid_t> Clients() const {
    std::vector<pid_t> pids;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = e.path().filename();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      const std::string comm = ReadFile(e.path().string() + "/comm");
      if (comm != "salloc\n" && comm != "srun\n" && comm != "sbatch\n") continue;
      const std::string env = ReadFile(e.path().string() + "/environ");
      if (env.find("SLURM_CONF=" + conf_ + std::string(1, '\0')) == std::string::npos) continue;
      pids.push_back(static_cast<pid_t>(std::stol(name)));
    }
    return pids;
  }

  // Waits up to `ms` for the clients of this cluster to end (they may still
  // be giving their allocation back); SIGKILLs those that do not and returns
  // how many there were.
  // Those left are described in `*left_desc` (PID, name, state, parent).
  size_t EndClients(int64_t ms, std::string* left_desc) const {
    Deadline deadline = Deadline::InMillis(ms);
    std::vector<pid_t> left = Clients();
    while (!left.empty() && !deadline.Expired()) {
      usleep(100000);
      left = Clients();
    }
    for (pid_t pid : left) {
      // /proc/PID/stat: "pid (comm) state ppid ...".
      const std::string stat = ReadFile(StrCat("/proc/", pid, "/stat"));
      const size_t close = stat.rfind(')');
      std::string cmdline = ReadFile(StrCat("/proc/", pid, "/cmdline"));
      std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
      *left_desc += StrCat("  ", close == std::string::npos ? stat : stat.substr(0, close + 12),
                           " | ", cmdline, "\n");
      kill(pid, SIGKILL);
    }
    return left.size();
  }

  // Stops the daemons it started (by PID) and removes the folder.
  ~SlurmCluster() {
    for (auto* daemon : {&slurmd_, &slurmctld_, &munged_}) {
      if (*daemon == nullptr) continue;
      (*daemon)->SignalGroup(SIGTERM);
      Deadline deadline = Deadline::InMillis(10000);
      while (!(*daemon)->Poll() && !deadline.Expired()) usleep(20000);
      daemon->reset();  // SIGKILL if it is still there
    }
  }

  // The environment of the launcher and Slurm's clients: this cluster's
  // configuration, and no allocation of another cluster.
  std::map<std::string, std::string> Env() const {
    std::map<std::string, std::string> env = Environment().All();
    for (auto it = env.begin(); it != env.end();) {
      it = it->first.rfind("SLURM_", 0) == 0 ? env.erase(it) : std::next(it);
    }
    env["SLURM_CONF"] = conf_;
    return env;
  }
  // What the launcher needs on top of the test's environment.
  std::map<std::string, std::string> LaunchEnv() const {
    std::map<std::string, std::string> env = {{"SLURM_CONF", conf_}};
    for (const auto& [k, v] : Environment().All()) {
      if (k.rfind("SLURM_", 0) == 0 && k != "SLURM_CONF") env[k] = "";
    }
    return env;
  }

  // squeue's jobs and steps of this cluster, one per line ("" when none).
  std::string Queue() const {
    CommandRun jobs =
        RunCommand({program("squeue"), "--noheader", "--format=%i %j %T"}, Env(), 10000);
    CommandRun steps =
        RunCommand({program("squeue"), "--noheader", "--steps", "--format=%i %j"}, Env(), 10000);
    if (jobs.exit_code != 0 || steps.exit_code != 0) {
      return "squeue failed: " + jobs.output + steps.output;
    }
    return jobs.output + steps.output;
  }
  // Waits (bounded) for the queue to be empty; returns what is left.
  std::string QueueWhenEmpty(int timeout_ms = 15000) const {
    Deadline deadline = Deadline::InMillis(timeout_ms);
    std::string left;
    do {
      left = Queue();
      if (left.empty()) break;
      usleep(200000);
    } while (!deadline.Expired());
    return left;
  }

  std::string program(const std::string& name) const { return programs_.at(name); }

 private:
  // Starts `name` with `args`, its output appended to <dir>/<name>.out.
  std::string StartDaemon(std::unique_ptr<tracker::Subprocess>* out, const std::string& name,
                          const std::vector<std::string>& args) {
    tracker::ProcessSpec spec;
    spec.argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" >>\"$PSTRAIN_DAEMON_OUT\" 2>&1",
                 programs_[name]};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.env = Env();
    spec.env["PSTRAIN_DAEMON_OUT"] = dir_.Sub(name + ".out");
    auto p = tracker::Subprocess::Start(spec);
    if (!p.ok()) return p.status().ToString();
    *out = std::move(p).value();
    return "";
  }

  TempDir dir_;
  std::string conf_;
  std::map<std::string, std::string> programs_;
  std::unique_ptr<tracker::Subprocess> munged_, slurmctld_, slurmd_;
};

class SlurmLauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<SlurmCluster>();
    bool skip = false;
    std::string why = cluster_->Start(&skip);
    if (skip) GTEST_SKIP() << why;
    ASSERT_EQ(why, "");
    ASSERT_EQ(mkdir(dir_.Sub("reports").c_str(), 0755), 0);
  }

  void TearDown() override {
    if (cluster_ == nullptr) return;
    // Nothing of the job may be left in Slurm, whatever the test did, and no
    // salloc or srun of it may outlive the launcher for long (one stopped
    // with its daemons gone spins forever).
    std::string lingering;
    const size_t clients = cluster_->EndClients(30000, &lingering);
    std::string left = cluster_->Queue();
    cluster_.reset();
    EXPECT_EQ(left, "") << "jobs or steps left in Slurm";
    EXPECT_EQ(clients, 0u) << "salloc or srun processes still running 30 s after the test:\n"
                           << lingering;
  }

  // `pstrain launch --launcher slurm` for 2 servers and 2 workers, asking
  // for its allocation, up to the command.
  std::vector<std::string> LaunchArgs(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"-n",
                                     "2",
                                     "-s",
                                     "2",
                                     "--launcher",
                                     "slurm",
                                     "--nodes",
                                     "1",
                                     "--salloc-option=--overcommit",
                                     "--srun-option=--overcommit",
                                     "--alloc-timeout",
                                     "60",
                                     "--log-dir",
                                     dir_.Sub("logs"),
                                     "--timeout",
                                     "90"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  std::vector<std::string> ProbeArgs(std::vector<std::string> probe_extra) {
    std::vector<std::string> args = LaunchArgs(
        {"--env", "PROBE_SPACEY=" + kSpacey, "--", EnvProbe(), "--out=" + dir_.Sub("reports"),
         "--show=PROBE_SPACEY,SLURM_JOB_ID,SLURM_PROCID,SLURM_STEP_ID,PSTRAIN_LOCAL_RANK,"
         "PSTRAIN_LOCAL_SIZE"});
    args.insert(args.end(), probe_extra.begin(), probe_extra.end());
    return args;
  }

  std::unique_ptr<SlurmCluster> cluster_;
  TempDir dir_;
};

// The parameter server's conformance check run inside an allocation the
// user holds (salloc COMMAND): the launcher takes the job id from
// SLURM_JOB_ID and the overcommit from salloc's environment.
TEST_F(SlurmLauncherTest, KvbenchVerifyInsideAnAllocation) {
  CommandRun run = RunCommand({cluster_->program("salloc"),
                               "--ntasks=4",
                               "--overcommit",
                               "--job-name=kvbench-test",
                               "--immediate=60",
                               PstrainBinary(),
                               "launch",
                               "-n",
                               "2",
                               "-s",
                               "2",
                               "--launcher",
                               "slurm",
                               "--log-dir",
                               dir_.Sub("logs"),
                               "--timeout",
                               "90",
                               "--",
                               PstrainBinary(),
                               "kvbench",
                               "--verify"},
                              cluster_->Env(), 150000);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("verify dist_sync ok"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("verify dist_async ok"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("(slurm, Slurm job "), std::string::npos) << run.output;
  // One log per process, split from srun's labelled output.
  for (const char* name : {"scheduler-0", "server-0", "server-1", "worker-0", "worker-1"}) {
    EXPECT_TRUE(std::filesystem::exists(dir_.Sub("logs") + "/" + name + ".log")) << name;
  }
  EXPECT_NE(run.output.find("[worker-1] "), std::string::npos) << run.output;
  EXPECT_EQ(cluster_->QueueWhenEmpty(), "");
}

// The launcher asks for the allocation itself; every process sees MXNet's
// environment, the servers and workers run as tasks of Slurm steps (rank =
// SLURM_PROCID), and the allocation is released at the end.
TEST_F(SlurmLauncherTest, EnvironmentAndRanksFromSlurmSteps) {
  LaunchRun run =
      RunLaunch(ProbeArgs({"plain", kSpacey}), dir_.path(), 120000, cluster_->LaunchEnv());
  ASSERT_EQ(run.exit_code(), 0) << run.output;
  EXPECT_NE(run.output.find("asking Slurm for an allocation: salloc --job-name=pstrain-"),
            std::string::npos)
      << run.output;
  Reports reports = ReadReports(dir_.Sub("reports"));
  ExpectJobReports(reports, 2, 2, "slurm");
  const std::string job = reports["scheduler-0"]["SLURM_JOB_ID"];
  EXPECT_FALSE(job.empty());
  EXPECT_EQ(reports["scheduler-0"]["SLURM_PROCID"], "<unset>")
      << "the scheduler runs here, not in a step";
  for (const char* role : {"server", "worker"}) {
    for (int rank = 0; rank < 2; ++rank) {
      const std::string name = StrCat(role, "-", rank);
      SCOPED_TRACE(name);
      auto& kv = reports[name];
      EXPECT_EQ(kv.at("SLURM_JOB_ID"), job);
      EXPECT_EQ(kv.at("SLURM_PROCID"), std::to_string(rank));
      EXPECT_FALSE(kv.at("SLURM_STEP_ID").empty());
      EXPECT_EQ(kv.at("DMLC_TASK_ID"), std::to_string(role[0] == 's' ? rank : 2 + rank));
      // One node: the workers' local ranks are their ranks, of 2; servers have none.
      EXPECT_EQ(kv.at("PSTRAIN_LOCAL_RANK"), role[0] == 's' ? "<unset>" : std::to_string(rank));
      EXPECT_EQ(kv.at("PSTRAIN_LOCAL_SIZE"), role[0] == 's' ? "<unset>" : "2");
      EXPECT_EQ(kv.at("PROBE_SPACEY"), kSpacey);
      EXPECT_EQ(kv.at("arg0"), "plain");
      EXPECT_EQ(kv.at("arg1"), kSpacey);
      EXPECT_EQ(kv.at("cwd"), dir_.path());
      std::string log = ReadFile(dir_.Sub("logs") + "/" + name + ".log");
      EXPECT_NE(log.find(name + ": pid"), std::string::npos) << log;
    }
  }
  // The two steps are different steps of the one job.
  EXPECT_NE(reports["server-0"]["SLURM_STEP_ID"], reports["worker-0"]["SLURM_STEP_ID"]);
  EXPECT_NE(ReadFile(dir_.Sub("logs") + "/worker-1.log").find("Epoch[1] Train-accuracy=0.61"),
            std::string::npos);
  EXPECT_NE(run.output.find("[server-1] server-1: pid"), std::string::npos) << run.output;
  EXPECT_EQ(Survivors(reports), std::vector<std::string>{});
  EXPECT_EQ(cluster_->QueueWhenEmpty(), "");
}

// A short distributed training job: LeNet on MNIST, dist_sync, a few batches.
TEST_F(SlurmLauncherTest, TrainsLenetOnMnist) {
  const std::string mnist = SharedDataDir() + "/mnist";
  ASSERT_TRUE(std::filesystem::exists(mnist + "/train-images-idx3-ubyte.gz")) << mnist;
  LaunchRun run = RunLaunch(
      LaunchArgs({"--", PstrainBinary(), "train", "--network", "lenet", "--kv-store", "dist_sync",
                  "--data-dir", mnist, "--num-examples", "1600", "--num-epochs", "1",
                  "--batch-size", "100", "--lr", "0.1", "--disp-batches", "4"}),
      dir_.path(), 120000, cluster_->LaunchEnv());
  ASSERT_EQ(run.exit_code(), 0) << run.output;
  for (const char* name : {"worker-0", "worker-1"}) {
    std::string log = ReadFile(dir_.Sub("logs") + "/" + name + ".log");
    EXPECT_NE(log.find("Epoch[0] Batch [4]"), std::string::npos) << name << ":\n" << log;
    EXPECT_NE(log.find("Epoch[0] Train-accuracy="), std::string::npos) << name << ":\n" << log;
    EXPECT_NE(log.find("Epoch[0] Validation-accuracy="), std::string::npos) << name << ":\n" << log;
  }
  EXPECT_EQ(cluster_->QueueWhenEmpty(), "");
}

// One worker exits 3: srun's notice names it, the job stops at once, the
// launcher exits non-zero, and neither a process nor a step nor the
// allocation is left.
TEST_F(SlurmLauncherTest, FailingWorkerStopsTheJob) {
  LaunchRun run = RunLaunch(ProbeArgs({"--sleep=60", "--fail=worker:1:3"}), dir_.path(), 120000,
                            cluster_->LaunchEnv());
  EXPECT_EQ(run.exit_code(), 1) << run.output;
  EXPECT_LT(run.seconds, 40) << run.output;
  EXPECT_NE(run.output.find("worker-1 (Slurm task 1 on " + std::string(kNodeName) +
                            ") under srun-workers (Slurm job "),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("exited with code 3"), std::string::npos) << run.output;
  EXPECT_NE(ReadFile(dir_.Sub("logs") + "/worker-1.log").find("failing with exit code 3"),
            std::string::npos);
  Reports reports = ReadReports(dir_.Sub("reports"));
  EXPECT_EQ(reports.size(), 5u) << run.output;
  EXPECT_EQ(Survivors(reports, 10000), std::vector<std::string>{}) << run.output;
  EXPECT_EQ(cluster_->QueueWhenEmpty(), "");
}

// Ctrl-C: every process stops, the steps and the allocation go.
TEST_F(SlurmLauncherTest, InterruptLeavesNothingBehind) {
  Launch launch(ProbeArgs({"--sleep=60"}), dir_.path(), cluster_->LaunchEnv());
  ASSERT_TRUE(launch.PumpUntil([&] { return ReadReports(dir_.Sub("reports")).size() == 5; }, 60000))
      << launch.output();
  Reports reports = ReadReports(dir_.Sub("reports"));
  ASSERT_EQ(kill(launch.pid(), SIGINT), 0);
  LaunchRun run = launch.Wait(60000);
  EXPECT_EQ(run.exit_code(), 128 + SIGINT) << run.output;
  EXPECT_EQ(Survivors(reports, 10000), std::vector<std::string>{}) << run.output;
  EXPECT_EQ(cluster_->QueueWhenEmpty(), "");
}

// --timeout: the job is stopped, the launcher exits 1 saying so, nothing is left.
TEST_F(SlurmLauncherTest, TimeoutLeavesNothingBehind) {
  std::vector<std::string> args = ProbeArgs({"--sleep=60"});
  ASSERT_EQ(args[14], "--timeout");
  args[15] = "5";
  LaunchRun run = RunLaunch(args, dir_.path(), 90000, cluster_->LaunchEnv());
  EXPECT_EQ(run.exit_code(), 1) << run.output;
  EXPECT_NE(run.output.find("the job ran past its --timeout"), std::string::npos) << run.output;
  // No SIGCONT where nothing was stopped (srun would report it).
  EXPECT_EQ(run.output.find("got SIGCONT"), std::string::npos) << run.output;
  Reports reports = ReadReports(dir_.Sub("reports"));
  EXPECT_EQ(reports.size(), 5u) << run.output;
  EXPECT_EQ(Survivors(reports, 10000), std::vector<std::string>{}) << run.output;
  EXPECT_EQ(cluster_->QueueWhenEmpty(), "");
}

// A launcher killed outright (SIGKILL) cannot clean up: its srun and salloc
// children get SIGTERM as it dies (parent-death signal), srun cancels its
// step, and salloc's command sees its stdin close, so the allocation goes.
TEST_F(SlurmLauncherTest, KilledLauncherLeavesNoAllocation) {
  Launch launch(ProbeArgs({"--sleep=60"}), dir_.path(), cluster_->LaunchEnv());
  ASSERT_TRUE(launch.PumpUntil([&] { return ReadReports(dir_.Sub("reports")).size() == 5; }, 60000))
      << launch.output();
  Reports reports = ReadReports(dir_.Sub("reports"));
  ASSERT_EQ(kill(launch.pid(), SIGKILL), 0);
  LaunchRun run = launch.Wait(30000);
  EXPECT_EQ(run.wait_status & 0x7f, SIGKILL);
  EXPECT_EQ(Survivors(reports, 20000), std::vector<std::string>{}) << run.output;
  EXPECT_EQ(cluster_->QueueWhenEmpty(30000), "");
}

// An allocation the cluster cannot give (2 nodes of 1) stays pending: the
// launcher gives up after --alloc-timeout with salloc's words, and nothing
// stays queued.
TEST_F(SlurmLauncherTest, AllocationThatCannotBeHadIsAnError) {
  std::vector<std::string> args = LaunchArgs({"--", EnvProbe(), "--out=" + dir_.Sub("reports")});
  ASSERT_EQ(args[6], "--nodes");
  args[7] = "2";
  ASSERT_EQ(args[10], "--alloc-timeout");
  args[11] = "3";
  LaunchRun run = RunLaunch(args, dir_.path(), 60000, cluster_->LaunchEnv());
  EXPECT_EQ(run.exit_code(), 1) << run.output;
  EXPECT_LT(run.seconds, 20) << run.output;
  EXPECT_NE(run.output.find("no Slurm allocation (salloc --job-name=pstrain-"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find(" --nodes=2 --immediate=3 --overcommit; waited up to 3 s, "
                            "--alloc-timeout): salloc: "),
            std::string::npos)
      << run.output;
  EXPECT_TRUE(ReadReports(dir_.Sub("reports")).empty());
  EXPECT_EQ(cluster_->QueueWhenEmpty(), "");
}

// Ctrl-C while the request is pending: it is withdrawn, nothing runs.
TEST_F(SlurmLauncherTest, InterruptWhileWaitingForTheAllocation) {
  std::vector<std::string> args = LaunchArgs({"--", EnvProbe(), "--out=" + dir_.Sub("reports")});
  ASSERT_EQ(args[6], "--nodes");
  args[7] = "2";  // never granted on one node
  Launch launch(args, dir_.path(), cluster_->LaunchEnv());
  ASSERT_TRUE(launch.PumpUntil(
      [&] { return launch.output().find("queued and waiting for resources") != std::string::npos; },
      30000))
      << launch.output();
  ASSERT_EQ(kill(launch.pid(), SIGINT), 0);
  LaunchRun run = launch.Wait(30000);
  EXPECT_EQ(run.exit_code(), 128 + SIGINT) << run.output;
  EXPECT_NE(run.output.find("Cancelled: stopped while waiting for the Slurm allocation"),
            std::string::npos)
      << run.output;
  EXPECT_TRUE(ReadReports(dir_.Sub("reports")).empty());
  EXPECT_EQ(cluster_->QueueWhenEmpty(), "");
}

}  // namespace
}  // namespace pstrain::testing
