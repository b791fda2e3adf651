#include "net/zmq_dealer.h"

#include <zmq.h>

#include <atomic>
#include <cstring>

#include "net/zmq_util.h"

namespace pstrain {
namespace {

// Frames smaller than this are copied into ZeroMQ (cheaper than a reference).
constexpr size_t kCopyBelowBytes = 512;

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

// Initialises `m` with the batch frame of `items` (see kBatchMagic).
void BuildBatchFrame(const std::vector<BatchEntry>& items, zmq_msg_t* m) {
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

}  // namespace

StatusOr<std::unique_ptr<ZmqDealer>> ZmqDealer::Open(void* context, const DealerOptions& options) {
  std::unique_ptr<ZmqDealer> d(new ZmqDealer());
  d->socket_ = zmq_socket(context, ZMQ_DEALER);
  if (d->socket_ == nullptr) {
    return Status::ResourceExhausted(
        StrCat(options.name, ": cannot open a ZeroMQ socket: ", ZmqError()));
  }
  int linger = 2000;  // lets a final SHUTDOWN or error reply leave before the process exits
  zmq_setsockopt(d->socket_, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_setsockopt(d->socket_, ZMQ_SNDTIMEO, &options.send_timeout_ms,
                 sizeof(options.send_timeout_ms));
  int hwm = 100000;
  zmq_setsockopt(d->socket_, ZMQ_SNDHWM, &hwm, sizeof(hwm));
  SetTcpKeepalive(d->socket_);
  if (options.reconnect_interval_ms > 0) {
    zmq_setsockopt(d->socket_, ZMQ_RECONNECT_IVL, &options.reconnect_interval_ms,
                   sizeof(options.reconnect_interval_ms));
  }
  if (!options.routing_id.empty()) {
    zmq_setsockopt(d->socket_, ZMQ_ROUTING_ID, options.routing_id.data(),
                   options.routing_id.size());
  }
  if (options.keys != nullptr && !options.encrypt) {
    const JobKeys& k = *options.keys;
    const std::string user = "pstrain";
    if (zmq_setsockopt(d->socket_, ZMQ_PLAIN_USERNAME, user.data(), user.size()) != 0 ||
        zmq_setsockopt(d->socket_, ZMQ_PLAIN_PASSWORD, k.client_secret.data(),
                       k.client_secret.size()) != 0) {
      return Status::InvalidArgument(
          StrCat(options.name, ": cannot set the job's password: ", ZmqError()));
    }
  } else if (options.keys != nullptr) {
    const JobKeys& k = *options.keys;
    if (zmq_setsockopt(d->socket_, ZMQ_CURVE_SERVERKEY, k.server_public.c_str(),
                       k.server_public.size()) != 0 ||
        zmq_setsockopt(d->socket_, ZMQ_CURVE_PUBLICKEY, k.client_public.c_str(),
                       k.client_public.size()) != 0 ||
        zmq_setsockopt(d->socket_, ZMQ_CURVE_SECRETKEY, k.client_secret.c_str(),
                       k.client_secret.size()) != 0) {
      return Status::InvalidArgument(
          StrCat(options.name, ": the job's client keys are not usable: ", ZmqError()));
    }
  }
  // Connection events, so that a peer that cannot be reached can be told
  // apart from one that refuses us or went away (ConnectionEvents::Report).
  d->events_->Watch(context, d->socket_);
  return d;
}

ZmqDealer::~ZmqDealer() {
  if (socket_ != nullptr) {
    events_->Stop(socket_);
    zmq_close(socket_);
  }
}

Status ZmqDealer::Connect(const std::string& address) {
  address_ = address;
  events_->SetAddress(address);
  // "tcp://[v6addr]:port": ZeroMQ reaches IPv6 addresses only when told to.
  if (address.find('[') != std::string::npos) {
    const int on = 1;
    zmq_setsockopt(socket_, ZMQ_IPV6, &on, sizeof(on));
  }
  if (zmq_connect(socket_, address_.c_str()) != 0) return Status::IOError(ZmqError());
  return Status::Ok();
}

bool ZmqDealer::SendFrames(const std::string& header, const Message* data, bool values) {
  zmq_msg_t m;
  zmq_msg_init_size(&m, header.size());
  std::memcpy(zmq_msg_data(&m), header.data(), header.size());
  if (zmq_msg_send(&m, socket_, data != nullptr ? ZMQ_SNDMORE : 0) < 0) {
    zmq_msg_close(&m);
    return false;
  }
  if (data == nullptr) return true;
  // After the first frame ZeroMQ accepts the rest of a multipart message atomically.
  const bool frames = values && !data->values.empty();
  InitFrame(&m, data->keys);
  zmq_msg_send(&m, socket_, ZMQ_SNDMORE);
  InitFrame(&m, data->lens);
  zmq_msg_send(&m, socket_, frames ? ZMQ_SNDMORE : 0);
  if (!frames) return true;
  for (size_t i = 0; i < data->values.size(); ++i) {
    InitFrame(&m, data->values[i]);
    zmq_msg_send(&m, socket_, i + 1 < data->values.size() ? ZMQ_SNDMORE : 0);
  }
  return true;
}

bool ZmqDealer::SendBatchFrame(const std::vector<BatchEntry>& entries) {
  zmq_msg_t m;
  BuildBatchFrame(entries, &m);
  if (zmq_msg_send(&m, socket_, 0) < 0) {
    zmq_msg_close(&m);
    return false;
  }
  return true;
}

ConnectionEvents::~ConnectionEvents() {
  MutexLock l(&mu_);
  if (monitor_ != nullptr) zmq_close(monitor_);
}

bool ConnectionEvents::Watch(void* context, void* socket) {
  static std::atomic<uint64_t> monitors{0};
  const std::string events = StrCat("inproc://peer-events-", reinterpret_cast<uintptr_t>(this), "-",
                                    monitors.fetch_add(1));
  if (zmq_socket_monitor(socket, events.c_str(),
                         ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_DISCONNECTED |
                             ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0) {
    return false;
  }
  void* pair = zmq_socket(context, ZMQ_PAIR);
  if (pair != nullptr && zmq_connect(pair, events.c_str()) != 0) {
    zmq_close(pair);
    pair = nullptr;
  }
  if (pair == nullptr) {
    zmq_socket_monitor(socket, nullptr, 0);
    return false;
  }
  MutexLock l(&mu_);
  monitor_ = pair;
  return true;
}

void ConnectionEvents::Stop(void* socket) {
  MutexLock l(&mu_);
  if (monitor_ == nullptr) return;
  // A full monitor holds ZeroMQ's I/O thread in its send, and with it the
  // lock that stopping the monitor takes: make room first.
  DrainLocked();
  zmq_socket_monitor(socket, nullptr, 0);
  DrainLocked();
  zmq_close(monitor_);
  monitor_ = nullptr;
}

void ConnectionEvents::SetAddress(const std::string& address) {
  MutexLock l(&mu_);
  address_ = address;
}

void ConnectionEvents::Drain() {
  MutexLock l(&mu_);
  DrainLocked();
}

void ConnectionEvents::DrainLocked() {
  // Each event: a frame of (uint16 event, uint32 value), then the address.
  for (int n = 0; monitor_ != nullptr && n < 100000; ++n) {
    zmq_msg_t f;
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, monitor_, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&f);
      break;
    }
    uint16_t event = 0;
    if (zmq_msg_size(&f) >= sizeof(event)) std::memcpy(&event, zmq_msg_data(&f), sizeof(event));
    const bool more = zmq_msg_more(&f);
    zmq_msg_close(&f);
    while (more) {
      zmq_msg_init(&f);
      const bool got = zmq_msg_recv(&f, monitor_, ZMQ_DONTWAIT) >= 0;
      const bool again = got && zmq_msg_more(&f);
      zmq_msg_close(&f);
      if (!again) break;
    }
    switch (event) {
      case ZMQ_EVENT_CONNECTED:
        ++tcp_up_;
        up_ = true;
        break;
      case ZMQ_EVENT_CONNECT_RETRIED:
        ++retries_;
        break;
      case ZMQ_EVENT_DISCONNECTED:
        if (up_) ++lost_;
        up_ = false;
        handshake_ok_ = false;
        break;
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        handshake_ok_ = true;
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        ++auth_refused_;
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        ++other_failures_;
        break;
      default:
        break;
    }
  }
}

ConnectionReport ConnectionEvents::Report() {
  MutexLock l(&mu_);
  DrainLocked();
  const std::string& at = address_;
  using R = ConnectionReport;
  if (up_ && handshake_ok_) return {R::kConnected, StrCat("connected to ", at)};
  if (auth_refused_ > 0) {
    return {R::kKeyRefused,
            StrCat(at, " refused our handshake ", auth_refused_,
                   " time(s): this process does not hold the job's key (PSTRAIN_KEY_FILE)")};
  }
  if (other_failures_ > 0) {
    return {R::kHandshakeFailed,
            StrCat("the handshake with ", at, " failed ", other_failures_,
                   " time(s): this process's key or security setting is not the job's "
                   "(PSTRAIN_KEY_FILE, PSTRAIN_WIRE_SECURITY)")};
  }
  if (tcp_up_ == 0 && retries_ > 0) {
    return {R::kRefused, StrCat("every TCP connection to ", at, " was refused (", retries_,
                                " attempts): nothing listens there")};
  }
  if (tcp_up_ == 0) {
    return {R::kNoAnswer, StrCat("no TCP connection to ", at, " yet: the host does not answer")};
  }
  if (!up_) return {R::kLost, StrCat("the connection to ", at, " was lost (", lost_, " time(s))")};
  return {R::kHandshaking, StrCat("TCP connection to ", at, " open, handshake not finished")};
}

}  // namespace pstrain
