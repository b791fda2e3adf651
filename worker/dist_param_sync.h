// DistParamSync: `--kv-store dist_sync | dist_async` — the parameters live on
// the servers, which apply the optimizer (../shared/design.md 1 and 6).
//
// Key i is parameter i of the executor (creation order, as MXNet numbers them).
// Init configures every server (sync mode, optimizer, MXNet's weight-decay
// multipliers), lets worker rank 0 push the initial values, runs a worker
// barrier and pulls the values everyone starts from. Then, per step:
//   OnGradReady(i)  one PushPull of grad(i) whose reply lands straight in
//                   param(i) (zero-copy both ways on the CPU), priority -i so
//                   that the parameters the next forward needs first go first;
//   WaitParam(i)    waits for that exchange just before forward reads param(i).
//
// On a device (a GPU: params->backend() not host-accessible) the exchange goes
// through two pinned host buffers per parameter and never blocks the thread
// that enqueues the kernels: OnGradReady(i) enqueues the gradient's download
// into host_grad_[i] and a Fence, hands both to the pusher thread and returns;
// the pusher waits for the fences in order and then calls PushPull (same key,
// priority), whose reply lands in host_param_[i]; WaitParam(i) waits for the
// push to be issued and answered, then enqueues the upload of host_param_[i]
// into param(i) ahead of the forward's kernels that read it.
// No pinned buffer is overwritten while a copy may still use it:
//   host_grad_[i]  the download of step t+1 is enqueued by OnGradReady(i) of
//                  step t+1, after WaitParam(i) of step t+1 saw step t's
//                  exchange answered (the client no longer reads it; the
//                  pusher pushed only after the download's fence);
//   host_param_[i] the reply of step t+1's exchange is written only after its
//                  push, which waits for a fence recorded after Backward read
//                  param(i); that forward and backward ran after the compute
//                  stream waited for step t's upload from host_param_[i].
// (OnGradReady settles an exchange WaitParam did not, to keep this true.)
// In dist_sync the server answers after summing every worker's gradient and
// applying the optimizer once; in dist_async after applying this push.
//
// With 2-bit gradient compression (--gc-type 2bit) the ServerConfig says so,
// and the KV client quantizes every PushPull's gradient (the reply is still
// the full float32 weights).
//
// Optimizer state (momentum) lives on the servers: SaveState returns nothing,
// and a resumed job restarts momentum from zero (MXNet's dist stores do too).
// Threads: as ParamSync requires (OnGradReady may come from a device group's
// merge thread); on a device, the pusher thread besides.
#ifndef PSTRAIN_WORKER_DIST_PARAM_SYNC_H_
#define PSTRAIN_WORKER_DIST_PARAM_SYNC_H_

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "common/gradient_compression.h"
#include "common/mutex.h"
#include "proto/optimizer.pb.h"
#include "worker/kv_client.h"
#include "worker/param_sync.h"

namespace pstrain {

class DistParamSync : public ParamSync {
 public:
  // `client` must be started and outlive this object.
  DistParamSync(KVClient* client, const OptimizerConfig& optimizer, bool sync_mode,
                int request_timeout_ms, int barrier_timeout_ms,
                const GradientCompression& compression = GradientCompression());
  ~DistParamSync() override;

  Status Init(ModelParams* exec) override;
  void OnGradReady(int param_index) override;
  void WaitParam(int param_index) override;
  Status TakeError() override;
  Status Drain() override;
  std::vector<NamedArray> SaveState() const override { return {}; }
  Status LoadState(const std::vector<NamedArray>& arrays) override;

 private:
  // A gradient's download, to push once its fence is done.
  struct PushJob {
    int param = 0;
    std::unique_ptr<Fence> fence;
  };

  Deadline RequestDeadline() const { return Deadline::InMillis(request_timeout_ms_); }
  // Init's requests: an error fails and stops the node before Init returns
  // it, so that no late reply writes into Init's buffers after they are gone.
  Status StopOnError(const Status& s);
  void Record(const Status& s);
  bool HasError();
  // The device path's thread: waits for each job's fence, then pushes.
  void PusherLoop();

  KVClient* const client_;
  const OptimizerConfig optimizer_;
  const bool sync_mode_;
  const GradientCompression compression_;
  const int request_timeout_ms_;
  const int barrier_timeout_ms_;
  ModelParams* exec_ = nullptr;
  std::vector<KVClient::Key> keys_;  // one per parameter
  std::vector<int64_t> lens_;        // elements per parameter
  // A device backend's pinned host copies of each gradient and pulled weight
  // (empty on the CPU, where the KV client uses the executor's memory).
  std::vector<std::shared_ptr<Buffer>> host_grad_, host_param_;

  Mutex mu_;
  CondVar cv_{&mu_};  // jobs_, queued_ or stop_ changed
  // 0: nothing in flight for parameter i.
  std::vector<KVClient::Ticket> pending_ GUARDED_BY(mu_);
  // Per parameter: handed to the pusher and not yet pushed.
  std::vector<bool> queued_ GUARDED_BY(mu_);
  std::deque<PushJob> jobs_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  Status error_ GUARDED_BY(mu_);
  std::thread pusher_;  // on a device only
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DIST_PARAM_SYNC_H_
