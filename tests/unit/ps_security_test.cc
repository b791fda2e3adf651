// The attacks of issue 12, replayed on loopback against a job that has keys:
// a process without the job's key cannot register, push, configure or abort
// (its handshake fails, nothing reaches the job); a member that forges another
// node's sender is dropped; the job ends well each time. And the key files.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>
#include <vector>

#include "net/cluster_node.h"
#include "net/job_keys.h"
#include "net/van.h"
#include "tests/test_util.h"
#include "tests/unit/inproc_job.h"

namespace pstrain {
namespace {

using testing::Config;
using testing::ExpectAllOk;
using testing::JobResult;
using testing::JobSpec;
using testing::RunJobWith;
using testing::Soon;

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          StrCat("pstrain-", getpid(), "-", name, "-",
                 std::chrono::steady_clock::now().time_since_epoch().count()))
      .string();
}

// A fresh key file, removed with the object.
struct KeyFile {
  std::string path = TempPath("job.key");
  KeyFile() {
    auto keys = GenerateJobKeys();
    CHECK(keys.ok()) << keys.status();
    CHECK_OK(WriteJobKeys(*keys, path));
  }
  ~KeyFile() { std::filesystem::remove(path); }
};

TEST(JobKeysTest, WrittenPrivateAndReadBack) {
  KeyFile f;
  struct stat st;
  ASSERT_EQ(stat(f.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto keys = ReadJobKeys(f.path);
  ASSERT_OK(keys.status());
  EXPECT_EQ(keys->server_public.size(), 40u);
  EXPECT_NE(keys->server_public, keys->client_public);
  auto again = GenerateJobKeys();
  ASSERT_OK(again.status());
  const Status exists = WriteJobKeys(*again, f.path);
  EXPECT_EQ(exists.code(), StatusCode::kFailedPrecondition) << exists;
}

TEST(JobKeysTest, AFileOthersCanReadOrAMalformedOneIsRefusedByName) {
  KeyFile f;
  chmod(f.path.c_str(), 0644);
  auto open = ReadJobKeys(f.path);
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("readable by others (mode 644)"), std::string::npos)
      << open.status();
  chmod(f.path.c_str(), 0600);
  {
    std::ofstream out(f.path, std::ios::app);
    out << "client-secret not-a-key\n";
  }
  auto bad = ReadJobKeys(f.path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(f.path + ":6:"), std::string::npos) << bad.status();
  const std::string partial = TempPath("partial.key");
  {
    std::ofstream out(partial);
    out << "server-public " << std::string(40, '0') << "\n";
  }
  chmod(partial.c_str(), 0600);
  auto missing = ReadJobKeys(partial);
  std::filesystem::remove(partial);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("has no server-secret line"), std::string::npos)
      << missing.status();
}

// The values MXNet's conformance check expects, with the job's keys, over TCP
// and through shared memory.
// `midway` (if set) runs after the initial barrier, before the rounds.
Status Rounds(KVClient& kv, int rounds, const std::function<void()>& midway = nullptr) {
  const int W = kv.num_workers();
  const std::vector<KVClient::Key> keys = {3, 4};
  const std::vector<int64_t> lens = {6, 300000};
  const size_t n = lens[0] + lens[1];
  std::vector<float> ones(n, 1.0f), grad(n, kv.rank() + 1.0f), got(n);
  RETURN_IF_ERROR(kv.SetServerConfig(Config(true, 2.0f), Soon()));
  RETURN_IF_ERROR(kv.Wait(kv.Init(keys, lens, ones.data()), Soon()));
  RETURN_IF_ERROR(kv.Barrier(Soon()));
  if (midway) midway();
  for (int i = 1; i <= rounds; ++i) {
    RETURN_IF_ERROR(kv.Wait(kv.PushPull(keys, lens, grad.data(), got.data()), Soon()));
    const float expect = 1.0f + 2.0f * W * (W + 1) / 2.0f * i;
    for (size_t j = 0; j < n; ++j) {
      if (got[j] != expect) {
        return Status::Internal(StrCat("round ", i, " element ", j, ": ", got[j], " != ", expect));
      }
    }
  }
  return Status::Ok();
}

TEST(SecurityTest, AJobWithKeysTrainsOverTcpAndSharedMemoryEncryptedOrNot) {
  KeyFile key;
  for (bool encrypt : {true, false}) {
    for (int64_t shm : {int64_t{0}, int64_t{16} << 20}) {
      SCOPED_TRACE(StrCat(shm > 0 ? "shared memory" : "tcp", encrypt ? ", curve" : ", auth"));
      JobSpec spec;
      spec.key_file = key.path;
      spec.encrypt = encrypt;
      spec.shm_bytes = shm;
      ExpectAllOk(RunJobWith(
          2, 2, [](KVClient& kv) { return Rounds(kv, 3); }, spec));
    }
  }
}

// A process that sends to one of the job's ports, with or without the keys.
class Intruder {
 public:
  Intruder(const std::string& key_file, uint64_t nonce, bool encrypt = true) {
    VanOptions vo;
    vo.bind_host = "127.0.0.1";
    vo.name = "intruder";
    vo.routing_id = NodeRoute(nonce);
    if (!key_file.empty()) {
      auto keys = ReadJobKeys(key_file);
      CHECK(keys.ok()) << keys.status();
      vo.keys = std::make_shared<const JobKeys>(*keys);
      vo.encrypt = encrypt;
    }
    auto van = Van::Create(vo, [this](Message&&) { ++received; });
    CHECK(van.ok()) << van.status();
    van_ = std::move(van).value();
    van_->StartReceiving();
  }
  // `edit` (if set) changes the message last (a malformed one).
  void Send(int port, PsHeader h, std::vector<float> values = {},
            const std::function<void(Message*)>& edit = nullptr) {
    // One connection per port (a second with the same routing id is refused).
    if (connected_.insert(port).second) CHECK_OK(van_->Connect(port, "127.0.0.1", port));
    Message m;
    h.set_version(PROTOCOL_VERSION_CURRENT);
    m.header = h;
    if (h.cmd() == CMD_DATA) {
      const uint64_t key = 3;
      const uint32_t len = static_cast<uint32_t>(values.size());
      m.keys = Blob::Copy(&key, sizeof(key));
      m.lens = Blob::Copy(&len, sizeof(len));
      m.values.push_back(Blob::Copy(values.data(), values.size() * sizeof(float)));
      m.header.set_num_keys(1);
      m.header.set_num_value_frames(1);
      m.header.set_value_bytes(values.size() * sizeof(float));
      m.header.set_dtype(DTYPE_FLOAT32);
    }
    if (edit) edit(&m);
    (void)van_->Send(port, m);
  }
  std::atomic<int> received{0};

 private:
  std::unique_ptr<Van> van_;
  std::set<int> connected_;
};

PsHeader Forged(PsCommand cmd, int sender) {
  PsHeader h;
  h.set_cmd(cmd);
  h.set_sender(sender);
  h.set_receiver(ServerId(0));
  h.set_request_id(424242);
  return h;
}

// A NaN push claiming worker 0, a configuration with a huge learning rate and
// an abort claiming the scheduler, all sent to server 0 while the job runs.
void Attack(Intruder* in, int server_port) {
  PsHeader push = Forged(CMD_DATA, WorkerId(0));
  push.set_push(true);
  in->Send(server_port, push, std::vector<float>(6, std::nanf("")));
  PsHeader config = Forged(CMD_CONFIG, WorkerId(0));
  ServerConfig c = Config(false, 1e6f);
  c.set_generation(99);
  config.set_body(c.SerializeAsString());
  in->Send(server_port, config);
  PsHeader abort = Forged(CMD_ABORT, kSchedulerId);
  abort.set_error_message("forged abort");
  in->Send(server_port, abort);
}

// Without the key: nothing it sends arrives, and its registration does not
// take the job's only worker slot (it used to, and the real worker was then
// turned away). With the key but another node's sender: dropped as forged.
TEST(SecurityTest, OutsidersAndForgedSendersCannotHarmTheJob) {
  KeyFile key;
  KeyFile other;  // another job's
  for (int kind = 0; kind < 5; ++kind) {
    // 0-2 against a curve job, 3-4 against an auth job (connections
    // authenticated, frames in the clear).
    const bool member = kind == 2 || kind == 4;
    const bool encrypt = kind <= 2;
    SCOPED_TRACE(kind == 0   ? "an outsider without CURVE"
                 : kind == 1 ? "an outsider with another job's key"
                 : kind == 2 ? "a member forging senders"
                 : kind == 3 ? "an outsider with another job's password (auth)"
                             : "a member forging senders (auth)");
    Intruder intruder(kind == 0                  ? ""
                      : (kind == 1 || kind == 3) ? other.path
                                                 : key.path,
                      7, encrypt);
    std::atomic<int> server_port{0};
    JobSpec spec;
    spec.key_file = key.path;
    spec.encrypt = encrypt;
    spec.on_scheduler = [&](int port) {
      if (member) return;  // a member's registration would be a real one
      PsHeader reg;
      reg.set_cmd(CMD_REGISTER);
      reg.mutable_node()->set_role(static_cast<int>(Role::kWorker));
      reg.mutable_node()->set_host("127.0.0.1");
      reg.mutable_node()->set_port(1);
      reg.mutable_node()->set_nonce(7);
      reg.mutable_node()->set_num_servers(1);
      reg.mutable_node()->set_num_workers(1);
      reg.mutable_node()->set_build(BuildId());
      intruder.Send(port, reg);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    };
    spec.on_server = [&](int rank, int port) { server_port = port; };
    JobResult r = RunJobWith(
        1, 1,
        [&](KVClient& kv) -> Status {
          Attack(&intruder, server_port.load());
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          return Rounds(kv, 3);
        },
        spec);
    ExpectAllOk(r);
    EXPECT_EQ(intruder.received.load(), 0) << "nothing may answer it";
  }
}

// Before its table a node knows nobody's route, so a member's messages
// claiming the scheduler or a worker could come from any connection then:
// they are held and checked against the table (the push and configuration),
// or taken only from a scheduler's connection (the abort). A forged abort
// taken then used to end the job (SecurityTest above, when the attack
// overtook the server's table).
TEST(SecurityTest, ForgedMessagesBeforeTheTableAreNotTaken) {
  KeyFile key;
  for (bool encrypt : {true, false}) {
    SCOPED_TRACE(encrypt ? "curve" : "auth");
    Intruder intruder(key.path, 7, encrypt);
    std::atomic<bool> attacked{false};
    JobSpec spec;
    spec.key_file = key.path;
    spec.encrypt = encrypt;
    spec.on_server = [&](int rank, int port) {
      Attack(&intruder, port);  // the server has not even registered yet
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      attacked = true;
    };
    spec.tweak_worker = [&](int w, ClusterOptions*) {
      for (int i = 0; i < 500 && !attacked.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    };
    JobResult r = RunJobWith(
        1, 1, [](KVClient& kv) { return Rounds(kv, 3); }, spec);
    ExpectAllOk(r);
    EXPECT_TRUE(attacked.load());
    EXPECT_EQ(intruder.received.load(), 0) << "nothing may answer it";
  }
}

// A member that names a co-located worker as the sender of a malformed
// numbered message (an old protocol version; more value frames than it sends)
// must not touch that worker's numbering at the server: it used to start the
// worker's numbering over at the forged one, and the server then held every
// later message of the worker, waiting for a number that was never coming.
TEST(SecurityTest, AForgedMalformedMessageDoesNotTouchTheNumberingOfTheSenderItNames) {
  for (int kind = 0; kind < 2; ++kind) {
    SCOPED_TRACE(kind == 0 ? "old protocol version" : "frames that do not decode");
    Intruder intruder("", 7);
    std::atomic<int> server_port{0};
    JobSpec spec;
    spec.shm_bytes = int64_t{16} << 20;  // the worker numbers its messages to the server
    spec.on_server = [&](int rank, int port) { server_port = port; };
    const auto attack = [&] {
      PsHeader push = Forged(CMD_DATA, WorkerId(0));
      push.set_push(true);
      push.set_shm_stream(12345);
      push.set_shm_seq(0);
      push.set_shm_mapped(true);
      intruder.Send(server_port.load(), push, std::vector<float>(kind == 0 ? 6 : 100000, 1.0f),
                    [kind](Message* m) {
                      if (kind == 0) m->header.set_version(PROTOCOL_VERSION_CURRENT + 1);
                      if (kind == 1) m->header.set_num_value_frames(3);
                    });
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    };
    JobResult r = RunJobWith(
        1, 1, [&](KVClient& kv) { return Rounds(kv, 3, attack); }, spec);
    ExpectAllOk(r);
    EXPECT_EQ(intruder.received.load(), 0) << "nothing may answer it";
  }
}

// Only the scheduler shuts a node down, aborts it, releases its barriers or
// sends it a table: a member's own messages of those kinds (its real sender,
// on its own connection) are ignored. A worker used to shut a server down.
TEST(SecurityTest, AMemberCannotShutDownAbortOrReleaseAnotherNode) {
  JobSpec spec;
  JobResult r = RunJobWith(
      2, 1,
      [&](KVClient& kv) {
        return Rounds(kv, 3, [&kv] {
          if (kv.rank() != 0) return;
          ClusterNode* node = kv.node();
          const int own = node->id();
          for (PsCommand cmd : {CMD_SHUTDOWN, CMD_ABORT, CMD_BARRIER, CMD_NODE_TABLE}) {
            for (int to : {ServerId(0), ServerId(1)}) {
              Message m;
              m.header.set_version(PROTOCOL_VERSION_CURRENT);
              m.header.set_cmd(cmd);
              m.header.set_sender(own);
              m.header.set_receiver(to);
              m.header.set_error_message("a member's abort");
              m.header.set_error_code(static_cast<int>(StatusCode::kInternal));
              m.header.set_group(0);
              m.header.set_generation(1000);
              const Status sent = node->Send(to, m);
              EXPECT_TRUE(sent.ok()) << PsCommand_Name(cmd) << ": " << sent;
            }
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
        });
      },
      spec);
  ExpectAllOk(r);
}

// Numbered messages from a peer whose arena this node has not mapped come
// over ZeroMQ alone, in order: they are handed on at once, gaps and all. They
// used to wait for the missing numbers, without bound (a member could fill
// the node's memory).
TEST(SecurityTest, NumberedMessagesFromAPeerWhoseQueueIsNotReadAreNotHeld) {
  std::atomic<int> got{0};
  VanOptions vo;
  vo.bind_host = "127.0.0.1";
  vo.name = "receiver";
  auto van = Van::Create(vo, [&got](Message&&) { ++got; });
  ASSERT_OK(van.status());
  (*van)->StartReceiving();
  Intruder sender("", 7);
  const std::vector<uint64_t> numbers = {5, 9, 20, 21, 400};
  for (uint64_t seq : numbers) {
    PsHeader h = Forged(CMD_HEARTBEAT, 77);
    h.set_shm_stream(1);
    h.set_shm_seq(seq);
    h.set_shm_mapped(true);
    sender.Send((*van)->port(), h);
  }
  for (int i = 0; i < 200 && got.load() < static_cast<int>(numbers.size()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(got.load(), static_cast<int>(numbers.size()));
  EXPECT_EQ((*van)->dropped(), 0);
}

// What a node says when it cannot join: the connection's own events tell a
// port where nothing listens from a scheduler that refuses our key.
ConnectionReport ReportAfter(Van& from, int port, ConnectionReport::Kind want) {
  // ZeroMQ connects (and shakes hands) without a message being sent.
  CHECK_OK(from.Connect(port, "127.0.0.1", port));
  ConnectionReport r;
  for (int i = 0; i < 100; ++i) {  // up to 5 s
    r = from.DescribeConnection(port);
    if (r.kind == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return r;
}

std::unique_ptr<Van> TestVan(const std::string& key_file) {
  VanOptions vo;
  vo.bind_host = "127.0.0.1";
  vo.name = "test";
  if (!key_file.empty()) {
    auto keys = ReadJobKeys(key_file);
    CHECK(keys.ok()) << keys.status();
    vo.keys = std::make_shared<const JobKeys>(*keys);
  }
  auto van = Van::Create(vo, [](Message&&) {});
  CHECK(van.ok()) << van.status();
  (*van)->StartReceiving();
  return std::move(van).value();
}

TEST(ConnectionReportTest, RefusedUnansweredKeyRefusedAndConnectedAreToldApart) {
  KeyFile key, other;
  auto job = TestVan(key.path);
  {
    // A port nothing listens on: a just-closed one.
    int port = 0;
    {
      auto gone = TestVan("");
      port = gone->port();
    }
    auto v = TestVan("");
    const ConnectionReport r = ReportAfter(*v, port, ConnectionReport::kRefused);
    EXPECT_EQ(r.kind, ConnectionReport::kRefused) << r.text;
    EXPECT_NE(r.text.find("was refused"), std::string::npos) << r.text;
    EXPECT_NE(r.text.find(StrCat("127.0.0.1:", port)), std::string::npos) << r.text;
  }
  {
    auto v = TestVan("");  // no security against a CURVE job
    const ConnectionReport r = ReportAfter(*v, job->port(), ConnectionReport::kHandshakeFailed);
    EXPECT_EQ(r.kind, ConnectionReport::kHandshakeFailed) << r.text;
    EXPECT_NE(r.text.find("PSTRAIN_KEY_FILE"), std::string::npos) << r.text;
  }
  {
    auto v = TestVan(other.path);  // another job's keys
    const ConnectionReport r = ReportAfter(*v, job->port(), ConnectionReport::kHandshakeFailed);
    EXPECT_TRUE(r.kind == ConnectionReport::kHandshakeFailed ||
                r.kind == ConnectionReport::kKeyRefused)
        << r.text;
  }
  {
    auto v = TestVan(key.path);
    const ConnectionReport r = ReportAfter(*v, job->port(), ConnectionReport::kConnected);
    EXPECT_EQ(r.kind, ConnectionReport::kConnected) << r.text;
  }
  {
    auto v = TestVan("");
    EXPECT_EQ(v->DescribeConnection(12345).kind, ConnectionReport::kNone);
  }
}

// Found by review: ZeroMQ's I/O thread hands a dealer's connection events to
// its monitor with a blocking send, and nothing read them after start-up: some
// 2,000 retries to a peer that stays away (5 minutes at ZeroMQ's interval, a
// worker lost under --worker-loss continue) filled the monitor and stopped
// every socket of the node, and closing the dealer hung. Here the retries
// come every millisecond. The same holds after the Van stopped receiving (its
// owner still sends while it stops its threads): another thread reads the
// events then.
class PeerAwayTest : public ::testing::TestWithParam<bool> {};

TEST_P(PeerAwayTest, APeerThatStaysAwayDoesNotStopTheNodesOtherConnections) {
  const bool stopped_receiving = GetParam();
  // Port 1 (tcpmux): privileged and unused, so no test running beside this
  // one can take it, as it could a port just given back.
  const int dead_port = 1;
  std::atomic<int> received{0};
  VanOptions vo;
  vo.bind_host = "127.0.0.1";
  vo.name = "receiver";
  auto rx = Van::Create(vo, [&](Message&&) { ++received; });
  ASSERT_OK(rx.status());
  (*rx)->SetSelfId(8);
  (*rx)->StartReceiving();
  vo.name = "sender";
  vo.reconnect_interval_ms = 1;
  auto tx = Van::Create(vo, [](Message&&) {});
  ASSERT_OK(tx.status());
  (*tx)->SetSelfId(9);
  (*tx)->StartReceiving();
  ASSERT_OK((*tx)->Connect(1, "127.0.0.1", dead_port));
  ASSERT_OK((*tx)->Connect(8, "127.0.0.1", (*rx)->port()));
  if (stopped_receiving) (*tx)->StopReceiving();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 70; ++i) {  // 7 s: thousands of retries
    Message m;
    m.header.set_version(PROTOCOL_VERSION_CURRENT);
    m.header.set_cmd(CMD_HEARTBEAT);
    m.header.set_sender(9);
    m.header.set_receiver(8);
    ASSERT_OK((*tx)->Send(8, m));
    Deadline arrived = Deadline::InMillis(3000);
    while (received.load() <= i && !arrived.Expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_GT(received.load(), i)
        << "message " << i << " did not arrive: the node's sockets stopped after "
        << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
        << " s of retries";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const ConnectionReport r = (*tx)->DescribeConnection(1);
  EXPECT_EQ(r.kind, ConnectionReport::kRefused) << r.text;
  tx->reset();  // the dealer's monitor is stopped without hanging
}

INSTANTIATE_TEST_SUITE_P(Receiving, PeerAwayTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "AfterStopReceiving" : "WhileReceiving";
                         });

// A node whose scheduler is not there says so (not only that the table did
// not come), within its start-up timeout.
TEST(ConnectionReportTest, ANodeWhoseSchedulerIsNotThereSaysTheConnectionWasRefused) {
  int port = 0;
  {
    auto gone = TestVan("");
    port = gone->port();
  }
  ClusterOptions o = testing::TestOptions(1, 1, "127.0.0.1");
  o.role = Role::kServer;
  o.root_port = port;
  o.startup_timeout_ms = 1500;
  auto node = ClusterNode::Create(o);
  ASSERT_OK(node.status());
  const auto start = std::chrono::steady_clock::now();
  const Status s = (*node)->Start();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 3.0);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(
      s.message().find(StrCat("every TCP connection to tcp://127.0.0.1:", port, " was refused")),
      std::string::npos)
      << s;
  EXPECT_NE(s.message().find("is the scheduler running there?"), std::string::npos) << s;
}

}  // namespace
}  // namespace pstrain
