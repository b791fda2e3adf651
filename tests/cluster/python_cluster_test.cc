// Jobs whose every process runs a Python script that imports the pstrain
// package (tests/python/, examples/): started by `pstrain launch --launcher
// local`, or by hand to kill a server. On 127.0.0.1 only.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "logtools/log_table.h"
#include "tests/python/python_test_util.h"

namespace pstrain {
namespace {

using testing::PythonEnv;
using testing::PythonExecutable;
using testing::PythonScript;
using testing::ReadFile;
using testing::RunWithEnv;
using testing::TempDir;

// `pstrain launch -n W -s S --launcher local --log-dir DIR -- python3 ARGS...`.
testing::ScriptRun Launch(int workers, int servers, const std::string& log_dir,
                          const std::vector<std::string>& args, int timeout_ms) {
  std::vector<std::string> argv = {testing::PstrainBinary(),
                                   "launch",
                                   "-n",
                                   std::to_string(workers),
                                   "-s",
                                   std::to_string(servers),
                                   "--launcher",
                                   "local",
                                   "--log-dir",
                                   log_dir,
                                   "--",
                                   PythonExecutable()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunWithEnv(argv, PythonEnv(), timeout_ms);
}

class PythonClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::PythonHas("numpy")) GTEST_SKIP() << PythonExecutable() << " has no numpy";
  }
  void NeedTorch() {
    if (!testing::PythonHas("torch")) {
      GTEST_SKIP() << PythonExecutable()
                   << " has no torch (Debian: python3-torch, which scripts/install-deps.sh "
                      "installs)";
    }
  }
};

// MXNet's dist_sync conformance check from Python: 2 servers (the 1200x1200
// key is split over both), 2 workers; pushpull, conversions, device lists,
// errors and 2-bit gradient compression along the way.
TEST_F(PythonClusterTest, ConformanceDistSync) {
  TempDir logs;
  auto run =
      Launch(2, 2, logs.path(), {PythonScript("kvstore_conformance.py"), "--mode", "sync"}, 120000);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  for (int w = 0; w < 2; ++w) {
    const std::string log = ReadFile(logs.path() + "/worker-" + std::to_string(w) + ".log");
    EXPECT_NE(log.find("conformance: dist_sync ok: 5 rounds, 2 workers, 2 servers"),
              std::string::npos)
        << log;
    // The servers' own message, raised in Python.
    EXPECT_NE(log.find("pull of a key no server holds raised Error"), std::string::npos) << log;
    // ... and, for a request nobody waited for, at the next waitall.
    EXPECT_NE(log.find("waitall after a pull that failed unseen raised Error"), std::string::npos)
        << log;
    EXPECT_NE(log.find("conformance: 2-bit compression ok: 7 rounds"), std::string::npos) << log;
  }
  EXPECT_NE(run.output.find("all 5 processes exited 0"), std::string::npos) << run.output;
}

TEST_F(PythonClusterTest, DistAsyncAppliesEveryPushOnce) {
  TempDir logs;
  auto run = Launch(2, 2, logs.path(), {PythonScript("kvstore_conformance.py"), "--mode", "async"},
                    120000);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  for (int w = 0; w < 2; ++w) {
    const std::string log = ReadFile(logs.path() + "/worker-" + std::to_string(w) + ".log");
    EXPECT_NE(log.find("conformance: dist_async ok: 5 pushes per worker applied exactly once"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("conformance: dist_async wd_mult before init ok"), std::string::npos) << log;
    EXPECT_NE(log.find("conformance: a new generation keeps the schedule's clock ok"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("conformance: allreduce refused in dist_async ok"), std::string::npos)
        << log;
  }
}

// The servers' NAG, Adam, RMSProp and AdaGrad (2 servers, one key sharded
// over both, 2 workers) against MXNet's rules in NumPy, and a
// DistributedOptimizer over server_optimizer(torch Adam) against torch's Adam.
TEST_F(PythonClusterTest, OptimizersDistSync) {
  TempDir logs;
  auto run =
      Launch(2, 2, logs.path(), {PythonScript("optimizer_test.py"), "--mode", "dist_sync"}, 120000);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  const bool torch = testing::PythonHas("torch");
  for (int w = 0; w < 2; ++w) {
    const std::string log = ReadFile(logs.path() + "/worker-" + std::to_string(w) + ".log");
    for (const char* rule : {"nag", "adam defaults", "rmsprop", "rmsprop centered", "adagrad"}) {
      EXPECT_NE(log.find(StrCat("optimizers: dist_sync ", rule, " vs MXNet's rule in NumPy")),
                std::string::npos)
          << rule << "\n"
          << log;
    }
    EXPECT_NE(log.find("optimizers: dist_sync lr_mult and wd_mult ok"), std::string::npos) << log;
    EXPECT_NE(log.find("optimizers: dist_sync rules ok"), std::string::npos) << log;
    if (torch) {
      EXPECT_NE(log.find("optimizers: dist_sync DistributedOptimizer(server_optimizer(torch "
                         "Adam)) vs torch Adam"),
                std::string::npos)
          << log;
      EXPECT_NE(log.find("optimizers: dist_sync DistributedOptimizer(server_optimizer(torch SGD "
                         "with a bias group and a frozen bias)) vs torch"),
                std::string::npos)
          << log;
    }
    EXPECT_NE(log.find("optimizers: dist_sync all ok"), std::string::npos) << log;
  }
}

// One worker through the servers trains exactly as PyTorch alone (the script
// explains which comparisons are bit for bit and which to float tolerance).
TEST_F(PythonClusterTest, OneWorkerTrainsAsPyTorchAlone) {
  NeedTorch();
  TempDir logs;
  auto run = Launch(1, 1, logs.path(), {PythonScript("torch_exactness.py")}, 180000);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  const std::string log = ReadFile(logs.path() + "/worker-0.log");
  EXPECT_NE(log.find("DistributedOptimizer(torch SGD) vs torch SGD alone: max |diff| 0"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("server-side SGD vs MXNet's rule in torch ops: max |diff| 0"),
            std::string::npos)
      << log;
  // A second DistributedOptimizer may not change the servers' optimizer under the first.
  EXPECT_NE(log.find("exactness: one optimizer on the servers at a time ok"), std::string::npos)
      << log;
  // module=: a forward that reads a child's weights waits for them first.
  EXPECT_NE(log.find("exactness: a parent's forward reading a child's weights: 0 reads before "
                     "the wait, max |diff| 0"),
            std::string::npos)
      << log;
  // Local mode: a parameter no worker gave a gradient is skipped, as by torch alone.
  EXPECT_NE(log.find("exactness: an unused parameter, local torch SGD: max |diff| 0 vs torch "
                     "alone, spare weight moved 0"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("exactness: server-side param_groups ok"), std::string::npos) << log;
  // A local torch optimizer counts on exact sums: no gradient compression under it.
  EXPECT_NE(log.find("exactness: a local optimizer over compressed gradients refused"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("exactness: ok"), std::string::npos) << log;
}

// Two workers built from different seeds and fed different data end every
// step with the same weights, bit for bit: broadcast_parameters, a local
// torch optimizer over summed gradients, the servers' SGD.
TEST_F(PythonClusterTest, TwoWorkersStayOneModel) {
  NeedTorch();
  TempDir logs;
  auto run = Launch(2, 1, logs.path(), {PythonScript("torch_two_workers.py")}, 180000);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  for (int w = 0; w < 2; ++w) {
    const std::string log = ReadFile(logs.path() + "/worker-" + std::to_string(w) + ".log");
    EXPECT_NE(log.find("two_workers: broadcast_parameters ok"), std::string::npos) << log;
    EXPECT_NE(log.find("two_workers: local torch SGD over summed gradients keeps the workers "
                       "equal"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("two_workers: server-side SGD keeps the workers equal"), std::string::npos)
        << log;
    EXPECT_NE(
        log.find("two_workers: allreduce (sum, average, in place) beside the servers' SGD ok"),
        std::string::npos)
        << log;
    EXPECT_NE(log.find("two_workers: broadcast (every root) and allgather (uneven rows) ok"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("two_workers: allreduce_async, poll and synchronize ok"), std::string::npos)
        << log;
    EXPECT_NE(log.find("two_workers: broadcast_parameters again ok (no new key)"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("two_workers: broadcast_object and broadcast_optimizer_state ok"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("two_workers: ok"), std::string::npos) << log;
  }
  // The server holds what the store initialized, nothing more (a second
  // broadcast_parameters used to add a copy of the model).
  std::smatch keys;
  const std::string worker = ReadFile(logs.path() + "/worker-0.log");
  ASSERT_TRUE(std::regex_search(worker, keys, std::regex("the store initialized ([0-9]+) keys")))
      << worker;
  const std::string server = ReadFile(logs.path() + "/server-0.log");
  EXPECT_NE(server.find(StrCat("holding ", keys[1].str(), " keys")), std::string::npos) << server;
}

// examples/torch_mnist.py, 2 workers and 1 server, the MLP on a slice of
// MNIST: both workers learn, and their logs read as MXNet's through parse-log.
// `optimizer`: the example's flags that choose it.
void TrainMnist(const std::string& kv_store, const std::vector<std::string>& optimizer,
                double min_accuracy) {
  const std::string mnist = testing::SharedDataDir() + "/mnist";
  ASSERT_TRUE(std::filesystem::exists(mnist + "/train-images-idx3-ubyte.gz")) << mnist;
  TempDir logs;
  std::vector<std::string> args = {testing::SourceDir() + "/examples/torch_mnist.py", "--data-dir",
                                   mnist, "--kv-store", kv_store};
  for (const char* flag : {"--network", "mlp", "--num-examples", "20000", "--num-epochs", "2",
                           "--batch-size", "50", "--disp-batches", "50"}) {
    args.push_back(flag);
  }
  args.insert(args.end(), optimizer.begin(), optimizer.end());
  auto run = Launch(2, 1, logs.path(), args, 240000);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto parsed = logtools::ReadLog(logs.path(), {"accuracy"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const std::vector<logtools::TableRow> rows = logtools::Summarize(*parsed, logtools::Op::kAvg);
  ASSERT_EQ(rows.size(), 2u) << run.output;
  for (const auto& row : rows) {
    ASSERT_TRUE(row.valid[0].has_value()) << run.output;
    ASSERT_TRUE(row.train[0].has_value()) << run.output;
    ASSERT_TRUE(row.time.has_value()) << run.output;
  }
  EXPECT_GT(*rows[1].valid[0], min_accuracy) << run.output;
  for (int w = 0; w < 2; ++w) {
    const std::string log = ReadFile(logs.path() + "/worker-" + std::to_string(w) + ".log");
    EXPECT_TRUE(std::regex_search(log, std::regex("Epoch\\[1\\] Batch \\[200\\]\tSpeed: [0-9.]+ "
                                                  "samples/sec\taccuracy=0\\.[0-9]+")))
        << log;
  }
}

// torch's Adam with a parameter group of its own for the biases (no decay),
// on the servers through server_optimizer (per-key wd_mult).
TEST_F(PythonClusterTest, TwoWorkersLearnMnistDistSync) {
  NeedTorch();
  TrainMnist("dist_sync", {"--optimizer", "adam", "--lr", "0.001", "--no-bias-decay"}, 0.9);
}

// Asynchrony adds implicit momentum (train_cluster_test.cc): the smaller rate
// MXNet's async runs used.
TEST_F(PythonClusterTest, TwoWorkersLearnMnistDistAsync) {
  NeedTorch();
  TrainMnist("dist_async", {"--optimizer", "sgd", "--lr", "0.05"}, 0.88);
}

// ---- a job started by hand, to kill one of its servers ----

using testing::FreePort;

// A python3 process running `script` with `env`, output to `log`.
std::unique_ptr<testing::LoggedProcess> PyProc(const std::string& script,
                                               const std::map<std::string, std::string>& env,
                                               const std::string& log) {
  return std::make_unique<testing::LoggedProcess>(
      std::vector<std::string>{PythonExecutable(), script}, env, log);
}

// A worker whose script calls sys.exit(3) mid-training fails the job at once,
// named with its exit (it once closed its store as a finished worker and the
// job hung until the barrier timeout, the other worker waiting for its pushes).
TEST_F(PythonClusterTest, AWorkerThatCallsSysExitFailsTheJobAtOnce) {
  TempDir logs;
  const auto start = std::chrono::steady_clock::now();
  auto run = Launch(2, 1, logs.path(), {PythonScript("early_exit.py")}, 90000);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_LT(seconds, 30.0) << run.output;
  EXPECT_NE(run.output.find("worker-1"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("sys.exit(3)"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("no error within 120 s"), std::string::npos) << run.output;
}

// sys.exit(0) (or sys.exit()) inside `with kv:` is a normal end: the store
// closes as a finished worker and the job succeeds (it once failed the job).
TEST_F(PythonClusterTest, SysExitZeroInsideWithKvEndsTheJobCleanly) {
  TempDir logs;
  auto run = Launch(2, 1, logs.path(), {PythonScript("early_exit.py"), "--clean"}, 90000);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("all 4 processes exited 0"), std::string::npos) << run.output;
  for (int w = 0; w < 2; ++w) {
    const std::string log = ReadFile(logs.path() + "/worker-" + std::to_string(w) + ".log");
    EXPECT_NE(log.find("leaving inside `with kv:`"), std::string::npos) << log;
  }
}

// A server killed mid-training: every worker's pending request raises
// pstrain.Error naming the server within the heartbeat timeout, the scripts
// die of it (non-zero), and nothing is left running. The timeout is 4 s: at
// 2 s, one CI run (clang-format's check beside it on two cores) had a worker
// declare the scheduler silent before the scheduler's report of the server
// reached it, most likely a process starved of the CPU for 2 s.
TEST_F(PythonClusterTest, DeadServerRaisesInEveryWorkerWithinTheDeadline) {
  TempDir dir;
  const int port = FreePort();
  const int server1_port = FreePort();
  auto env = [&](const std::string& role) {
    std::map<std::string, std::string> e = {{"DMLC_ROLE", role},
                                            {"DMLC_PS_ROOT_URI", "127.0.0.1"},
                                            {"DMLC_PS_ROOT_PORT", std::to_string(port)},
                                            {"DMLC_NUM_SERVER", "2"},
                                            {"DMLC_NUM_WORKER", "2"},
                                            {"PSTRAIN_HEARTBEAT_INTERVAL_MS", "200"},
                                            {"PSTRAIN_HEARTBEAT_TIMEOUT_MS", "4000"},
                                            {"PSTRAIN_STARTUP_TIMEOUT_MS", "30000"}};
    return PythonEnv(e);
  };
  const std::string script = PythonScript("dead_server.py");
  std::vector<std::unique_ptr<testing::LoggedProcess>> job;
  job.push_back(PyProc(script, env("scheduler"), dir.path() + "/scheduler.log"));
  for (int s = 0; s < 2; ++s) {
    auto e = env("server");
    if (s == 1) e["PORT"] = std::to_string(server1_port);
    job.push_back(PyProc(script, e, dir.path() + "/server" + std::to_string(s) + ".log"));
  }
  for (int w = 0; w < 2; ++w) {
    job.push_back(
        PyProc(script, env("worker"), dir.path() + "/worker" + std::to_string(w) + ".log"));
  }
  // Both workers exchanging (bounded: 60 s for imports and registration).
  for (int w = 3; w < 5; ++w) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (job[w]->Log().find("dead_server: exchanging") == std::string::npos &&
           std::chrono::steady_clock::now() < end) {
      ASSERT_EQ(job[w]->Wait(0.1), -1) << job[w]->Log();
    }
    ASSERT_NE(job[w]->Log().find("dead_server: exchanging"), std::string::npos) << job[w]->Log();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(job[2]->Wait(0), -1) << "server 1 ended early: " << job[2]->Log();
  const auto killed_at = std::chrono::steady_clock::now();
  job[2]->Kill9();
  for (int i : {0, 1, 3, 4}) {
    const int code = job[i]->Wait(20);
    EXPECT_NE(code, 0) << job[i]->Log();
    EXPECT_NE(code, -1) << "still running 20 s after the kill: " << job[i]->Log();
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(secs, 12.0);
  for (int w = 3; w < 5; ++w) {
    const std::string log = job[w]->Log();
    EXPECT_NE(log.find("dead_server: raised"), std::string::npos) << log;
    EXPECT_NE(log.find("pstrain.Error"), std::string::npos) << log;
    EXPECT_NE(log.find("server rank"), std::string::npos) << log;
    EXPECT_NE(log.find(":" + std::to_string(server1_port)), std::string::npos) << log;
  }
}

// A store failed from one thread while another pushes: the pushing thread gets
// pstrain.Error ("closed"), the process exits normally (the client and the
// node are destroyed only once no call is in flight in them). Started by hand:
// a launcher would stop the worker as soon as the job fails.
TEST_F(PythonClusterTest, ClosingWhileAnotherThreadPushesRaisesThere) {
  TempDir dir;
  const int port = FreePort();
  auto env = [&](const std::string& role) {
    return PythonEnv({{"DMLC_ROLE", role},
                      {"DMLC_PS_ROOT_URI", "127.0.0.1"},
                      {"DMLC_PS_ROOT_PORT", std::to_string(port)},
                      {"DMLC_NUM_SERVER", "1"},
                      {"DMLC_NUM_WORKER", "1"}});
  };
  const std::string script = PythonScript("close_race.py");
  std::vector<std::unique_ptr<testing::LoggedProcess>> job;
  job.push_back(PyProc(script, env("scheduler"), dir.path() + "/scheduler.log"));
  job.push_back(PyProc(script, env("server"), dir.path() + "/server.log"));
  job.push_back(PyProc(script, env("worker"), dir.path() + "/worker.log"));
  EXPECT_EQ(job[2]->Wait(60), 0) << job[2]->Log();
  EXPECT_NE(job[2]->Log().find("close_race: the pushing thread ['raised pstrain.Error after some "
                               "pushes: FailedPrecondition: the KVStore is closed']"),
            std::string::npos)
      << job[2]->Log();
  for (int i : {0, 1}) EXPECT_NE(job[i]->Wait(20), -1) << job[i]->Log();
}

}  // namespace
}  // namespace pstrain
