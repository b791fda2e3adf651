// The slurm launcher without Slurm: its arguments, the plan of srun steps, the
// rank wrapper through a real /bin/sh, srun's output tags and task notices,
// and the supervisor's handling of a srun group (a shell that writes what srun
// would). tests/launcher/slurm_launcher_test.cc runs it on a real cluster.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/env.h"
#include "tests/test_util.h"
#include "tracker/launcher.h"
#include "tracker/process.h"
#include "tracker/slurm.h"
#include "tracker/supervisor.h"

namespace pstrain::tracker {
namespace {

const std::map<std::string, std::string> kInsideJob = {{"SLURM_JOB_ID", "42"},
                                                       {"SLURM_JOB_NODELIST", "n[1-3]"},
                                                       {"SLURM_JOB_NUM_NODES", "3"},
                                                       {"SLURM_CONF", "/etc/slurm/x.conf"}};

// Index of `word` in `argv`, or -1.
int Find(const std::vector<std::string>& argv, const std::string& word) {
  auto it = std::find(argv.begin(), argv.end(), word);
  return it == argv.end() ? -1 : static_cast<int>(it - argv.begin());
}

TEST(SlurmArgsTest, OptionsAndWhatGoesWithWhat) {
  auto o =
      ParseLaunchArgs({"-n", "4", "-s", "2", "--launcher", "slurm", "--nodes", "3", "--partition",
                       "gpu", "--time", "1:00:00", "--salloc-option", "--account=x",
                       "--srun-option=--cpus-per-task=8", "--alloc-timeout", "30", "prog", "arg"});
  ASSERT_OK(o.status());
  EXPECT_EQ(o->launcher, LauncherKind::kSlurm);
  EXPECT_EQ(o->nodes, 3);
  EXPECT_EQ(o->partition, "gpu");
  EXPECT_EQ(o->time_limit, "1:00:00");
  EXPECT_EQ(o->salloc_options, std::vector<std::string>{"--account=x"});
  EXPECT_EQ(o->srun_options, std::vector<std::string>{"--cpus-per-task=8"});
  EXPECT_EQ(o->alloc_timeout_s, 30);
  EXPECT_EQ(o->command, (std::vector<std::string>{"prog", "arg"}));
  EXPECT_EQ(SallocCommand(*o, "j1"),
            (std::vector<std::string>{"salloc", "--job-name=pstrain-j1", "--ntasks=6", "--nodes=3",
                                      "--immediate=30", "--partition=gpu", "--time=1:00:00",
                                      "--account=x"}));
  // Default: one node per server/worker pair, max(S, W).
  o->nodes = 0;
  EXPECT_EQ(SallocCommand(*o, "j1")[3], "--nodes=4");

  // Slurm's options need --launcher slurm; Slurm places processes itself;
  // srun owns its tasks (no restarts, no lost workers).
  auto local = ParseLaunchArgs({"-n", "1", "--srun-option=-v", "prog"});
  EXPECT_EQ(local.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(local.status().message().find("--srun-option works only with --launcher slurm"),
            std::string::npos)
      << local.status();
  EXPECT_FALSE(ParseLaunchArgs({"-n", "1", "--launcher", "slurm", "-H", "hosts", "prog"}).ok());
  EXPECT_FALSE(
      ParseLaunchArgs({"-n", "1", "--launcher", "slurm", "--restart-servers", "1", "prog"}).ok());
  EXPECT_FALSE(
      ParseLaunchArgs({"-n", "1", "--launcher", "slurm", "--worker-loss", "continue", "prog"})
          .ok());
  EXPECT_FALSE(ParseLaunchArgs({"-n", "1", "--launcher", "slurm", "--nodes", "0", "prog"}).ok());
  EXPECT_FALSE(
      ParseLaunchArgs({"-n", "1", "--launcher", "slurm", "--sync-dst-dir", "/x", "prog"}).ok());
}

TEST(SlurmPlanTest, TwoStepsInTheAllocation) {
  auto o = ParseLaunchArgs({"-n", "4", "-s", "2", "--launcher", "slurm", "--host-ip", "127.0.0.1",
                            "--srun-option=--cpus-per-task=8", "--env", "A=b c", "--job-id", "j7",
                            "--", "prog", "it's"});
  ASSERT_OK(o.status());
  auto plan = PlanLaunch(*o, Environment::Isolated(kInsideJob));
  ASSERT_OK(plan.status());
  EXPECT_EQ(plan->slurm_job_id, "42");
  EXPECT_EQ(plan->slurm_steps,
            (std::vector<std::string>{"pstrain-j7-servers", "pstrain-j7-workers"}));
  EXPECT_EQ(plan->root_uri, "127.0.0.1");
  ASSERT_EQ(plan->tasks.size(), 3u);
  EXPECT_EQ(plan->tasks[0].role, "scheduler");
  EXPECT_EQ(plan->tasks[0].spec.argv, (std::vector<std::string>{"prog", "it's"}));
  EXPECT_EQ(plan->tasks[0].spec.env.at("SLURM_JOB_ID"), "42");
  for (size_t i = 1; i < 3; ++i) {
    const Task& t = plan->tasks[i];
    const bool server = i == 1;
    SCOPED_TRACE(t.role);
    EXPECT_EQ(t.role, server ? "srun-servers" : "srun-workers");
    EXPECT_EQ(t.host, "Slurm job 42");
    EXPECT_EQ(t.tags, OutputTags::kSlurm);
    EXPECT_EQ(t.rank_names,
              server ? (std::vector<std::string>{"server-0", "server-1"})
                     : (std::vector<std::string>{"worker-0", "worker-1", "worker-2", "worker-3"}));
    const std::vector<std::string>& argv = t.spec.argv;
    ASSERT_GE(argv.size(), 10u);
    EXPECT_EQ(argv[0], "srun");
    for (const std::string& w :
         {std::string("--jobid=42"),
          "--job-name=pstrain-j7-" + std::string(server ? "servers" : "workers"),
          std::string(server ? "--ntasks=2" : "--ntasks=4"),
          // At most one node per task, at most the allocation's.
          std::string(server ? "--nodes=2" : "--nodes=3"), std::string("--label"),
          std::string("--input=none"), std::string("--kill-on-bad-exit=1"),
          std::string("--overlap")}) {
      EXPECT_GE(Find(argv, w), 1) << w;
    }
    // The user's srun options come after ours, then the wrapper, then the command.
    const int user = Find(argv, "--cpus-per-task=8");
    const int sh = Find(argv, "/bin/sh");
    EXPECT_GT(user, Find(argv, "--overlap"));
    ASSERT_EQ(sh, user + 1);
    EXPECT_EQ(argv[sh + 3], "pstrain-slurm");
    EXPECT_EQ(argv[sh + 4], server ? "0" : "2");  // the first task id of the step
    EXPECT_EQ(std::vector<std::string>(argv.begin() + sh + 5, argv.end()),
              (std::vector<std::string>{"prog", "it's"}));
    const auto& env = t.spec.env;
    EXPECT_EQ(env.at("DMLC_ROLE"), server ? "server" : "worker");
    EXPECT_EQ(env.at("DMLC_JOB_CLUSTER"), "slurm");
    EXPECT_EQ(env.at("DMLC_PS_ROOT_URI"), "127.0.0.1");
    EXPECT_EQ(env.at("DMLC_NUM_SERVER"), "2");
    EXPECT_EQ(env.at("DMLC_NUM_WORKER"), "4");
    EXPECT_EQ(env.at("A"), "b c");
    EXPECT_EQ(env.at("SLURM_CONF"), "/etc/slurm/x.conf");
    EXPECT_EQ(env.at("PSTRAIN_KEY_FILE"), plan->key_file);
  }
}

// NodeAddr values that are IPv6 addresses (slurm.conf with
// CommunicationParameters=EnableIPv6): hosts as sinfo prints them, bare,
// written in brackets before a port, and the scheduler's address found
// towards them (or, with no route from this machine, the error that asks
// for --host-ip). A stand-in sinfo prints what Slurm's would.
TEST(SlurmPlanTest, Ipv6NodeAddressesAreTheHostsAndTheSchedulerLooksTowardsThem) {
  testing::TempDir dir("slurm-v6");
  const std::string sinfo = dir.Sub("sinfo");
  // n1 in two partitions: listed twice, one host.
  std::ofstream(sinfo) << "#!/bin/sh\nprintf 'n1 fd00:7::11\\nn2 n2\\nn1 fd00:7::11\\n'\n";
  ASSERT_EQ(chmod(sinfo.c_str(), 0755), 0);
  const std::map<std::string, std::string> env = {{"PATH", dir.path() + ":/usr/bin:/bin"}};
  // execvpe looks the program up on this process's PATH, not the child's.
  const std::string old_path = Environment().Get("PATH").value_or("/usr/bin:/bin");
  ASSERT_EQ(setenv("PATH", env.at("PATH").c_str(), 1), 0);
  struct RestorePath {
    std::string path;
    ~RestorePath() { setenv("PATH", path.c_str(), 1); }
  } restore{old_path};
  auto hosts = SlurmNodeAddresses("n[1-2]", env);
  ASSERT_OK(hosts.status());
  ASSERT_EQ(hosts->size(), 2u);
  EXPECT_EQ((*hosts)[0].name, "fd00:7::11");
  EXPECT_EQ((*hosts)[0].bracketed(), "[fd00:7::11]");
  EXPECT_EQ((*hosts)[1].name, "n2");

  std::map<std::string, std::string> inside = kInsideJob;
  inside["SLURM_JOB_NODELIST"] = "n[1-2]";
  inside["SLURM_JOB_NUM_NODES"] = "2";
  inside["PATH"] = env.at("PATH");
  std::ofstream(sinfo) << "#!/bin/sh\nprintf 'n1 fd00:7::11\\nn2 fd00:7::12\\n'\n";
  auto o = ParseLaunchArgs({"-n", "2", "--launcher", "slurm", "--", "prog"});
  ASSERT_OK(o.status());
  auto plan = PlanLaunch(*o, Environment::Isolated(inside));
  if (plan.ok()) {
    EXPECT_NE(plan->root_uri.find(':'), std::string::npos) << plan->root_uri;  // IPv6
  } else {
    EXPECT_NE(plan.status().message().find("--host-ip"), std::string::npos) << plan.status();
  }
}

TEST(SlurmPlanTest, NeedsAnAllocation) {
  auto o = ParseLaunchArgs({"-n", "1", "--launcher", "slurm", "--host-ip", "127.0.0.1", "prog"});
  ASSERT_OK(o.status());
  auto plan = PlanLaunch(*o, Environment::Isolated({}));
  EXPECT_EQ(plan.status().code(), StatusCode::kNotFound);
  EXPECT_NE(plan.status().message().find("SLURM_JOB_ID is not set"), std::string::npos)
      << plan.status();
  auto bad = kInsideJob;
  bad["SLURM_JOB_NUM_NODES"] = "two";
  plan = PlanLaunch(*o, Environment::Isolated(bad));
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("SLURM_JOB_NUM_NODES='two'"), std::string::npos)
      << plan.status();
  // sbatch's older names do as well.
  auto job = SlurmJobFromEnvironment(Environment::Isolated(
      {{"SLURM_JOBID", "7"}, {"SLURM_NODELIST", "a,b"}, {"SLURM_NNODES", "2"}}));
  ASSERT_OK(job.status());
  EXPECT_EQ(job->id, "7");
  EXPECT_EQ(job->nodelist, "a,b");
  EXPECT_EQ(job->num_nodes, 2);
}

// The wrapper srun runs: the rank from SLURM_PROCID, task ids from the step's first.
TEST(SlurmPlanTest, RankWrapperThroughARealShell) {
  LaunchOptions o;
  o.num_workers = 4;
  o.num_servers = 2;
  SlurmJob job;
  job.id = "42";
  std::vector<std::string> argv =
      SrunCommand(o, job, "step", 4, 2,
                  {"/bin/sh", "-c", "echo \"$PSTRAIN_LAUNCH_RANK $DMLC_TASK_ID $1\"", "x", "a b"});
  const int sh = Find(argv, "/bin/sh");
  ASSERT_GE(sh, 0);
  std::vector<std::string> task(argv.begin() + sh, argv.end());
  std::string out;
  int status = 0;
  ASSERT_OK(RunAndCapture(task, {{"SLURM_PROCID", "3"}, {"PATH", "/usr/bin:/bin"}}, 10000, &out,
                          &status));
  EXPECT_EQ(status, 0);
  EXPECT_EQ(out, "3 5 a b\n");
  ASSERT_OK(RunAndCapture(task, {{"PATH", "/usr/bin:/bin"}}, 10000, &out, &status));
  EXPECT_EQ(WEXITSTATUS(status), 127);
  EXPECT_NE(out.find("no SLURM_PROCID"), std::string::npos) << out;

  // A worker's rank among its node's workers and their count: SLURM_LOCALID,
  // and its node's entry of the step's tasks per node; a server gets neither.
  std::vector<std::string> local_argv = SrunCommand(
      o, job, "step", 4, 2,
      {"/bin/sh", "-c", "echo \"${PSTRAIN_LOCAL_RANK:-none} ${PSTRAIN_LOCAL_SIZE:-none}\""});
  std::vector<std::string> local_task(local_argv.begin() + Find(local_argv, "/bin/sh"),
                                      local_argv.end());
  const struct {
    const char* role;
    const char* node;
    const char* per_node;
    const char* want;
  } cases[] = {{"worker", "0", "2(x3),1", "1 2\n"}, {"worker", "2", "2(x3),1", "1 2\n"},
               {"worker", "3", "2(x3),1", "1 1\n"}, {"worker", "1", "3,1", "1 1\n"},
               {"worker", "0", "3", "1 3\n"},       {"server", "0", "2", "none none\n"}};
  for (const auto& c : cases) {
    ASSERT_OK(RunAndCapture(local_task,
                            {{"SLURM_PROCID", "1"},
                             {"SLURM_LOCALID", "1"},
                             {"SLURM_NODEID", c.node},
                             {"SLURM_STEP_TASKS_PER_NODE", c.per_node},
                             {"DMLC_ROLE", c.role},
                             {"PATH", "/usr/bin:/bin"}},
                            10000, &out, &status));
    EXPECT_EQ(status, 0);
    EXPECT_EQ(out, c.want) << c.role << " on node " << c.node << " of " << c.per_node;
  }
}

TEST(SlurmTagsTest, LabelsAndTaskNotices) {
  int rank = -1;
  std::string text;
  EXPECT_TRUE(SplitRankTag(OutputTags::kSlurm, "0: hello: x\n", &rank, &text));
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(text, "hello: x\n");
  EXPECT_TRUE(SplitRankTag(OutputTags::kSlurm, " 7: \n", &rank, &text));
  EXPECT_EQ(rank, 7);
  EXPECT_EQ(text, "\n");
  EXPECT_TRUE(SplitRankTag(OutputTags::kSlurm, "12: Epoch[0] x", &rank, &text));
  EXPECT_EQ(rank, 12);
  EXPECT_FALSE(SplitRankTag(OutputTags::kSlurm, "srun: error: n1: task 1: Killed\n", &rank, &text));
  EXPECT_FALSE(SplitRankTag(OutputTags::kSlurm, "3:x\n", &rank, &text));
  EXPECT_FALSE(SplitRankTag(OutputTags::kSlurm, ": x\n", &rank, &text));
  EXPECT_FALSE(SplitRankTag(OutputTags::kSlurm, "   \n", &rank, &text));

  std::string node, what;
  EXPECT_TRUE(ParseSrunTaskNotice("srun: error: node-3: task 1: Exited with exit code 3\n", &rank,
                                  &node, &what));
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(node, "node-3");
  EXPECT_EQ(what, "Exited with exit code 3");
  EXPECT_TRUE(ParseSrunTaskNotice("srun: error: n1: tasks 2,4-5: Killed", &rank, &node, &what));
  EXPECT_EQ(rank, 2);
  EXPECT_EQ(what, "Killed");
  EXPECT_FALSE(ParseSrunTaskNotice(
      "srun: error: Unable to create step for job 5: More processors requested than permitted",
      &rank, &node, &what));
  EXPECT_FALSE(ParseSrunTaskNotice("0: srun: error: n1: task 1: Killed", &rank, &node, &what));
  EXPECT_FALSE(ParseSrunTaskNotice("srun: error: n1: task x: Killed", &rank, &node, &what));
}

// A shell in srun's place: labelled lines, then srun's notice that task 1
// failed, then it hangs, as srun does while it winds the step down.
class SrunGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_.Sub("logs");
    options_.log_dir = dir_;
    options_.terminal_out_fd =
        open(temp_.Sub("terminal").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    options_.terminal_err_fd = options_.terminal_out_fd;
    options_.term_grace_ms = 1000;
    ASSERT_GE(options_.terminal_out_fd, 0);
  }
  void TearDown() override { close(options_.terminal_out_fd); }

  static Task Group(const std::string& script) {
    Task t;
    t.role = "srun-workers";
    t.host = "Slurm job 7";
    t.tags = OutputTags::kSlurm;
    t.rank_names = {"worker-0", "worker-1"};
    t.spec.argv = {"/bin/sh", "-c", script};
    t.spec.env = Environment().All();
    return t;
  }
  static std::string Read(const std::string& path) { return testing::ReadFile(path); }

  testing::TempDir temp_{"srun-group"};
  std::string dir_;
  SupervisorOptions options_;
};

TEST_F(SrunGroupTest, TaskNoticeFailsTheJobAtOnceNamingTheProcess) {
  std::vector<Task> tasks;
  tasks.push_back(
      Group("echo '0: hi'; echo '1: there'; sleep 0.2; "
            "echo 'srun: error: n1: task 1: Exited with exit code 3' >&2; exec sleep 30"));
  auto start = SteadyClock::now();
  auto result = RunJob(std::move(tasks), options_);
  ASSERT_OK(result.status());
  EXPECT_FALSE(result->success);
  EXPECT_EQ(result->exit_code, 1);
  EXPECT_EQ(result->reason,
            "worker-1 (Slurm task 1 on n1) under srun-workers (Slurm job 7) exited with code 3");
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(Read(dir_ + "/worker-0.log"), "hi\n");
  EXPECT_EQ(Read(dir_ + "/worker-1.log"),
            "there\nsrun: error: n1: task 1: Exited with exit code 3\n");
  EXPECT_EQ(Read(dir_ + "/srun-workers.log"), "srun: error: n1: task 1: Exited with exit code 3\n");
}

TEST_F(SrunGroupTest, SrunsOwnFailureCarriesItsLastError) {
  std::vector<Task> tasks;
  tasks.push_back(
      Group("echo 'srun: error: Unable to create step for job 7: More processors requested than "
            "permitted' >&2; exit 1"));
  auto result = RunJob(std::move(tasks), options_);
  ASSERT_OK(result.status());
  EXPECT_FALSE(result->success);
  EXPECT_NE(result->reason.find("srun-workers (Slurm job 7) (pid "), std::string::npos)
      << result->reason;
  EXPECT_NE(result->reason.find(") exited with code 1: srun: error: Unable to create step for "
                                "job 7: More processors requested than permitted"),
            std::string::npos)
      << result->reason;
}

}  // namespace
}  // namespace pstrain::tracker
