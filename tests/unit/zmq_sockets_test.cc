// The Van's ZeroMQ sockets on their own: a ROUTER and DEALERs in one context,
// the frames they carry (the wire format), what the DEALER's connection
// events tell, and the ROUTER's authentication of the job's keys.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "net/zmq_dealer.h"
#include "net/zmq_router.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

// A ZeroMQ context for one test; sockets must be closed before it ends.
struct Context {
  void* ctx = zmq_ctx_new();
  ~Context() { zmq_ctx_term(ctx); }
};

RouterOptions Local() {
  RouterOptions o;
  o.bind_host = "127.0.0.1";
  o.name = "router";
  return o;
}

std::unique_ptr<ZmqDealer> DealerTo(void* ctx, int port, DealerOptions o = {}) {
  auto d = ZmqDealer::Open(ctx, o);
  CHECK_OK(d.status());
  CHECK_OK((*d)->Connect(StrCat("tcp://127.0.0.1:", port)));
  return std::move(d).value();
}

// The next message the router receives within `ms`; empty if none.
std::vector<Blob> ReceiveWithin(ZmqRouter& r, int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  std::vector<Blob> frames;
  while (std::chrono::steady_clock::now() < end) {
    if (r.Receive(&frames) == ZmqRouter::Read::kMessage) return frames;
    zmq_pollitem_t item{r.socket(), 0, ZMQ_POLLIN, 0};
    zmq_poll(&item, 1, 20);
  }
  return {};
}

Message Data(uint64_t id, size_t floats, float v) {
  Message m;
  m.header.set_version(PROTOCOL_VERSION_CURRENT);
  m.header.set_cmd(CMD_DATA);
  m.header.set_sender(WorkerId(0));
  m.header.set_receiver(ServerId(0));
  m.header.set_request_id(id);
  m.header.set_push(true);
  m.header.set_num_keys(1);
  m.header.set_num_value_frames(1);
  m.header.set_value_bytes(floats * sizeof(float));
  const uint64_t key = WireKey(0, 3, 0);
  const uint32_t len = static_cast<uint32_t>(floats);
  m.keys = Blob::Copy(&key, sizeof(key));
  m.lens = Blob::Copy(&len, sizeof(len));
  std::vector<float> f(floats, v);
  m.values.push_back(Blob::Copy(f.data(), f.size() * sizeof(float)));
  return m;
}

std::string Str(const Blob& b) { return std::string(b.data(), b.size()); }

TEST(ZmqSocketsTest, ADataMessageTravelsAsHeaderKeysLensAndValueFrames) {
  Context c;
  auto router = ZmqRouter::Bind(c.ctx, Local());
  ASSERT_OK(router.status());
  ASSERT_GT((*router)->port(), 0);
  DealerOptions o;
  o.routing_id = "n-test";
  auto dealer = DealerTo(c.ctx, (*router)->port(), o);
  EXPECT_EQ(dealer->address(), StrCat("tcp://127.0.0.1:", (*router)->port()));
  const Message m = Data(7, 4096, 2.5f);  // 16 KB: sent by reference
  const std::string header = m.header.SerializeAsString();
  ASSERT_TRUE(dealer->SendFrames(header, &m, /*values=*/true));
  std::vector<Blob> frames = ReceiveWithin(**router, 5000);
  ASSERT_EQ(frames.size(), 5u) << "routing id, header, keys, lens, one value frame";
  EXPECT_EQ(Str(frames[0]), "n-test");
  EXPECT_EQ(Str(frames[1]), header);
  EXPECT_EQ(Str(frames[2]), Str(m.keys));
  EXPECT_EQ(Str(frames[3]), Str(m.lens));
  EXPECT_EQ(Str(frames[4]), Str(m.values[0]));
  Decoded d = DecodeFrames(frames);
  ASSERT_TRUE(d.error.empty()) << d.error;
  EXPECT_EQ(d.msg.route, "n-test");
  EXPECT_EQ(d.msg.header.request_id(), 7u);
  EXPECT_OK(ValidateFrames(d.msg));

  // Without values (they went through shared memory): header, keys, lens.
  ASSERT_TRUE(dealer->SendFrames(header, &m, /*values=*/false));
  frames = ReceiveWithin(**router, 5000);
  EXPECT_EQ(frames.size(), 4u);
  // A control message: the header alone.
  Message ctl;
  ctl.header.set_cmd(CMD_HEARTBEAT);
  ASSERT_TRUE(dealer->SendFrames(ctl.header.SerializeAsString(), nullptr, false));
  frames = ReceiveWithin(**router, 5000);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(Str(frames[1]), ctl.header.SerializeAsString());
  dealer.reset();
  router->reset();
}

// A TCP relay to 127.0.0.1:`port` on a port of its own that can freeze: it
// then forwards nothing either way and keeps both connections open, as a
// host that froze (no ping answered, no FIN).
class FreezableRelay {
 public:
  explicit FreezableRelay(int port) : port_(port) {
    listen_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = Loopback(0);
    CHECK_EQ(bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    CHECK_EQ(listen(listen_, 1), 0);
    socklen_t len = sizeof(addr);
    getsockname(listen_, reinterpret_cast<sockaddr*>(&addr), &len);
    own_port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~FreezableRelay() {
    stop_ = true;
    thread_.join();
    for (int fd : {listen_, a_, b_}) {
      if (fd >= 0) close(fd);
    }
  }
  int port() const { return own_port_; }
  void Freeze() { frozen_ = true; }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return addr;
  }
  void Run() {
    pollfd accept_fd = {listen_, POLLIN, 0};
    while (!stop_ && poll(&accept_fd, 1, 20) <= 0) {
    }
    if (stop_) return;
    a_ = accept(listen_, nullptr, nullptr);
    b_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in to = Loopback(port_);
    CHECK_EQ(connect(b_, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
    char buf[65536];
    while (!stop_) {
      pollfd fds[2] = {{a_, POLLIN, 0}, {b_, POLLIN, 0}};
      if (frozen_ || poll(fds, 2, 20) <= 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(frozen_ ? 20 : 0));
        continue;
      }
      for (int k = 0; k < 2; ++k) {
        if ((fds[k].revents & (POLLIN | POLLHUP)) == 0) continue;
        const ssize_t n = read(fds[k].fd, buf, sizeof(buf));
        if (n <= 0) return;
        CHECK_EQ(write(fds[1 - k].fd, buf, static_cast<size_t>(n)), n);
      }
    }
  }
  const int port_;
  int own_port_ = 0, listen_ = -1, a_ = -1, b_ = -1;
  std::atomic<bool> stop_{false}, frozen_{false};
  std::thread thread_;
};

// A node whose connection died unseen (its host froze: no FIN, and a
// receive-only socket does not notice) reconnects under the same routing id.
// The new connection takes the id over; the ROUTER used to keep it with the
// old one and take the new one's first frame for its id, so nothing from the
// node was served again.
TEST(ZmqSocketsTest, AReconnectionUnderTheSameRoutingIdIsServed) {
  Context c;
  auto router = ZmqRouter::Bind(c.ctx, Local());
  ASSERT_OK(router.status());
  FreezableRelay relay((*router)->port());
  DealerOptions d;
  d.routing_id = "n-same";
  auto before = DealerTo(c.ctx, relay.port(), d);
  Message ctl;
  ctl.header.set_cmd(CMD_HEARTBEAT);
  ASSERT_TRUE(before->SendFrames(ctl.header.SerializeAsString(), nullptr, false));
  std::vector<Blob> frames = ReceiveWithin(**router, 5000);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(Str(frames[0]), "n-same");
  relay.Freeze();

  // The node comes back and sends until it is heard (a node's heartbeats).
  auto again = DealerTo(c.ctx, (*router)->port(), d);
  bool heard = false;
  for (int i = 0; i < 50 && !heard; ++i) {
    ASSERT_TRUE(again->SendFrames(ctl.header.SerializeAsString(), nullptr, false));
    frames = ReceiveWithin(**router, 100);
    heard = frames.size() == 2 && Str(frames[0]) == "n-same";
  }
  EXPECT_TRUE(heard) << "the new connection was never served";
  // And dead connections are found by TCP too.
  int keepalive = 0;
  size_t size = sizeof(keepalive);
  ASSERT_EQ(zmq_getsockopt((*router)->socket(), ZMQ_TCP_KEEPALIVE, &keepalive, &size), 0);
  EXPECT_EQ(keepalive, 1);
  again.reset();
  before.reset();
  router->reset();
}

TEST(ZmqSocketsTest, ABatchFrameCarriesSeveralMessagesInOrder) {
  Context c;
  auto router = ZmqRouter::Bind(c.ctx, Local());
  ASSERT_OK(router.status());
  auto dealer = DealerTo(c.ctx, (*router)->port());
  const Message a = Data(1, 3, 1.0f), b = Data(2, 5, 2.0f);
  std::vector<BatchEntry> entries = {{a.header.SerializeAsString(), &a, true},
                                     {b.header.SerializeAsString(), &b, true}};
  ASSERT_TRUE(dealer->SendBatchFrame(entries));
  std::vector<Blob> frames = ReceiveWithin(**router, 5000);
  ASSERT_EQ(frames.size(), 2u) << "routing id and one batch frame";
  ASSERT_TRUE(IsBatch(frames));
  EXPECT_EQ(std::memcmp(frames[1].data(), kBatchMagic, sizeof(kBatchMagic)), 0);
  std::vector<Decoded> got = DecodeBatch(frames);
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(got[i].error.empty()) << got[i].error;
    EXPECT_EQ(got[i].msg.header.request_id(), i + 1);
    EXPECT_OK(ValidateFrames(got[i].msg));
  }
  EXPECT_EQ(Str(got[1].msg.values[0]), Str(b.values[0]));
  dealer.reset();
  router->reset();
}

TEST(ZmqSocketsTest, AMessageWithTooManyFramesIsReadAndDiscarded) {
  Context c;
  auto router = ZmqRouter::Bind(c.ctx, Local());
  ASSERT_OK(router.status());
  void* raw = zmq_socket(c.ctx, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(raw, StrCat("tcp://127.0.0.1:", (*router)->port()).c_str()), 0);
  const char byte = 0;
  for (size_t i = 0; i < ZmqRouter::kMaxFrames; ++i) zmq_send(raw, &byte, 1, ZMQ_SNDMORE);
  zmq_send(raw, &byte, 1, 0);  // one more than a message may have, with the routing id
  zmq_send(raw, "after", 5, 0);
  std::vector<Blob> frames;
  ZmqRouter::Read read = ZmqRouter::Read::kNone;
  for (int i = 0; i < 500 && read == ZmqRouter::Read::kNone; ++i) {
    read = (*router)->Receive(&frames);
    if (read == ZmqRouter::Read::kNone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(read, ZmqRouter::Read::kTooManyFrames);
  EXPECT_TRUE(frames.empty());
  frames = ReceiveWithin(**router, 5000);
  ASSERT_EQ(frames.size(), 2u) << "the next message is read normally";
  EXPECT_EQ(Str(frames[1]), "after");
  zmq_close(raw);
  router->reset();
}

TEST(ZmqSocketsTest, BindingATakenPortNamesTheAddress) {
  Context c;
  auto first = ZmqRouter::Bind(c.ctx, Local());
  ASSERT_OK(first.status());
  RouterOptions o = Local();
  o.port = (*first)->port();
  auto second = ZmqRouter::Bind(c.ctx, o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kIOError);
  EXPECT_NE(second.status().message().find(StrCat("tcp://127.0.0.1:", o.port)), std::string::npos)
      << second.status();
  first->reset();
}

ConnectionReport ReportAfter(ZmqDealer& d, ConnectionReport::Kind want) {
  ConnectionReport r;
  for (int i = 0; i < 300; ++i) {
    r = d.events()->Report();
    if (r.kind == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return r;
}

TEST(ZmqSocketsTest, TheDealerTellsAConnectionFromAPortWhereNothingListens) {
  Context c;
  // A port bound but not listening: connections to it are refused, and no
  // other process can take it while the test runs.
  const int held = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(held, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(getsockname(held, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  auto nowhere = DealerTo(c.ctx, ntohs(addr.sin_port));
  ConnectionReport r = ReportAfter(*nowhere, ConnectionReport::kRefused);
  EXPECT_EQ(r.kind, ConnectionReport::kRefused) << r.text;
  EXPECT_NE(r.text.find("nothing listens there"), std::string::npos) << r.text;

  auto router = ZmqRouter::Bind(c.ctx, Local());
  ASSERT_OK(router.status());
  auto there = DealerTo(c.ctx, (*router)->port());
  r = ReportAfter(*there, ConnectionReport::kConnected);
  EXPECT_EQ(r.kind, ConnectionReport::kConnected) << r.text;
  EXPECT_EQ(r.text, "connected to " + there->address());
  nowhere.reset();
  there.reset();
  router->reset();
  close(held);
}

class ZmqSocketsSecurityTest : public ::testing::TestWithParam<bool> {};

TEST_P(ZmqSocketsSecurityTest, OnlyDealersHoldingTheJobsKeysGetThrough) {
  const bool encrypt = GetParam();
  auto keys = GenerateJobKeys();
  if (!keys.ok()) GTEST_SKIP() << "this ZeroMQ has no CURVE: " << keys.status();
  auto other = GenerateJobKeys();
  ASSERT_OK(other.status());
  Context c;
  RouterOptions ro = Local();
  ro.keys = std::make_shared<JobKeys>(*keys);
  ro.encrypt = encrypt;
  auto router = ZmqRouter::Bind(c.ctx, ro);
  ASSERT_OK(router.status());
  const int port = (*router)->port();
  const Message m = Data(3, 16, 1.0f);
  const std::string header = m.header.SerializeAsString();

  // Without keys, and with another job's: refused, nothing arrives.
  auto stranger = DealerTo(c.ctx, port);
  DealerOptions wrong;
  wrong.keys = std::make_shared<JobKeys>(*other);
  wrong.encrypt = encrypt;
  auto impostor = DealerTo(c.ctx, port, wrong);
  stranger->SendFrames(header, &m, true);
  impostor->SendFrames(header, &m, true);
  for (int i = 0; i < 300 && (*router)->refused() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE((*router)->refused(), 2);
  EXPECT_TRUE(ReceiveWithin(**router, 300).empty());
  ConnectionReport r = impostor->events()->Report();
  EXPECT_NE(r.kind, ConnectionReport::kConnected) << r.text;

  // With the job's keys: through.
  DealerOptions member;
  member.keys = ro.keys;
  member.encrypt = encrypt;
  member.routing_id = "n-member";
  auto friendly = DealerTo(c.ctx, port, member);
  ASSERT_TRUE(friendly->SendFrames(header, &m, true));
  std::vector<Blob> frames = ReceiveWithin(**router, 5000);
  ASSERT_EQ(frames.size(), 5u);
  EXPECT_EQ(Str(frames[0]), "n-member");
  EXPECT_EQ(Str(frames[1]), header);
  EXPECT_EQ(ReportAfter(*friendly, ConnectionReport::kConnected).kind,
            ConnectionReport::kConnected);
  stranger.reset();
  impostor.reset();
  friendly.reset();
  router->reset();
}

INSTANTIATE_TEST_SUITE_P(CurveAndPlain, ZmqSocketsSecurityTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Curve" : "Plain";
                         });

}  // namespace
}  // namespace pstrain
