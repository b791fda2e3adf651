// Van: the transport of one node (ps-lite's name for it).
//
// Each node binds one ROUTER socket and connects one DEALER socket per peer;
// every message travels from the sender's DEALER to the receiver's ROUTER, so
// replies are ordinary sends in the other direction. Messages are multipart:
// the serialized PsHeader, then (data messages only) keys, lens and the value
// frames. Sends are zero-copy: a value Blob is handed to ZeroMQ by reference
// and released when ZeroMQ is done with it. Received frames are wrapped as
// Blobs without a copy.
//
// One receive thread reads the ROUTER, drops malformed messages with a log line
// (garbage, wrong protocol version, frames that disagree with the header,
// frames over the size limit) and hands the rest to the handler, in arrival
// order. Threads: Send, Connect and Disconnect are thread-safe; sends to one
// peer are serialized by a per-peer lock, sends to different peers run in parallel.
//
// Co-located peers (net/shm_arena.h): with shm_bytes > 0 the Van owns a
// shared-memory arena. Connect() maps the peer's arena when the node table
// offers one and it is reachable; every message to that peer then says so
// (shm_mapped), and once a peer has said it mapped ours, the values of data
// messages to it travel through our arena: a value Blob allocated from the
// arena is sent by reference (no copy), any other is copied into the arena's ring
// (one copy, none through the kernel); the receiver reads them in place. Any
// step that fails (no arena, not reachable, ring full) falls back to TCP.
//
// The Van composes parts that each do one job and are tested on their own:
//   net/zmq_router.h      the ROUTER, its authentication thread (ZAP), receiving frames
//   net/zmq_dealer.h      one DEALER per peer: security, connection events, sending frames
//   net/shm_placement.h   values of data messages placed in our arena, resolved in a peer's
//   net/shm_queue.h       whole messages through a peer's queue; the queues we drain
//   net/doorbell.h        the socket that wakes a sleeping receive thread
//   net/shm_sequence.h    the numbering of messages to a co-located peer; numbers given
//                         back (failed send) or up (dropped message)
//   net/reorderer.h       each co-located sender's messages handed on in its order
//   net/host_address.h    host names, the address a node advertises
#ifndef PSTRAIN_NET_VAN_H_
#define PSTRAIN_NET_VAN_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "net/host_address.h"
#include "net/job_keys.h"
#include "net/message.h"
#include "net/reorderer.h"
#include "net/shm_arena.h"
#include "net/shm_queue.h"
#include "net/zmq_dealer.h"

namespace pstrain {

struct VanOptions {
  std::string bind_host = "0.0.0.0";             // IP, host name, "*" or "::"
  int port = 0;                                  // 0: any free port
  int64_t max_message_bytes = int64_t{1} << 31;  // larger frames drop the connection
  int send_timeout_ms = 30000;                   // a send blocked this long (peer gone) fails
  int verbose = 0;                               // PS_VERBOSE
  std::string name = "node";                     // for log lines
  uint64_t shm_bytes = 0;         // PSTRAIN_SHM_BYTES: arena ring (0: no arena, TCP only)
  uint64_t shm_store_bytes = 0;   // arena store (servers' stored values)
  uint64_t shm_min_bytes = 4096;  // smaller values are not copied into the ring
  // The job's CURVE keys (net/job_keys.h): the ROUTER accepts only peers that
  // hold them, and every frame is encrypted. Null: no security (anyone who
  // reaches the port can connect).
  std::shared_ptr<const JobKeys> keys;
  // With keys: true (PSTRAIN_WIRE_SECURITY=curve) authenticates every
  // connection and encrypts every frame (CURVE); false (=auth) only
  // authenticates each connection when it opens (ZeroMQ's PLAIN, the job's
  // secret as password) and sends frames in the clear: for a network no one
  // else can listen on, at the speed of no security.
  bool encrypt = true;
  // This node's ZeroMQ routing id on every connection it opens (peers check
  // it against the sender a message claims; see ExpectRoute). Empty: ZeroMQ's.
  std::string routing_id;
  // Milliseconds between ZeroMQ's attempts to reach a peer that cannot be
  // reached; 0: ZeroMQ's default (100). Tests make retries come fast.
  int reconnect_interval_ms = 0;
  // How long the messages of a co-located sender wait for an earlier number
  // that has not arrived before it is given up as lost (Reorderer::SkipOverdue).
  // Both paths deliver on this host within far less.
  int order_gap_timeout_ms = 30000;
};

class Doorbell;
class ShmPlacement;
class ZmqRouter;

class Van {
 public:
  // Called on the receive thread with every well-formed message, in arrival order.
  using Handler = std::function<void(Message&&)>;

  // Binds the ROUTER. IOError names the address when binding fails. Nothing
  // is received until StartReceiving(): the owner stores the Van first, so
  // its handler never sees a half-built owner (a node queued to a bound port
  // delivers at once).
  static StatusOr<std::unique_ptr<Van>> Create(const VanOptions& options, Handler handler);
  // Called on the receive thread after each pass that handed messages on,
  // before it looks for more (a handler may gather its answers until then).
  // Set before StartReceiving.
  void SetBurstEnd(std::function<void()> burst_end) { burst_end_ = std::move(burst_end); }
  // Starts the receive thread. Call once.
  void StartReceiving();
  // Stops the receive thread and closes every socket; queued sends are dropped.
  ~Van();

  int port() const { return port_; }

  // Stops and joins the receive thread: no handler runs after it returns.
  // Sends still work: a thread takes over reading the connections' events
  // (ConnectionEvents; unread, they would stop ZeroMQ's I/O thread and with
  // it every send) until the Van goes. Idempotent.
  // Not concurrently with itself.
  void StopReceiving();

  // This node's arena, for the node table; null when it has none.
  const ShmInfo* shm_info() const;
  // The arena (null: none); fixed for the Van's life. Value Blobs allocated
  // from it (AllocateOrHeap) are sent to co-located peers without a copy.
  const std::shared_ptr<ShmArena>& arena() const { return arena_; }

  // This node's id (once the scheduler assigned it): messages that peers queue
  // for it in shared memory are found under it. Call before Connect.
  void SetSelfId(int id);
  // From now on a message that claims to come from node `id` is taken only
  // from a connection with routing id `route` (the one the node table gives
  // that node); others are dropped as forged. Messages from ids with no
  // expected route are taken from any connection.
  void ExpectRoute(int id, const std::string& route) EXCLUDES(mu_);
  // Connections refused for not holding the job's keys (for tests).
  int64_t refused() const;

  // Opens (or replaces) the connection to node `id` at host:port (a name or an
  // IP). With `shm` (the peer's arena from the node table) it also tries to map
  // the peer's arena; failing that is not an error (the peer is elsewhere).
  // Replacing a connection (or connecting again after Disconnect) is for a
  // peer process replaced by a new one, before the new one maps our arena: it
  // starts a new numbering of the messages to `id`, empties the queue `id`
  // reads in our arena for the new process (ShmArena::ResetQueue: a send to
  // the old one under way can queue nothing more), and once the old
  // connection is let go takes back every block of our arena the old process
  // still held (ShmArena::ReleaseReceiver). Do not re-Connect a live process:
  // it would lose what it reads. Calls for one id must not overlap.
  Status Connect(int id, const std::string& host, int port, const ShmInfo* shm = nullptr)
      EXCLUDES(mu_);
  // Closes the connection to `id` (sends to it fail from then on) and stops
  // reading its shared-memory queue; its arena is unmapped once the values
  // read from it are gone. Once no send to it is under way, every block of
  // our arena the process still held is taken back: for a peer that is gone.
  // Nothing when there is none.
  void Disconnect(int id) EXCLUDES(mu_);
  // What happened to the connection to node `id` so far, for error messages.
  ConnectionReport DescribeConnection(int id) EXCLUDES(mu_);
  // The connection to `from` becomes the connection to `to` (a peer known by
  // a temporary id until it has its own); no-op if there is none.
  void Rename(int from, int to) EXCLUDES(mu_);
  // Sends `msg` to node `id`. Unavailable if there is no connection to `id` or
  // the send blocks past send_timeout_ms. Value Blobs are kept alive until
  // ZeroMQ releases them.
  Status Send(int id, const Message& msg) EXCLUDES(mu_);
  // Sends `msgs` to node `id` in their order, stopping at the first error;
  // `*sent` (optional) says how many went. Over TCP, consecutive small data
  // messages (IsBatchable) go as one ZeroMQ frame (kBatchMagic); to a peer
  // that shares memory with this node each goes as Send sends it.
  Status SendBatch(int id, const std::vector<const Message*>& msgs, size_t* sent = nullptr)
      EXCLUDES(mu_);
  // Whether `msg` may go in a batch: a data message whose keys, lens and
  // values fit in kPackBytes.
  static bool IsBatchable(const Message& msg);

  // Messages dropped as malformed so far (for tests).
  int64_t dropped() const { return dropped_.load(); }
  // Data messages whose values went through shared memory, and those that
  // could have but found the arena full (for tests and benchmarks).
  int64_t shm_sent() const { return shm_sent_.load(); }
  int64_t shm_fallbacks() const;
  // Messages sent through the peers' shared-memory queues instead of ZeroMQ.
  int64_t shm_queued() const { return shm_queued_.load(); }
  // Messages sent inside batch frames (SendBatch), and those frames.
  int64_t batched() const { return batched_.load(); }
  int64_t batch_frames() const { return batch_frames_.load(); }
  // Times this node woke a sleeping peer through its doorbell.
  int64_t doorbells_rung() const { return doorbells_rung_.load(); }
  // Whether node `id` has mapped this node's arena (it said so).
  bool PeerMapsOurArena(int id) EXCLUDES(mu_);

 private:
  struct Peer;
  Van(const VanOptions& options, Handler handler);
  void ReceiveLoop();
  // The whole message (header, keys, lens, and the values unless they are
  // placed in shared memory already) through `id`'s queue in our arena,
  // ringing its doorbell if it sleeps; false when there is no room.
  // REQUIRES: peer.mu held.
  bool SendThroughQueue(int id, Peer& peer, const std::string& header, const Message& msg,
                        bool inline_values);
  // A message to `id` could not be sent: takes back its number and the arena
  // blocks `placed` lists (null: none). REQUIRES: peer.mu held.
  Status SendFailed(int id, Peer& peer, bool ordered, const PsHeader* placed);
  std::shared_ptr<Peer> FindPeer(int id) EXCLUDES(mu_);
  // msgs[begin, end) as one batch frame. EXCLUDES: peer.mu.
  Status SendFrameOf(int id, Peer& peer, const std::vector<const Message*>& msgs, size_t begin,
                     size_t end);
  // Receive thread: messages `peer` queued for node `me`; true if any.
  bool DrainQueue(int peer, ShmMapping& mapping, int me);
  void Finish(Message&& msg) EXCLUDES(mu_);
  // Whether a message from ZeroMQ may speak for the sender it claims: it came
  // on the connection the node table gives that sender (or no route is known
  // for the sender yet). Messages from a queue are checked where read.
  bool RouteMatches(const Message& msg) EXCLUDES(mu_);
  // The sender's arena as mapped here (null: its queue is not read here, and
  // everything it sends comes over ZeroMQ).
  std::shared_ptr<ShmMapping> ArenaOf(int sender) EXCLUDES(mu_);
  // Counts and logs a malformed message; a numbered one is skipped in the
  // order of `queue_owner` (default: its sender) so later ones are not held
  // up. One from ZeroMQ whose route does not match its sender touches nothing
  // of that sender's (numbering, arena blocks).
  void Drop(const Message* msg, const std::string& why, int queue_owner = -1) EXCLUDES(mu_);
  // Receive thread: reads one message from the ROUTER; false when none was waiting.
  bool ReceiveOne();
  // Receive thread: reads every connection's pending events (ConnectionEvents).
  void DrainConnectionEvents() EXCLUDES(mu_);

  const VanOptions options_;
  const Handler handler_;
  std::function<void()> burst_end_;
  void* context_ = nullptr;
  std::unique_ptr<ZmqRouter> router_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> dropped_{0};
  std::atomic<int64_t> shm_sent_{0};
  std::shared_ptr<ShmArena> arena_;          // null: TCP only
  std::unique_ptr<ShmPlacement> placement_;  // with arena_
  ShmInfo shm_info_;                         // the arena's, plus the doorbell
  std::unique_ptr<Doorbell> doorbell_;       // null: none (peers send to us over TCP)
  std::atomic<int> self_id_{-1};
  std::atomic<int64_t> shm_queued_{0};
  std::atomic<int64_t> batched_{0};
  std::atomic<int64_t> batch_frames_{0};
  std::atomic<int64_t> doorbells_rung_{0};
  // Peers whose arena is mapped here, whose queues ReceiveLoop reads.
  ShmInbox inbox_;
  // Receive thread only: each co-located sender's messages in its order.
  Reorderer order_;
  std::thread receiver_;
  // After StopReceiving: reads the connections' events until the Van goes.
  void DrainEventsLoop();
  std::thread event_drainer_;
  Mutex drainer_mu_;
  CondVar drainer_cv_{&drainer_mu_};
  bool drainer_stop_ GUARDED_BY(drainer_mu_) = false;
  Mutex mu_;
  std::map<int, std::shared_ptr<Peer>> peers_ GUARDED_BY(mu_);
  // Per node id ever connected: the incarnation of its latest connection (the
  // tag of the tickets our arena hands it, ShmArena::Ticket).
  std::map<int, uint8_t> incarnations_ GUARDED_BY(mu_);
  std::map<int, std::string> routes_ GUARDED_BY(mu_);
};

}  // namespace pstrain

#endif  // PSTRAIN_NET_VAN_H_
