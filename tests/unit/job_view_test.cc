// The live view of a job: the log-line parser it shares with parse-log, the
// job model fed by recorded log lines and launcher events, the rendered
// frames (golden, fixed widths), following a job directory, and the terminal
// block's escape sequences.
#include "logtools/job_view.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "logtools/live_display.h"
#include "logtools/log_line.h"
#include "tests/test_util.h"
#include "worker/train_log.h"

namespace pstrain::logtools {
namespace {

using Kind = LogLine::Kind;

// Lines of worker-1 of a 2-worker LeNet job (pstrain launch -n 2 -s 1 ...
// train --network lenet --num-examples 6000 --num-epochs 2 --batch-size 100
// --disp-batches 5), as its log recorded them; the first epoch.
const char* const kWorkerEpoch0[] = {
    "INFO:root:train data: MNIST train part 1/2, 30000 examples, batch 100, shuffled; 30 batches "
    "per epoch",
    "INFO:root:validation data: MNIST validation part 1/2, 5000 examples, batch 100",
    "INFO:root:optimizer: type: SGD learning_rate: 0.05 momentum: 0.9 wd: 0.0001 rescale_grad: "
    "0.005 clip_gradient: -1",
    "INFO:root:Epoch[0] Start: 30 batches of 100 samples; --num-epochs 2",
    "INFO:root:Epoch[0] Batch [5]\tSpeed: 840.15 samples/sec\taccuracy=0.380000",
    "INFO:root:Epoch[0] Batch [10]\tSpeed: 1762.96 samples/sec\taccuracy=0.802000",
    "INFO:root:Epoch[0] Batch [15]\tSpeed: 2336.37 samples/sec\taccuracy=0.864000",
    "INFO:root:Epoch[0] Batch [20]\tSpeed: 335.25 samples/sec\taccuracy=0.872000",
};
const char* const kWorkerEpoch0End[] = {
    "INFO:root:Epoch[0] Batch [25]\tSpeed: 305.27 samples/sec\taccuracy=0.904000",
    "INFO:root:Epoch[0] Train-accuracy=0.910000",
    "INFO:root:Epoch[0] Time cost=5.431",
    "INFO:root:Epoch[0] Validation-accuracy=0.939400",
    "INFO:root:Epoch[1] Start: 30 batches of 100 samples; --num-epochs 2",
};

JobEvent Start(const std::string& name, int pid) {
  JobEvent e;
  e.kind = JobEvent::Kind::kStart;
  e.name = name;
  e.host = "127.0.0.1";
  e.pid = pid;
  e.time = "2026-11-23T02:20:31.000Z";
  return e;
}

JobEvent Exit(const std::string& name, int code, int signal = 0, bool stopped = false) {
  JobEvent e;
  e.kind = JobEvent::Kind::kExit;
  e.name = name;
  e.exit_code = code;
  e.signal = signal;
  e.stopped = stopped;
  e.time = "2026-11-23T02:20:51.000Z";
  return e;
}

std::string Join(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

TEST(LogLineTest, OurLinesAndMxnetsVariants) {
  LogLine l = ParseLogLine("INFO:root:Epoch[3] Start: 469 batches of 128 samples; --num-epochs 10");
  EXPECT_EQ(l.kind, Kind::kEpochStart);
  EXPECT_EQ(l.epoch, 3);
  EXPECT_EQ(l.epoch_batches, 469);
  EXPECT_EQ(l.batch_size, 128);
  EXPECT_EQ(l.num_epochs, 10);
  // The trainer's line is exactly what the parser reads.
  l = ParseLogLine(FormatEpochStartLine(1, 30, 100, 2));
  EXPECT_EQ(l.kind, Kind::kEpochStart);
  EXPECT_EQ(l.epoch, 1);
  EXPECT_EQ(l.epoch_batches, 30);
  EXPECT_EQ(l.batch_size, 100);
  EXPECT_EQ(l.num_epochs, 2);

  l = ParseLogLine(
      "[worker-0] 2026-11-22 01:02:03,456 Node[0] Epoch[2] Batch [20]\tSpeed: 812.50 "
      "samples/sec\taccuracy=0.100000\ttop_k_accuracy_5=0.300000\r");
  EXPECT_EQ(l.kind, Kind::kBatch);
  EXPECT_EQ(l.epoch, 2);
  EXPECT_EQ(l.batch, 20);
  EXPECT_DOUBLE_EQ(l.samples_per_sec, 812.5);
  ASSERT_EQ(l.metrics.size(), 2u);
  EXPECT_EQ(l.metrics[0].first, "accuracy");
  EXPECT_DOUBLE_EQ(l.metrics[0].second, 0.1);
  EXPECT_EQ(l.metrics[1].first, "top_k_accuracy_5");
  // MXNet 1.4+: a batch range; MXNet 0.9: Train- metrics; 2015: Iter[N]; --test-io: no epoch.
  l = ParseLogLine("Epoch[1] Batch [40-60]\tSpeed: 1000.00 samples/sec\taccuracy=0.5");
  EXPECT_EQ(l.kind, Kind::kBatch);
  EXPECT_EQ(l.batch, 60);
  l = ParseLogLine("Epoch[0] Batch [50]\tSpeed: 99.00 samples/sec\tTrain-accuracy=0.25");
  ASSERT_EQ(l.metrics.size(), 1u);
  EXPECT_EQ(l.metrics[0].first, "accuracy");
  l = ParseLogLine("INFO:root:Iter[7] Batch [10]\tSpeed: 345.68 samples/sec");
  EXPECT_EQ(l.kind, Kind::kBatch);
  EXPECT_EQ(l.epoch, 7);
  EXPECT_TRUE(l.metrics.empty());
  l = ParseLogLine(FormatTestIoLine(99, 1234.5));
  EXPECT_EQ(l.kind, Kind::kBatch);
  EXPECT_EQ(l.epoch, -1);
  EXPECT_EQ(l.batch, 99);

  l = ParseLogLine("INFO:root:Epoch[4] Validation-top_k_accuracy_5=0.912");
  EXPECT_EQ(l.kind, Kind::kValidationMetric);
  EXPECT_EQ(l.metrics.at(0).first, "top_k_accuracy_5");
  l = ParseLogLine(FormatTimeCostLine(4, 70.614));
  EXPECT_EQ(l.kind, Kind::kTimeCost);
  EXPECT_DOUBLE_EQ(l.seconds, 70.614);

  for (const char* junk : {"", "Epoch[x] Train-accuracy=0.9", "garbage Epoch[3 Train-accuracy=1",
                           "Epoch[1] Start: many batches", "Epoch[0] Batch [5] Speed: fast",
                           "Epoch[0] Resetting Data Iterator", "Batch [3]"}) {
    EXPECT_EQ(ParseLogLine(junk).kind, Kind::kNone) << junk;
  }
}

TEST(JobEventTest, LinesRoundTrip) {
  JobEvent job;
  job.kind = JobEvent::Kind::kJob;
  job.name = "20261123-022031-28016";
  job.pid = 28016;
  job.host = "vm";
  job.time = "2026-11-23T02:20:31.123Z";
  EXPECT_EQ(FormatJobEvent(job),
            "2026-11-23T02:20:31.123Z job pid=28016 host=vm id=20261123-022031-28016");
  JobEvent start = Start("worker-1", 42);
  start.host = "node 7";  // the host is last: spaces survive
  JobEvent end;
  end.kind = JobEvent::Kind::kEnd;
  end.ok = false;
  end.text = "worker-1 on 127.0.0.1 (pid 42) exited with code 3";
  end.time = "t";
  for (const JobEvent& e : {job, start, Exit("worker-1", 3), Exit("server-0", 0, 15, true),
                            Exit("server-1", 0, 9), end}) {
    const std::string line = FormatJobEvent(e);
    SCOPED_TRACE(line);
    JobEvent back;
    ASSERT_TRUE(ParseJobEvent(line, &back));
    EXPECT_EQ(back.kind, e.kind);
    EXPECT_EQ(back.name, e.name);
    EXPECT_EQ(back.host, e.host);
    EXPECT_EQ(back.pid, e.pid);
    EXPECT_EQ(back.exit_code, e.exit_code);
    EXPECT_EQ(back.signal, e.signal);
    EXPECT_EQ(back.stopped, e.stopped);
    EXPECT_EQ(back.ok, e.ok);
    EXPECT_EQ(back.text, e.text);
    EXPECT_EQ(FormatJobEvent(back), line);
  }
  EXPECT_EQ(FormatJobEvent(Exit("server-0", 0, 15, true)),
            "2026-11-23T02:20:51.000Z exit server-0 signal=15 stopped");
  JobEvent now;
  now.kind = JobEvent::Kind::kExit;
  now.name = "worker-0";
  EXPECT_EQ(FormatJobEvent(now).substr(4, 1), "-") << "a UTC time when none is given";
  JobEvent e;
  for (const char* bad : {"", "t", "t start", "t start worker-0 pid=x host=h", "t exit worker-0",
                          "t exit worker-0 code=", "t end maybe", "t job pid=1 host=h"}) {
    EXPECT_FALSE(ParseJobEvent(bad, &e)) << bad;
  }
}

TEST(JobViewTest, RecordedTrainingLinesGiveEpochBatchSpeedMetricAndEta) {
  JobView view;
  view.Apply(Start("scheduler-0", 10));
  view.Apply(Start("worker-1", 13));
  view.Apply(Start("server-0", 11));
  view.Apply(Start("worker-0", 12));
  ASSERT_EQ(view.processes().size(), 4u);
  EXPECT_EQ(view.processes()[1].name, "server-0") << "scheduler, servers, workers";
  EXPECT_EQ(view.Find("worker-1")->state, ProcessState::kStarting);
  for (const char* line : kWorkerEpoch0) view.AddLine("worker-1", line);
  const ProcessView* p = view.Find("worker-1");
  EXPECT_EQ(p->state, ProcessState::kRunning);
  EXPECT_EQ(p->epoch, 0);
  EXPECT_EQ(p->num_epochs, 2);
  EXPECT_EQ(p->batches_done, 21);
  EXPECT_EQ(p->epoch_batches, 30);
  EXPECT_EQ(p->batch_size, 100);
  EXPECT_DOUBLE_EQ(p->samples_per_sec, 335.25);
  EXPECT_EQ(p->metric, "accuracy=0.872000");
  // 9 batches of 100 left at 335.25 samples/s.
  ASSERT_TRUE(p->EpochEtaSeconds().has_value());
  EXPECT_NEAR(*p->EpochEtaSeconds(), 900 / 335.25, 1e-9);

  for (const char* line : kWorkerEpoch0End) view.AddLine("worker-1", line);
  EXPECT_EQ(p->epoch, 1);
  EXPECT_EQ(p->batches_done, 0);
  EXPECT_EQ(p->metric, "val-accuracy=0.939400");
  EXPECT_NEAR(*p->EpochEtaSeconds(), 3000 / 305.27, 1e-9) << "the last speed, a whole epoch";
  view.AddLine("worker-1", "INFO:root:Epoch[1] Train-accuracy=0.922500");
  EXPECT_EQ(p->batches_done, 30);
  EXPECT_FALSE(p->EpochEtaSeconds().has_value()) << "the epoch's batches are done";

  // The scheduler writes a line: running; servers that have not: starting.
  view.AddLine("scheduler-0", "I20261123 02:20:31.000000 1 cluster_role.cc:36] scheduler: ...");
  EXPECT_EQ(view.Find("scheduler-0")->state, ProcessState::kRunning);
  EXPECT_EQ(view.Find("server-0")->StateText(), "starting");

  view.Apply(Exit("worker-1", 0));
  view.AddLine("worker-1", "a line after the exit");
  EXPECT_EQ(p->state, ProcessState::kDone) << "lines after the exit change nothing";
  view.Apply(Exit("worker-0", 3));
  EXPECT_EQ(view.Find("worker-0")->StateText(), "failed(3)");
  view.Apply(Exit("server-0", 0, 9));
  EXPECT_EQ(view.Find("server-0")->StateText(), "failed(SIGKILL)");
  view.Apply(Start("server-0", 20));
  EXPECT_EQ(view.Find("server-0")->StateText(), "restarting");
  view.Apply(Exit("scheduler-0", 0, 15, true));
  EXPECT_EQ(view.Find("scheduler-0")->StateText(), "stopped");
  EXPECT_FALSE(view.ended());
  JobEvent end;
  end.kind = JobEvent::Kind::kEnd;
  end.text = "worker-0 exited with code 3";
  view.Apply(end);
  EXPECT_TRUE(view.ended());
  EXPECT_FALSE(view.ended_ok());
  EXPECT_EQ(view.end_text(), "worker-0 exited with code 3");
}

TEST(JobViewTest, MxnetLogHasEpochsAndMetricsButNoEta) {
  std::ifstream in(pstrain::testing::SharedDataDir() + "/mxnet-logs/cifar10/incept_2");
  ASSERT_TRUE(in.good());
  JobView view;
  std::string line;
  while (std::getline(in, line)) view.AddLine("worker-0", line);
  const ProcessView* p = view.Find("worker-0");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->state, ProcessState::kUnknown) << "no launcher events";
  EXPECT_EQ(p->epoch, 19);
  EXPECT_EQ(p->metric.rfind("val-accuracy=", 0), 0u) << p->metric;
  EXPECT_FALSE(p->EpochEtaSeconds().has_value());
}

// Frames at fixed widths, compared whole.
TEST(JobViewTest, GoldenFrames) {
  JobView view;
  for (const char* name : {"scheduler-0", "server-0", "worker-0", "worker-1"}) {
    view.Apply(Start(name, 1));
  }
  view.AddLine("scheduler-0", "scheduler: listening");
  view.AddLine("server-0", "server: joining the job");
  for (const char* line : kWorkerEpoch0) view.AddLine("worker-1", line);
  view.AddLine("worker-0", "INFO:root:Epoch[0] Start: 30 batches of 100 samples; --num-epochs 2");
  view.AddLine("worker-0",
               "INFO:root:Epoch[0] Batch [15]\tSpeed: 2304.60 samples/sec\t"
               "accuracy=0.838000");
  EXPECT_EQ(Join(RenderJobView(view, 120)),
            "PROCESS      HOST       STATE    EPOCH  BATCH  SAMPLES/S  METRIC              ETA\n"
            "scheduler-0  127.0.0.1  running      -      -          -  -                     -\n"
            "server-0     127.0.0.1  running      -      -          -  -                     -\n"
            "worker-0     127.0.0.1  running    1/2  16/30     2304.6  accuracy=0.838000  0:01\n"
            "worker-1     127.0.0.1  running    1/2  21/30      335.2  accuracy=0.872000  0:03\n"
            "4 processes: 4 running; workers 2639.8 samples/s\n");
  // Cut, never wrapped; a title first.
  EXPECT_EQ(Join(RenderJobView(view, 40, 0, "job j in logs/j: running")),
            "job j in logs/j: running\n"
            "PROCESS      HOST       STATE    EPOCH\n"
            "scheduler-0  127.0.0.1  running      -\n"
            "server-0     127.0.0.1  running      -\n"
            "worker-0     127.0.0.1  running    1/2\n"
            "worker-1     127.0.0.1  running    1/2\n"
            "4 processes: 4 running; workers 2639.8 s\n");
  // A short terminal: the processes that do not fit are counted.
  EXPECT_EQ(Join(RenderJobView(view, 60, 5)),
            "PROCESS      HOST       STATE    EPOCH  BATCH  SAMPLES/S  ME\n"
            "scheduler-0  127.0.0.1  running      -      -          -  -\n"
            "server-0     127.0.0.1  running      -      -          -  -\n"
            "... 2 more (a taller terminal shows them)\n"
            "4 processes: 4 running; workers 2639.8 samples/s\n");

  view.Apply(Exit("worker-1", 3));
  view.Apply(Exit("worker-0", 0, 15, true));
  view.Apply(Exit("server-0", 0, 15, true));
  view.Apply(Exit("scheduler-0", 0, 15, true));
  EXPECT_EQ(Join(RenderJobView(view, 100)),
            "PROCESS      HOST       STATE      EPOCH  BATCH  SAMPLES/S  METRIC             ETA\n"
            "scheduler-0  127.0.0.1  stopped        -      -          -  -                    -\n"
            "server-0     127.0.0.1  stopped        -      -          -  -                    -\n"
            "worker-0     127.0.0.1  stopped      1/2  16/30     2304.6  accuracy=0.838000    -\n"
            "worker-1     127.0.0.1  failed(3)    1/2  21/30      335.2  accuracy=0.872000    -\n"
            "4 processes: 1 failed, 3 stopped\n");
  // The end names the cause, which the table marks (found by review: a worker
  // whose script raised showed "stopped", the server that exited 1 after it
  // "failed(1)", and nothing pointed at the worker).
  JobView blamed;
  for (const char* name : {"scheduler-0", "server-0", "worker-0", "worker-1", "worker-10"}) {
    blamed.Apply(Start(name, 1));
  }
  blamed.Apply(Exit("server-0", 1));
  for (const char* name : {"worker-0", "worker-1", "worker-10", "scheduler-0"}) {
    blamed.Apply(Exit(name, 0, 15, true));
  }
  JobEvent end;
  end.kind = JobEvent::Kind::kEnd;
  end.text =
      "worker-1 on 127.0.0.1 (pid 3149) caused it; the scheduler says: worker rank 1 at "
      "127.0.0.1:43179 failed: the worker's script raised KeyError (the first process to exit was "
      "server-0 on 127.0.0.1 (pid 3147) exited with code 1)";
  blamed.Apply(end);
  EXPECT_EQ(Join(RenderJobView(blamed, 100)),
            "PROCESS      HOST       STATE            EPOCH  BATCH  SAMPLES/S  METRIC  ETA\n"
            "scheduler-0  127.0.0.1  stopped              -      -          -  -         -\n"
            "server-0     127.0.0.1  failed(1)            -      -          -  -         -\n"
            "worker-0     127.0.0.1  stopped              -      -          -  -         -\n"
            "worker-1     127.0.0.1  stopped (cause)      -      -          -  -         -\n"
            "worker-10    127.0.0.1  stopped              -      -          -  -         -\n"
            "5 processes: 1 failed, 4 stopped\n");
}

TEST(JobViewTest, ImportantLines) {
  for (const char* line :
       {"E20261123 02:19:53.594201 26860 scheduler.cc:43] scheduler: worker-1 is dead",
        "F1123 02:19:53.594201 26860 x.cc:1] Check failed: a == b",
        "pstrain train: joining the cluster: Unavailable: no scheduler at 127.0.0.1:9",
        "Corruption: train-images-idx3-ubyte.gz: bad magic at byte 0", "RuntimeError: boom",
        "E1123 02:19:53.594201 26860 x.cc:1] older glog",
        "scheduler: job failed; cause: server-0: silent for 10 s", "Segmentation fault"}) {
    EXPECT_TRUE(IsImportantLine(line)) << line;
  }
  for (const char* line :
       {"INFO:root:Epoch[0] Batch [5]\tSpeed: 840.15 samples/sec\taccuracy=0.380000",
        "INFO:root:Epoch[0] Time cost=5.431",
        "I20261123 02:19:53.594201 26860 cluster_role.cc:43] scheduler: job done",
        "INFO:root:optimizer: type: SGD learning_rate: 0.05", "E2 is a name, not glog"}) {
    EXPECT_FALSE(IsImportantLine(line)) << line;
  }
}

class JobLogFollowerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = pstrain::testing::MakeTempDir("jobview");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Append(const std::string& file, const std::string& text) {
    std::ofstream out(dir_ + "/" + file, std::ios::app | std::ios::binary);
    out << text;
  }
  std::string dir_;
};

TEST_F(JobLogFollowerTest, FollowsEventsAndLogsAsTheyGrow) {
  JobLogFollower follower(dir_ + "/");
  JobView view;
  ASSERT_OK(follower.Poll(&view));
  EXPECT_FALSE(follower.has_events());
  EXPECT_TRUE(view.processes().empty());

  Append("launch.log", FormatJobEvent(Start("worker-0", 5)) + "\n" +
                           FormatJobEvent(Start("worker-10", 6)) + "\n" +
                           FormatJobEvent(Start("worker-2", 7)) + "\n");
  Append("worker-0.log", std::string(kWorkerEpoch0[3]) + "\n" + "INFO:root:Epoch[0] Batch [5]");
  Append("job.key", "not a log\n");
  Append("sshd.log", "not a process's log\n");
  Append("mpirun.log", "mpirun's own lines\n");
  ASSERT_OK(follower.Poll(&view));
  EXPECT_TRUE(follower.has_events());
  ASSERT_EQ(view.processes().size(), 4u);
  EXPECT_EQ(view.processes()[1].name, "worker-2") << "ranks in numeric order";
  EXPECT_EQ(view.processes()[3].name, "mpirun") << "after the roles";
  const ProcessView* p = view.Find("worker-0");
  EXPECT_EQ(p->state, ProcessState::kRunning);
  EXPECT_EQ(p->epoch_batches, 30);
  EXPECT_EQ(p->samples_per_sec, -1) << "half a line waits for its end";

  Append("worker-0.log", "\tSpeed: 840.15 samples/sec\taccuracy=0.380000\n");
  Append("launch.log", FormatJobEvent(Exit("worker-0", 0)) + "\n");
  ASSERT_OK(follower.Poll(&view));
  EXPECT_EQ(p->batches_done, 6);
  EXPECT_DOUBLE_EQ(p->samples_per_sec, 840.15);
  EXPECT_EQ(p->state, ProcessState::kDone);
  EXPECT_EQ(view.Find("worker-2")->state, ProcessState::kStarting);

  // A log without events (not started by pstrain launch): state unknown.
  Append("server-3.log", "hello\n");
  ASSERT_OK(follower.Poll(&view));
  EXPECT_EQ(view.Find("server-3")->StateText(), "unknown");

  JobLogFollower missing(dir_ + "/nope");
  Status s = missing.Poll(&view);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(dir_ + "/nope"), std::string::npos) << s;
}

// Reads everything written to a pipe so far.
std::string Drain(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

TEST(LiveDisplayTest, RedrawsTheBlockInPlace) {
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_NONBLOCK), 0);
  LiveDisplay display(fds[1], std::chrono::milliseconds(200));
  EXPECT_FALSE(LiveDisplay::IsTerminal(fds[1], Environment::Isolated({{"TERM", "xterm"}})));
  int columns = 0, rows = 0;
  display.Size(&columns, &rows);
  EXPECT_EQ(columns, 80) << "not a terminal: 80 x 24";
  EXPECT_EQ(rows, 24);

  EXPECT_TRUE(display.Draw({"a", "b"}, true));
  EXPECT_EQ(Drain(fds[0]), "\ra\x1b[K\n\rb\x1b[K\n");
  EXPECT_FALSE(display.Draw({"a", "c"})) << "within min_interval";
  EXPECT_EQ(Drain(fds[0]), "");
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_FALSE(display.Draw({"a", "b"})) << "unchanged";
  EXPECT_TRUE(display.Draw({"x"}));
  // Up two lines, one line rewritten, the rest of the old block cleared.
  EXPECT_EQ(Drain(fds[0]), "\x1b[2A\rx\x1b[K\n\x1b[J");

  // Lines printed above: queued until the next redraw, then written where
  // the block was, the block below them.
  display.PrintAbove(fds[1], "[worker-0] hello\n");
  display.PrintAbove(fds[1], "[worker-1] hi");
  EXPECT_EQ(Drain(fds[0]), "");
  EXPECT_FALSE(display.Draw({"x"})) << "within min_interval";
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_TRUE(display.Draw({"x"})) << "unchanged, but text is queued";
  EXPECT_EQ(Drain(fds[0]), "\x1b[1A\r\x1b[J[worker-0] hello\n[worker-1] hi\n\rx\x1b[K\n");
  // Text for another descriptor goes there, in order.
  int other[2];
  ASSERT_EQ(pipe2(other, O_NONBLOCK), 0);
  display.PrintAbove(other[1], "pstrain launch: stopping the job\n");
  EXPECT_TRUE(display.Draw({"x"}, true));
  EXPECT_EQ(Drain(fds[0]), "\x1b[1A\r\x1b[J\rx\x1b[K\n");
  EXPECT_EQ(Drain(other[0]), "pstrain launch: stopping the job\n");
  close(other[0]);
  close(other[1]);
  display.PrintAbove(fds[1], "last words\n");
  display.Release();
  EXPECT_EQ(Drain(fds[0]), "\x1b[1A\r\x1b[Jlast words\n\rx\x1b[K\n") << "flushed";
  EXPECT_TRUE(display.Draw({"y"}, true));
  EXPECT_EQ(Drain(fds[0]), "\ry\x1b[K\n") << "a released block stays where it is";
  close(fds[0]);
  close(fds[1]);
}

// What the terminal's side of a pseudo-terminal received within 200 ms of quiet.
std::string DrainPty(int master) {
  std::string out;
  for (;;) {
    pollfd p = {master, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) return out;
    char buf[4096];
    const ssize_t n = read(master, buf, sizeof(buf));
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

// A terminal made narrower has rewrapped the block's longer lines: the next
// redraw, at once (within min_interval, the lines unchanged), goes up as many
// rows as they take at the new width.
TEST(LiveDisplayTest, ANarrowedTerminalIsRedrawnOverItsWrappedRows) {
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(grantpt(master), 0);
  ASSERT_EQ(unlockpt(master), 0);
  const int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(slave, 0);
  termios raw;
  ASSERT_EQ(tcgetattr(slave, &raw), 0);
  cfmakeraw(&raw);  // bytes through unchanged ("\n" stays "\n")
  ASSERT_EQ(tcsetattr(slave, TCSANOW, &raw), 0);
  winsize ws = {};
  ws.ws_col = 80;
  ws.ws_row = 24;
  ASSERT_EQ(ioctl(master, TIOCSWINSZ, &ws), 0);
  EXPECT_TRUE(LiveDisplay::IsTerminal(slave, Environment::Isolated({{"TERM", "xterm"}})));

  LiveDisplay display(slave, std::chrono::milliseconds(60000));
  const std::string wide(70, 'w');
  EXPECT_TRUE(display.Draw({wide, "short"}, true));
  EXPECT_EQ(DrainPty(master), "\r" + wide + "\x1b[K\n\rshort\x1b[K\n");
  EXPECT_FALSE(display.Draw({wide, "short"})) << "unchanged";
  ws.ws_col = 30;
  ASSERT_EQ(ioctl(master, TIOCSWINSZ, &ws), 0);
  // 70 columns on 30 take 3 rows, "short" 1: up 4; two rows are left to clear.
  const std::string cut(29, 'w');
  EXPECT_TRUE(display.Draw({cut, "short"}));
  EXPECT_EQ(DrainPty(master), "\x1b[4A\r" + cut + "\x1b[K\n\rshort\x1b[K\n\x1b[J");
  EXPECT_FALSE(display.Draw({cut, "short"})) << "as wide as before: nothing to do";
  close(slave);
  close(master);
}

TEST(LiveDisplayTest, DisplayWidthCountsCharactersNotBytesOrEscapes) {
  EXPECT_EQ(DisplayWidth(""), 0u);
  EXPECT_EQ(DisplayWidth("abc"), 3u);
  EXPECT_EQ(DisplayWidth("\x1b[1m\xc3\xa9\xe2\x80\xa6x\x1b[0m"), 3u);  // bold "é…x"
}

}  // namespace
}  // namespace pstrain::logtools
