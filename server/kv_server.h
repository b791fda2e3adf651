// KVServer: one server's shard of every parameter (../shared/design.md 6,
// ../shared/reference/mxnet_facts.md 1.5).
//
// Requests arrive on the node's receive thread, are validated (an invalid one
// gets an error reply naming the key and the problem) and split by key over
// `num_threads` request shards. Each shard thread owns its keys' state (stored
// value, waiting requests, optimizer state) alone, so no key is
// ever touched by two threads, and it sees each worker's requests for a key in
// the order the worker sent them. A request is answered once all its keys are
// done; the reply of a pull is assembled by the shards in one buffer and sent
// without a further copy. Replies to a worker reached over TCP made on the
// receive thread wait for the end of the burst of requests it is handling and
// leave together (small ones as one message).
//
// A 2-bit compressed push (DTYPE_2BIT, MXNet's gradient compression, needs
// ServerConfig.gradient_compression) is dequantized to +-threshold / 0 by the
// shard that owns each part, into a buffer the request keeps, and is from then
// on exactly a float32 push.
//
// dist_sync: a push is held until every worker has pushed that key, then the
// optimizer runs once on the sum and all held pushes are answered. A pull or a
// second push from a worker that is part of the open round waits for the round
// to close, so a pull always sees the puller's own earlier pushes. dist_async:
// each push is applied at once. Without an optimizer a sync round stores the
// sum (MXNet's behaviour) and async pushes are refused.
#ifndef PSTRAIN_SERVER_KV_SERVER_H_
#define PSTRAIN_SERVER_KV_SERVER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "net/cluster_node.h"
#include "nn/optimizer.h"
#include "server/snapshot.h"

namespace pstrain {

struct KVServerOptions {
  int num_threads = 2;  // request shards (PSTRAIN_SERVER_THREADS)
  // A pushed gradient with NaN or Inf: false (PSTRAIN_NONFINITE=fail) ends
  // the job with an error naming the worker, key and round; true (=skip)
  // leaves it out of the update with a warning. Weights an update makes
  // non-finite from finite gradients always end the job.
  bool skip_nonfinite = false;
  // A dist_sync round still waiting for some worker's push after this long
  // ends the job naming the worker(s) (a warning at a quarter of it); 0: never.
  // PSTRAIN_ROUND_TIMEOUT_MS.
  int64_t round_timeout_ms = 120000;
  // Server recovery: this server's snapshot folder (empty: no snapshots), and
  // whether it replaces a dead server (load the snapshots) or starts the job
  // (clear them).
  std::string snapshot_dir;
  int snapshot_rank = -1;  // the server rank whose snapshots snapshot_dir holds
  int restart = 0;
  // Write snapshots with fdatasync (survive a host crash, not only a process's).
  bool snapshot_sync = false;
  // Tests: each shard waits this long before the snapshots a configuration
  // that replaces the optimizer waits for.
  int test_config_snapshot_delay_ms = 0;
};

class KVServer {
 public:
  // Installs the request handler on `node`. REQUIRES: node is a server that has
  // not been started; `node` outlives this object.
  KVServer(ClusterNode* node, const KVServerOptions& options);
  // Stops the node (no request arrives afterwards) and joins the shard threads.
  ~KVServer();

  // Starts the node (registration) and serves until the scheduler says the job
  // is over (OK) or the job fails (the error, naming the node at fault).
  Status Run();

  // Requests answered so far (for tests and logs).
  int64_t requests_served() const { return served_.load(); }
  // Key parts held (initialized), for tests and logs.
  int64_t keys_held() const { return keys_held_.load(); }

 private:
  struct Request;
  struct Op;
  struct Shard;
  struct KeyState;

  // Loads (restart) or clears the snapshots; before the node starts.
  Status OpenSnapshots();
  // Writes ks's snapshot when its closed rounds are a multiple of `every`
  // (0: never; 1: now); an error ends the job.
  Status MaybeSnapshot(uint64_t wire, KeyState* ks, uint64_t every);
  // Whether `op` must wait for the key's open round to close (the worker
  // pushed in it already, or the op's push belongs to a later round).
  static bool MustWait(const KeyState& ks, const Op& op);
  void HandleMessage(Message&& msg);
  // A DTYPE_2BIT push (valid as ValidateDataRequest sees it) is one this job
  // takes: its servers are configured for 2-bit compression and its float32
  // twin is not larger than a message may be: the floats it stands for, or
  // the error to answer.
  StatusOr<uint64_t> CheckCompressedPush(const Message& msg) const;
  // Receive thread: worker `id` is gone; the shards drop its pushes.
  void HandleWorkerLost(int id);
  // Shard (busy): drops lost workers' pushes and closes the rounds now complete.
  void RemoveLost(Shard* shard);
  // Shard (busy): leaves lost workers' pushes out of `ks`'s round and deferred ones.
  void DropLostPushes(KeyState* ks) const;
  // Receive thread: worker `id` finished while others go on; the shards look
  // for rounds that wait for it.
  void HandleWorkerFinished(int id);
  // Shard (busy): a worker that finished, whose push `ks`'s open round waits
  // for, ends the job (that round can never close): true when it did.
  bool FailRoundOfFinished(uint64_t wire, const KeyState& ks);
  // Shard (busy), `ks` with no open round: a push of a later round than the
  // next one, held past PSTRAIN_ROUND_TIMEOUT_MS for rounds nobody pushed,
  // ends the job naming its worker: true when it did.
  bool FailHeldPushOfALostRound(uint64_t wire, const KeyState& ks, SteadyClock::time_point now);
  // The optimizer of `cfg` for `live` workers: in dist_sync a round sums
  // `live` gradients, so fewer than all rescale it; a dist_async push is one
  // worker's own and is never rescaled.
  StatusOr<std::shared_ptr<Optimizer>> MakeOptimizer(const ServerConfig& cfg, int live) const;
  void HandleConfig(const Message& msg);
  // Writes `cfg` where a replacement of this server reads it (snapshots on).
  Status SaveConfig(const ServerConfig& cfg);
  // Answers a configuration request: taken.
  void ConfirmConfig(const PsHeader& request);
  // A configuration that replaced the optimizer (pending_config_ set): each
  // shard, after what arrived before it, snapshots every key (the rounds
  // closed before, the state's slot layout with it); then `cfg` is saved and
  // every worker that sent it is answered, so that a replacement never
  // replays a round of the old optimizer with the new one, nor takes the old
  // one's state for its own.
  void SnapshotThenConfirm(ServerConfig cfg);
  void ReplyError(const PsHeader& request, const Status& error);
  void ShardLoop(Shard* shard);
  void Submit(Shard* shard, const Op& op);
  // Runs the deferred ops of `ks` that may run now; `rounds_before`: its
  // closed rounds when the caller began (the held ops' clock restarts if
  // that moved).
  void Drain(Shard* shard, KeyState* ks, uint64_t rounds_before);
  void Execute(Shard* shard, KeyState* ks, const Op& op);
  // Heartbeat thread: asks every shard to look at its open rounds.
  void RequestRoundCheck();
  // Shard (busy): fails the job for a round that waits for a finished worker;
  // reports rounds open past a quarter of the timeout, fails the job past it.
  void CheckRounds(Shard* shard);
  void CompletePart(const Op& op, const KeyState* ks, const Status& s);
  // out = grads[0] + ... + grads[k-1] (n elements each, summed in that order).
  static void SumInto(const float* const* grads, size_t k, float* out, size_t n);
  void SendReply(Request* r);
  // Sends `reply` to `worker`, or on the receive thread holds it for a worker
  // reached over TCP until the end of the burst of messages it is handling
  // (SendHeldReplies sends what each worker is owed in one batch).
  void Answer(int worker, Message&& reply);
  void SendHeldReplies();
  // Whether a line about a request of `worker` (refused, or its reply not
  // sent) is logged: always, but for a worker declared lost only the first.
  bool ShouldWarnAbout(int worker);
  std::shared_ptr<const ServerConfig> config() const;
  // What a push is applied with, read at once: the configuration, its
  // optimizer, and the live workers that optimizer was made for (a loss
  // changes the last two together, so a round never sums one count of
  // gradients with the rescale of another).
  struct UpdateRule {
    std::shared_ptr<const ServerConfig> config;
    std::shared_ptr<Optimizer> optimizer;
    int live = 0;
  };
  UpdateRule rule() const;

  ClusterNode* node_;
  KVServerOptions options_;
  std::vector<std::unique_ptr<Shard>> shards_;
  // The receive thread (known once it ended a burst), and the replies it
  // made in the current one (touched by it alone).
  std::atomic<std::thread::id> burst_thread_{};
  std::vector<std::pair<int, Message>> held_replies_;
  std::vector<std::thread> threads_;
  std::atomic<int64_t> served_{0};
  std::atomic<int64_t> keys_held_{0};

  mutable Mutex config_mu_;
  std::shared_ptr<const ServerConfig> config_ GUARDED_BY(config_mu_);
  std::shared_ptr<Optimizer> optimizer_ GUARDED_BY(config_mu_);
  // A generation that replaced the optimizer, until its snapshots are written
  // and it is saved: the requests of the workers that sent it, answered then.
  // Meanwhile a newer generation is refused.
  struct PendingConfig {
    uint32_t generation = 0;
    std::vector<PsHeader> waiters;
  };
  std::optional<PendingConfig> pending_config_ GUARDED_BY(config_mu_);
  std::unique_ptr<SnapshotStore> snapshots_;  // null: no snapshots; set before Start
  // Workers still in the job (lowered under config_mu_, with optimizer_), and
  // which ranks are lost (set once, never cleared).
  std::atomic<int> live_workers_{0};
  std::unique_ptr<std::atomic<bool>[]> lost_;
  // Lost ranks whose unanswered request was logged (once each).
  std::unique_ptr<std::atomic<bool>[]> lost_unanswered_;
  // Workers that finished while others went on (set once, never cleared).
  std::atomic<int> finished_workers_{0};
  std::unique_ptr<std::atomic<bool>[]> finished_;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_KV_SERVER_H_
