// The live view on a real terminal: `pstrain launch` of a 2-worker LeNet job
// inside a detached tmux session (its own socket), read back with
// capture-pane; then `pstrain top --once` on the finished job's logs, and
// `pstrain top` following a running job until it is sent q.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/launcher/launch_test_util.h"
#include "tracker/shell.h"

namespace pstrain::testing {
namespace {

namespace fs = std::filesystem;

// Runs `argv` and returns its output; *status gets the wait status.
std::string RunCommand(const std::vector<std::string>& argv, int* status, int timeout_ms = 30000) {
  std::string out;
  Status s = tracker::RunAndCapture(argv, Environment().All(), timeout_ms, &out, status);
  EXPECT_OK(s);
  return out;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && line.back() == ' ') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> Fields(const std::string& line) {
  std::vector<std::string> fields;
  std::istringstream in(line);
  std::string f;
  while (in >> f) fields.push_back(f);
  return fields;
}

// The status line of `name` in a pane ("" if none).
std::string Row(const std::vector<std::string>& lines, const std::string& name) {
  for (const std::string& l : lines) {
    if (l.rfind(name + " ", 0) == 0) return l;
  }
  return "";
}

// The view's block in `lines`: from the PROCESS header through the summary.
std::vector<std::string> Block(const std::vector<std::string>& lines) {
  std::vector<std::string> block;
  for (const std::string& l : lines) {
    if (l.rfind("PROCESS ", 0) == 0) block.clear();
    if (!block.empty() || l.rfind("PROCESS ", 0) == 0) block.push_back(l);
    if (!block.empty() && l.find(" processes") != std::string::npos &&
        std::isdigit(static_cast<unsigned char>(l[0])) != 0)
      break;
  }
  return block;
}

// A tmux server of the test's own (-L socket), killed at the end.
class Tmux {
 public:
  Tmux() : socket_("pstrain-live-view-" + std::to_string(getpid())) {}
  // Kills the server (the sessions' processes get SIGHUP) and removes its
  // socket, which kill-server leaves behind.
  ~Tmux() {
    int status = 0;
    std::string path;
    Status s =
        tracker::RunAndCapture({"tmux", "-L", socket_, "display-message", "-p", "#{socket_path}"},
                               Environment().All(), 10000, &path, &status);
    std::string out;
    (void)tracker::RunAndCapture({"tmux", "-L", socket_, "kill-server"}, Environment().All(), 10000,
                                 &out, &status);
    while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
    if (s.ok() && path.find("/" + socket_) != std::string::npos) unlink(path.c_str());
  }
  static bool Available(std::string* why) {
    int status = 0;
    std::string out;
    Status s = tracker::RunAndCapture({"tmux", "-V"}, Environment().All(), 10000, &out, &status);
    if (s.ok() && WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
    *why = "tmux is not installed (Debian package tmux, in scripts/install-deps.sh): " + out;
    return false;
  }
  // A detached 160x40 session running `command` (a shell command line).
  void NewSession(const std::string& name, const std::string& command) {
    int status = 0;
    std::string out = RunCommand({"tmux", "-L", socket_, "-f", "/dev/null", "new-session", "-d",
                                  "-x", "160", "-y", "40", "-s", name, command},
                                 &status);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  }
  std::string Capture(const std::string& name) {
    int status = 0;
    return RunCommand({"tmux", "-L", socket_, "capture-pane", "-p", "-t", name}, &status);
  }
  void SendKeys(const std::string& name, const std::string& keys) {
    int status = 0;
    std::string out = RunCommand({"tmux", "-L", socket_, "send-keys", "-t", name, keys}, &status);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  }
  // Captures the pane every 200 ms until `done(pane)` or the deadline;
  // returns the last capture.
  std::string WaitFor(const std::string& name, const std::function<bool(const std::string&)>& done,
                      int timeout_ms) {
    Deadline deadline = Deadline::InMillis(timeout_ms);
    std::string pane;
    while (!deadline.Expired()) {
      pane = Capture(name);
      if (done(pane)) return pane;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ADD_FAILURE() << "tmux pane " << name << " not as expected within " << timeout_ms
                  << " ms; it shows:\n"
                  << pane;
    return pane;
  }

 private:
  std::string socket_;
};

// Both workers' lines show training: an epoch, a batch of 30, a speed.
bool WorkersTraining(const std::string& pane) {
  const std::vector<std::string> lines = Lines(pane);
  for (const char* w : {"worker-0", "worker-1"}) {
    std::vector<std::string> f = Fields(Row(lines, w));
    if (f.size() != 8 || f[2] != "running" || f[3] == "-" || f[5] == "-") return false;
  }
  return true;
}

TEST(LiveViewTest, LaunchShowsStatusLinesAndTopShowsTheSame) {
  std::string why;
  if (!Tmux::Available(&why)) GTEST_SKIP() << why;
  const std::string mnist = SharedDataDir() + "/mnist";
  ASSERT_TRUE(fs::exists(mnist + "/train-images-idx3-ubyte.gz")) << mnist;
  TempDir dir;
  const std::string logs = dir.Sub("logs");
  Tmux tmux;
  const std::vector<std::string> launch = {PstrainBinary(),
                                           "launch",
                                           "-n",
                                           "2",
                                           "-s",
                                           "1",
                                           "--launcher",
                                           "local",
                                           "--log-dir",
                                           logs,
                                           "--timeout",
                                           "240",
                                           "--",
                                           PstrainBinary(),
                                           "train",
                                           "--network",
                                           "lenet",
                                           "--kv-store",
                                           "dist_sync",
                                           "--data-dir",
                                           mnist,
                                           "--num-examples",
                                           "6000",
                                           "--num-epochs",
                                           "2",
                                           "--batch-size",
                                           "100",
                                           "--disp-batches",
                                           "5"};
  tmux.NewSession("launch", "cd " + tracker::ShellQuote(dir.path()) + " && " +
                                tracker::ShellJoin(launch) + "; echo LAUNCH-EXIT=$?; sleep 600");

  // While it runs: one line per process, the workers' with their progress.
  std::string pane = tmux.WaitFor("launch", WorkersTraining, 180000);
  std::vector<std::string> lines = Lines(pane);
  for (const char* w : {"worker-0", "worker-1"}) {
    SCOPED_TRACE(w);
    std::vector<std::string> f = Fields(Row(lines, w));
    ASSERT_EQ(f.size(), 8u) << pane;
    EXPECT_EQ(f[1], "127.0.0.1");
    EXPECT_TRUE(f[3] == "1/2" || f[3] == "2/2") << f[3];
    EXPECT_EQ(f[4].substr(f[4].find('/')), "/30") << f[4];
    EXPECT_GT(std::stod(f[5]), 0) << f[5];
    EXPECT_NE(f[6].find("accuracy="), std::string::npos) << f[6];
  }
  for (const char* p : {"scheduler-0", "server-0"}) {
    EXPECT_NE(Row(lines, p), "") << p << " in\n" << pane;
  }
  EXPECT_EQ(pane.find("Speed:"), std::string::npos) << "the view replaces the output:\n" << pane;

  // The end: the final state stays, and the usual summary below it.
  pane = tmux.WaitFor(
      "launch", [](const std::string& p) { return p.find("LAUNCH-EXIT=") != std::string::npos; },
      180000);
  ASSERT_NE(pane.find("LAUNCH-EXIT=0"), std::string::npos) << pane;
  EXPECT_NE(pane.find("finished: all 4 processes exited 0"), std::string::npos) << pane;
  lines = Lines(pane);
  const std::vector<std::string> final_block = Block(lines);
  ASSERT_EQ(final_block.size(), 6u) << pane;
  EXPECT_EQ(final_block.back(), "4 processes: 4 done") << pane;
  for (const char* w : {"worker-0", "worker-1"}) {
    std::vector<std::string> f = Fields(Row(lines, w));
    ASSERT_EQ(f.size(), 8u) << pane;
    EXPECT_EQ(f[2], "done");
    EXPECT_EQ(f[3], "2/2");
    EXPECT_EQ(f[4], "30/30");
    EXPECT_EQ(f[6].rfind("val-accuracy=", 0), 0u) << f[6];
    EXPECT_EQ(f[7], "-");
  }
  // The full logs are in the log directory.
  for (const char* w : {"worker-0", "worker-1"}) {
    const std::string log = ReadFile(logs + "/" + w + ".log");
    for (const char* want : {"Epoch[0] Start: 30 batches of 100 samples; --num-epochs 2",
                             "Epoch[0] Batch [25]\tSpeed: ", "Epoch[1] Train-accuracy=",
                             "Epoch[1] Validation-accuracy="}) {
      EXPECT_NE(log.find(want), std::string::npos) << w << " lacks " << want << ":\n" << log;
    }
  }
  EXPECT_NE(ReadFile(logs + "/launch.log").find(" end ok all 4 processes exited 0"),
            std::string::npos);

  // top --once on the finished job: the same block.
  int status = 0;
  const std::string top = RunCommand({PstrainBinary(), "top", logs, "--once"}, &status);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << top;
  std::vector<std::string> top_lines = Lines(top);
  ASSERT_FALSE(top_lines.empty());
  EXPECT_NE(top_lines[0].find(": finished: all 4 processes exited 0"), std::string::npos) << top;
  EXPECT_EQ(Block(top_lines), final_block) << top << "\nvs the pane:\n" << pane;
}

TEST(LiveViewTest, TopFollowsARunningJobUntilQ) {
  std::string why;
  if (!Tmux::Available(&why)) GTEST_SKIP() << why;
  TempDir dir;
  const std::string logs = dir.Sub("logs");
  // A job whose workers print a trainer's lines for up to a minute.
  const std::string script =
      "echo 'INFO:root:Epoch[0] Start: 500 batches of 10 samples; --num-epochs 1'; i=0; "
      "while [ $i -lt 300 ]; do i=$((i+1)); "
      "printf 'INFO:root:Epoch[0] Batch [%d]\\tSpeed: 50.00 samples/sec\\taccuracy=0.5\\n' $i; "
      "sleep 0.2; done";
  Launch launch({"-n", "2", "-s", "1", "--launcher", "local", "--log-dir", logs, "--timeout", "90",
                 "--no-keys", "--", "sh", "-c", script},
                dir.path());
  ASSERT_TRUE(launch.PumpUntil([&] { return fs::exists(logs + "/worker-1.log"); }, 30000));

  Tmux tmux;
  tmux.NewSession(
      "top", tracker::ShellJoin({PstrainBinary(), "top", logs}) + "; echo TOP-EXIT=$?; sleep 600");
  std::string pane;
  Deadline deadline = Deadline::InMillis(60000);
  // Batch counts grow while top follows.
  int first = -1, later = -1;
  while (!deadline.Expired() && (first < 0 || later <= first)) {
    launch.PumpUntil([] { return false; }, 200);
    pane = tmux.Capture("top");
    std::vector<std::string> f = Fields(Row(Lines(pane), "worker-1"));
    if (f.size() != 8 || f[2] != "running" || f[4] == "-") continue;
    const int batches = std::stoi(f[4]);
    if (first < 0) {
      first = batches;
      EXPECT_EQ(f[3], "1/1");
      EXPECT_EQ(f[4].substr(f[4].find('/')), "/500");
      EXPECT_EQ(f[5], "50.0");
      EXPECT_EQ(f[6], "accuracy=0.500000");
      // (500 - batches) * 10 samples at 50 samples/s.
      EXPECT_NE(f[7], "-");
    } else {
      later = batches;
    }
  }
  ASSERT_GT(later, first) << pane;
  EXPECT_NE(pane.find(": running"), std::string::npos) << pane;
  tmux.SendKeys("top", "q");
  pane = tmux.WaitFor(
      "top", [](const std::string& p) { return p.find("TOP-EXIT=") != std::string::npos; }, 20000);
  EXPECT_NE(pane.find("TOP-EXIT=0"), std::string::npos) << pane;
  EXPECT_NE(Row(Lines(pane), "worker-0"), "") << "the last frame stays:\n" << pane;

  // The job itself goes on until stopped; stop it (SIGTERM to the launcher we started).
  ASSERT_GT(launch.pid(), 0);
  EXPECT_FALSE(ProcessGone(launch.pid())) << "q ends top, not the job";
  kill(launch.pid(), SIGTERM);
  LaunchRun run = launch.Wait(30000);
  EXPECT_EQ(run.exit_code(), 128 + SIGTERM) << run.output;
}

// Without a terminal, top follows a running job to its end, or until
// --timeout-s: then it prints the frame it has and exits 124 (a launcher that
// died on another host never writes the end).
TEST(LiveViewTest, TopWithoutATerminalStopsAtItsTimeout) {
  TempDir dir;
  const std::string logs = dir.Sub("logs");
  Launch launch({"-n", "1", "-s", "1", "--launcher", "local", "--log-dir", logs, "--timeout", "90",
                 "--no-keys", "--", "sh", "-c", "echo started; sleep 60"},
                dir.path());
  ASSERT_TRUE(launch.PumpUntil([&] { return fs::exists(logs + "/worker-0.log"); }, 30000));
  int status = 0;
  const auto start = SteadyClock::now();
  const std::string out =
      RunCommand({PstrainBinary(), "top", logs, "--timeout-s", "1"}, &status, 20000);
  const auto took = SteadyClock::now() - start;
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 124) << out;
  EXPECT_NE(out.find("the job had not ended after --timeout-s 1"), std::string::npos) << out;
  EXPECT_NE(out.find(": running"), std::string::npos) << out;
  EXPECT_GE(took, std::chrono::seconds(1));
  EXPECT_LT(took, std::chrono::seconds(15));
  int bad = 0;
  RunCommand({PstrainBinary(), "top", logs, "--timeout-s", "-1"}, &bad);
  EXPECT_TRUE(WIFEXITED(bad) && WEXITSTATUS(bad) == 2);

  ASSERT_GT(launch.pid(), 0);
  kill(launch.pid(), SIGTERM);
  LaunchRun run = launch.Wait(30000);
  EXPECT_EQ(run.exit_code(), 128 + SIGTERM) << run.output;
}

}  // namespace
}  // namespace pstrain::testing
