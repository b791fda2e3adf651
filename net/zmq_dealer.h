// ZmqDealer: the DEALER socket a node sends to one peer's ROUTER on.
//
// One per peer (net/zmq_router.h is the other end). It connects with the
// node's routing id (peers check it against the sender a message claims) and
// the job's security (CURVE keys or the PLAIN password; see RouterOptions),
// and watches its own connection events, so that a peer that cannot be
// reached is told apart from one that refuses us or went away (Describe).
//
// Sends are zero-copy: a frame references its Blob (keeping its owner alive
// until ZeroMQ is done with it) unless it is small enough that a copy is
// cheaper. A message goes either as frames (header, then for data messages
// keys, lens and value frames) or as one batch frame of one or more messages
// (kBatchMagic, net/message.h).
//
// Threads: not thread-safe. The Van serializes every call on one dealer
// with that peer's lock; its ConnectionEvents (events()) may be used from any
// thread.
#ifndef PSTRAIN_NET_ZMQ_DEALER_H_
#define PSTRAIN_NET_ZMQ_DEALER_H_

#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "net/job_keys.h"
#include "net/message.h"

namespace pstrain {

// The state of a connection to a peer, from ZeroMQ's events, and a sentence
// for error messages ("every TCP connection to tcp://10.0.0.2:9000 was
// refused (12 attempts): nothing listens there").
struct ConnectionReport {
  enum Kind {
    kNone,             // never opened, or closed (Van::Disconnect)
    kConnected,        // up, handshake done
    kRefused,          // every TCP connection refused
    kNoAnswer,         // no TCP connection, no refusal either (the host does not answer)
    kKeyRefused,       // the peer refused our handshake: we do not hold the job's key
    kHandshakeFailed,  // the handshake failed otherwise (keys or security settings differ)
    kLost,             // was up, is down
    kHandshaking,      // TCP up, handshake under way
  };
  Kind kind = kNone;
  std::string text;
};

// A dealer's connection events, read from ZeroMQ's monitor of its socket.
// ZeroMQ's I/O thread hands each event over with a blocking send, and that
// thread serves every socket of the context: events left unread (about 2,000,
// 5 minutes of retries to a peer that stays away) stop the whole node, and
// stopping the monitor then hangs. So the owner drains them regularly (the
// Van's receive thread does, several times a second). Thread-safe.
class ConnectionEvents {
 public:
  ConnectionEvents() = default;
  ~ConnectionEvents();
  ConnectionEvents(const ConnectionEvents&) = delete;
  ConnectionEvents& operator=(const ConnectionEvents&) = delete;

  // Starts monitoring `socket` (of `context`). False when ZeroMQ cannot
  // (then no events are told, and Report only names the address).
  bool Watch(void* context, void* socket) EXCLUDES(mu_);
  // Drains the events, then stops the monitor. Before the socket is closed.
  void Stop(void* socket) EXCLUDES(mu_);
  void SetAddress(const std::string& address) EXCLUDES(mu_);
  // Reads the events that arrived since the last call; never blocks.
  void Drain() EXCLUDES(mu_);
  // What the events told of the connection so far (draining first).
  ConnectionReport Report() EXCLUDES(mu_);

 private:
  void DrainLocked() REQUIRES(mu_);

  Mutex mu_;
  void* monitor_ GUARDED_BY(mu_) = nullptr;  // a PAIR receiving the events (null: none)
  std::string address_ GUARDED_BY(mu_);
  int tcp_up_ GUARDED_BY(mu_) = 0;          // TCP connections made
  int retries_ GUARDED_BY(mu_) = 0;         // reconnects scheduled (refused or lost)
  int lost_ GUARDED_BY(mu_) = 0;            // connections lost
  int auth_refused_ GUARDED_BY(mu_) = 0;    // handshakes the peer refused (not our key)
  int other_failures_ GUARDED_BY(mu_) = 0;  // handshakes failed otherwise
  bool up_ GUARDED_BY(mu_) = false;
  bool handshake_ok_ GUARDED_BY(mu_) = false;
};

struct DealerOptions {
  int send_timeout_ms = 30000;          // a send blocked this long (peer gone) fails
  std::string routing_id;               // empty: ZeroMQ's
  std::shared_ptr<const JobKeys> keys;  // null: no security
  bool encrypt = true;                  // with keys: CURVE (true) or PLAIN
  std::string name = "node";            // for errors
  int reconnect_interval_ms = 0;        // 0: ZeroMQ's default (VanOptions)
};

// One message of a batch frame: its serialized header (with
// num_value_frames 1 when its values travel inline) and the message.
struct BatchEntry {
  std::string header;
  const Message* msg = nullptr;
  bool inline_values = false;
};

class ZmqDealer {
 public:
  // A DEALER of `context` with `options` and a monitor of its connection
  // events. InvalidArgument (naming options.name) when the job's keys or
  // password cannot be set.
  static StatusOr<std::unique_ptr<ZmqDealer>> Open(void* context, const DealerOptions& options);
  // Closes the socket and its monitor.
  ~ZmqDealer();
  ZmqDealer(const ZmqDealer&) = delete;
  ZmqDealer& operator=(const ZmqDealer&) = delete;

  // Connects to `address` ("tcp://ip:port"); ZeroMQ connects in the
  // background and keeps retrying. IOError with ZeroMQ's reason when it
  // refuses the address. Call once.
  Status Connect(const std::string& address);
  const std::string& address() const { return address_; }

  // Sends `header` as a frame and, for a data message (`data` non-null), its
  // keys and lens and, with `values`, its value frames, as one multipart
  // message. False when ZeroMQ took nothing (zmq_errno() says why, e.g. the
  // peer is gone and the send blocked past send_timeout_ms); once the header
  // is taken, the rest goes with it.
  bool SendFrames(const std::string& header, const Message* data, bool values);
  // Sends `entries` as one batch frame (kBatchMagic), each message's envelope
  // copied in. False when ZeroMQ did not take it (zmq_errno() says why).
  bool SendBatchFrame(const std::vector<BatchEntry>& entries);

  // This connection's events; lives as long as the dealer, usable from any
  // thread.
  ConnectionEvents* events() const { return events_.get(); }

 private:
  ZmqDealer() = default;

  void* socket_ = nullptr;
  std::string address_;
  const std::unique_ptr<ConnectionEvents> events_ = std::make_unique<ConnectionEvents>();
};

}  // namespace pstrain

#endif  // PSTRAIN_NET_ZMQ_DEALER_H_
