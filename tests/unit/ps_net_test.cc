// Addresses (bind vs advertise, host names, DMLC_INTERFACE) and the parameter
// server's environment variables.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/env.h"
#include "net/cluster_node.h"
#include "net/van.h"
#include "scheduler/scheduler.h"
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

// A node name that resolves to loopback here (Debian's 127.0.1.1 line for
// the host's own name) in a job across hosts: listening there, no other host
// could connect (found by review), so the node listens on every interface.
TEST(AddressTest, ALoopbackNameInAJobAcrossHostsListensEverywhere) {
  EXPECT_EQ(DefaultBindHost("localhost", "10.0.0.1"), "0.0.0.0");
  EXPECT_EQ(DefaultBindHost("127.0.1.1", "10.0.0.1"), "0.0.0.0");
  EXPECT_EQ(DefaultBindHost("localhost", "127.0.0.1"), "localhost");
  EXPECT_EQ(DefaultBindHost("127.0.0.1", "localhost"), "127.0.0.1");
  EXPECT_EQ(DefaultBindHost("10.1.2.3", "10.0.0.1"), "10.1.2.3");
  EXPECT_EQ(DefaultBindHost("no-such-host.invalid", "10.0.0.1"), "no-such-host.invalid");
}

TEST(AddressTest, Ipv6AddressesResolveAndTakeBracketsBeforeAPort) {
  EXPECT_EQ(*ResolveHost("::1"), "::1");
  EXPECT_EQ(*ResolveHost("[::1]"), "::1");
  EXPECT_EQ(*ResolveHost("fd00:0:0::11"), "fd00::11");     // the canonical form
  EXPECT_EQ(*ResolveHost("::ffff:10.0.0.1"), "10.0.0.1");  // an IPv4 address
  EXPECT_TRUE(IsLoopbackIp("::1"));
  EXPECT_TRUE(IsLoopbackIp("127.0.1.1"));
  EXPECT_TRUE(IsLoopbackIp("::ffff:127.0.0.1"));
  EXPECT_FALSE(IsLoopbackIp("fd00::1"));
  EXPECT_FALSE(IsLoopbackIp("10.0.0.1"));
  EXPECT_EQ(JoinHostPort("10.0.0.1", 9091), "10.0.0.1:9091");
  EXPECT_EQ(JoinHostPort("fd00::11", 9091), "[fd00::11]:9091");
  EXPECT_EQ(JoinHostPort("[fd00::11]", "*"), "[fd00::11]:*");
  EXPECT_EQ(JoinHostPort("node7", 22), "node7:22");
}

// With the scheduler at an IPv6 address a node advertises one of its own
// IPv6 addresses, and a loopback name listens on every interface, IPv6 too.
TEST(AddressTest, AnIpv6SchedulerMakesNodesUseIpv6) {
  EXPECT_EQ(*AdvertisedHost("", "", "::1"), "::1");
  EXPECT_EQ(*AdvertisedHost("", "", "[::1]"), "::1");
  EXPECT_EQ(*AdvertisedHost("fd00::5", "", "::1"), "fd00::5");
  EXPECT_EQ(DefaultBindHost("localhost", "fd00::1"), "::");
  EXPECT_EQ(DefaultBindHost("::1", "fd00::1"), "::");
  EXPECT_EQ(DefaultBindHost("::1", "10.0.0.1"), "0.0.0.0");
  EXPECT_EQ(DefaultBindHost("::1", "::1"), "::1");
  EXPECT_EQ(DefaultBindHost("fd00::5", "fd00::1"), "fd00::5");
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

// Whether a TCP connection to ip:port (IPv4 or IPv6) is accepted.
bool Accepts(const std::string& ip, int port) {
  sockaddr_storage a{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a);
  if (inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v6);
  } else {
    ADD_FAILURE() << "not an address: " << ip;
    return false;
  }
  const int fd = socket(a.ss_family, SOCK_STREAM, 0);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), len) == 0;
  close(fd);
  return ok;
}

// With the scheduler at `root`, a node (advertising its default address,
// `here`) and the scheduler listen on `here` only, not at `elsewhere`, another
// local address; with PSTRAIN_BIND_HOST = `every` on every interface.
void ExpectListeningWhereTold(const std::string& root, const std::string& here,
                              const std::string& elsewhere, const std::string& every) {
  for (const std::string& bind : {std::string(), every}) {
    SCOPED_TRACE("bind '" + bind + "'");
    ClusterOptions o;
    o.role = Role::kWorker;
    o.root_host = root;
    o.root_port = 1;  // nothing to reach: Create only queues the connection
    o.bind_host = bind;
    auto node = ClusterNode::Create(o);
    ASSERT_OK(node.status());
    EXPECT_EQ((*node)->host(), here);
    EXPECT_TRUE(Accepts(here, (*node)->port()));
    EXPECT_EQ(Accepts(elsewhere, (*node)->port()), !bind.empty());
    ClusterOptions so;
    so.root_host = root;
    so.bind_host = bind;
    auto sched = Scheduler::Create(so);
    ASSERT_OK(sched.status());
    EXPECT_TRUE(Accepts(here, (*sched)->port()));
    EXPECT_EQ(Accepts(elsewhere, (*sched)->port()), !bind.empty());
  }
}

TEST(AddressTest, NodesBindTheAdvertisedAddressByDefault) {
  ExpectListeningWhereTold("127.0.0.1", "127.0.0.1", "127.0.0.2", "0.0.0.0");
}

// On ::1 a node listens on ::1 only; "::" is every interface, IPv4 too.
TEST(AddressTest, NodesListenOnIpv6) {
  if (const std::string why = testing::Ipv6LoopbackMissing(); !why.empty()) GTEST_SKIP() << why;
  ExpectListeningWhereTold("::1", "::1", "127.0.0.1", "::");
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
