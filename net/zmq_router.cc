#include "net/zmq_router.h"

#include <zmq.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "net/host_address.h"
#include "net/zmq_util.h"

namespace pstrain {
namespace {

// A received frame; a Blob made from it shares its ownership.
struct ZmqFrame {
  zmq_msg_t msg;
  ZmqFrame() { zmq_msg_init(&msg); }
  ~ZmqFrame() { zmq_msg_close(&msg); }
};

}  // namespace

StatusOr<std::unique_ptr<ZmqRouter>> ZmqRouter::Bind(void* context, const RouterOptions& options) {
  std::unique_ptr<ZmqRouter> r(new ZmqRouter());
  r->options_ = options;
  if (options.keys != nullptr) {
    if (options.encrypt && !zmq_has("curve")) {
      return Status::Unavailable(
          StrCat(options.name, ": a job key was given, but this ZeroMQ has no CURVE security"));
    }
    uint8_t key[32];
    if (zmq_z85_decode(key, options.keys->client_public.c_str()) == nullptr) {
      return Status::InvalidArgument(StrCat(options.name, ": the job's client key is not Z85"));
    }
    r->client_key_.assign(reinterpret_cast<char*>(key), sizeof(key));
    // The handler must listen before the ROUTER takes its first handshake.
    void* zap = zmq_socket(context, ZMQ_REP);
    if (zap == nullptr || zmq_bind(zap, "inproc://zeromq.zap.01") != 0) {
      if (zap != nullptr) zmq_close(zap);
      return Status::IOError(StrCat(options.name, ": cannot start authentication: ", ZmqError()));
    }
    r->zap_socket_ = zap;
  }
  r->socket_ = zmq_socket(context, ZMQ_ROUTER);
  int64_t max_size = options.max_message_bytes;
  zmq_setsockopt(r->socket_, ZMQ_MAXMSGSIZE, &max_size, sizeof(max_size));
  int linger = 0;
  zmq_setsockopt(r->socket_, ZMQ_LINGER, &linger, sizeof(linger));
  int hwm = 0;  // never drop inbound messages; senders are bounded by their own HWM
  zmq_setsockopt(r->socket_, ZMQ_RCVHWM, &hwm, sizeof(hwm));
  // A peer reconnecting under its routing id takes it over from its old
  // connection, which may be dead without this receive-only socket knowing
  // (no FIN came). Without this the ROUTER keeps the id with the old one and
  // takes the new one's first frame for its id: nothing from the node would
  // be served again. The price: what the old connection delivered and is
  // still unread when the new one comes is relabelled, and the Van drops it
  // as forged (only a receive thread far behind has any).
  int handover = 1;
  zmq_setsockopt(r->socket_, ZMQ_ROUTER_HANDOVER, &handover, sizeof(handover));
  SetTcpKeepalive(r->socket_);
  if (options.keys != nullptr) {
    // Failed handshakes (a peer without CURVE, or with other keys) are
    // reported on a monitor socket the authentication thread reads.
    const std::string monitor = StrCat("inproc://monitor-", reinterpret_cast<uintptr_t>(r.get()));
    zmq_socket_monitor(r->socket_, monitor.c_str(),
                       ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    void* events = zmq_socket(context, ZMQ_PAIR);
    zmq_connect(events, monitor.c_str());
    ZmqRouter* raw = r.get();
    void* zap = r->zap_socket_;
    r->zap_socket_ = nullptr;
    r->zap_ = std::thread([raw, zap, events] { raw->ZapLoop(zap, events); });
    int server = 1;
    const std::string domain = "pstrain";
    const bool set =
        options.encrypt
            ? zmq_setsockopt(r->socket_, ZMQ_CURVE_SERVER, &server, sizeof(server)) == 0 &&
                  zmq_setsockopt(r->socket_, ZMQ_CURVE_SECRETKEY,
                                 options.keys->server_secret.c_str(),
                                 options.keys->server_secret.size()) == 0
            : zmq_setsockopt(r->socket_, ZMQ_PLAIN_SERVER, &server, sizeof(server)) == 0;
    if (!set || zmq_setsockopt(r->socket_, ZMQ_ZAP_DOMAIN, domain.data(), domain.size()) != 0) {
      return Status::InvalidArgument(
          StrCat(options.name, ": the job's server key is not usable: ", ZmqError()));
    }
  }

  // Every interface: "0.0.0.0" or "*" (IPv4), "::" or "[::]" (IPv6 and IPv4).
  const std::string& bind = options.bind_host;
  std::string ip = "*";
  bool v6 = bind == "::" || bind == "[::]";
  if (!bind.empty() && bind != "*" && bind != "0.0.0.0" && !v6) {
    ASSIGN_OR_RETURN(ip, ResolveHost(bind));
    v6 = ip.find(':') != std::string::npos;
  }
  if (v6) {
    const int on = 1;
    zmq_setsockopt(r->socket_, ZMQ_IPV6, &on, sizeof(on));
  }
  const std::string endpoint =
      StrCat("tcp://",
             JoinHostPort(ip, options.port == 0 ? std::string("*") : std::to_string(options.port)));
  if (zmq_bind(r->socket_, endpoint.c_str()) != 0) {
    return Status::IOError(StrCat(options.name, ": cannot bind ", endpoint, " (bind host '",
                                  options.bind_host, "'): ", ZmqError()));
  }
  char last[256] = {0};
  size_t last_len = sizeof(last);
  zmq_getsockopt(r->socket_, ZMQ_LAST_ENDPOINT, last, &last_len);
  const char* colon = std::strrchr(last, ':');
  r->port_ = colon != nullptr ? std::atoi(colon + 1) : options.port;
  return r;
}

ZmqRouter::~ZmqRouter() {
  if (socket_ != nullptr) zmq_close(socket_);
  zap_stop_ = true;
  if (zap_.joinable()) zap_.join();
  if (zap_socket_ != nullptr) zmq_close(zap_socket_);
}

ZmqRouter::Read ZmqRouter::Receive(std::vector<Blob>* blobs) {
  std::vector<std::shared_ptr<ZmqFrame>> frames;
  bool too_many = false;
  for (;;) {
    auto f = std::make_shared<ZmqFrame>();
    if (zmq_msg_recv(&f->msg, socket_, frames.empty() ? ZMQ_DONTWAIT : 0) < 0) {
      if (frames.empty()) return Read::kNone;
      break;
    }
    const bool more = zmq_msg_more(&f->msg);
    if (frames.size() < kMaxFrames) {
      frames.push_back(std::move(f));
    } else {
      too_many = true;
    }
    if (!more) break;
  }
  if (too_many) return Read::kTooManyFrames;
  // Wrapped without a copy: each Blob keeps its ZeroMQ frame alive.
  blobs->reserve(blobs->size() + frames.size());
  for (const auto& f : frames) {
    void* data = zmq_msg_data(&f->msg);
    blobs->emplace_back(std::shared_ptr<const void>(f, data), data, zmq_msg_size(&f->msg));
  }
  return Read::kMessage;
}

void ZmqRouter::ZapLoop(void* socket, void* events) {
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

}  // namespace pstrain
