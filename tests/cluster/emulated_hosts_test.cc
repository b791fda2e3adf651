// Three emulated hosts (bench/cluster/cluster.sh: network namespaces with
// their own addresses, sshd and 1 Gbit/s links): the ssh launcher and mpirun
// start a job across them, values between hosts take TCP and within a host shared
// memory, and a host whose link goes down or whose processes die ends the
// job everywhere, naming the host, with nothing left running.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/env.h"
#include "tests/test_util.h"
#include "tracker/process.h"

namespace pstrain {
namespace {

using testing::PstrainBinary;
using testing::SourceDir;

// A name and subnet of their own, so a cluster a user has up is not touched.
const char* const kName = "psttst";
const char* const kSubnet = "10.79.0";
const char* const kSubnet6 = "fd0a:79:0:1::";  // its IPv6 twin (bench/cluster/cluster.sh)

struct Ran {
  int code = -1;  // exit code; -1: killed or not run
  std::string out;
  double seconds = 0;
};

Ran Sh(const std::vector<std::string>& argv, int timeout_ms = 120000) {
  Ran r;
  int status = 0;
  const auto start = std::chrono::steady_clock::now();
  Status s = tracker::RunAndCapture(argv, Environment().All(), timeout_ms, &r.out, &status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!s.ok()) r.out += "\n(" + s.ToString() + ")";
  if (s.ok() && WIFEXITED(status)) r.code = WEXITSTATUS(status);
  return r;
}

std::string Script() { return SourceDir() + "/bench/cluster/cluster.sh"; }

Ran Cluster(std::vector<std::string> args) {
  std::vector<std::string> argv = {"env", StrCat("PSTRAIN_CLUSTER_NAME=", kName),
                                   StrCat("PSTRAIN=", PstrainBinary()), "bash", Script()};
  argv.insert(argv.end(), args.begin(), args.end());
  return Sh(argv, 300000);
}

// Processes left in the hosts' namespaces, other than their sshd listeners.
std::string LeftRunning() {
  std::string left;
  for (int i = 1; i <= 3; ++i) {
    Ran pids = Sh({"sh", "-c",
                   StrCat("for p in $(ip netns pids ", kName, "-h", i,
                          "); do [ \"$p\" = \"$(cat /run/pstrain-cluster/", kName, "/h", i,
                          ".sshd.pid)\" ] || ps -o pid=,args= -p $p; done")});
    left += pids.out;
  }
  return left;
}

// pstrain processes on the hosts end within 10 s of the job.
void ExpectNothingLeftRunning() {
  std::string left;
  for (int i = 0; i < 40; ++i) {
    left = LeftRunning();
    if (left.find("pstrain") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_EQ(left.find("pstrain"), std::string::npos) << "left running:\n" << left;
}

class EmulatedHostsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) {
      skip_ = "needs root to make network namespaces (bench/cluster/cluster.sh)";
      return;
    }
    Ran probe = Sh({"sh", "-c",
                    "ip netns add psttst-cap && nsenter --net=/run/netns/psttst-cap true; "
                    "r=$?; ip netns del psttst-cap 2>/dev/null; exit $r"});
    if (probe.code != 0) {
      skip_ = "this machine cannot make network namespaces: " + probe.out;
      return;
    }
    (void)Cluster({"down", "--name", kName});  // a run that crashed before
    Ran up = Cluster({"up", "3", "--name", kName, "--subnet", kSubnet, "--rate", "1gbit"});
    if (up.code != 0) setup_error_ = "cluster.sh up failed: " + up.out;
  }

  static void TearDownTestSuite() {
    if (!skip_.empty()) return;
    Ran down = Cluster({"down", "--name", kName});
    EXPECT_EQ(down.code, 0) << down.out;
    Ran left = Sh({"sh", "-c", StrCat("ip netns list | grep '^", kName, "-' || true")});
    EXPECT_EQ(left.out, "") << "namespaces left behind";
    EXPECT_NE(access(StrCat("/run/pstrain-cluster/", kName).c_str(), F_OK), 0)
        << "state left behind";
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_EQ(setup_error_, "");
    log_dir_ = testing::MakeTempDir("emulated-hosts");
    ASSERT_NE(log_dir_, "");
  }
  void TearDown() override {
    if (!log_dir_.empty()) (void)Sh({"rm", "-rf", log_dir_});
  }

  // pstrain launch --launcher ssh across the hosts, from host 1.
  Ran Launch(std::vector<std::string> args, int timeout_ms = 180000) {
    std::vector<std::string> argv = {"launch", "--log-dir", log_dir_};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> all = {"env", StrCat("PSTRAIN_CLUSTER_NAME=", kName),
                                    StrCat("PSTRAIN=", PstrainBinary()), "bash", Script()};
    all.insert(all.end(), argv.begin(), argv.end());
    return Sh(all, timeout_ms);
  }

  std::string log_dir_;
  static std::string skip_;
  static std::string setup_error_;
};

std::string EmulatedHostsTest::skip_;
std::string EmulatedHostsTest::setup_error_;

// Every one of `workers` kvbench --verify workers said its dist_sync check passed.
void ExpectWorkersVerified(const Ran& verify, int workers) {
  for (int w = 0; w < workers; ++w) {
    EXPECT_NE(verify.out.find(StrCat("[worker-", w, "] kvbench: verify dist_sync ok")),
              std::string::npos)
        << "worker " << w << ":\n"
        << verify.out;
  }
}

TEST_F(EmulatedHostsTest, KvbenchVerifiesAcrossHostsOverTcpAndWithinAHostInSharedMemory) {
  Ran verify = Launch({"-n", "6", "-s", "3", "--timeout", "120", "--", PstrainBinary(), "kvbench",
                       "--verify", "--verify-rounds", "3"});
  ASSERT_EQ(verify.code, 0) << verify.out;
  ExpectWorkersVerified(verify, 6);
  for (int h = 1; h <= 3; ++h) {
    EXPECT_NE(verify.out.find(StrCat(kSubnet, ".", 10 + h, ":")), std::string::npos)
        << "no process on host " << h << ":\n"
        << verify.out;
  }
  // Each worker shares its host with one of the three servers.
  Ran bench = Launch({"-n", "3", "-s", "3", "--timeout", "120", "--", PstrainBinary(), "kvbench",
                      "--iters", "10", "--rounds", "1", "--mode", "pushpull", "--tensor-bytes",
                      "1048576", "--tensors", "4"});
  ASSERT_EQ(bench.code, 0) << bench.out;
  const std::regex line(R"(\[worker-\d\] kvbench: .* transport=(\S+))");
  int lines = 0;
  for (std::sregex_iterator it(bench.out.begin(), bench.out.end(), line), end; it != end; ++it) {
    EXPECT_EQ((*it)[1].str(), "shm(1/3)+tcp") << it->str();
    ++lines;
  }
  EXPECT_EQ(lines, 3) << bench.out;
}

// How many of the 3 hosts a process of the job logged an address of
// ("10.79.0.12:" or, with `ipv6`, "[fd0a:79:0:1::12]:").
int HostsWithProcesses(const Ran& job, bool ipv6) {
  int hosts = 0;
  for (int h = 1; h <= 3; ++h) {
    const std::string at =
        ipv6 ? StrCat("at [", kSubnet6, 10 + h, "]:") : StrCat(kSubnet, ".", 10 + h, ":");
    hosts += job.out.find(at) != std::string::npos ? 1 : 0;
  }
  return hosts;
}

// Why the tests that need the hosts' names must skip, or "" (they have them).
std::string NoNames() {
  Ran names = Sh({"cat", StrCat("/run/pstrain-cluster/", kName, "/names")});
  if (names.out.rfind("no", 0) != 0) return "";
  return "the emulated hosts have no names here (no private mount namespace, as in a chroot: "
         "bench/cluster/cluster.sh up says so)";
}

TEST_F(EmulatedHostsTest, MpirunLaunchesAcrossHosts) {
  Ran verify = Launch({"--launcher", "mpi", "-n", "3", "-s", "3", "--timeout", "120", "--",
                       PstrainBinary(), "kvbench", "--verify", "--verify-rounds", "3"});
  ASSERT_EQ(verify.code, 0) << verify.out;
  ExpectWorkersVerified(verify, 3);
  // Open MPI fills each host's slots (its cores) before the next host.
  EXPECT_GE(HostsWithProcesses(verify, false), 2) << verify.out;
}

// The same job over the hosts' IPv6 addresses (a hosts file of "[fd0a:...]"
// lines): the launcher finds host 1's IPv6 address for the scheduler, every
// node advertises its host's, values between hosts take TCP over IPv6.
TEST_F(EmulatedHostsTest, KvbenchVerifiesAcrossHostsOverIpv6) {
  Ran v6 = Sh({"cat", StrCat("/run/pstrain-cluster/", kName, "/ipv6")});
  if (v6.out.rfind("yes", 0) != 0) GTEST_SKIP() << "the emulated hosts have no IPv6 here";
  Ran verify = Launch({"--ipv6", "-n", "3", "-s", "3", "--timeout", "120", "--", PstrainBinary(),
                       "kvbench", "--verify", "--verify-rounds", "3"});
  ASSERT_EQ(verify.code, 0) << verify.out;
  ExpectWorkersVerified(verify, 3);
  EXPECT_NE(verify.out.find(StrCat("scheduler at [", kSubnet6, "11]:")), std::string::npos)
      << verify.out;
  for (int h = 1; h <= 3; ++h) {
    EXPECT_NE(verify.out.find(StrCat("at [", kSubnet6, 10 + h, "]:")), std::string::npos)
        << "no process on host " << h << ":\n"
        << verify.out;
  }
  EXPECT_EQ(verify.out.find(StrCat(kSubnet, ".")), std::string::npos)
      << "an IPv4 address in an IPv6 job:\n"
      << verify.out;
}

// MPICH's mpiexec (Hydra) across the hosts: ssh through the cluster's
// wrapper, its proxies reaching mpiexec at host 1's name (exec and launch
// run under the host's name).
TEST_F(EmulatedHostsTest, MpichLaunchesAcrossHosts) {
  Ran named = Sh(
      {"env", StrCat("PSTRAIN_CLUSTER_NAME=", kName), "bash", Script(), "exec", "2", "hostname"});
  EXPECT_EQ(named.out, StrCat(kName, "-h2\n"));
  if (Sh({"sh", "-c", "command -v mpirun.mpich"}).code != 0) {
    GTEST_SKIP() << "no MPICH here (mpirun.mpich)";
  }
  if (const std::string why = NoNames(); !why.empty()) {
    GTEST_SKIP() << why << ", and Hydra's proxies need host 1's";
  }
  Ran verify =
      Launch({"--launcher", "mpi", "--mpirun", "mpirun.mpich", "-n", "3", "-s", "3", "--timeout",
              "120", "--", PstrainBinary(), "kvbench", "--verify", "--verify-rounds", "3"});
  ASSERT_EQ(verify.code, 0) << verify.out;
  ExpectWorkersVerified(verify, 3);
  EXPECT_GE(HostsWithProcesses(verify, false), 2) << verify.out;
}

// Open MPI 4's mpirun over IPv6: it takes no IPv6 address for a host, so the
// hosts go by names that resolve to their IPv6 addresses alone (the
// cluster's /etc/hosts, in a mount namespace of its own). pstrain resolves
// them too: the scheduler and every node are at IPv6 addresses.
TEST_F(EmulatedHostsTest, MpirunLaunchesAcrossHostsOverIpv6ByName) {
  Ran v6 = Sh({"cat", StrCat("/run/pstrain-cluster/", kName, "/ipv6")});
  if (v6.out.rfind("yes", 0) != 0) GTEST_SKIP() << "the emulated hosts have no IPv6 here";
  if (const std::string why = NoNames(); !why.empty()) GTEST_SKIP() << why;
  // The names resolve on the hosts, and here not at all.
  Ran resolved = Sh({"env", StrCat("PSTRAIN_CLUSTER_NAME=", kName), "bash", Script(), "exec", "2",
                     "getent", "ahostsv6", StrCat(kName, "-h3-v6")});
  EXPECT_EQ(resolved.out.rfind(StrCat(kSubnet6, "13 "), 0), 0u) << resolved.out;
  EXPECT_NE(Sh({"getent", "hosts", StrCat(kName, "-h3-v6")}).code, 0)
      << "the cluster's names leaked into this machine's /etc/hosts";
  Ran verify = Launch({"--ipv6", "--launcher", "mpi", "-n", "3", "-s", "3", "--timeout", "120",
                       "--", PstrainBinary(), "kvbench", "--verify", "--verify-rounds", "3"});
  ASSERT_EQ(verify.code, 0) << verify.out;
  ExpectWorkersVerified(verify, 3);
  EXPECT_NE(verify.out.find(StrCat("scheduler at [", kSubnet6, "11]:")), std::string::npos)
      << verify.out;
  EXPECT_GE(HostsWithProcesses(verify, true), 2) << verify.out;
  EXPECT_EQ(verify.out.find(StrCat(kSubnet, ".")), std::string::npos)
      << "an IPv4 address in an IPv6 job:\n"
      << verify.out;
}

// A fault on host 3 while the job runs; every other process must end,
// naming that host, within the heartbeat deadline (3 s here).
void ExpectJobEndsNamingHost3(const Ran& r, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(StrCat("failed: ")), std::string::npos) << r.out;
  const std::string host3 = StrCat(kSubnet, ".13");
  const size_t failed = r.out.rfind("pstrain launch: job ");
  ASSERT_NE(failed, std::string::npos) << r.out;
  EXPECT_NE(r.out.find(host3, failed), std::string::npos)
      << "the launcher's verdict does not name host 3:\n"
      << r.out.substr(failed);
  EXPECT_LT(r.seconds, 40) << "the job took too long to end";
}

std::vector<std::string> LongJob() {
  return {"-n",        "3",
          "-s",        "3",
          "--timeout", "120",
          "--env",     "PSTRAIN_HEARTBEAT_TIMEOUT_MS=3000",
          "--",        PstrainBinary(),
          "kvbench",   "--iters",
          "1000000",   "--rounds",
          "1",         "--mode",
          "pushpull",  "--tensor-bytes",
          "262144",    "--tensors",
          "4"};
}

TEST_F(EmulatedHostsTest, AHostWhoseLinkGoesDownEndsTheJobNamingIt) {
  std::thread fault([] {
    std::this_thread::sleep_for(std::chrono::seconds(4));
    Ran down = Cluster({"link", "3", "down"});
    EXPECT_EQ(down.code, 0) << down.out;
  });
  Ran r = Launch(LongJob());
  fault.join();
  ExpectJobEndsNamingHost3(r, "link down");
  ExpectNothingLeftRunning();  // host 3's lose the scheduler and end by themselves
  Ran up = Cluster({"link", "3", "up"});
  EXPECT_EQ(up.code, 0) << up.out;
}

TEST_F(EmulatedHostsTest, AHostWhoseProcessesDieEndsTheJobNamingIt) {
  std::thread fault([] {
    std::this_thread::sleep_for(std::chrono::seconds(4));
    Ran killed = Cluster({"kill", "3"});
    EXPECT_EQ(killed.code, 0) << killed.out;
  });
  Ran r = Launch(LongJob());
  fault.join();
  ExpectJobEndsNamingHost3(r, "processes killed");
  ExpectNothingLeftRunning();
}

}  // namespace
}  // namespace pstrain
