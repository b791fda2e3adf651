// The ssh launcher against a real OpenSSH server that the test starts on
// 127.0.0.1 on a free port, with throw-away host and user keys and a
// known_hosts file, so host-key checking stays on.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "net/job_keys.h"
#include "tests/launcher/launch_test_util.h"
#include "tracker/launcher.h"

namespace pstrain::testing {
namespace {

class SshLauncherTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    keys_ = new TempDir();
    const std::string& d = keys_->path();
    auto run = [](const std::vector<std::string>& argv) {
      std::string out;
      int status = 0;
      Status s = tracker::RunAndCapture(argv, Environment().All(), 30000, &out, &status);
      return s.ok() && status == 0 ? std::string() : "'" + argv[0] + "' failed: " + out;
    };
    for (const char* key : {"hostkey", "userkey"}) {
      std::string err = run({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", d + "/" + key});
      if (!err.empty()) {
        setup_error_ = err;
        return;
      }
    }
    WriteFile(d + "/authorized_keys", ReadFile(d + "/userkey.pub"));
    chmod((d + "/authorized_keys").c_str(), 0600);
    if (geteuid() == 0) mkdir("/run/sshd", 0755);  // sshd's privilege-separation directory
    // A port found free may be taken by a test running beside this one before
    // sshd binds it; sshd then exits, and a fresh port is tried.
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (sshd_ != nullptr) {
        delete sshd_;
        sshd_ = nullptr;
      }
      auto port = tracker::FindFreePort("127.0.0.1");
      if (!port.ok()) {
        setup_error_ = port.status().ToString();
        return;
      }
      port_ = *port;
      WriteFile(d + "/sshd_config",
                StrCat("Port ", port_, "\nListenAddress 127.0.0.1\nHostKey ", d,
                       "/hostkey\nAuthorizedKeysFile ", d, "/authorized_keys\nPidFile ", d,
                       "/sshd.pid\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n"
                       "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
                       "PermitRootLogin yes\nMaxStartups 100\nMaxSessions 100\n"));
      std::string host_key = ReadFile(d + "/hostkey.pub");
      host_key = host_key.substr(0, host_key.find(' ', host_key.find(' ') + 1));
      WriteFile(d + "/known_hosts", StrCat("[127.0.0.1]:", port_, " ", host_key,
                                           "\n[localhost]:", port_, " ", host_key, "\n"));
      WriteFile(d + "/empty_known_hosts", "");
      WriteFile(d + "/hosts", StrCat("# two names for this host\n127.0.0.1:", port_,
                                     "\n\nlocalhost:", port_, "  slots=2\n"));
      tracker::ProcessSpec spec;
      spec.argv = {"/usr/sbin/sshd", "-D", "-f", d + "/sshd_config", "-E", d + "/sshd.log"};
      spec.env = Environment().All();
      auto sshd = tracker::Subprocess::Start(spec);
      if (!sshd.ok()) {
        setup_error_ = sshd.status().ToString();
        return;
      }
      sshd_ = std::move(sshd).value().release();
      // Ready when a real ssh login works.
      Deadline deadline = Deadline::InMillis(20000);
      while (!deadline.Expired()) {
        if (run({"ssh", "-T", "-o", "BatchMode=yes", "-o", "IdentityFile=" + d + "/userkey", "-o",
                 "UserKnownHostsFile=" + d + "/known_hosts", "-p", std::to_string(port_),
                 "127.0.0.1", "true"})
                .empty()) {
          return;
        }
        if (sshd_->Poll()) break;  // exited: most likely the port was taken meanwhile
        usleep(100000);
      }
      if (!sshd_->Poll()) break;  // running but no login in 20 s: not the port
    }
    setup_error_ = "sshd did not come up: " + ReadFile(d + "/sshd.log");
  }

  static void TearDownTestSuite() {
    if (sshd_ != nullptr) {
      sshd_->SignalGroup(SIGTERM);
      delete sshd_;
      sshd_ = nullptr;
    }
    delete keys_;
    keys_ = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(setup_error_.empty()) << setup_error_;
    ASSERT_EQ(mkdir(dir_.Sub("reports").c_str(), 0755), 0);
    ASSERT_EQ(mkdir(dir_.Sub("work").c_str(), 0755), 0);
  }

  std::vector<std::string> Args(std::vector<std::string> launcher_extra,
                                std::vector<std::string> probe_extra,
                                const std::string& known_hosts = "known_hosts") {
    const std::string& d = keys_->path();
    std::vector<std::string> args = {"-n",           "2",
                                     "-s",           "2",
                                     "-H",           d + "/hosts",
                                     "--log-dir",    dir_.Sub("logs"),
                                     "--timeout",    "60",
                                     "--ssh-option", "IdentityFile=" + d + "/userkey",
                                     "--ssh-option", "IdentitiesOnly=yes",
                                     "--ssh-option", "UserKnownHostsFile=" + d + "/" + known_hosts,
                                     "--env",        "PROBE_SPACEY=" + kSpacey,
                                     "--env",        "PROBE_FORWARDED"};
    args.insert(args.end(), launcher_extra.begin(), launcher_extra.end());
    std::vector<std::string> cmd = {"--", EnvProbe(), "--out=" + dir_.Sub("reports"),
                                    "--show=PROBE_SPACEY,PROBE_FORWARDED,PSTRAIN_PROBE_AUTO,"
                                    "PSTRAIN_KEY_FILE"};
    args.insert(args.end(), cmd.begin(), cmd.end());
    args.insert(args.end(), probe_extra.begin(), probe_extra.end());
    return args;
  }

  std::map<std::string, std::string> env_ = {{"PROBE_FORWARDED", "from the launcher"},
                                             {"PSTRAIN_PROBE_AUTO", "forwarded $too"}};
  TempDir dir_;
  static TempDir* keys_;
  static tracker::Subprocess* sshd_;
  static int port_;
  static std::string setup_error_;
};

TempDir* SshLauncherTest::keys_ = nullptr;
tracker::Subprocess* SshLauncherTest::sshd_ = nullptr;
int SshLauncherTest::port_ = 0;
std::string SshLauncherTest::setup_error_;

TEST_F(SshLauncherTest, TwoServersTwoWorkersOverSsh) {
  LaunchRun run = RunLaunch(Args({}, {"plain", kSpacey, "it's"}), dir_.Sub("work"), 60000, env_);
  ASSERT_EQ(run.exit_code(), 0) << run.output;
  Reports reports = ReadReports(dir_.Sub("reports"));
  ExpectJobReports(reports, 2, 2, "ssh");
  // MXNet placement: task i < S is server i, host i mod H.
  EXPECT_EQ(reports["server-0"]["DMLC_NODE_HOST"], "127.0.0.1");
  EXPECT_EQ(reports["server-1"]["DMLC_NODE_HOST"], "localhost");
  EXPECT_EQ(reports["worker-0"]["DMLC_NODE_HOST"], "127.0.0.1");
  EXPECT_EQ(reports["worker-1"]["DMLC_NODE_HOST"], "localhost");
  EXPECT_EQ(reports["worker-1"]["DMLC_TASK_ID"], "3");
  for (const auto& [name, kv] : reports) {
    SCOPED_TRACE(name);
    EXPECT_EQ(kv.at("DMLC_PS_ROOT_URI"), "127.0.0.1");
    EXPECT_EQ(kv.at("PROBE_SPACEY"), kSpacey);
    EXPECT_EQ(kv.at("PROBE_FORWARDED"), "from the launcher");
    EXPECT_EQ(kv.at("PSTRAIN_PROBE_AUTO"), "forwarded $too");
    // The job's keys: the scheduler (here) reads the launcher's file; the
    // others got theirs over the ssh session into a private file of the
    // remote side (never on a command line), gone at the end.
    const std::string key = kv.at("PSTRAIN_KEY_FILE");
    if (name == "scheduler-0") {
      EXPECT_EQ(key, dir_.Sub("logs") + "/job.key");
    } else {
      EXPECT_NE(key, dir_.Sub("logs") + "/job.key");
      EXPECT_FALSE(key.empty());
      EXPECT_FALSE(std::filesystem::exists(key)) << key;
    }
    EXPECT_EQ(run.output.find("server-secret"), std::string::npos);
    EXPECT_EQ(kv.at("cwd"), dir_.Sub("work"));
    EXPECT_EQ(kv.at("arg0"), "plain");
    EXPECT_EQ(kv.at("arg1"), kSpacey);
    EXPECT_EQ(kv.at("arg2"), "it's");
  }
  EXPECT_NE(ReadFile(dir_.Sub("logs") + "/worker-1.log").find("Epoch[1] Train-accuracy=0.61"),
            std::string::npos);
  EXPECT_NE(run.output.find("[server-1] server-1: pid"), std::string::npos) << run.output;
  EXPECT_EQ(Survivors(reports), std::vector<std::string>{});
}

// The parameter server's conformance check as the job: servers and workers on
// "127.0.0.1" and "localhost" (a host name) talk to each other through ssh-started processes.
TEST_F(SshLauncherTest, KvbenchVerifyOverSsh) {
  const std::string& d = keys_->path();
  LaunchRun run = RunLaunch({"-n",           "2",
                             "-s",           "2",
                             "-H",           d + "/hosts",
                             "--log-dir",    dir_.Sub("logs"),
                             "--timeout",    "90",
                             "--ssh-option", "IdentityFile=" + d + "/userkey",
                             "--ssh-option", "IdentitiesOnly=yes",
                             "--ssh-option", "UserKnownHostsFile=" + d + "/known_hosts",
                             "--",           PstrainBinary(),
                             "kvbench",      "--verify"},
                            dir_.Sub("work"), 120000, env_);
  ASSERT_EQ(run.exit_code(), 0) << run.output;
  EXPECT_NE(run.output.find("verify dist_sync ok"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("verify dist_async ok"), std::string::npos) << run.output;
}

// No key file travels with the copy: an earlier job's left in its log
// folder (job.key) or the job's own given one lying in the folder copied.
TEST_F(SshLauncherTest, SyncDstDirCopiesTheWorkingDirectoryFirst) {
  WriteFile(dir_.Sub("work") + "/marker file.txt", "synced");
  std::filesystem::create_directories(dir_.Sub("work") + "/logs/old-job");
  WriteFile(dir_.Sub("work") + "/logs/old-job/job.key", "an earlier job's keys");
  const std::string given = dir_.Sub("work") + "/my-keys";
  auto keys = GenerateJobKeys();
  ASSERT_OK(keys.status());
  ASSERT_OK(WriteJobKeys(*keys, given));
  LaunchRun run =
      RunLaunch(Args({"--sync-dst-dir", dir_.Sub("remote dir"), "--key-file", given}, {}),
                dir_.Sub("work"), 60000, env_);
  ASSERT_EQ(run.exit_code(), 0) << run.output;
  EXPECT_EQ(ReadFile(dir_.Sub("remote dir") + "/marker file.txt"), "synced");
  EXPECT_FALSE(std::filesystem::exists(dir_.Sub("remote dir") + "/logs/old-job/job.key"));
  EXPECT_FALSE(std::filesystem::exists(dir_.Sub("remote dir") + "/my-keys"));
  Reports reports = ReadReports(dir_.Sub("reports"));
  ASSERT_EQ(reports.size(), 5u);
  EXPECT_EQ(reports["worker-0"]["cwd"], dir_.Sub("remote dir"));
  EXPECT_EQ(reports["scheduler-0"]["cwd"], dir_.Sub("work"));  // the scheduler stays here

  // The key file named through a link to the folder (the launcher's working
  // directory is the folder's real path), and a name rsync would read as a
  // pattern: it stays here all the same.
  std::filesystem::create_directory_symlink(dir_.Sub("work"), dir_.Sub("alias"));
  const std::string odd = "keys [1]*?\\";
  ASSERT_OK(WriteJobKeys(*keys, dir_.Sub("work") + "/" + odd));
  LaunchRun aliased = RunLaunch(
      Args({"--sync-dst-dir", dir_.Sub("remote 2"), "--key-file", dir_.Sub("alias") + "/" + odd},
           {}),
      dir_.Sub("work"), 60000, env_);
  ASSERT_EQ(aliased.exit_code(), 0) << aliased.output;
  EXPECT_EQ(ReadFile(dir_.Sub("remote 2") + "/marker file.txt"), "synced");
  EXPECT_FALSE(std::filesystem::exists(dir_.Sub("remote 2") + "/" + odd));
}

TEST_F(SshLauncherTest, FailingRemoteProcessStopsTheJob) {
  LaunchRun run =
      RunLaunch(Args({}, {"--sleep=60", "--fail=worker:1:3"}), dir_.Sub("work"), 60000, env_);
  EXPECT_NE(run.exit_code(), 0) << run.output;
  EXPECT_LT(run.seconds, 20) << run.output;
  EXPECT_NE(run.output.find(StrCat("worker-1 on localhost:", port_)), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("exited with code 3"), std::string::npos) << run.output;
  Reports reports = ReadReports(dir_.Sub("reports"));
  EXPECT_EQ(reports.size(), 5u) << run.output;
  EXPECT_EQ(Survivors(reports), std::vector<std::string>{}) << run.output;
}

// --restart-servers over ssh: a remote server killed on its first run is
// started again through a new ssh session, and the restart's remote command
// carries PSTRAIN_RESTART (the ssh client's environment does not travel).
TEST_F(SshLauncherTest, KilledRemoteServerIsRestarted) {
  const std::string& d = keys_->path();
  const std::string script =
      "echo \"$DMLC_ROLE-$PSTRAIN_LAUNCH_RANK restart=${PSTRAIN_RESTART:-0} "
      "of=$PSTRAIN_SERVER_RESTARTS snapshots=$PSTRAIN_SNAPSHOT_DIR\"; "
      "if [ \"$DMLC_ROLE-$PSTRAIN_LAUNCH_RANK\" = server-1 ] && [ -z \"${PSTRAIN_RESTART:-}\" ]; "
      "then kill -9 $$; fi";
  LaunchRun run = RunLaunch({"-n",
                             "1",
                             "-s",
                             "2",
                             "-H",
                             d + "/hosts",
                             "--log-dir",
                             dir_.Sub("logs"),
                             "--timeout",
                             "60",
                             "--restart-servers",
                             "1",
                             "--ssh-option",
                             "IdentityFile=" + d + "/userkey",
                             "--ssh-option",
                             "IdentitiesOnly=yes",
                             "--ssh-option",
                             "UserKnownHostsFile=" + d + "/known_hosts",
                             "--",
                             "/bin/sh",
                             "-c",
                             script},
                            dir_.Sub("work"), 60000, env_);
  ASSERT_EQ(run.exit_code(), 0) << run.output;
  const std::string snapshots = dir_.Sub("logs") + "/snapshots";
  // The remote wrapper reports the job's death by SIGKILL as exit code 137.
  EXPECT_NE(run.output.find(StrCat("pstrain launch: server-1 on localhost:", port_, " (pid ")),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find(") exited with code 137; restarting it (restart 1 of 1)"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("[server-1] server-1 restart=1 of=1 snapshots=" + snapshots + "\n"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("[server-0] server-0 restart=0 of=1 snapshots=" + snapshots + "\n"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("all 4 processes exited 0 (after 1 restart)"), std::string::npos)
      << run.output;
}

TEST_F(SshLauncherTest, InterruptStopsRemoteProcesses) {
  Launch launch(Args({}, {"--sleep=60"}), dir_.Sub("work"), env_);
  ASSERT_TRUE(launch.PumpUntil([&] { return ReadReports(dir_.Sub("reports")).size() == 5; }, 30000))
      << launch.output();
  Reports reports = ReadReports(dir_.Sub("reports"));
  ASSERT_EQ(kill(launch.pid(), SIGINT), 0);
  LaunchRun run = launch.Wait(30000);
  EXPECT_EQ(run.exit_code(), 128 + SIGINT) << run.output;
  EXPECT_LT(run.seconds, 25);
  EXPECT_EQ(Survivors(reports), std::vector<std::string>{}) << run.output;
}

TEST_F(SshLauncherTest, KilledLauncherLeavesNoRemoteProcess) {
  Launch launch(Args({}, {"--sleep=60"}), dir_.Sub("work"), env_);
  ASSERT_TRUE(launch.PumpUntil([&] { return ReadReports(dir_.Sub("reports")).size() == 5; }, 30000))
      << launch.output();
  Reports reports = ReadReports(dir_.Sub("reports"));
  ASSERT_EQ(kill(launch.pid(), SIGKILL), 0);
  launch.Wait(10000);
  // ssh gets SIGTERM when its parent dies; the remote wrapper sees the session
  // end and kills the job's process group.
  EXPECT_EQ(Survivors(reports, 10000), std::vector<std::string>{});
  // The remote side's key files go with the session too: the wrapper once
  // died of SIGPIPE reporting the killed job to the gone channel, before its rm.
  for (const auto& [name, kv] : reports) {
    if (name == "scheduler-0") continue;
    const std::string key = kv.at("PSTRAIN_KEY_FILE");
    ASSERT_FALSE(key.empty()) << name;
    Deadline gone = Deadline::InMillis(5000);
    while (std::filesystem::exists(key) && !gone.Expired()) usleep(20000);
    EXPECT_FALSE(std::filesystem::exists(key)) << name << " left its key file " << key;
  }
}

TEST_F(SshLauncherTest, UnknownHostKeyIsRefusedUnlessCheckingIsTurnedOff) {
  LaunchRun refused = RunLaunch(Args({}, {}, "empty_known_hosts"), dir_.Sub("work"), 60000, env_);
  EXPECT_NE(refused.exit_code(), 0) << refused.output;
  EXPECT_NE(refused.output.find("Host key verification failed"), std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("exited with code 255"), std::string::npos) << refused.output;

  TempDir other;
  ASSERT_EQ(mkdir(other.Sub("reports").c_str(), 0755), 0);
  std::vector<std::string> args = Args({"--no-host-key-check"}, {}, "empty_known_hosts");
  for (std::string& a : args) {
    if (a == "--out=" + dir_.Sub("reports")) a = "--out=" + other.Sub("reports");
  }
  LaunchRun accepted = RunLaunch(args, dir_.Sub("work"), 60000, env_);
  EXPECT_EQ(accepted.exit_code(), 0) << accepted.output;
  EXPECT_EQ(ReadReports(other.Sub("reports")).size(), 5u);
}

}  // namespace
}  // namespace pstrain::testing
