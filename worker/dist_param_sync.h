// DistParamSync: `--kv-store dist_sync | dist_async` — the parameters live on
// the servers, which apply the optimizer (../shared/design.md 1 and 6).
//
// Key i is parameter i of the executor (creation order, as MXNet numbers them).
// Init configures every server (sync mode, optimizer, MXNet's weight-decay
// multipliers), lets worker rank 0 push the initial values, runs a worker
// barrier and pulls the values everyone starts from. Then, per step:
//   OnGradReady(i)  one PushPull of grad(i) whose reply lands straight in
//                   param(i) (zero-copy both ways on the CPU; on a GPU through
//                   host buffers: the gradient is copied out first and the
//                   reply copied in by WaitParam), priority -i so that the
//                   parameters the next forward needs first go first;
//   WaitParam(i)    waits for that exchange just before forward reads param(i).
// In dist_sync the server answers after summing every worker's gradient and
// applying the optimizer once; in dist_async after applying this push.
//
// With 2-bit gradient compression (--gc-type 2bit) the ServerConfig says so,
// and the KV client quantizes every PushPull's gradient (the reply is still
// the full float32 weights).
//
// Optimizer state (momentum) lives on the servers: SaveState returns nothing,
// and a resumed job restarts momentum from zero (MXNet's dist stores do too).
// Threads: the executor's thread only, as ParamSync requires.
#ifndef PSTRAIN_WORKER_DIST_PARAM_SYNC_H_
#define PSTRAIN_WORKER_DIST_PARAM_SYNC_H_

#include <memory>
#include <vector>

#include "common/gradient_compression.h"
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
  Deadline RequestDeadline() const { return Deadline::InMillis(request_timeout_ms_); }
  void Record(const Status& s);

  KVClient* const client_;
  const OptimizerConfig optimizer_;
  const bool sync_mode_;
  const GradientCompression compression_;
  const int request_timeout_ms_;
  const int barrier_timeout_ms_;
  ModelParams* exec_ = nullptr;
  std::vector<KVClient::Key> keys_;        // one per parameter
  std::vector<int64_t> lens_;              // elements per parameter
  std::vector<KVClient::Ticket> pending_;  // 0: nothing in flight for parameter i
  // A device backend's host copies of each gradient and pulled weight (empty
  // on the CPU, where the KV client uses the executor's memory).
  std::vector<std::vector<float>> host_grad_, host_param_;
  Status error_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DIST_PARAM_SYNC_H_
