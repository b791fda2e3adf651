// KVClient: a worker's view of the parameter servers (../shared/design.md 6,
// ../shared/reference/mxnet_facts.md 1.4).
//
// Every call takes a list of keys, each with its length in float32 elements;
// values of all keys lie back to back in the caller's buffer, in key-list order.
// A call becomes at most one message per server (its frames reference the
// caller's buffer, except that small arrays not adjacent there are gathered
// into one copied frame) and returns a ticket at once; completion is
// reported by Wait(ticket, deadline) or by the callback, never both needed.
//
// Ordering: requests touching a key reach its server in call order, so a pull
// sees every earlier push of this worker to that key (in dist_sync the server
// holds the pull until the push's round closes). When more than
// `max_inflight_per_server` requests to a server are outstanding, new ones queue
// and leave highest priority first (ties in call order); a queued request never
// overtakes an earlier one that shares a key with it.
//
// Tickets: one without a callback is kept until Wait() reports it; wait for
// every such ticket (a callback ticket is forgotten once its callback ran).
//
// Buffers: `vals` must stay valid and unchanged, and `out` valid, until the
// ticket completes. If the job fails (Wait returns Unavailable), outstanding
// requests are abandoned; their buffers must then stay valid until the
// ClusterNode is stopped (this object's destructor does it).
//
// Server recovery (options.recover): every push carries its round per key
// part (PsHeader.push_rounds), every request is kept until answered, and with
// snapshot_every > 1 a copy of the last snapshot_every pushes of each part.
// When the scheduler says a server was replaced, the client stops sending to
// it, and once connected to the new process sends it first the answered
// pushes it may have lost (those after its last snapshot), then every request
// it has not answered, in their order; the server skips rounds it holds.
//
// Threads: every method is thread-safe. Callbacks run on the node's receive,
// heartbeat or replacement thread, on the client's sender thread, or on the calling thread
// (requests that complete at once), and must not block; they may issue new
// requests. No lock is held while a message is sent: requests are handed to
// a per-server outbox under the lock and sent, in order, after it is released
// by the calling thread, or by the sender thread when the request was let
// out of the queue by a reply (the receive thread never sends).
//
// Gradient compression (MXNet's 2-bit, common/gradient_compression.h): once
// SetServerConfig installed a config whose gradient_compression is 2-bit,
// every Push and PushPull is quantized: the client keeps a residual per key
// (fp32, the key's full length, created at the key's first push; a config
// without compression drops them all), and each
// part a server gets is quantized on its own (its blocks of 16 start at the
// part's start) straight from the caller's buffer into the one buffer per
// server that is sent (in the shared-memory arena for a co-located server).
// Init and Pull stay float32, and so do the replies (a PushPull's weights).
// Compressed pushes are serialized with each other (the residuals' lock);
// the quantizing happens outside the client's main lock, so replies keep
// flowing meanwhile. A push whose gradient plus residual holds NaN or Inf
// fails (FailedPrecondition naming the key): compressed, the servers would
// see 0. With recovery, kept copies hold the dequantized values (what the
// server applied) and are re-sent as float32.
//
// Batching: a small request to a server reached over TCP that still owes
// replies is left to the sender thread, which sends everything queued for
// that server meanwhile as one message (Van::SendBatch); a burst of small
// calls thus costs a few messages, not one each, and an idle connection
// still gets a request at once from the calling thread.
#ifndef PSTRAIN_WORKER_KV_CLIENT_H_
#define PSTRAIN_WORKER_KV_CLIENT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/gradient_compression.h"
#include "common/mutex.h"
#include "common/status.h"
#include "net/cluster_node.h"
#include "worker/placement.h"

namespace pstrain {

struct KVClientOptions {
  Placement placement = Placement::kMxnet;  // PSTRAIN_PLACEMENT
  int64_t bigarray_bound = 1000000;         // MXNET_KVSTORE_BIGARRAY_BOUND
  int64_t chunk_elems = 262144;             // PSTRAIN_CHUNK_ELEMS
  // 256: a training step's push and pull of every array of a model like
  // inception-bn (156 requests) leave at once; a request let out of the queue by
  // a reply costs a hand-off to the sender thread (bench/RESULTS.md, issue 13).
  int max_inflight_per_server = 256;
  int request_timeout_ms = 600000;  // PSTRAIN_REQUEST_TIMEOUT_MS
  bool recover = false;             // PSTRAIN_SERVER_RESTARTS > 0
  int snapshot_every = 1;           // PSTRAIN_SNAPSHOT_EVERY
};

// The options a worker gets from its environment (PSTRAIN_PLACEMENT,
// MXNET_KVSTORE_BIGARRAY_BOUND, PSTRAIN_CHUNK_ELEMS, PSTRAIN_REQUEST_TIMEOUT_MS).
KVClientOptions KVClientOptionsFromJobEnv(const JobEnv& env);

class KVClient {
 public:
  using Key = uint64_t;
  using Ticket = int64_t;
  using Callback = std::function<void(const Status&)>;

  // Installs the reply handler on `node`. REQUIRES: node is a worker that has
  // not been started; `node` outlives this object.
  KVClient(ClusterNode* node, const KVClientOptions& options);
  // Stops the node: no callback runs after it returns.
  ~KVClient();

  // Registers with the scheduler and connects to the servers.
  Status Start() { return node_->Start(); }

  // Sends `config` (sync mode, optimizer, gradient compression) to every
  // server and waits for all of them to install it. Every worker calls it with
  // the same config before Init. Once they did, later pushes are compressed as
  // config.gradient_compression says (see "Gradient compression" above).
  Status SetServerConfig(const ServerConfig& config, Deadline deadline) EXCLUDES(gc_mu_);

  // Each request names a key at most once (InvalidArgument otherwise; MXNet
  // sums repeated keys, pstrain.kvstore does too before it calls these).
  // Initial values: only worker rank 0 sends them (others complete at once).
  // MXNet's protocol: Wait for it, then Barrier() on every worker.
  Ticket Init(const std::vector<Key>& keys, const std::vector<int64_t>& lens, const float* vals,
              Callback cb = nullptr);
  // As Init, but the values replace those the keys hold (NotFound for a
  // key the servers hold no value of; InvalidArgument for another length
  // than the key's). Between dist_sync rounds: a replace arriving while
  // other workers' pushes of the key are in its open round is refused
  // (FailedPrecondition), so every worker's pushes of it must be answered
  // first. Rank 0 sends them. To hand every worker the new values: a
  // Barrier() after the last pull of the old ones, Replace on rank 0 and
  // Wait, a Barrier(), then Pull.
  Ticket Replace(const std::vector<Key>& keys, const std::vector<int64_t>& lens, const float* vals,
                 Callback cb = nullptr);
  Ticket Push(const std::vector<Key>& keys, const std::vector<int64_t>& lens, const float* vals,
              int priority = 0, Callback cb = nullptr) EXCLUDES(gc_mu_);
  Ticket Pull(const std::vector<Key>& keys, const std::vector<int64_t>& lens, float* out,
              int priority = 0, Callback cb = nullptr);
  // Push `vals`, then receive the updated values into `out` in one round trip.
  // `out` may equal `vals`.
  Ticket PushPull(const std::vector<Key>& keys, const std::vector<int64_t>& lens, const float* vals,
                  float* out, int priority = 0, Callback cb = nullptr) EXCLUDES(gc_mu_);

  // Horovod's allreduce over the servers: every worker pushes `vals` of the
  // keys as one dist_sync round; the servers store the round's sum as the
  // keys' values, whatever optimizer they run (it is not applied, and the
  // keys' optimizer state stays), and `out` receives it. Never compressed.
  // The keys must be initialized (any value). The servers refuse it in
  // dist_async (no rounds) and in a round that mixes it with plain pushes.
  Ticket AllReduce(const std::vector<Key>& keys, const std::vector<int64_t>& lens,
                   const float* vals, float* out, int priority = 0, Callback cb = nullptr);

  // The compression later pushes use (kNone until SetServerConfig set one).
  GradientCompression gradient_compression() const EXCLUDES(gc_mu_);

  // Tests only: sends `msg`, a CMD_DATA request to server rank `server` whose
  // header and frames the caller built (its ids are filled in here), under a
  // new ticket that the reply completes. REQUIRES: msg does not pull.
  Ticket TEST_SendRaw(int server, Message msg, Callback cb = nullptr);

  // Waits for `ticket`: its error, DeadlineExceeded naming the servers still
  // owing a reply, or the job's failure. A ticket with a callback returns OK
  // (or the job's failure) once its result is handed to the callback, which
  // may still be running; so does one that was already waited for.
  Status Wait(Ticket ticket, Deadline deadline);

  // Worker-group barrier.
  Status Barrier(Deadline deadline) { return node_->Barrier(kWorkerGroup, deadline); }
  // Tells the scheduler this worker is done and waits for the job's end.
  // REQUIRES: every ticket completed.
  Status Finish(Deadline deadline) { return node_->Finish(deadline); }

  int rank() const { return node_->rank(); }
  int num_workers() const { return node_->num_workers(); }
  int num_servers() const { return node_->num_servers(); }
  ClusterNode* node() { return node_; }

 private:
  struct TicketState {
    int remaining = 0;
    Status status;
    Callback cb;
    bool done = false;
  };
  struct Sub;  // one message to one server

  enum Kind { kInit, kReplace, kPush, kPull, kPushPull, kAllReduce };
  // A push's 2-bit codes: per server, one frame with its parts' words in the
  // order Issue visits them (empty: no part there).
  struct CompressedValues {
    std::vector<Blob> frames;
    float threshold = 0;
  };
  // Queue, then sends (or leaves to the sender thread) and runs the callbacks due.
  Ticket Issue(Kind kind, const std::vector<Key>& keys, const std::vector<int64_t>& lens,
               const float* vals, float* out, int priority, Callback cb) EXCLUDES(mu_);
  // Makes the ticket and its requests and puts them in the outboxes or
  // queues; *flush_here says whether the caller should Flush() (else the
  // sender thread sends). `compressed`: the values to send instead of `vals`
  // (null: vals as float32); `pre`: an error found before (the ticket
  // completes with it).
  Ticket Queue(Kind kind, const std::vector<Key>& keys, const std::vector<int64_t>& lens,
               const float* vals, float* out, int priority, Callback cb,
               const CompressedValues* compressed, const Status& pre, bool* flush_here)
      EXCLUDES(mu_);
  // Push or PushPull, compressed when a compression is set.
  Ticket IssuePush(Kind kind, const std::vector<Key>& keys, const std::vector<int64_t>& lens,
                   const float* vals, float* out, int priority, Callback cb) EXCLUDES(gc_mu_);
  // Quantizes `vals` with the residuals into one buffer per server.
  Status Compress(const std::vector<Key>& keys, const std::vector<int64_t>& lens, const float* vals,
                  CompressedValues* out) REQUIRES(gc_mu_) EXCLUDES(mu_);
  StatusOr<const std::vector<PartPlan>*> Parts(Key key, int64_t len) REQUIRES(mu_);
  // A request to `server` under `ticket` with its header filled in (id, sender, receiver).
  std::unique_ptr<Sub> NewSub(Ticket ticket, int server, int priority, PsCommand cmd) REQUIRES(mu_);
  // The value frames of a message to `server` from the caller's runs (start,
  // floats), in order: a run is referenced in place, consecutive small runs
  // are gathered into one copied frame.
  void AddValueFrames(int server, const std::vector<std::pair<const float*, uint64_t>>& runs,
                      std::vector<Blob>* frames) REQUIRES(mu_);
  void Enqueue(std::unique_ptr<Sub> sub) REQUIRES(mu_);
  void Pump(int server) REQUIRES(mu_);
  // Marks one sub-request of `ticket` done; returns the callback to run, if any.
  Callback FinishSub(Ticket ticket, const Status& s) REQUIRES(mu_);
  // Registers `sub` as in flight and puts its message in its server's outbox.
  void SendSub(std::unique_ptr<Sub> sub) REQUIRES(mu_);
  // Sends what the outboxes hold, each server's in order, no lock held while
  // sending; a server another thread is flushing is left to that thread.
  void Flush() EXCLUDES(mu_);
  // Sends `out` (request id, message) to `server` in order, consecutive small
  // messages as one batch; returns the requests whose send failed. No lock held.
  std::vector<std::pair<uint64_t, Status>> SendInOrder(
      int server, const std::deque<std::pair<uint64_t, Message>>& out) EXCLUDES(mu_);
  // Whether what `server`'s outbox holds may wait for the sender thread, to
  // leave in one batch with what follows: small messages to a busy TCP
  // connection (a reply is due), where a batch saves more than the hand-off costs.
  bool Deferrable(int server) REQUIRES(mu_);
  void WakeSender() REQUIRES(mu_);
  // Flush() now on the calling thread, or (on the receive thread) by the
  // sender thread; then the callbacks.
  void FlushAndRunCallbacks(bool may_block) EXCLUDES(mu_);
  void SenderLoop();
  void RunCallbacks() EXCLUDES(mu_);
  void HandleReply(Message&& msg);
  // Server `id` is being replaced: stop sending to it (connected false), then
  // send it what it may lack (true).
  void ServerReplaced(int id, bool connected) EXCLUDES(mu_);
  void FailAll(const Status& s);
  void ExpireRequests();

  ClusterNode* node_;
  KVClientOptions options_;
  // The job's PSTRAIN_MAX_MESSAGE_BYTES: every frame a request sends, or a
  // reply brings back whole (a part), stays within it.
  const uint64_t max_frame_bytes_;

  // Gradient compression: the setting and each key's residual. Taken before
  // mu_ (a compressed push holds it while it is issued).
  mutable Mutex gc_mu_ ACQUIRED_BEFORE(mu_);
  GradientCompression gc_ GUARDED_BY(gc_mu_);
  std::unordered_map<Key, std::vector<float>> residuals_ GUARDED_BY(gc_mu_);

  Mutex mu_;
  CondVar cv_{&mu_};          // tickets done (Wait)
  CondVar sender_cv_{&mu_};   // the sender thread: work or stop
  CondVar flushed_cv_{&mu_};  // a paused server's send in progress ended (ServerReplaced)
  Status failure_ GUARDED_BY(mu_);
  Ticket next_ticket_ GUARDED_BY(mu_) = 1;
  uint64_t next_request_ GUARDED_BY(mu_) = 1;
  std::unordered_map<Ticket, TicketState> tickets_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::unique_ptr<Sub>> inflight_ GUARDED_BY(mu_);
  std::vector<std::deque<std::unique_ptr<Sub>>> queued_ GUARDED_BY(mu_);  // per server
  std::vector<int> inflight_count_ GUARDED_BY(mu_);                       // per server
  std::unordered_map<Key, std::pair<int64_t, std::vector<PartPlan>>> plans_ GUARDED_BY(mu_);
  std::vector<std::pair<Callback, Status>> to_run_ GUARDED_BY(mu_);  // run after unlocking
  // Per server: messages to send, in order (request id, message), and whether
  // a thread is sending them now.
  std::vector<std::deque<std::pair<uint64_t, Message>>> outbox_ GUARDED_BY(mu_);
  std::vector<bool> flushing_ GUARDED_BY(mu_);
  std::vector<bool> paused_ GUARDED_BY(mu_);  // per server: being replaced, send nothing
  // Recovery: pushes issued per wire key (the round of the next is one more),
  // the highest round answered, and copies of the last pushes (snapshot_every > 1).
  struct Kept {
    uint64_t round = 0;
    std::vector<float> values;
    bool sum_only = false;  // an AllReduce's push
  };
  std::unordered_map<uint64_t, uint64_t> pushes_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, uint64_t> answered_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::deque<Kept>> kept_ GUARDED_BY(mu_);
  bool sender_wanted_ GUARDED_BY(mu_) = false;  // the receive thread filled an outbox
  bool sender_stop_ GUARDED_BY(mu_) = false;
  std::thread sender_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_KV_CLIENT_H_
