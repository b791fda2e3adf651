// Real processes on 127.0.0.1: `pstrain kvbench` as scheduler, servers and
// workers (DMLC_ROLE), as a user starts a job by hand.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/env.h"
#include "proto/ps.pb.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

using Env = std::map<std::string, std::string>;

using testing::FreePort;
using testing::ReadFile;

using Proc = testing::LoggedProcess;

// `pstrain args...` with `env` over this process's environment.
std::unique_ptr<Proc> StartPstrain(const std::vector<std::string>& args, const Env& env,
                                   const std::string& log) {
  std::vector<std::string> argv = {testing::PstrainBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  return std::make_unique<Proc>(argv, Environment(env).All(), log);
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pstrain_cluster_XXXXXX";
    dir_ = mkdtemp(tmpl);
    port_ = FreePort();
  }
  void TearDown() override {
    procs_.clear();
    if (!HasFailure()) std::system(("rm -rf " + dir_).c_str());
  }
  Env JobEnv(int S, int W, const std::string& role) {
    return Env{{"DMLC_ROLE", role},
               {"DMLC_PS_ROOT_URI", "127.0.0.1"},
               {"DMLC_PS_ROOT_PORT", std::to_string(port_)},
               {"DMLC_NUM_SERVER", std::to_string(S)},
               {"DMLC_NUM_WORKER", std::to_string(W)},
               {"PSTRAIN_HEARTBEAT_INTERVAL_MS", "200"},
               {"PSTRAIN_HEARTBEAT_TIMEOUT_MS", "2000"},
               {"PSTRAIN_STARTUP_TIMEOUT_MS", "10000"}};
  }
  Proc* Start(const std::string& name, const std::vector<std::string>& args, const Env& env) {
    procs_.push_back(StartPstrain(args, env, dir_ + "/" + name + ".log"));
    return procs_.back().get();
  }
  // Starts scheduler, S servers and W workers running `args`; returns them in that order.
  std::vector<Proc*> StartJob(int S, int W, const std::vector<std::string>& args,
                              const Env& extra = {}, std::vector<int>* server_ports = nullptr) {
    std::vector<Proc*> p;
    auto with = [&](Env e) {
      for (const auto& [k, v] : extra) e[k] = v;
      return e;
    };
    p.push_back(Start("scheduler", args, with(JobEnv(S, W, "scheduler"))));
    for (int s = 0; s < S; ++s) {
      Env e = with(JobEnv(S, W, "server"));
      if (server_ports != nullptr) e["PORT"] = std::to_string((*server_ports)[s]);
      p.push_back(Start("server" + std::to_string(s), args, e));
    }
    for (int w = 0; w < W; ++w) {
      p.push_back(Start("worker" + std::to_string(w), args, with(JobEnv(S, W, "worker"))));
    }
    return p;
  }

  std::string dir_;
  int port_ = 0;
  std::vector<std::unique_ptr<Proc>> procs_;
};

void ExpectVerified(const std::vector<Proc*>& job, int W) {
  for (Proc* p : job) EXPECT_EQ(p->Wait(60), 0) << p->Log();
  for (size_t i = job.size() - W; i < job.size(); ++i) {
    const std::string log = job[i]->Log();
    EXPECT_NE(log.find("verify dist_sync ok"), std::string::npos) << log;
    EXPECT_NE(log.find("verify dist_async ok"), std::string::npos) << log;
  }
}

TEST_F(ClusterTest, VerifyOneServerOneWorker) {
  ExpectVerified(StartJob(1, 1, {"kvbench", "--verify"}), 1);
}

TEST_F(ClusterTest, VerifyTwoServersThreeWorkersBalanced) {
  ExpectVerified(StartJob(2, 3, {"kvbench", "--verify"}, {{"PSTRAIN_PLACEMENT", "balanced"}}), 3);
}

TEST_F(ClusterTest, VerifyTwoServersThreeWorkersMxnetPlacementShardsBigKey) {
  ExpectVerified(StartJob(2, 3, {"kvbench", "--verify"}, {{"PSTRAIN_PLACEMENT", "mxnet"}}), 3);
}

TEST_F(ClusterTest, VerifyTwoServersThreeWorkersOverTcpOnly) {
  ExpectVerified(StartJob(2, 3, {"kvbench", "--verify"}, {{"PSTRAIN_SHM_BYTES", "0"}}), 3);
}

// A job whose scheduler is at an IPv6 address: every node advertises and
// listens on ::1 and the values cross TCP over IPv6.
TEST_F(ClusterTest, VerifyOverIpv6Loopback) {
  if (const std::string why = testing::Ipv6LoopbackMissing(); !why.empty()) GTEST_SKIP() << why;
  std::vector<Proc*> job = StartJob(2, 2, {"kvbench", "--verify"},
                                    {{"DMLC_PS_ROOT_URI", "::1"}, {"PSTRAIN_SHM_BYTES", "0"}});
  ExpectVerified(job, 2);
  for (int s = 1; s <= 2; ++s) {
    const std::string log = job[s]->Log();
    EXPECT_TRUE(std::regex_search(log, std::regex(R"(server rank [01] at \[::1\]:\d+)"))) << log;
  }
}

// Processes on one host reach each other's arenas: the values go through
// shared memory unless PSTRAIN_SHM_BYTES=0 turns it off.
TEST_F(ClusterTest, BenchmarkUsesSharedMemoryBetweenCoLocatedProcessesUnlessTurnedOff) {
  for (const char* shm : {"134217728", "0"}) {
    auto job = StartJob(1, 1, {"kvbench", "--tensor-bytes=65536", "--tensors=4", "--iters=30"},
                        {{"PSTRAIN_SHM_BYTES", shm}});
    for (Proc* p : job) EXPECT_EQ(p->Wait(60), 0) << p->Log();
    const std::string log = job.back()->Log();
    const std::string want = std::string(shm) == "0" ? "transport=tcp" : "transport=shm";
    EXPECT_NE(log.find(want), std::string::npos) << log;
    procs_.clear();
    port_ = FreePort();
  }
}

TEST_F(ClusterTest, BenchmarkPrintsTableAndScriptLines) {
  auto job = StartJob(1, 1,
                      {"kvbench", "--tensor-bytes=4096", "--tensors=8", "--iters=50",
                       "--mode=sync,async,pushpull"});
  for (Proc* p : job) EXPECT_EQ(p->Wait(60), 0) << p->Log();
  const std::string log = job.back()->Log();
  for (const char* mode : {"sync", "async", "pushpull"}) {
    EXPECT_NE(
        log.find(std::string("kvbench: tensor_bytes=4096 tensors=8 servers=1 workers=1 mode=") +
                 mode + " steps_per_s="),
        std::string::npos)
        << log;
  }
  EXPECT_NE(log.find("ceiling_gbps="), std::string::npos) << log;
  EXPECT_NE(log.find("| tensor bytes |"), std::string::npos) << log;
}

// Sizes that are not whole float32 values would be reported but not sent.
TEST_F(ClusterTest, BenchmarkSizesAreWholeFloats) {
  auto job = StartJob(1, 1, {"kvbench", "--tensor-bytes=4097", "--tensors=1", "--iters=5"});
  EXPECT_NE(job.back()->Wait(60), 0);
  const std::string log = job.back()->Log();
  EXPECT_NE(log.find("--tensor-bytes: 4097 is not a whole number of float32 values"),
            std::string::npos)
      << log;
  for (Proc* p : job) p->Wait(60);
}

// --shapes-of moves exactly a zoo model's parameter arrays, one call each.
TEST_F(ClusterTest, BenchmarkMovesTheParameterArraysOfAModel) {
  auto job = StartJob(2, 1,
                      {"kvbench", "--shapes-of=inception-bn-28-small,lenet", "--iters=10",
                       "--rounds=1", "--ceiling-iters=5", "--mode=sync"});
  for (Proc* p : job) EXPECT_EQ(p->Wait(90), 0) << p->Log();
  const std::string log = job.back()->Log();
  // 78 arrays, 1.65 M floats (84,760 bytes each on average); LeNet 8 arrays.
  EXPECT_NE(log.find("kvbench: model=inception-bn-28-small tensor_bytes=84760 tensors=78 "
                     "servers=2 workers=1 mode=sync steps_per_s="),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("kvbench: model=lenet tensor_bytes="), std::string::npos) << log;
  EXPECT_NE(log.find("| inception-bn-28-small (mean 84760) | 78 | 78 | sync |"), std::string::npos)
      << log;
  procs_.clear();
  port_ = FreePort();
  auto bad = StartJob(1, 1, {"kvbench", "--shapes-of=resnet-x"});
  EXPECT_NE(bad.back()->Wait(60), 0);
  EXPECT_NE(bad.back()->Log().find("--shapes-of: 'resnet-x': expected resnet-<layers>"),
            std::string::npos)
      << bad.back()->Log();
  for (size_t i = 0; i + 1 < bad.size(); ++i) EXPECT_NE(bad[i]->Wait(60), 0) << bad[i]->Log();
}

TEST_F(ClusterTest, KilledServerFailsEveryoneWithinDeadlineNamingIt) {
  std::vector<int> ports = {FreePort(), FreePort()};
  auto job = StartJob(2, 2,
                      {"kvbench", "--tensor-bytes=4096", "--tensors=16", "--iters=100000000",
                       "--ceiling-iters=10", "--mode=sync"},
                      {}, &ports);
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  ASSERT_EQ(job[2]->Wait(0), -1) << "server 1 ended early: " << job[2]->Log();
  const auto killed_at = std::chrono::steady_clock::now();
  job[2]->Kill9();
  const std::string name = ":" + std::to_string(ports[1]);
  for (Proc* p : {job[0], job[1], job[3], job[4]}) {
    const int code = p->Wait(15);
    EXPECT_NE(code, 0) << p->Log();
    EXPECT_NE(code, -1) << "still running 15 s after the kill: " << p->Log();
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(secs, 10.0);
  for (Proc* w : {job[3], job[4]}) {
    const std::string log = w->Log();
    EXPECT_NE(log.find("server rank"), std::string::npos) << log;
    EXPECT_NE(log.find(name), std::string::npos) << log;
  }
}

TEST_F(ClusterTest, KilledSchedulerFailsEveryoneWithinDeadline) {
  auto job = StartJob(1, 2,
                      {"kvbench", "--tensor-bytes=4096", "--tensors=16", "--iters=100000000",
                       "--ceiling-iters=10", "--mode=sync"});
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_EQ(job[0]->Wait(0), -1) << "scheduler ended early: " << job[0]->Log();
  job[0]->Kill9();
  for (size_t i = 1; i < job.size(); ++i) {
    const int code = job[i]->Wait(15);
    EXPECT_NE(code, 0) << job[i]->Log();
    EXPECT_NE(code, -1) << "still running 15 s after the kill: " << job[i]->Log();
    EXPECT_NE(job[i]->Log().find("scheduler at 127.0.0.1:" + std::to_string(port_)),
              std::string::npos)
        << job[i]->Log();
  }
}

TEST_F(ClusterTest, MissingWorkerFailsStartupNamingWhatIsMissing) {
  std::vector<Proc*> job;
  auto env = [&](const std::string& role) {
    Env e = JobEnv(1, 2, role);
    e["PSTRAIN_STARTUP_TIMEOUT_MS"] = "2000";
    return e;
  };
  job.push_back(Start("scheduler", {"kvbench", "--verify"}, env("scheduler")));
  job.push_back(Start("server0", {"kvbench", "--verify"}, env("server")));
  job.push_back(Start("worker0", {"kvbench", "--verify"}, env("worker")));
  for (Proc* p : job) {
    const int code = p->Wait(12);
    EXPECT_NE(code, 0) << p->Log();
    EXPECT_NE(code, -1) << p->Log();
  }
  EXPECT_NE(job[0]->Log().find("1/2 workers"), std::string::npos) << job[0]->Log();
}

// Sends `frames` as one multipart message to tcp://127.0.0.1:port.
void SendRaw(int port, const std::vector<std::string>& frames) {
  void* ctx = zmq_ctx_new();
  void* d = zmq_socket(ctx, ZMQ_DEALER);
  int linger = 2000;
  zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof(linger));
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
  zmq_connect(d, ep.c_str());
  for (size_t i = 0; i < frames.size(); ++i) {
    zmq_send(d, frames[i].data(), frames[i].size(), i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
  }
  zmq_close(d);
  zmq_ctx_term(ctx);
}

// Malformed messages; the well-formed ones claim worker rank 5 (id 19), a
// sender with no connection of its own, so validation sees them.
void SendGarbage(int port) {
  PsHeader h;
  h.set_version(PROTOCOL_VERSION_CURRENT);
  h.set_cmd(CMD_DATA);
  h.set_sender(19);
  h.set_request_id(77);
  h.set_push(true);
  h.set_dtype(DTYPE_FLOAT32);
  h.set_num_keys(1);
  h.set_num_value_frames(1);
  h.set_value_bytes(16);
  const std::string header = h.SerializeAsString();
  std::string key(8, '\0');
  key[7] = 3;  // server rank 768: not this server
  const std::string len("\x04\0\0\0", 4);
  SendRaw(port, {"\xde\xad\xbe\xef garbage"});                    // not a header
  SendRaw(port, {header});                                        // truncated
  SendRaw(port, {header, key, len});                              // value frame missing
  SendRaw(port, {header, key, len, std::string(8, 'v')});         // short values
  SendRaw(port, {header, key, len, std::string(24 << 20, 'v')});  // oversized
  SendRaw(port, {header, key, len, std::string(16, 'v')});        // wrong server's key
  h.set_sender(9);  // worker rank 0, which has a connection of its own
  SendRaw(port, {h.SerializeAsString(), key, len, std::string(16, 'v')});  // forged sender
}

TEST_F(ClusterTest, GarbageTruncatedAndOversizedMessagesDoNotHurtAServer) {
  std::vector<int> ports = {FreePort()};
  // 600 rounds (about 1.5 s): the second garbage must reach the server while
  // the job still runs; 30 rounds once ended first (a fresh Debian chroot).
  const std::vector<std::string> args = {"kvbench", "--verify", "--verify-rounds=600"};
  Env extra = {{"PSTRAIN_MAX_MESSAGE_BYTES", std::to_string(16 << 20)}};
  std::vector<Proc*> job;
  Env se = JobEnv(1, 1, "server");
  se["PORT"] = std::to_string(ports[0]);
  se["PSTRAIN_MAX_MESSAGE_BYTES"] = std::to_string(16 << 20);
  job.push_back(Start("scheduler", args, JobEnv(1, 1, "scheduler")));
  job.push_back(Start("server0", args, se));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  SendGarbage(ports[0]);  // before the job starts
  job.push_back(Start("worker0", args, JobEnv(1, 1, "worker")));
  SendGarbage(ports[0]);  // while it runs
  ExpectVerified(job, 1);
  const std::string log = job[1]->Log();
  EXPECT_NE(log.find("dropped a malformed message"), std::string::npos) << log;
  EXPECT_NE(log.find("belongs to server rank 768"), std::string::npos) << log;
  EXPECT_NE(log.find("forged sender"), std::string::npos) << log;
}

}  // namespace
}  // namespace pstrain
