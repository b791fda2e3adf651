#include "common/env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace pstrain {
namespace {

TEST(EnvTest, ReadsJobEnvironment) {
  auto env = Environment::Isolated({{"DMLC_ROLE", "server"},
                                    {"DMLC_PS_ROOT_URI", "127.0.0.1"},
                                    {"DMLC_PS_ROOT_PORT", "9091"},
                                    {"DMLC_NUM_SERVER", "2"},
                                    {"DMLC_NUM_WORKER", "3"},
                                    {"PSTRAIN_HEARTBEAT_TIMEOUT_MS", "2500"}});
  auto job = ReadJobEnv(env);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->role, Role::kServer);
  EXPECT_EQ(job->root_uri, "127.0.0.1");
  EXPECT_EQ(job->root_port, 9091);
  EXPECT_EQ(job->num_servers, 2);
  EXPECT_EQ(job->num_workers, 3);
  EXPECT_EQ(job->heartbeat_timeout_ms, 2500);
  EXPECT_EQ(job->bigarray_bound, 1000000);
}

TEST(EnvTest, MissingVariableIsNamed) {
  auto env = Environment::Isolated({{"DMLC_ROLE", "worker"}, {"DMLC_PS_ROOT_URI", "h"}});
  auto job = ReadJobEnv(env);
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().message().find("DMLC_PS_ROOT_PORT"), std::string::npos) << job.status();
}

TEST(EnvTest, MalformedValuesAreRejectedWithTheirName) {
  auto env = Environment::Isolated({{"DMLC_ROLE", "boss"}});
  auto job = ReadJobEnv(env, /*cluster_required=*/false);
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().message().find("boss"), std::string::npos);

  auto env2 = Environment::Isolated({{"DMLC_PS_ROOT_URI", "h"},
                                     {"DMLC_PS_ROOT_PORT", "70000"},
                                     {"DMLC_NUM_SERVER", "1"},
                                     {"DMLC_NUM_WORKER", "1"}});
  auto job2 = ReadJobEnv(env2);
  ASSERT_FALSE(job2.ok());
  EXPECT_NE(job2.status().message().find("DMLC_PS_ROOT_PORT=70000"), std::string::npos)
      << job2.status();

  auto env3 = Environment::Isolated({{"PS_VERBOSE", "lots"}});
  EXPECT_FALSE(ReadJobEnv(env3, false).ok());
}

TEST(EnvTest, OverridesWinOverProcessEnvironment) {
  setenv("PSTRAIN_ENV_TEST_VAR", "from-process", 1);
  Environment plain;
  EXPECT_EQ(plain.Get("PSTRAIN_ENV_TEST_VAR").value_or(""), "from-process");
  Environment over(std::map<std::string, std::string>{{"PSTRAIN_ENV_TEST_VAR", "from-map"}});
  EXPECT_EQ(over.Get("PSTRAIN_ENV_TEST_VAR").value_or(""), "from-map");
  EXPECT_FALSE(Environment::Isolated({}).Get("PSTRAIN_ENV_TEST_VAR").has_value());
  unsetenv("PSTRAIN_ENV_TEST_VAR");
}

TEST(EnvTest, BoolParsing) {
  auto env = Environment::Isolated({{"A", "Yes"}, {"B", "0"}, {"C", "maybe"}});
  EXPECT_TRUE(env.GetBool("A", false).value());
  EXPECT_FALSE(env.GetBool("B", true).value());
  EXPECT_FALSE(env.GetBool("C", true).ok());
  EXPECT_TRUE(env.GetBool("UNSET", true).value());
}

}  // namespace
}  // namespace pstrain
