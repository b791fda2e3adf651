#include "net/van.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

namespace pstrain {
namespace {

// Frames smaller than this are copied into ZeroMQ (cheaper than a reference).
constexpr size_t kCopyBelowBytes = 512;
// Data messages whose keys, lens and (not shared-memory) values fit in this
// many bytes cross ZeroMQ as one frame (a batch, kBatchMagic, of one or
// more): one copy of them costs less than three more frames through ZeroMQ
// on both ends.
constexpr uint64_t kPackBytes = 32 * 1024;
// A batch frame stops growing past this many bytes of keys, lens and values.
constexpr uint64_t kMaxBatchBytes = 4 << 20;
// Messages of one peer waiting for an earlier-numbered one past which its
// shared-memory queue is not read (the missing one is on ZeroMQ).
constexpr size_t kMaxStashed = 1 << 16;

// Bytes a data message carries besides its header: keys, lens and (with
// `values`) its values.
uint64_t PayloadBytes(const Message& msg, bool values) {
  uint64_t bytes = msg.keys.size() + msg.lens.size();
  if (values) {
    for (const Blob& v : msg.values) bytes += v.size();
  }
  return bytes;
}

// One message of a batch frame: its serialized header and whether its
// values travel inline.
struct Framed {
  std::string header;
  const Message* msg = nullptr;
  bool inline_values = false;
};

// Initialises `m` with the batch frame of `items` (see kBatchMagic).
void BuildBatchFrame(const std::vector<Framed>& items, zmq_msg_t* m) {
  std::vector<uint64_t> bytes(items.size());
  uint64_t total = 16;
  for (size_t i = 0; i < items.size(); ++i) {
    bytes[i] = EnvelopeBytes(items[i].header, *items[i].msg, items[i].inline_values);
    total += 8 + (bytes[i] + 7) / 8 * 8;
  }
  zmq_msg_init_size(m, total);
  char* dst = static_cast<char*>(zmq_msg_data(m));
  std::memcpy(dst, kBatchMagic, sizeof(kBatchMagic));
  const uint32_t count[2] = {static_cast<uint32_t>(items.size()), 0};
  std::memcpy(dst + 8, count, sizeof(count));
  uint64_t at = 16;
  for (size_t i = 0; i < items.size(); ++i) {
    std::memcpy(dst + at, &bytes[i], 8);
    WriteEnvelope(items[i].header, *items[i].msg, items[i].inline_values, dst + at + 8);
    const uint64_t padded = (bytes[i] + 7) / 8 * 8;
    std::memset(dst + at + 8 + bytes[i], 0, padded - bytes[i]);
    at += 8 + padded;
  }
}

struct ZmqFrame {
  zmq_msg_t msg;
  ZmqFrame() { zmq_msg_init(&msg); }
  ~ZmqFrame() { zmq_msg_close(&msg); }
};

std::string ZmqError() { return zmq_strerror(zmq_errno()); }

void ReleaseOwner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

// Fills `m` with `b`: a copy when small, else a reference that keeps b's owner alive.
void InitFrame(zmq_msg_t* m, const Blob& b) {
  if (b.size() < kCopyBelowBytes || b.owner() == nullptr) {
    if (b.size() < kCopyBelowBytes) {
      zmq_msg_init_size(m, b.size());
      if (b.size() > 0) std::memcpy(zmq_msg_data(m), b.data(), b.size());
      return;
    }
    // Caller-owned memory: valid until the request completes (see KVClient).
    zmq_msg_init_data(m, const_cast<char*>(b.data()), b.size(), nullptr, nullptr);
    return;
  }
  auto* hold = new std::shared_ptr<const void>(b.owner());
  zmq_msg_init_data(m, const_cast<char*>(b.data()), b.size(), &ReleaseOwner, hold);
}

}  // namespace

struct Van::Peer {
  Mutex mu;
  void* socket = nullptr;  // DEALER, used only under mu
  std::string address;
  std::shared_ptr<ShmMapping> theirs;  // the peer's arena, mapped here (null: TCP)
  std::atomic<bool> maps_mine{false};  // the peer said it mapped our arena
  uint64_t next_seq = 0;               // shm_seq of the next message (with theirs), under mu
  uint64_t stream = 0;                 // names this connection's numbering (shm_stream)
  sockaddr_un doorbell{};              // the peer's doorbell (with theirs)
  socklen_t doorbell_len = 0;          // 0: none, messages to it go over ZeroMQ
  // The DEALER's connection events (a PAIR), read under mu by
  // DescribeConnection, and what they told so far.
  void* monitor = nullptr;
  int tcp_up = 0;          // TCP connections made
  int retries = 0;         // reconnects scheduled (after a refused or lost connection)
  int lost = 0;            // connections lost
  int auth_refused = 0;    // handshakes the peer refused (not our job's key)
  int other_failures = 0;  // handshakes failed otherwise (security settings differ)
  bool up = false;
  bool handshake_ok = false;
  ~Peer() {
    if (socket != nullptr) {
      if (monitor != nullptr) zmq_socket_monitor(socket, nullptr, 0);
      zmq_close(socket);
    }
    if (monitor != nullptr) zmq_close(monitor);
  }
};

StatusOr<std::string> ResolveHost(const std::string& host) {
  if (host.empty()) return Status::InvalidArgument("empty host name");
  in_addr addr{};
  if (inet_pton(AF_INET, host.c_str(), &addr) == 1) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::NotFound(StrCat("cannot resolve host '", host, "': ", gai_strerror(rc)));
  }
  char buf[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return std::string(buf);
}

StatusOr<std::string> AdvertisedHost(const std::string& node_host, const std::string& interface,
                                     const std::string& root_host) {
  if (!node_host.empty()) return node_host;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return Status::IOError("getifaddrs failed");
  std::string found;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
    if (!interface.empty()) {
      if (interface == i->ifa_name) {
        found = buf;
        break;
      }
      continue;
    }
    if ((i->ifa_flags & IFF_LOOPBACK) == 0 && found.empty()) found = buf;
  }
  freeifaddrs(ifs);
  if (!interface.empty() && found.empty()) {
    return Status::NotFound(
        StrCat("DMLC_INTERFACE=", interface, " has no IPv4 address on this host"));
  }
  if (interface.empty()) {
    auto root_ip = ResolveHost(root_host);
    if (root_ip.ok() && root_ip->rfind("127.", 0) == 0) return std::string("127.0.0.1");
    if (found.empty()) return std::string("127.0.0.1");
  }
  return found;
}

StatusOr<std::unique_ptr<Van>> Van::Create(const VanOptions& options, Handler handler) {
  std::unique_ptr<Van> van(new Van());
  van->options_ = options;
  van->handler_ = std::move(handler);
  van->context_ = zmq_ctx_new();
  if (options.keys != nullptr && van->context_ != nullptr) {
    if (options.encrypt && !zmq_has("curve")) {
      return Status::Unavailable(
          StrCat(options.name, ": a job key was given, but this ZeroMQ has no CURVE security"));
    }
    uint8_t key[32];
    if (zmq_z85_decode(key, options.keys->client_public.c_str()) == nullptr) {
      return Status::InvalidArgument(StrCat(options.name, ": the job's client key is not Z85"));
    }
    van->client_key_.assign(reinterpret_cast<char*>(key), sizeof(key));
    // The handler must listen before the ROUTER takes its first handshake.
    void* zap = zmq_socket(van->context_, ZMQ_REP);
    if (zap == nullptr || zmq_bind(zap, "inproc://zeromq.zap.01") != 0) {
      if (zap != nullptr) zmq_close(zap);
      return Status::IOError(StrCat(options.name, ": cannot start authentication: ", ZmqError()));
    }
    van->zap_socket_ = zap;
  }
  if (van->context_ == nullptr) return Status::IOError("zmq_ctx_new: " + ZmqError());
  van->router_ = zmq_socket(van->context_, ZMQ_ROUTER);
  int64_t max_size = options.max_message_bytes;
  zmq_setsockopt(van->router_, ZMQ_MAXMSGSIZE, &max_size, sizeof(max_size));
  int linger = 0;
  zmq_setsockopt(van->router_, ZMQ_LINGER, &linger, sizeof(linger));
  int hwm = 0;  // never drop inbound messages; senders are bounded by their own HWM
  zmq_setsockopt(van->router_, ZMQ_RCVHWM, &hwm, sizeof(hwm));
  if (options.keys != nullptr) {
    // Failed handshakes (a peer without CURVE, or with other keys) are
    // reported on a monitor socket the authentication thread reads.
    const std::string monitor = StrCat("inproc://monitor-", reinterpret_cast<uintptr_t>(van.get()));
    zmq_socket_monitor(van->router_, monitor.c_str(),
                       ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    void* events = zmq_socket(van->context_, ZMQ_PAIR);
    zmq_connect(events, monitor.c_str());
    Van* raw = van.get();
    void* zap = van->zap_socket_;
    van->zap_socket_ = nullptr;
    van->zap_ = std::thread([raw, zap, events] { raw->ZapLoop(zap, events); });
    int server = 1;
    const std::string domain = "pstrain";
    const bool set =
        options.encrypt
            ? zmq_setsockopt(van->router_, ZMQ_CURVE_SERVER, &server, sizeof(server)) == 0 &&
                  zmq_setsockopt(van->router_, ZMQ_CURVE_SECRETKEY,
                                 options.keys->server_secret.c_str(),
                                 options.keys->server_secret.size()) == 0
            : zmq_setsockopt(van->router_, ZMQ_PLAIN_SERVER, &server, sizeof(server)) == 0;
    if (!set || zmq_setsockopt(van->router_, ZMQ_ZAP_DOMAIN, domain.data(), domain.size()) != 0) {
      return Status::InvalidArgument(
          StrCat(options.name, ": the job's server key is not usable: ", ZmqError()));
    }
  }

  std::string ip = "*";
  if (!options.bind_host.empty() && options.bind_host != "*" && options.bind_host != "0.0.0.0") {
    ASSIGN_OR_RETURN(ip, ResolveHost(options.bind_host));
  }
  std::string endpoint = StrCat(
      "tcp://", ip, ":", options.port == 0 ? std::string("*") : std::to_string(options.port));
  if (zmq_bind(van->router_, endpoint.c_str()) != 0) {
    return Status::IOError(StrCat(options.name, ": cannot bind ", endpoint, " (bind host '",
                                  options.bind_host, "'): ", ZmqError()));
  }
  char last[256] = {0};
  size_t last_len = sizeof(last);
  zmq_getsockopt(van->router_, ZMQ_LAST_ENDPOINT, last, &last_len);
  const char* colon = std::strrchr(last, ':');
  van->port_ = colon != nullptr ? std::atoi(colon + 1) : options.port;
  if (options.shm_bytes > 0) {
    auto arena = ShmArena::Create(options.shm_bytes, options.shm_store_bytes);
    if (arena.ok()) {
      van->arena_ = std::move(arena).value();
      van->shm_info_ = van->arena_->info();
      van->OpenDoorbell();
    } else {
      LOG(WARNING) << options.name
                   << ": no shared-memory arena, co-located peers use TCP: " << arena.status();
    }
  }
  return van;
}

void Van::StartReceiving() {
  CHECK(!receiver_.joinable()) << "StartReceiving called twice";
  receiver_ = std::thread([this] { ReceiveLoop(); });
}

void Van::StopReceiving() {
  stop_ = true;
  if (receiver_.joinable()) receiver_.join();
}

Van::~Van() {
  StopReceiving();
  {
    MutexLock l(&mu_);
    peers_.clear();
  }
  if (router_ != nullptr) zmq_close(router_);
  zap_stop_ = true;
  if (zap_.joinable()) zap_.join();
  if (zap_socket_ != nullptr) zmq_close(zap_socket_);
  if (context_ != nullptr) zmq_ctx_term(context_);
  if (doorbell_in_ >= 0) close(doorbell_in_);
  if (doorbell_out_ >= 0) close(doorbell_out_);
}

const ShmInfo* Van::shm_info() const { return arena_ != nullptr ? &shm_info_ : nullptr; }

void Van::OpenDoorbell() {
  // An abstract Unix datagram socket named after the arena's token: peers on
  // this host (and network namespace) write a byte to it to wake ReceiveLoop.
  const std::string name = StrCat("pstrain-", getpid(), "-", shm_info_.token());
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    LOG(WARNING) << options_.name << ": no doorbell socket (" << std::strerror(errno)
                 << "); co-located peers send messages over TCP";
    if (fd >= 0) close(fd);
    return;
  }
  doorbell_in_ = fd;
  doorbell_out_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  shm_info_.set_doorbell(name);
}

void Van::SetSelfId(int id) { self_id_ = id; }

void Van::ExpectRoute(int id, const std::string& route) {
  MutexLock l(&mu_);
  routes_[id] = route;
}

void Van::ZapLoop(void* socket, void* events) {
  zmq_pollitem_t items[2] = {{socket, 0, ZMQ_POLLIN, 0}, {events, 0, ZMQ_POLLIN, 0}};
  while (!zap_stop_.load()) {
    if (zmq_poll(items, 2, 100) <= 0) continue;
    if (items[1].revents & ZMQ_POLLIN) {
      // A monitor event: 2 frames, (uint16 event, uint32 value) and the address.
      std::string address;
      for (int frame = 0;; ++frame) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, events, ZMQ_DONTWAIT) < 0) {
          zmq_msg_close(&f);
          break;
        }
        if (frame == 1) address.assign(static_cast<char*>(zmq_msg_data(&f)), zmq_msg_size(&f));
        const bool more = zmq_msg_more(&f);
        zmq_msg_close(&f);
        if (!more) break;
      }
      const int64_t n = ++refused_;
      LOG_IF(WARNING, n <= 10 || n % 100 == 0)
          << options_.name << ": refused a connection"
          << (address.empty() ? "" : " from " + address)
          << ": its handshake failed (it does not use this job's key)";
    }
    if ((items[0].revents & ZMQ_POLLIN) == 0) continue;
    // version, request id, domain, address, routing id, mechanism, credentials...
    std::vector<std::string> frames;
    for (;;) {
      zmq_msg_t f;
      zmq_msg_init(&f);
      if (zmq_msg_recv(&f, socket, 0) < 0) {
        zmq_msg_close(&f);
        break;
      }
      frames.emplace_back(static_cast<char*>(zmq_msg_data(&f)), zmq_msg_size(&f));
      const bool more = zmq_msg_more(&f);
      zmq_msg_close(&f);
      if (!more) break;
    }
    // CURVE: the client's public key; PLAIN: user name and password (the
    // job's secret, compared in constant time).
    bool ok = false;
    if (frames.size() >= 7 && frames[0] == "1.0") {
      if (options_.encrypt) {
        ok = frames[5] == "CURVE" && frames[6] == client_key_;
      } else if (frames[5] == "PLAIN" && frames.size() >= 8) {
        const std::string& want = options_.keys->client_secret;
        const std::string& got = frames[7];
        unsigned diff = got.size() != want.size();
        for (size_t i = 0; i < want.size() && i < got.size(); ++i) diff |= got[i] ^ want[i];
        ok = diff == 0;
      }
    }
    if (!ok) {
      const int64_t n = ++refused_;
      LOG_IF(WARNING, n <= 10 || n % 100 == 0) << options_.name << ": refused a connection from "
                                               << (frames.size() > 3 ? frames[3] : std::string("?"))
                                               << ": it does not hold this job's key";
    }
    const std::string reply[] = {"1.0",
                                 frames.size() > 1 ? frames[1] : std::string(),
                                 ok ? "200" : "400",
                                 ok ? "OK" : "not a member of this job",
                                 "",
                                 ""};
    for (size_t i = 0; i < 6; ++i) {
      zmq_send(socket, reply[i].data(), reply[i].size(), i + 1 < 6 ? ZMQ_SNDMORE : 0);
    }
  }
  zmq_close(socket);
  zmq_close(events);
}

bool Van::PeerMapsOurArena(int id) {
  MutexLock l(&mu_);
  auto it = peers_.find(id);
  return it != peers_.end() && it->second->maps_mine.load();
}

Status Van::Connect(int id, const std::string& host, int port, const ShmInfo* shm) {
  ASSIGN_OR_RETURN(std::string ip, ResolveHost(host));
  auto peer = std::make_shared<Peer>();
  {
    std::random_device rd;
    peer->stream = (uint64_t{rd()} << 32) ^ rd();
    if (peer->stream == 0) peer->stream = 1;
  }
  if (shm != nullptr && options_.shm_bytes > 0) {
    auto mapped = ShmMapping::Open(*shm);
    if (mapped.ok()) {
      peer->theirs = std::move(mapped).value();
      const std::string& bell = shm->doorbell();
      if (!bell.empty() && doorbell_out_ >= 0 &&
          bell.size() + 1 < sizeof(peer->doorbell.sun_path)) {
        peer->doorbell.sun_family = AF_UNIX;
        std::memcpy(peer->doorbell.sun_path + 1, bell.data(), bell.size());
        peer->doorbell_len =
            static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + bell.size());
      }
    } else if (options_.verbose >= 1) {
      LOG(INFO) << options_.name << ": " << NodeIdName(id) << " at " << host << ":" << port
                << " over TCP only: " << mapped.status();
    }
  }
  peer->address = StrCat("tcp://", ip, ":", port);
  peer->socket = zmq_socket(context_, ZMQ_DEALER);
  int linger = 2000;  // lets a final SHUTDOWN or error reply leave before the process exits
  zmq_setsockopt(peer->socket, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_setsockopt(peer->socket, ZMQ_SNDTIMEO, &options_.send_timeout_ms,
                 sizeof(options_.send_timeout_ms));
  int hwm = 100000;
  zmq_setsockopt(peer->socket, ZMQ_SNDHWM, &hwm, sizeof(hwm));
  if (!options_.routing_id.empty()) {
    zmq_setsockopt(peer->socket, ZMQ_ROUTING_ID, options_.routing_id.data(),
                   options_.routing_id.size());
  }
  if (options_.keys != nullptr && !options_.encrypt) {
    const JobKeys& k = *options_.keys;
    const std::string user = "pstrain";
    if (zmq_setsockopt(peer->socket, ZMQ_PLAIN_USERNAME, user.data(), user.size()) != 0 ||
        zmq_setsockopt(peer->socket, ZMQ_PLAIN_PASSWORD, k.client_secret.data(),
                       k.client_secret.size()) != 0) {
      return Status::InvalidArgument(
          StrCat(options_.name, ": cannot set the job's password: ", ZmqError()));
    }
  } else if (options_.keys != nullptr) {
    const JobKeys& k = *options_.keys;
    if (zmq_setsockopt(peer->socket, ZMQ_CURVE_SERVERKEY, k.server_public.c_str(),
                       k.server_public.size()) != 0 ||
        zmq_setsockopt(peer->socket, ZMQ_CURVE_PUBLICKEY, k.client_public.c_str(),
                       k.client_public.size()) != 0 ||
        zmq_setsockopt(peer->socket, ZMQ_CURVE_SECRETKEY, k.client_secret.c_str(),
                       k.client_secret.size()) != 0) {
      return Status::InvalidArgument(
          StrCat(options_.name, ": the job's client keys are not usable: ", ZmqError()));
    }
  }
  // Connection events, so that a peer that cannot be reached can be told
  // apart from one that refuses us or went away (DescribeConnection).
  static std::atomic<uint64_t> monitors{0};
  const std::string events = StrCat("inproc://peer-events-", reinterpret_cast<uintptr_t>(this), "-",
                                    monitors.fetch_add(1));
  if (zmq_socket_monitor(peer->socket, events.c_str(),
                         ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_DISCONNECTED |
                             ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) == 0) {
    peer->monitor = zmq_socket(context_, ZMQ_PAIR);
    if (peer->monitor != nullptr && zmq_connect(peer->monitor, events.c_str()) != 0) {
      zmq_close(peer->monitor);
      peer->monitor = nullptr;
    }
    if (peer->monitor == nullptr) zmq_socket_monitor(peer->socket, nullptr, 0);
  }
  if (zmq_connect(peer->socket, peer->address.c_str()) != 0) {
    return Status::IOError(StrCat(options_.name, ": cannot connect to ", NodeIdName(id), " at ",
                                  host, ":", port, ": ", ZmqError()));
  }
  if (options_.verbose >= 1) {
    LOG(INFO) << options_.name << ": connected to " << NodeIdName(id) << " at " << host << ":"
              << port << (peer->theirs != nullptr ? " (its shared memory mapped)" : "");
  }
  MutexLock l(&mu_);
  if (peer->theirs != nullptr) {
    auto it = std::find_if(inbound_.begin(), inbound_.end(),
                           [id](const auto& p) { return p.first == id; });
    if (it != inbound_.end()) {
      it->second = peer->theirs;
    } else {
      inbound_.emplace_back(id, peer->theirs);
    }
    ++inbound_version_;
  }
  // A replaced peer: what was queued for its old process is not for the new one.
  if (arena_ != nullptr && peers_.count(id) > 0) arena_->ResetQueue(id);
  peers_[id] = std::move(peer);
  return Status::Ok();
}

ConnectionReport Van::DescribeConnection(int id) {
  std::shared_ptr<Peer> peer;
  {
    MutexLock l(&mu_);
    auto it = peers_.find(id);
    if (it != peers_.end()) peer = it->second;
  }
  if (peer == nullptr) return {ConnectionReport::kNone, "no connection was opened"};
  MutexLock l(&peer->mu);
  Peer& p = *peer;
  // Each event: a frame of (uint16 event, uint32 value), then the address.
  for (int n = 0; p.monitor != nullptr && n < 100000; ++n) {
    zmq_msg_t f;
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, p.monitor, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&f);
      break;
    }
    uint16_t event = 0;
    if (zmq_msg_size(&f) >= sizeof(event)) std::memcpy(&event, zmq_msg_data(&f), sizeof(event));
    const bool more = zmq_msg_more(&f);
    zmq_msg_close(&f);
    while (more) {
      zmq_msg_init(&f);
      const bool got = zmq_msg_recv(&f, p.monitor, ZMQ_DONTWAIT) >= 0;
      const bool again = got && zmq_msg_more(&f);
      zmq_msg_close(&f);
      if (!again) break;
    }
    switch (event) {
      case ZMQ_EVENT_CONNECTED:
        ++p.tcp_up;
        p.up = true;
        break;
      case ZMQ_EVENT_CONNECT_RETRIED:
        ++p.retries;
        break;
      case ZMQ_EVENT_DISCONNECTED:
        if (p.up) ++p.lost;
        p.up = false;
        p.handshake_ok = false;
        break;
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        p.handshake_ok = true;
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        ++p.auth_refused;
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        ++p.other_failures;
        break;
      default:
        break;
    }
  }
  const std::string& at = p.address;
  using R = ConnectionReport;
  if (p.up && p.handshake_ok) return {R::kConnected, StrCat("connected to ", at)};
  if (p.auth_refused > 0) {
    return {R::kKeyRefused,
            StrCat(at, " refused our handshake ", p.auth_refused,
                   " time(s): this process does not hold the job's key (PSTRAIN_KEY_FILE)")};
  }
  if (p.other_failures > 0) {
    return {R::kHandshakeFailed,
            StrCat("the handshake with ", at, " failed ", p.other_failures,
                   " time(s): this process's key or security setting is not the job's "
                   "(PSTRAIN_KEY_FILE, PSTRAIN_WIRE_SECURITY)")};
  }
  if (p.tcp_up == 0 && p.retries > 0) {
    return {R::kRefused, StrCat("every TCP connection to ", at, " was refused (", p.retries,
                                " attempts): nothing listens there")};
  }
  if (p.tcp_up == 0) {
    return {R::kNoAnswer, StrCat("no TCP connection to ", at, " yet: the host does not answer")};
  }
  if (!p.up)
    return {R::kLost, StrCat("the connection to ", at, " was lost (", p.lost, " time(s))")};
  return {R::kHandshaking, StrCat("TCP connection to ", at, " open, handshake not finished")};
}

void Van::Rename(int from, int to) {
  MutexLock l(&mu_);
  auto it = peers_.find(from);
  if (it == peers_.end()) return;
  std::shared_ptr<Peer> peer = std::move(it->second);
  peers_.erase(it);
  peers_[to] = std::move(peer);
}

void Van::Disconnect(int id) {
  std::shared_ptr<Peer> old;
  MutexLock l(&mu_);
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  old = std::move(it->second);
  peers_.erase(it);
}

bool Van::PlaceInShm(const Message& msg, PsHeader* extra) {
  uint64_t bytes = 0;
  for (const Blob& v : msg.values) bytes += v.size();
  const bool copy_ok = bytes >= options_.shm_min_bytes;
  for (const Blob& v : msg.values) {
    std::optional<uint64_t> offset = arena_->Reference(v.data(), v.size());
    if (!offset.has_value() && copy_ok) {
      if (auto block = arena_->AllocateRing(v.size())) {
        std::memcpy(block->data, v.data(), v.size());
        offset = block->offset;
      }
    }
    if (!offset.has_value()) {
      // All or nothing: hand back what this message took and use TCP.
      for (uint64_t taken : extra->shm_frame_offset()) arena_->Release(taken);
      extra->clear_shm_frame_offset();
      extra->clear_shm_frame_bytes();
      if (copy_ok) ++shm_fallbacks_;
      return false;
    }
    extra->add_shm_frame_offset(*offset);
    extra->add_shm_frame_bytes(v.size());
  }
  return true;
}

std::shared_ptr<Van::Peer> Van::FindPeer(int id) {
  MutexLock l(&mu_);
  auto it = peers_.find(id);
  return it != peers_.end() ? it->second : nullptr;
}

bool Van::IsBatchable(const Message& msg) {
  return msg.header.cmd() == CMD_DATA && PayloadBytes(msg, true) <= kPackBytes;
}

Status Van::SendBatch(int id, const std::vector<const Message*>& msgs, size_t* sent) {
  size_t dummy = 0;
  if (sent == nullptr) sent = &dummy;
  *sent = 0;
  std::shared_ptr<Peer> peer = FindPeer(id);
  if (peer == nullptr) {
    return Status::Unavailable(StrCat(options_.name, ": no connection to ", NodeIdName(id)));
  }
  // One by one where shared memory is in play (numbered messages, values in
  // the arena, the peer's queue): cheaper than a copy into a frame.
  const bool one_by_one = peer->theirs != nullptr || (arena_ != nullptr && peer->maps_mine);
  for (size_t i = 0; i < msgs.size();) {
    size_t end = i;
    uint64_t bytes = 0;
    while (!one_by_one && end < msgs.size() && end - i < kMaxBatch && bytes < kMaxBatchBytes &&
           IsBatchable(*msgs[end])) {
      bytes += PayloadBytes(*msgs[end++], true);
    }
    if (end - i < 2) {
      RETURN_IF_ERROR(Send(id, *msgs[i]));
      *sent = ++i;
      continue;
    }
    RETURN_IF_ERROR(SendFrameOf(id, *peer, msgs, i, end));
    *sent = i = end;
  }
  return Status::Ok();
}

Status Van::SendFrameOf(int id, Peer& peer, const std::vector<const Message*>& msgs, size_t begin,
                        size_t end) {
  const size_t n = end - begin;
  std::vector<Framed> items(n);
  for (size_t i = 0; i < n; ++i) {
    const Message& msg = *msgs[begin + i];
    items[i].msg = &msg;
    items[i].inline_values = !msg.values.empty();
    msg.header.SerializeToString(&items[i].header);
    if (msg.values.size() > 1) {
      PsHeader one;  // the values travel inline, as one frame
      one.set_num_value_frames(1);
      items[i].header += one.SerializeAsString();
    }
    if (options_.verbose >= 2) {
      LOG(INFO) << options_.name << " -> " << NodeIdName(id) << ": "
                << msg.header.ShortDebugString() << " (batch of " << n << ")";
    }
  }
  zmq_msg_t m;
  BuildBatchFrame(items, &m);
  MutexLock l(&peer.mu);
  if (zmq_msg_send(&m, peer.socket, 0) < 0) {
    zmq_msg_close(&m);
    return SendFailed(id, peer, /*ordered=*/false, nullptr);
  }
  batched_ += static_cast<int64_t>(n);
  ++batch_frames_;
  return Status::Ok();
}

Status Van::Send(int id, const Message& msg) {
  std::shared_ptr<Peer> peer = FindPeer(id);
  if (peer == nullptr) {
    return Status::Unavailable(StrCat(options_.name, ": no connection to ", NodeIdName(id)));
  }
  std::string header;
  msg.header.SerializeToString(&header);
  const bool data = msg.header.cmd() == CMD_DATA;
  // Shared-memory fields ride along as a second serialized PsHeader: protobuf
  // merges concatenated messages, so the caller's header is not copied.
  PsHeader extra;
  const bool ordered = peer->theirs != nullptr;
  if (ordered) extra.set_shm_mapped(true);
  const bool mine_mapped = arena_ != nullptr && peer->maps_mine.load();
  const bool in_shm = data && !msg.values.empty() && mine_mapped && PlaceInShm(msg, &extra);
  if (options_.verbose >= 2) {
    LOG(INFO) << options_.name << " -> " << NodeIdName(id) << ": " << msg.header.ShortDebugString()
              << (in_shm ? " (values in shared memory)" : "");
  }
  MutexLock l(&peer->mu);
  // Numbered under the peer's lock: the receiver restores this order whichever
  // way (queue or ZeroMQ) each message goes.
  if (ordered) {
    extra.set_shm_seq(peer->next_seq++);
    extra.set_shm_stream(peer->stream);
  }
  if (ordered && mine_mapped && peer->doorbell_len > 0) {
    // Values not placed in shared memory travel inside the queued message, as
    // one frame.
    const bool inline_values = data && !msg.values.empty() && !in_shm;
    PsHeader queued = extra;
    if (inline_values) queued.set_num_value_frames(1);
    if (SendThroughQueue(id, *peer, header + queued.SerializeAsString(), msg, inline_values)) {
      ++shm_queued_;
      if (in_shm) ++shm_sent_;
      return Status::Ok();
    }
  }
  zmq_msg_t m;
  if (data && PayloadBytes(msg, !in_shm) <= kPackBytes) {
    // One frame, a batch of one: the envelope, values inline.
    const bool inline_values = !msg.values.empty() && !in_shm;
    if (inline_values) extra.set_num_value_frames(1);
    BuildBatchFrame({{header + extra.SerializeAsString(), &msg, inline_values}}, &m);
    if (zmq_msg_send(&m, peer->socket, 0) < 0) {
      zmq_msg_close(&m);
      return SendFailed(id, *peer, ordered, in_shm ? &extra : nullptr);
    }
    if (in_shm) ++shm_sent_;
    return Status::Ok();
  }
  if (extra.ByteSizeLong() > 0) header += extra.SerializeAsString();
  zmq_msg_init_size(&m, header.size());
  std::memcpy(zmq_msg_data(&m), header.data(), header.size());
  if (zmq_msg_send(&m, peer->socket, data ? ZMQ_SNDMORE : 0) < 0) {
    zmq_msg_close(&m);
    return SendFailed(id, *peer, ordered, in_shm ? &extra : nullptr);
  }
  if (!data) return Status::Ok();
  // After the first frame ZeroMQ accepts the rest of a multipart message atomically.
  const bool frames = !msg.values.empty() && !in_shm;
  InitFrame(&m, msg.keys);
  zmq_msg_send(&m, peer->socket, ZMQ_SNDMORE);
  InitFrame(&m, msg.lens);
  zmq_msg_send(&m, peer->socket, frames ? ZMQ_SNDMORE : 0);
  if (in_shm) {
    ++shm_sent_;
    return Status::Ok();
  }
  for (size_t i = 0; i < msg.values.size(); ++i) {
    InitFrame(&m, msg.values[i]);
    zmq_msg_send(&m, peer->socket, i + 1 < msg.values.size() ? ZMQ_SNDMORE : 0);
  }
  return Status::Ok();
}

Status Van::SendFailed(int id, Peer& peer, bool ordered, const PsHeader* placed) {
  const std::string error = ZmqError();
  // Nothing left: the number goes to the next message (still under peer.mu).
  if (ordered) --peer.next_seq;
  if (placed != nullptr) {
    for (uint64_t offset : placed->shm_frame_offset()) arena_->Release(offset);
  }
  return Status::Unavailable(StrCat(options_.name, ": send to ", NodeIdName(id), " at ",
                                    peer.address, " failed: ", error));
}

// Envelope of a message sent through the queue, in one ring block (see
// WriteEnvelope).
bool Van::SendThroughQueue(int id, Peer& peer, const std::string& header, const Message& msg,
                           bool inline_values) {
  const uint64_t total = EnvelopeBytes(header, msg, inline_values);
  std::optional<ShmArena::Block> block = arena_->AllocateRing(total);
  if (!block.has_value()) return false;
  WriteEnvelope(header, msg, inline_values, block->data);
  if (!arena_->Enqueue(id, block->offset, total)) {
    arena_->Release(block->offset);
    return false;
  }
  if (peer.theirs->PeerSleeping()) {
    ++doorbells_rung_;
    const char bell = 1;
    if (sendto(doorbell_out_, &bell, 1, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&peer.doorbell),
               peer.doorbell_len) < 0 &&
        errno != EAGAIN && errno != EWOULDBLOCK) {
      // Not reachable (another network namespace): the entry is read at the
      // receiver's next wake-up; later messages go over ZeroMQ, still in order.
      LOG(WARNING) << options_.name << ": doorbell of " << NodeIdName(id) << " failed ("
                   << std::strerror(errno) << "); sending to it over TCP from now on";
      peer.doorbell_len = 0;
    }
  }
  return true;
}

void Van::ReceiveLoop() {
  zmq_pollitem_t items[2] = {{router_, 0, ZMQ_POLLIN, 0}, {nullptr, doorbell_in_, ZMQ_POLLIN, 0}};
  const int num_items = doorbell_in_ >= 0 ? 2 : 1;
  std::vector<std::pair<int, std::shared_ptr<ShmMapping>>> inbound;
  uint64_t version = ~uint64_t{0};
  while (!stop_.load()) {
    if (inbound_version_.load() != version) {
      MutexLock l(&mu_);
      inbound = inbound_;
      version = inbound_version_.load();
    }
    const int me = self_id_.load();
    bool busy = false;
    for (const auto& [peer, mapping] : inbound) busy |= DrainQueue(peer, mapping, me);
    // Drain ZeroMQ, but look at stop_ now and then.
    for (int i = 0; i < 1024 && !stop_.load(); ++i) {
      if (!ReceiveOne(router_)) break;
      busy = true;
    }
    if (busy && burst_end_) burst_end_();
    if (busy) continue;
    // Nothing waiting: say so (peers that enqueue now ring the doorbell), look
    // once more, then sleep.
    if (arena_ != nullptr) arena_->SetSleeping(true);
    bool pending = false;
    for (const auto& [peer, mapping] : inbound) {
      auto waiting = order_.find(peer);
      const bool paused = waiting != order_.end() && waiting->second.stash.size() >= kMaxStashed;
      pending |= !paused && !mapping->QueueEmpty(me);
    }
    if (!pending) zmq_poll(items, num_items, 100);
    if (arena_ != nullptr) arena_->SetSleeping(false);
    if (doorbell_in_ >= 0) {
      char buf[256];
      while (recv(doorbell_in_, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
      }
    }
  }
}

bool Van::DrainQueue(int peer, const std::shared_ptr<ShmMapping>& mapping, int me) {
  bool any = false;
  // The queue is first in, first out: while many of this peer's messages wait
  // for an earlier number, that one is on ZeroMQ, so stop reading the queue.
  auto waiting = order_.find(peer);
  if (waiting != order_.end() && waiting->second.stash.size() >= kMaxStashed) return false;
  for (int i = 0; i < 256 && !stop_.load(); ++i) {
    uint64_t offset = 0, bytes = 0;
    const int rc = mapping->Dequeue(me, &offset, &bytes);
    if (rc == 0) break;
    any = true;
    if (rc < 0) {
      Drop(nullptr, StrCat(NodeIdName(peer), ": its shared-memory queue is corrupt; skipped"));
      continue;
    }
    auto envelope = mapping->Resolve(offset, bytes);
    if (!envelope.ok()) {
      Drop(nullptr, StrCat(NodeIdName(peer), ": queue entry: ", envelope.status().message()));
      continue;
    }
    Decoded d = DecodeQueued(*envelope);
    if (!d.error.empty()) {
      Drop(d.header_ok ? &d.msg : nullptr, StrCat(NodeIdName(peer), ": ", d.error), peer);
      continue;
    }
    Message& msg = d.msg;
    if (msg.header.sender() != peer) {
      Drop(&msg,
           StrCat("message queued by ", NodeIdName(peer), " claims to come from ",
                  NodeIdName(msg.header.sender())),
           peer);
      continue;
    }
    Finish(std::move(msg));
  }
  return any;
}

void Van::Drop(const Message* msg, const std::string& why, int stream) {
  ++dropped_;
  LOG(WARNING) << options_.name << ": dropped a malformed message: " << why;
  if (msg == nullptr) return;
  const PsHeader& h = msg->header;
  // Hand back the sender's shared-memory blocks that the message names but
  // that were never resolved (resolving takes a reference; dropping it at
  // once releases the block), so its ring is not stalled behind them.
  const int listed = std::min(h.shm_frame_offset_size(), h.shm_frame_bytes_size());
  if (static_cast<size_t>(listed) > msg->values.size()) {
    std::shared_ptr<ShmMapping> mapping;
    {
      MutexLock l(&mu_);
      auto it = peers_.find(h.sender());
      if (it != peers_.end()) mapping = it->second->theirs;
    }
    for (int i = static_cast<int>(msg->values.size()); mapping != nullptr && i < listed; ++i) {
      (void)mapping->Resolve(h.shm_frame_offset(i), h.shm_frame_bytes(i));
    }
  }
  // A numbered message that is dropped must not hold up the ones after it.
  if (h.has_shm_seq()) {
    Deliver(stream >= 0 ? stream : h.sender(), h.shm_stream(), h.shm_seq(), nullptr);
  }
}

// Reads one multipart message; false when none was waiting.
bool Van::ReceiveOne(void* socket) {
  std::vector<std::shared_ptr<ZmqFrame>> frames;
  bool too_many = false;
  for (;;) {
    auto f = std::make_shared<ZmqFrame>();
    if (zmq_msg_recv(&f->msg, socket, frames.empty() ? ZMQ_DONTWAIT : 0) < 0) {
      if (frames.empty()) return false;
      break;
    }
    const bool more = zmq_msg_more(&f->msg);
    if (frames.size() < kMaxValueFrames + 4) {
      frames.push_back(std::move(f));
    } else {
      too_many = true;
    }
    if (!more) break;
  }
  if (too_many) {
    Drop(nullptr, "more than " + std::to_string(kMaxValueFrames + 4) + " frames");
    return true;
  }
  // Wrapped without a copy: each Blob keeps its ZeroMQ frame alive.
  std::vector<Blob> blobs;
  blobs.reserve(frames.size());
  for (const auto& f : frames) {
    void* data = zmq_msg_data(&f->msg);
    blobs.emplace_back(std::shared_ptr<const void>(f, data), data, zmq_msg_size(&f->msg));
  }
  if (IsBatch(blobs)) {
    for (Decoded& d : DecodeBatch(blobs)) {
      if (d.error.empty()) {
        Finish(std::move(d.msg));
      } else {
        Drop(d.header_ok ? &d.msg : nullptr, d.error);
      }
    }
    return true;
  }
  Decoded d = DecodeFrames(blobs);
  if (!d.error.empty()) {
    Drop(d.header_ok ? &d.msg : nullptr, d.error);
    return true;
  }
  Finish(std::move(d.msg));
  return true;
}

// Checks a message from either path, resolves values in shared memory, and
// hands it on in its sender's order.
void Van::Finish(Message&& msg) {
  const PsHeader& h = msg.header;
  if (h.version() != PROTOCOL_VERSION_CURRENT && h.cmd() != CMD_REGISTER) {
    Drop(&msg, StrCat("protocol version ", h.version(), " from ", NodeIdName(h.sender()),
                      ", expected ", static_cast<int>(PROTOCOL_VERSION_CURRENT)));
    return;
  }
  if (!msg.route.empty()) {
    std::string expected;
    {
      MutexLock l(&mu_);
      auto it = routes_.find(h.sender());
      if (it != routes_.end()) expected = it->second;
    }
    if (!expected.empty() && expected != msg.route) {
      // Nothing of it may touch the claimed sender's order or arena.
      msg.header.clear_shm_seq();
      msg.header.clear_shm_frame_offset();
      msg.header.clear_shm_frame_bytes();
      Drop(&msg, StrCat("a message claiming to come from ", NodeIdName(h.sender()),
                        " arrived on another node's connection: forged sender"));
      return;
    }
  }
  const bool data = h.cmd() == CMD_DATA;
  const bool in_shm = data && h.shm_frame_offset_size() > 0;
  std::shared_ptr<ShmMapping> sender_arena;
  if (h.shm_mapped() || in_shm) {
    MutexLock l(&mu_);
    auto it = peers_.find(h.sender());
    if (it != peers_.end()) {
      if (h.shm_mapped()) it->second->maps_mine = true;
      sender_arena = it->second->theirs;
    }
  }
  if (in_shm) {
    if (sender_arena == nullptr) {
      Drop(&msg, StrCat(NodeIdName(h.sender()),
                        " sent values through shared memory, but its arena is not mapped here"));
      return;
    }
    const int n = h.shm_frame_offset_size();
    if (h.shm_frame_bytes_size() != n || static_cast<uint64_t>(n) != h.num_value_frames()) {
      Drop(&msg, StrCat(NodeIdName(h.sender()), " listed ", n, " shared-memory frame offsets and ",
                        h.shm_frame_bytes_size(), " sizes, header says ", h.num_value_frames(),
                        " value frames"));
      return;
    }
    msg.values.reserve(n);
    for (int i = 0; i < n; ++i) {
      auto v = sender_arena->Resolve(h.shm_frame_offset(i), h.shm_frame_bytes(i));
      if (!v.ok()) {
        Drop(&msg, StrCat(NodeIdName(h.sender()), ": value frame ", i, ": ", v.status().message()));
        return;
      }
      msg.values.push_back(std::move(v).value());
    }
  }
  if (data) {
    Status s = ValidateFrames(msg);
    if (!s.ok()) {
      Drop(&msg, s.message());
      return;
    }
  }
  if (options_.verbose >= 2) {
    LOG(INFO) << options_.name << " <- " << h.ShortDebugString();
  }
  if (!h.has_shm_seq()) {
    handler_(std::move(msg));
    return;
  }
  const int sender = h.sender();
  Deliver(sender, h.shm_stream(), h.shm_seq(), &msg);
}

// Hands `msg` (null: a dropped message) on when it is its sender's next, then
// any stashed ones that follow it.
void Van::Deliver(int sender, uint64_t stream, uint64_t seq, Message* msg) {
  InOrder& o = order_[sender];
  if (stream != o.stream) {
    // A new connection from that node (a replaced process): its numbers start
    // over, and what its predecessor left waiting is not coming.
    if (o.stream != 0 && options_.verbose >= 1) {
      LOG(INFO) << options_.name << ": " << NodeIdName(sender) << " numbers its messages anew ("
                << o.stash.size() << " of the old numbering dropped)";
    }
    o = InOrder{};
    o.stream = stream;
  }
  if (seq < o.expected || o.stash.count(seq) > 0) {
    ++dropped_;
    LOG(WARNING) << options_.name << ": dropped message " << seq << " from " << NodeIdName(sender)
                 << ": that number was seen already";
    return;
  }
  if (seq != o.expected) {
    if (o.stash.size() == kMaxStashed) {
      LOG(WARNING) << options_.name << ": " << o.stash.size() << " messages from "
                   << NodeIdName(sender) << " are waiting for its message " << o.expected
                   << "; its shared-memory queue is not read until that arrives";
    }
    std::optional<Message> keep;
    if (msg != nullptr) keep = std::move(*msg);
    o.stash.emplace(seq, std::move(keep));
    return;
  }
  if (msg != nullptr) handler_(std::move(*msg));
  ++o.expected;
  while (!o.stash.empty() && o.stash.begin()->first == o.expected) {
    auto node = o.stash.extract(o.stash.begin());
    if (node.mapped().has_value()) handler_(std::move(*node.mapped()));
    ++o.expected;
  }
}

}  // namespace pstrain
