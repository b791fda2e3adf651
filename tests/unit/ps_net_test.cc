// Addresses (bind vs advertise, host names, DMLC_INTERFACE) and the parameter
// server's environment variables.
#include <gtest/gtest.h>

#include "common/env.h"
#include "net/van.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

TEST(AddressTest, HostNamesResolve) {
  auto ip = ResolveHost("localhost");
  ASSERT_OK(ip.status());
  EXPECT_EQ(*ip, "127.0.0.1");
  EXPECT_EQ(*ResolveHost("10.1.2.3"), "10.1.2.3");
  auto bad = ResolveHost("no-such-host.invalid");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("no-such-host.invalid"), std::string::npos);
}

TEST(AddressTest, AdvertisedHostPrefersNodeHostThenInterface) {
  EXPECT_EQ(*AdvertisedHost("node7.example", "lo", "10.0.0.1"), "node7.example");
  EXPECT_EQ(*AdvertisedHost("", "lo", "10.0.0.1"), "127.0.0.1");
  EXPECT_EQ(*AdvertisedHost("", "", "127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(*AdvertisedHost("", "", "localhost"), "127.0.0.1");
  auto bad = AdvertisedHost("", "nosuchif9", "10.0.0.1");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("DMLC_INTERFACE=nosuchif9"), std::string::npos);
}

TEST(AddressTest, BindFailureNamesTheAddress) {
  VanOptions vo;
  vo.bind_host = "127.0.0.1";
  auto first = Van::Create(vo, [](Message&&) {});
  ASSERT_OK(first.status());
  vo.port = (*first)->port();
  auto second = Van::Create(vo, [](Message&&) {});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(StrCat("127.0.0.1:", vo.port)), std::string::npos)
      << second.status();
}

TEST(PsEnvTest, ReadsParameterServerVariables) {
  auto env = Environment::Isolated({{"PSTRAIN_PLACEMENT", "mxnet"},
                                    {"PSTRAIN_SERVER_THREADS", "4"},
                                    {"PSTRAIN_CHUNK_ELEMS", "1000"},
                                    {"PSTRAIN_BIND_HOST", "127.0.0.1"},
                                    {"PSTRAIN_MAX_MESSAGE_BYTES", "65536"}});
  auto job = ReadJobEnv(env, /*cluster_required=*/false);
  ASSERT_OK(job.status());
  EXPECT_EQ(job->placement, "mxnet");
  EXPECT_EQ(job->server_threads, 4);
  EXPECT_EQ(job->chunk_elems, 1000);
  EXPECT_EQ(job->bind_host, "127.0.0.1");
  EXPECT_EQ(job->max_message_bytes, 65536);
}

TEST(PsEnvTest, BadValuesAreNamed) {
  auto placement = ReadJobEnv(Environment::Isolated({{"PSTRAIN_PLACEMENT", "random"}}), false);
  ASSERT_FALSE(placement.ok());
  EXPECT_NE(placement.status().message().find("PSTRAIN_PLACEMENT"), std::string::npos);
  auto threads = ReadJobEnv(Environment::Isolated({{"PSTRAIN_SERVER_THREADS", "0"}}), false);
  ASSERT_FALSE(threads.ok());
  EXPECT_NE(threads.status().message().find("PSTRAIN_SERVER_THREADS"), std::string::npos);
}

}  // namespace
}  // namespace pstrain
