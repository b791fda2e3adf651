// ZmqRouter: the ROUTER socket a node receives on, with its security.
//
// Every node binds one ROUTER; every peer connects a DEALER to it
// (net/zmq_dealer.h), so all of a node's incoming messages arrive here, each
// prefixed by the routing id of the connection it came on. Frames are
// received without a copy: each Blob keeps its ZeroMQ frame alive.
//
// With the job's keys (net/job_keys.h) the ROUTER runs ZeroMQ's
// authentication handler (ZAP, RFC 27) on a thread of its own: it admits only
// CURVE clients holding the job's client key (encrypt) or PLAIN clients whose
// password is the job's client secret, compared in constant time (!encrypt:
// authentication only, frames in the clear). A socket monitor reports the
// handshakes that fail (a peer without CURVE, or with another job's keys).
// Both are logged with the peer's address (the first ten, then every
// hundredth) and counted (refused()).
//
// Threads: Receive and socket() are for one thread (the Van's receive
// thread); refused() is thread-safe.
#ifndef PSTRAIN_NET_ZMQ_ROUTER_H_
#define PSTRAIN_NET_ZMQ_ROUTER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "net/job_keys.h"
#include "net/message.h"

namespace pstrain {

struct RouterOptions {
  std::string bind_host = "0.0.0.0";  // IP, host name; "*" or "0.0.0.0": all (IPv4), "::" all
  int port = 0;                       // 0: any free port
  int64_t max_message_bytes = int64_t{1} << 31;  // larger frames drop the connection
  std::shared_ptr<const JobKeys> keys;           // null: no security
  bool encrypt = true;                           // with keys: CURVE (true) or PLAIN
  std::string name = "node";                     // for log lines and errors
};

class ZmqRouter {
 public:
  // Most frames one message may have (routing id, header, keys, lens and
  // kMaxValueFrames values); a longer one is read and discarded.
  static constexpr size_t kMaxFrames = kMaxValueFrames + 4;

  // Binds a ROUTER of `context` at options.bind_host:port and, with keys,
  // starts the authentication thread before it. IOError naming the address
  // when binding fails; Unavailable or InvalidArgument when the keys cannot
  // be used (no CURVE in this ZeroMQ, keys not Z85).
  static StatusOr<std::unique_ptr<ZmqRouter>> Bind(void* context, const RouterOptions& options);
  // Closes the socket and stops the authentication thread.
  // REQUIRES: the context is not terminated yet.
  ~ZmqRouter();
  ZmqRouter(const ZmqRouter&) = delete;
  ZmqRouter& operator=(const ZmqRouter&) = delete;

  // The bound port (the one chosen when options.port was 0).
  int port() const { return port_; }
  // The socket, for zmq_poll.
  void* socket() const { return socket_; }

  enum class Read {
    kNone,           // nothing waiting
    kMessage,        // *frames holds a message: routing id first, then its frames
    kTooManyFrames,  // a message of more than kMaxFrames frames was read and discarded
  };
  // Reads the next multipart message if one is waiting (never blocks for the
  // first frame). Its frames are appended to *frames without a copy.
  Read Receive(std::vector<Blob>* frames);

  // Connections refused so far (failed handshakes and ZAP refusals).
  int64_t refused() const { return refused_.load(); }

 private:
  ZmqRouter() = default;
  // The authentication thread: answers ZAP requests on `zap`, logs failed
  // handshakes reported on `events`. Closes both when it ends.
  void ZapLoop(void* zap, void* events);

  RouterOptions options_;
  void* socket_ = nullptr;
  int port_ = 0;
  std::string client_key_;      // the job's client public key, 32 bytes (with keys)
  void* zap_socket_ = nullptr;  // until the thread takes it
  std::thread zap_;
  std::atomic<bool> zap_stop_{false};
  std::atomic<int64_t> refused_{0};
};

}  // namespace pstrain

#endif  // PSTRAIN_NET_ZMQ_ROUTER_H_
