// The local launcher: a 2-server 2-worker job of env_probe on this host.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "logtools/log_table.h"
#include "net/job_keys.h"
#include "tests/launcher/launch_test_util.h"

namespace pstrain::testing {
namespace {

std::vector<std::string> ProbeCommand(const TempDir& dir, std::vector<std::string> extra) {
  std::vector<std::string> cmd = {
      "--", EnvProbe(), "--out=" + dir.Sub("reports"),
      "--show=PROBE_SPACEY,PROBE_FORWARDED,PROBE_COLON,PSTRAIN_KEY_FILE"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

std::vector<std::string> Args(const TempDir& dir, std::vector<std::string> extra) {
  std::vector<std::string> args = {"-n",         "2",
                                   "-s",         "2",
                                   "--launcher", "local",
                                   "--log-dir",  dir.Sub("logs"),
                                   "--timeout",  "60",
                                   "--env",      "PROBE_SPACEY=" + kSpacey,
                                   "--env",      "PROBE_FORWARDED",
                                   "--env",      "PROBE_COLON:a:b"};
  auto cmd = ProbeCommand(dir, std::move(extra));
  args.insert(args.end(), cmd.begin(), cmd.end());
  return args;
}

class LocalLauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    ASSERT_EQ(mkdir(dir_.Sub("reports").c_str(), 0755), 0);
  }
  TempDir dir_;
  std::map<std::string, std::string> env_ = {{"PROBE_FORWARDED", "from the launcher"}};
};

TEST_F(LocalLauncherTest, TwoServersTwoWorkersSucceed) {
  LaunchRun run =
      RunLaunch(Args(dir_, {"plain", kSpacey, "$PATH", "it's"}), dir_.path(), 60000, env_);
  ASSERT_EQ(run.exit_code(), 0) << run.output;
  Reports reports = ReadReports(dir_.Sub("reports"));
  ExpectJobReports(reports, 2, 2, "local");
  for (const auto& [name, kv] : reports) {
    SCOPED_TRACE(name);
    EXPECT_EQ(kv.at("DMLC_PS_ROOT_URI"), "127.0.0.1");
    EXPECT_EQ(kv.at("DMLC_NODE_HOST"), "127.0.0.1");
    EXPECT_EQ(kv.at("PROBE_SPACEY"), kSpacey);
    EXPECT_EQ(kv.at("PROBE_FORWARDED"), "from the launcher");
    EXPECT_EQ(kv.at("PROBE_COLON"), "a:b");
    EXPECT_EQ(kv.at("arg0"), "plain");
    EXPECT_EQ(kv.at("arg1"), kSpacey);
    EXPECT_EQ(kv.at("arg2"), "$PATH");
    EXPECT_EQ(kv.at("arg3"), "it's");
    // Every process of the job reads the job's own keys, made by the launcher.
    EXPECT_EQ(kv.at("PSTRAIN_KEY_FILE"), dir_.Sub("logs") + "/job.key");
  }
  struct stat st;
  ASSERT_EQ(stat((dir_.Sub("logs") + "/job.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_OK(ReadJobKeys(dir_.Sub("logs") + "/job.key").status());
  // dmlc-core's local numbering: workers are tasks 0..W-1, servers follow.
  EXPECT_EQ(reports["worker-1"]["DMLC_TASK_ID"], "1");
  EXPECT_EQ(reports["server-0"]["DMLC_TASK_ID"], "2");
  // Output: prefixed on the terminal, raw in <role>-<rank>.log.
  EXPECT_NE(run.output.find("[worker-1] worker-1: pid"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("[scheduler-0] scheduler: everyone has exited"), std::string::npos);
  for (const char* name : {"scheduler-0", "server-0", "server-1", "worker-0", "worker-1"}) {
    std::string log = ReadFile(dir_.Sub("logs") + "/" + name + ".log");
    EXPECT_NE(log.find(std::string(name) + ": pid"), std::string::npos) << name << ":\n" << log;
    EXPECT_EQ(log.find("[" + std::string(name) + "]"), std::string::npos) << "log files are raw";
  }
  EXPECT_TRUE(Survivors(reports).empty());

  // The job directory is a log parse-log reads: the workers' epochs, averaged.
  auto log = logtools::ReadLog(dir_.Sub("logs"), {"accuracy"});
  ASSERT_OK(log.status());
  std::string table = logtools::FormatTable(logtools::Summarize(*log, logtools::Op::kAvg),
                                            {"accuracy"}, logtools::TableFormat::kMarkdown);
  EXPECT_EQ(table,
            "| epoch | train-accuracy | valid-accuracy | time |\n"
            "| --- | --- | --- | --- |\n"
            "|  1 | 0.505000 | 0.455000 | 2.0 |\n"
            "|  2 | 0.605000 | 0.555000 | 2.0 |\n");
}

TEST_F(LocalLauncherTest, FailingProcessStopsTheJob) {
  LaunchRun run =
      RunLaunch(Args(dir_, {"--sleep=60", "--fail=worker:1:3"}), dir_.path(), 30000, env_);
  EXPECT_NE(run.exit_code(), 0) << run.output;
  EXPECT_LT(run.seconds, 15) << run.output;
  EXPECT_NE(run.output.find("worker-1 on 127.0.0.1"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("exited with code 3"), std::string::npos) << run.output;
  Reports reports = ReadReports(dir_.Sub("reports"));
  EXPECT_EQ(reports.size(), 5u) << run.output;
  EXPECT_EQ(Survivors(reports), std::vector<std::string>{}) << run.output;
}

// The pid of the job's process whose environment has DMLC_ROLE=`role`,
// PSTRAIN_LAUNCH_RANK=`rank` and `tag` (-1: none).
int FindJobProcess(const std::string& tag, const std::string& role, int rank) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto has = [&](const std::string& kv) { return env.find(kv + '\0') != std::string::npos; };
    if (has(tag) && has("DMLC_ROLE=" + role) &&
        (role == "scheduler" || has("PSTRAIN_LAUNCH_RANK=" + std::to_string(rank)))) {
      return std::stoi(name);
    }
  }
  return -1;
}

// A process of a real job that stops (SIGSTOP) is the one the summary names,
// not the first process to exit; and the launcher's "server-1" is the
// scheduler's server rank 1.
TEST_F(LocalLauncherTest, AStoppedProcessIsNamedInTheSummary) {
  for (const std::string victim : {"server", "scheduler"}) {
    SCOPED_TRACE(victim);
    TempDir dir;
    const std::string tag = StrCat("PROBE_JOB=", victim, getpid());
    Launch launch({"-n",
                   "2",
                   "-s",
                   "2",
                   "--launcher",
                   "local",
                   "--log-dir",
                   dir.Sub("logs"),
                   "--timeout",
                   "60",
                   "--env",
                   tag,
                   "--env",
                   "PSTRAIN_HEARTBEAT_TIMEOUT_MS=2000",
                   "--",
                   PstrainBinary(),
                   "kvbench",
                   "--tensor-bytes=4096",
                   "--tensors=4",
                   "--iters=100000000",
                   "--ceiling-iters=10",
                   "--mode=sync",
                   "--rounds=1"},
                  dir.path());
    const int rank = victim == "server" ? 1 : 0;
    ASSERT_TRUE(launch.PumpUntil([&] { return FindJobProcess(tag, victim, rank) > 0; }, 30000))
        << launch.output();
    // Past start-up: the table went out, the benchmark runs.
    launch.PumpUntil([] { return false; }, 1500);
    const int pid = FindJobProcess(tag, victim, rank);
    ASSERT_GT(pid, 0);
    ASSERT_EQ(kill(pid, SIGSTOP), 0);
    LaunchRun run = launch.Wait(30000);
    EXPECT_NE(run.exit_code(), 0) << run.output;
    EXPECT_LT(run.seconds, 25) << run.output;
    const std::string summary = run.output.substr(run.output.rfind("pstrain launch: job"));
    EXPECT_NE(summary.find(StrCat("failed: ", victim, "-", rank, " on 127.0.0.1 (pid ", pid,
                                  ", stopped) caused it; ")),
              std::string::npos)
        << summary;
    if (victim == "server") {
      EXPECT_NE(summary.find("the scheduler says: server rank 1 at 127.0.0.1:"), std::string::npos)
          << summary;
    } else {
      EXPECT_NE(summary.find("scheduler at 127.0.0.1:"), std::string::npos) << summary;
      EXPECT_NE(summary.find("silent for"), std::string::npos) << summary;
    }
    kill(pid, SIGKILL);
  }
}

// Two workers train the MLP on MNIST (dist_sync, 300 batches each, seeded)
// under the local launcher, with `options` for the launcher.
std::vector<std::string> MnistTrainingJob(const TempDir& dir, int servers,
                                          const std::vector<std::string>& options) {
  std::vector<std::string> args = {"-n",         "2",     "-s",        std::to_string(servers),
                                   "--launcher", "local", "--log-dir", dir.Sub("logs"),
                                   "--timeout",  "150"};
  args.insert(args.end(), options.begin(), options.end());
  const std::vector<std::string> train = {"--",
                                          PstrainBinary(),
                                          "train",
                                          "--network",
                                          "mlp",
                                          "--kv-store",
                                          "dist_sync",
                                          "--data-dir",
                                          SharedDataDir() + "/mnist",
                                          "--num-examples",
                                          "38400",
                                          "--num-epochs",
                                          "1",
                                          "--batch-size",
                                          "64",
                                          "--lr",
                                          "0.1",
                                          "--disp-batches",
                                          "10",
                                          "--num-threads",
                                          "1",
                                          "--seed",
                                          "7",
                                          "--model-prefix",
                                          dir.Sub("model")};
  args.insert(args.end(), train.begin(), train.end());
  return args;
}

// Waits until worker-1 is well into its epoch (it logged batch 30).
bool WellIntoTheEpoch(Launch& launch, const TempDir& dir) {
  return launch.PumpUntil(
      [&] {
        return ReadFile(dir.Sub("logs") + "/worker-1.log").find("Batch [30]") != std::string::npos;
      },
      120000);
}

// Server recovery end to end: a dist_sync training job whose server-1 is
// killed (SIGKILL) in the middle of training is restarted by the launcher,
// resumes from its snapshots, and the job saves exactly the model of an
// undisturbed run.
TEST_F(LocalLauncherTest, AServerKilledMidTrainingIsRestartedAndTheModelIsBitIdentical) {
  ASSERT_TRUE(std::filesystem::exists(SharedDataDir() + "/mnist/train-images-idx3-ubyte.gz"));
  auto options = [](const std::string& tag) {
    return std::vector<std::string>{
        "--restart-servers", "1", "--env", tag, "--env", "PSTRAIN_HEARTBEAT_TIMEOUT_MS=3000"};
  };
  TempDir calm;
  LaunchRun undisturbed =
      RunLaunch(MnistTrainingJob(calm, 2, options("PROBE_JOB=calm")), calm.path(), 150000);
  ASSERT_EQ(undisturbed.exit_code(), 0) << undisturbed.output;

  TempDir dir;
  const std::string tag = StrCat("PROBE_JOB=recovery", getpid());
  Launch launch(MnistTrainingJob(dir, 2, options(tag)), dir.path());
  ASSERT_TRUE(WellIntoTheEpoch(launch, dir)) << launch.output();
  const int pid = FindJobProcess(tag, "server", 1);
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  LaunchRun run = launch.Wait(150000);
  ASSERT_EQ(run.exit_code(), 0) << run.output;
  EXPECT_NE(run.output.find(StrCat("server-1 on 127.0.0.1 (pid ", pid,
                                   ") was killed by signal 9 (SIGKILL); restarting it")),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("(after 1 restart)"), std::string::npos) << run.output;
  EXPECT_NE(ReadFile(dir.Sub("logs") + "/server-1.log").find("resumed"), std::string::npos);
  EXPECT_NE(ReadFile(dir.Sub("logs") + "/worker-0.log").find("replaces the server process"),
            std::string::npos);
  const std::string expect = ReadFile(calm.Sub("model-0001.params"));
  ASSERT_GT(expect.size(), 100000u);
  EXPECT_TRUE(ReadFile(dir.Sub("model-0001.params")) == expect)
      << "the recovered run saved another model than the undisturbed one";
}

// --worker-loss continue: a training worker killed in the middle of an epoch
// is reported, and the job finishes with the other one.
TEST_F(LocalLauncherTest, AKilledWorkerIsLeftBehindWithWorkerLossContinue) {
  ASSERT_TRUE(std::filesystem::exists(SharedDataDir() + "/mnist/train-images-idx3-ubyte.gz"));
  TempDir dir;
  const std::string tag = StrCat("PROBE_JOB=lost", getpid());
  Launch launch(MnistTrainingJob(dir, 1,
                                 {"--worker-loss", "continue", "--env", tag, "--env",
                                  "PSTRAIN_HEARTBEAT_TIMEOUT_MS=2000"}),
                dir.path());
  ASSERT_TRUE(WellIntoTheEpoch(launch, dir)) << launch.output();
  const int pid = FindJobProcess(tag, "worker", 1);
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  LaunchRun run = launch.Wait(150000);
  ASSERT_EQ(run.exit_code(), 0) << run.output;
  EXPECT_NE(
      run.output.find(StrCat("worker-1 on 127.0.0.1 (pid ", pid,
                             ") was killed by signal 9 (SIGKILL); the job goes on without it")),
      std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("the 3 processes left exited 0; it went on without worker-1"),
            std::string::npos)
      << run.output;
  const std::string log = ReadFile(dir.Sub("logs") + "/worker-0.log");
  EXPECT_NE(log.find("is lost; the job goes on without it"), std::string::npos) << log;
  EXPECT_NE(log.find("Validation-accuracy="), std::string::npos) << log;
  EXPECT_NE(ReadFile(dir.Sub("logs") + "/server-0.log").find("rescaled by 2/1"), std::string::npos);
}

TEST_F(LocalLauncherTest, InterruptStopsEveryProcess) {
  for (int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig);
    TempDir dir;
    ASSERT_EQ(mkdir(dir.Sub("reports").c_str(), 0755), 0);
    Launch launch(Args(dir, {"--sleep=60"}), dir.path(), env_);
    ASSERT_TRUE(
        launch.PumpUntil([&] { return ReadReports(dir.Sub("reports")).size() == 5; }, 30000))
        << launch.output();
    Reports reports = ReadReports(dir.Sub("reports"));
    ASSERT_EQ(kill(launch.pid(), sig), 0);
    LaunchRun run = launch.Wait(20000);
    EXPECT_EQ(run.exit_code(), 128 + sig) << run.output;
    EXPECT_LT(run.seconds, 20);
    EXPECT_NE(run.output.find("interrupted by SIG"), std::string::npos) << run.output;
    EXPECT_EQ(Survivors(reports), std::vector<std::string>{}) << run.output;
  }
}

// --restart-servers: a server killed on its first run is started again with
// the same rank and PSTRAIN_RESTART=1, and the job still succeeds; one that
// keeps failing fails the job once its restarts are used up.
TEST_F(LocalLauncherTest, KilledServerIsRestarted) {
  const std::string script =
      "echo \"$DMLC_ROLE-$PSTRAIN_LAUNCH_RANK restart=${PSTRAIN_RESTART:-0} "
      "of=$PSTRAIN_SERVER_RESTARTS snapshots=$PSTRAIN_SNAPSHOT_DIR\"; "
      "if [ \"$DMLC_ROLE-$PSTRAIN_LAUNCH_RANK\" = server-1 ]; then "
      "  if [ -n \"$FAIL_ALWAYS\" ]; then exit 4; fi; "
      "  if [ -z \"${PSTRAIN_RESTART:-}\" ]; then kill -9 $$; fi; "
      "fi";
  auto args = [&](const TempDir& dir, const std::string& restarts) {
    return std::vector<std::string>{"-n",
                                    "1",
                                    "-s",
                                    "2",
                                    "--launcher",
                                    "local",
                                    "--log-dir",
                                    dir.Sub("logs"),
                                    "--timeout",
                                    "60",
                                    "--restart-servers",
                                    restarts,
                                    "--",
                                    "/bin/sh",
                                    "-c",
                                    script};
  };
  LaunchRun run = RunLaunch(args(dir_, "1"), dir_.path(), 30000);
  ASSERT_EQ(run.exit_code(), 0) << run.output;
  const std::string snapshots = dir_.Sub("logs") + "/snapshots";
  EXPECT_NE(run.output.find("pstrain launch: server-1 on 127.0.0.1 (pid "), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find(") was killed by signal 9 (SIGKILL); restarting it (restart 1 of 1)"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("[server-1] server-1 restart=1 of=1 snapshots=" + snapshots + "\n"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("[worker-0] worker-0 restart=0 of=1 snapshots=" + snapshots + "\n"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("all 4 processes exited 0 (after 1 restart)"), std::string::npos)
      << run.output;
  const std::string log = ReadFile(dir_.Sub("logs") + "/server-1.log");
  EXPECT_NE(log.find("server-1 restart=0"), std::string::npos) << log;
  EXPECT_LT(log.find("server-1 restart=0"), log.find("restarting it (restart 1 of 1)")) << log;
  EXPECT_LT(log.find("restarting it"), log.find("server-1 restart=1")) << log;
  EXPECT_EQ(ReadFile(dir_.Sub("logs") + "/server-0.log"),
            "server-0 restart=0 of=1 snapshots=" + snapshots + "\n")
      << "server-0 ran once";

  TempDir dir;
  run = RunLaunch(args(dir, "1"), dir.path(), 30000, {{"FAIL_ALWAYS", "1"}});
  EXPECT_EQ(run.exit_code(), 1) << run.output;
  EXPECT_NE(run.output.find("exited with code 4; restarting it (restart 1 of 1)"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("failed: server-1 on 127.0.0.1 (pid "), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("exited with code 4; it had been restarted 1 time, as many as allowed"),
            std::string::npos)
      << run.output;
}

TEST_F(LocalLauncherTest, CommandThatCannotRunIsAnError) {
  LaunchRun run = RunLaunch({"-n", "1", "--launcher", "local", "--log-dir", dir_.Sub("logs"), "--",
                             dir_.Sub("no-such-program")},
                            dir_.path(), 20000);
  EXPECT_EQ(run.exit_code(), 1) << run.output;
  EXPECT_NE(run.output.find("no-such-program"), std::string::npos) << run.output;
}

TEST_F(LocalLauncherTest, BadArgumentsPrintUsage) {
  LaunchRun run = RunLaunch({"--launcher", "local", "--", "true"}, dir_.path(), 20000);
  EXPECT_EQ(run.exit_code(), 2);
  EXPECT_NE(run.output.find("-n/--num-workers is required"), std::string::npos) << run.output;
  LaunchRun help = RunLaunch({"--help"}, dir_.path(), 20000);
  EXPECT_EQ(help.exit_code(), 0);
  EXPECT_NE(help.output.find("usage: pstrain launch"), std::string::npos);
}

}  // namespace
}  // namespace pstrain::testing
