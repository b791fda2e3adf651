#include "nn/cuda/cuda_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>

#include "common/deadline.h"
#include "common/env.h"
#include "nn/cuda/cuda_check.h"
#include "nn/cuda/cuda_factory.h"
#include "nn/cuda/kernels.h"

namespace pstrain::internal {

const char* CublasStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

int CudaDeviceCount(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why != nullptr) {
      *why = StrCat("no usable GPU: cudaGetDeviceCount: ", cudaGetErrorName(e), ": ",
                    cudaGetErrorString(e));
    }
    (void)cudaGetLastError();  // clear the sticky-free error for later calls
    return 0;
  }
  if (n == 0 && why != nullptr) {
    const std::optional<std::string> visible = Environment().Get("CUDA_VISIBLE_DEVICES");
    *why = StrCat("no GPU visible to this process",
                  visible ? StrCat(" (CUDA_VISIBLE_DEVICES=", *visible, ")") : "");
  }
  return n;
}

StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b, CudaBackend::Create(options));
  return std::unique_ptr<Backend>(std::move(b));
}

CudaBackend::CudaBackend(const BackendOptions& options)
    : options_(options), ordinal_(options.device.id) {}

StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const BackendOptions& options) {
  std::string why;
  const int count = CudaDeviceCount(&why);
  if (options.device.id < 0 || options.device.id >= count) {
    return Status::InvalidArgument(StrCat("no ", options.device.ToString(), ": this machine has ",
                                          count, " GPU(s)",
                                          count == 0 ? StrCat(" (", why, ")") : ""));
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend(options));
  RETURN_IF_ERROR(b->Init().WithContext(options.device.ToString()));
  return b;
}

void CudaBackend::SetDevice() const { PSTRAIN_CUDA_CHECK(cudaSetDevice(ordinal_)); }

Status CudaBackend::Init() {
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), "cudaSetDevice");
  cudaDeviceProp prop;
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal_), "cudaGetDeviceProperties");
  name_ = StrCat(prop.name, ", ", prop.totalGlobalMem >> 20, " MiB, sm_", prop.major, prop.minor);
  fence_events_ = std::make_shared<FenceEventPool>(ordinal_);
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                               "creating the compute stream");
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
                               "creating the copy stream");
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&peer_event_, cudaEventDisableTiming),
                               "cudaEventCreate");
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&copied_event_, cudaEventDisableTiming),
                               "cudaEventCreate");
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&download_stream_, cudaStreamNonBlocking),
                               "creating the download stream");
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming),
                               "cudaEventCreate");
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&upload_done_, cudaEventDisableTiming),
                               "cudaEventCreate");
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&timing_start_), "cudaEventCreate");
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&timing_stop_), "cudaEventCreate");
  PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnCreate(&cudnn_), "cudnnCreate");
  PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetStream(cudnn_, stream_), "cudnnSetStream");
  if (const cublasStatus_t s = cublasCreate(&cublas_); s != CUBLAS_STATUS_SUCCESS) {
    return Status::Unavailable(StrCat("cublasCreate: ", CublasStatusName(s)));
  }
  if (const cublasStatus_t s = cublasSetStream(cublas_, stream_); s != CUBLAS_STATUS_SUCCESS) {
    return Status::Unavailable(StrCat("cublasSetStream: ", CublasStatusName(s)));
  }
  const int ordinal = ordinal_;
  allocator_ = std::make_shared<CachingAllocator>(
      [ordinal](size_t bytes, std::string* error) -> void* {
        void* p = nullptr;
        cudaSetDevice(ordinal);
        const cudaError_t e = cudaMalloc(&p, bytes);
        if (e != cudaSuccess) {
          (void)cudaGetLastError();
          if (error != nullptr) *error = StrCat("cudaMalloc: ", cudaGetErrorString(e));
          return nullptr;
        }
        return p;
      },
      [ordinal](void* p) {
        cudaSetDevice(ordinal);
        PSTRAIN_CUDA_CHECK_RELEASE(cudaFree(p));
      },
      // Before an out-of-memory retry's cudaFrees, which wait for the whole
      // device with no deadline: this backend's queued work, with one (a
      // hung device ends the process naming it). Only Allocate calls it,
      // which only a live backend calls.
      [this] {
        for (cudaStream_t s : {stream_, copy_stream_, download_stream_}) {
          if (s != nullptr) AwaitStream(s, "the work queued before freeing cached device memory");
        }
      });
  for (int i = 0; i < kStagingSlots; ++i) RETURN_IF_ERROR(AddStagingSlot());
  void* download = nullptr;
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaMallocHost(&download, kStagingBytes), "pinned download buffer");
  download_ = static_cast<float*>(download);
  void* flags = nullptr;
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&flags, 2 * sizeof(unsigned long long),
                                             cudaHostAllocMapped | cudaHostAllocPortable),
                               "mapped pinned memory for the optimizer's check");
  step_flags_ = static_cast<unsigned long long*>(flags);
  step_flags_[0] = step_flags_[1] = 0;
  void* on_device = nullptr;
  PSTRAIN_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&on_device, flags, 0),
                               "the device's address of the optimizer's check");
  step_flags_device_ = static_cast<unsigned long long*>(on_device);
  return Status::Ok();
}

namespace {

// How long a wait polls back to back before it sleeps between polls
// (PollUntil): a fence's waiter (a merge or push thread, beside OpenMP's)
// briefly; the thread that drives the device (Synchronize, a copy to the
// host) longer, as cudaStreamSynchronize would spin, so that a wait of a few
// milliseconds wakes at once.
constexpr auto kFenceSpin = std::chrono::microseconds(50);
constexpr auto kDriverSpin = std::chrono::milliseconds(5);

// Whether a query (cudaEventQuery, cudaStreamQuery) says the work it asks
// about has finished. Another error than not ready is fatal, as every CUDA
// call's is, unless `closing` names the wait (the backend's destructor, or a
// cleanup after a failure its caller reports): it is logged with that name,
// and the wait ends.
bool Finished(cudaError_t e, const char* closing = nullptr) {
  if (e == cudaErrorNotReady) {
    // Not an error, but it may be left as the thread's last error, which
    // the next kernel launch's check would then report.
    (void)cudaGetLastError();
    return false;
  }
  if (closing != nullptr) {
    LOG_IF(ERROR, e != cudaSuccess) << "waiting for " << closing << ": " << cudaGetErrorName(e)
                                    << ": " << cudaGetErrorString(e);
    (void)cudaGetLastError();
    return true;
  }
  PSTRAIN_CUDA_CHECK(e);
  return true;
}

// Whether the work before `event` has finished. The device must be current.
bool EventDone(cudaEvent_t event) { return Finished(cudaEventQuery(event)); }

// Frees what a staging slot holds (any part may be missing).
template <typename Slot>
void FreeStaging(Slot& s) {
  if (s.host != nullptr) cudaFreeHost(s.host);
  s.host = nullptr;
  s.device.reset();
  if (s.uploaded != nullptr) cudaEventDestroy(s.uploaded);
  if (s.consumed != nullptr) cudaEventDestroy(s.consumed);
  s.uploaded = s.consumed = nullptr;
}

}  // namespace

Status CudaBackend::AddStagingSlot() {
  Staging s;
  auto fail = [&s](Status error) {
    (void)cudaGetLastError();  // not sticky: the next launch's check must not see it
    FreeStaging(s);
    return error;
  };
  void* host = nullptr;
  if (const cudaError_t e = cudaMallocHost(&host, kStagingBytes); e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: the context goes on
    const std::string why =
        StrCat("host: pinning a staging buffer of ", kStagingBytes, " bytes for ", name_, ": ",
               cudaGetErrorName(e), ": ", cudaGetErrorString(e));
    return fail(e == cudaErrorMemoryAllocation ? Status::ResourceExhausted(why)
                                               : Status::Unavailable(why));
  }
  s.host = static_cast<float*>(host);
  StatusOr<std::shared_ptr<Buffer>> device = TryAllocateBytes(kStagingBytes, "a staging buffer");
  if (!device.ok()) return fail(device.status());
  s.device = std::move(device).value();
  if (const cudaError_t e = cudaEventCreateWithFlags(&s.uploaded, cudaEventDisableTiming);
      e != cudaSuccess) {
    return fail(CudaError(e, "cudaEventCreate"));
  }
  if (const cudaError_t e = cudaEventCreateWithFlags(&s.consumed, cudaEventDisableTiming);
      e != cudaSuccess) {
    return fail(CudaError(e, "cudaEventCreate"));
  }
  // The device buffer may be a cached block that was freed while work queued
  // on the compute stream still reads it (the allocator reuses blocks in that
  // stream's order): the first upload into it, on the copy stream, waits for
  // what the compute stream has queued so far.
  if (const cudaError_t e = cudaEventRecord(s.consumed, stream_); e != cudaSuccess) {
    return fail(CudaError(e, "cudaEventRecord"));
  }
  staging_.push_back(std::move(s));
  return Status::Ok();
}

CudaBackend::~CudaBackend() {
  // The work still queued reads and writes what is freed below.
  if (stream_ != nullptr) cudaSetDevice(ordinal_);
  for (cudaStream_t s : {stream_, copy_stream_, download_stream_}) {
    if (s == nullptr) continue;
    constexpr const char* kWhat = "the work queued before a CUDA backend closed";
    Await([s] { return Finished(cudaStreamQuery(s), kWhat); }, kWhat);
  }
  for (Staging& s : staging_) FreeStaging(s);
  if (download_ != nullptr) cudaFreeHost(download_);
  if (step_flags_ != nullptr) cudaFreeHost(step_flags_);
  if (peer_event_ != nullptr) cudaEventDestroy(peer_event_);
  if (copied_event_ != nullptr) cudaEventDestroy(copied_event_);
  if (compute_done_ != nullptr) cudaEventDestroy(compute_done_);
  if (upload_done_ != nullptr) cudaEventDestroy(upload_done_);
  if (timing_start_ != nullptr) cudaEventDestroy(timing_start_);
  if (timing_stop_ != nullptr) cudaEventDestroy(timing_stop_);
  if (download_stream_ != nullptr) cudaStreamDestroy(download_stream_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  conv_algos_.clear();  // graph plans made with the cuDNN handle go first
  if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  // Blocks still held by tensors go back to the allocator when those go; the
  // allocator gives everything to the device when its last user is gone.
  if (allocator_) allocator_->ReleaseCached();
}

CudaBackend& CudaBackend::Of(const OpContext& ctx) {
  CHECK(ctx.backend != nullptr && !ctx.backend->device().is_cpu())
      << "a CUDA operator run with a backend for "
      << (ctx.backend ? ctx.backend->device().ToString() : "nothing");
  return *static_cast<CudaBackend*>(ctx.backend);
}

std::string CudaBackend::Describe() const {
  std::string graph;
  if (options_.gpu_conv_graph) {
    const int* n = conv_searches_;
    graph = StrCat("; convolution directions on cuDNN graph engines: ", n[1], " of ",
                   n[0] + n[1] + n[2], " searched, ", n[2], " the graph API could not build");
  }
  return StrCat("cuda ", device().ToString(), " (", name_, "; cuDNN ", cudnnGetVersion(),
                options_.gpu_tf32 ? "; TF32 convolutions" : "; full-float convolutions", graph,
                ")");
}

StatusOr<std::shared_ptr<Buffer>> CudaBackend::TryAllocateBytes(size_t bytes,
                                                                const std::string& what) {
  std::string error = "too large to allocate";
  void* p = bytes > (SIZE_MAX >> 4) ? nullptr : allocator_->Allocate(bytes, &error);
  if (p == nullptr) {
    return Status::ResourceExhausted(
        StrCat(device().ToString(), ": ", bytes, " bytes for ", what, ": ", error));
  }
  std::shared_ptr<CachingAllocator> allocator = allocator_;
  return Buffer::Wrap(static_cast<float*>(p), bytes / sizeof(float), device(),
                      [allocator](float* d) { allocator->Free(d); });
}

StatusOr<std::shared_ptr<Buffer>> CudaBackend::TryAllocate(size_t num_floats) {
  if (num_floats > (SIZE_MAX >> 4) / sizeof(float)) {  // (room for the allocator's rounding)
    return Status::ResourceExhausted(
        StrCat(device().ToString(), ": ", num_floats, " floats do not fit in memory"));
  }
  std::string error;
  void* p = allocator_->Allocate(num_floats * sizeof(float), &error);
  if (p == nullptr) return Status::ResourceExhausted(StrCat(device().ToString(), ": ", error));
  std::shared_ptr<CachingAllocator> allocator = allocator_;
  return Buffer::Wrap(static_cast<float*>(p), num_floats, device(),
                      [allocator](float* d) { allocator->Free(d); });
}

StatusOr<std::shared_ptr<Buffer>> CudaBackend::TryAllocatePinned(size_t num_floats) {
  // Past the host's memory, cudaHostAlloc may fail with another error than
  // out of memory (or try to lock pages that cannot exist): say so first.
  const uint64_t host_bytes =
      static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (num_floats > (SIZE_MAX >> 4) / sizeof(float) || num_floats * sizeof(float) > host_bytes) {
    return Status::ResourceExhausted(StrCat("host: ", num_floats,
                                            " floats do not fit in its memory (", host_bytes >> 20,
                                            " MiB) to pin for ", name_, "'s copies"));
  }
  // Portable: every GPU's context may copy from and to it (a device group
  // lists several, or the same one several times).
  void* p = nullptr;
  const size_t bytes = std::max<size_t>(num_floats, 1) * sizeof(float);
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: the context goes on
    const std::string why =
        StrCat("host: pinning ", bytes, " bytes for ", name_, "'s copies: ", cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? Status::ResourceExhausted(why)
                                          : Status::Unavailable(why);
  }
  return Buffer::Wrap(static_cast<float*>(p), num_floats, Device::Cpu(),
                      [](float* d) { PSTRAIN_CUDA_CHECK_RELEASE(cudaFreeHost(d)); });
}

StatusOr<std::unique_ptr<Operator>> CudaBackend::CreateOperator(const Node& node) {
  SetDevice();
  return MakeCudaOperator(node);
}

void CudaBackend::EnterNode(NodeId node) { SetDevice(); }

void CudaBackend::CopyFromHost(const float* src, const Tensor& dst) {
  CHECK(dst.device() == device()) << "CopyFromHost into " << dst.device().ToString();
  SetDevice();
  const char* from = reinterpret_cast<const char*>(src);
  char* to = reinterpret_cast<char*>(dst.data());
  const size_t bytes = dst.bytes();
  const size_t chunks = (bytes + kStagingBytes - 1) / kStagingBytes;
  const size_t want = std::min(chunks + 2, static_cast<size_t>(kMaxStagingSlots));
  while (staging_.size() < want && !staging_full_) {
    // Fresh slots: the ring's order past them is unchanged. The first batch
    // grows it; later ones find it grown. Short of memory, the slots it has
    // serve (a copy then waits for its own earlier chunks).
    const Status added = AddStagingSlot();
    if (!added.ok()) {
      staging_full_ = true;
      LOG(WARNING) << name_ << ": the staging ring stays at " << staging_.size() << " slots of "
                   << kStagingBytes << " bytes (host copies overlap less): " << added;
    }
  }
  for (size_t done = 0; done < bytes;) {
    Staging& s = staging_[next_slot_];
    next_slot_ = (next_slot_ + 1) % static_cast<int>(staging_.size());
    const size_t n = std::min(kStagingBytes, bytes - done);
    // The pinned buffer is free once its last upload finished; the device
    // buffer once the compute stream copied it out (or, new, once the compute
    // work queued before it was made: AddStagingSlot).
    if (s.used) AwaitEvent(s.uploaded, "an upload through a staging buffer");
    PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, s.consumed, 0));
    std::memcpy(s.host, from + done, n);
    PSTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(s.device->data(), s.host, n, cudaMemcpyHostToDevice, copy_stream_));
    PSTRAIN_CUDA_CHECK(cudaEventRecord(s.uploaded, copy_stream_));
    PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_, s.uploaded, 0));
    PSTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(to + done, s.device->data(), n, cudaMemcpyDeviceToDevice, stream_));
    PSTRAIN_CUDA_CHECK(cudaEventRecord(s.consumed, stream_));
    s.used = true;
    done += n;
  }
}

void CudaBackend::CopyToHost(const Tensor& src, float* dst) {
  CHECK(src.device() == device()) << "CopyToHost from " << src.device().ToString();
  SetDevice();
  const char* from = reinterpret_cast<const char*>(src.data());
  char* to = reinterpret_cast<char*>(dst);
  const size_t bytes = src.bytes();
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(kStagingBytes, bytes - done);
    PSTRAIN_CUDA_CHECK(cudaMemcpyAsync(download_, from + done, n, cudaMemcpyDeviceToHost, stream_));
    AwaitStream(stream_, "a copy to the host");
    std::memcpy(to + done, download_, n);
    done += n;
  }
  // It waits for everything asked before it (backend.h), the asynchronous
  // downloads on their own stream too.
  AwaitStream(download_stream_, "the copies queued to the host");
}

// Events for fences, reused: RecordFence runs once per parameter and step
// (a device group's merge, the dist sync's pushes), and creating and
// destroying an event each time costs two driver calls. The pool holds as
// many events as fences were ever alive at once. Thread-safe: a fence gives
// its event back from whichever thread drops it (no CUDA call then). Get
// runs on the backend's thread, its device current; the destructor makes
// the pool's device current first (see CudaFence).
class FenceEventPool {
 public:
  explicit FenceEventPool(int ordinal) : ordinal_(ordinal) {}
  ~FenceEventPool() {
    cudaSetDevice(ordinal_);
    MutexLock l(&mu_);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  FenceEventPool(const FenceEventPool&) = delete;
  FenceEventPool& operator=(const FenceEventPool&) = delete;

  cudaEvent_t Get() {
    {
      MutexLock l(&mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    // Polled (CudaFence::Wait), never synchronized on: no blocking-sync flag.
    PSTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  // Recording the event again later overwrites what it captured, even if
  // that has not completed yet: an event may come back before it is done.
  void Put(cudaEvent_t e) {
    MutexLock l(&mu_);
    free_.push_back(e);
  }

 private:
  const int ordinal_;
  Mutex mu_;
  std::vector<cudaEvent_t> free_ GUARDED_BY(mu_);
};

namespace {

// An event recorded once, from the backend's pool. Every call makes the
// event's device current first: the merge and push threads that wait never
// chose one, and an event call on a thread whose current device is another
// GPU (0 by default) opens a context there, hundreds of MB on a GPU this
// worker does not use.
class CudaFence : public Fence {
 public:
  CudaFence(int ordinal, std::shared_ptr<FenceEventPool> pool)
      : ordinal_(ordinal), pool_(std::move(pool)), event_(pool_->Get()) {}
  ~CudaFence() override { pool_->Put(event_); }
  cudaEvent_t event() const { return event_; }

  bool Done() override {
    PSTRAIN_CUDA_CHECK(cudaSetDevice(ordinal_));
    return EventDone(event_);
  }

  // Polled (PollUntil), since cudaEventSynchronize has no timeout: briefly
  // back to back (most fences are done, or nearly, when waited for), then
  // sleeping, so a waiting thread leaves the cores to OpenMP (the merge and
  // push threads share them) and wakes at most 100 us late (a step of a
  // small model waits for one fence per parameter).
  Status Wait(Deadline deadline) override {
    if (PollUntil([this] { return Done(); }, deadline, kFenceSpin)) return Status::Ok();
    return Status::DeadlineExceeded(
        StrCat("gpu(", ordinal_,
               "): the work queued before a fence did not finish in time "
               "(the device is hung or far slower than expected)"));
  }

 private:
  const int ordinal_;
  const std::shared_ptr<FenceEventPool> pool_;
  const cudaEvent_t event_;
};

}  // namespace

void CudaBackend::CopyToHostAsync(const Tensor& src, float* dst) {
  CHECK(src.device() == device()) << "CopyToHostAsync from " << src.device().ToString();
  SetDevice();
  PSTRAIN_CUDA_CHECK(cudaEventRecord(compute_done_, stream_));
  PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(download_stream_, compute_done_, 0));
  PSTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(dst, src.data(), src.bytes(), cudaMemcpyDeviceToHost, download_stream_));
}

void CudaBackend::CopyFromHostAsync(const float* src, const Tensor& dst) {
  CHECK(dst.device() == device()) << "CopyFromHostAsync into " << dst.device().ToString();
  SetDevice();
  PSTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(dst.data(), src, dst.bytes(), cudaMemcpyHostToDevice, copy_stream_));
  PSTRAIN_CUDA_CHECK(cudaEventRecord(upload_done_, copy_stream_));
  PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_, upload_done_, 0));
}

std::unique_ptr<Fence> CudaBackend::RecordFence() {
  SetDevice();
  auto fence = std::make_unique<CudaFence>(ordinal_, fence_events_);
  PSTRAIN_CUDA_CHECK(cudaEventRecord(compute_done_, stream_));
  PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(download_stream_, compute_done_, 0));
  PSTRAIN_CUDA_CHECK(cudaEventRecord(fence->event(), download_stream_));
  return fence;
}

void CudaBackend::Copy(const Tensor& src, const Tensor& dst) {
  CHECK_EQ(src.num_elements(), dst.num_elements());
  if (src.data() == dst.data()) return;
  SetDevice();
  PSTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(dst.data(), src.data(), dst.bytes(), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::CopyPeer(Backend& from, const Tensor& src, const Tensor& dst) {
  CHECK(!from.device().is_cpu()) << "CopyPeer from the CPU to " << device().ToString();
  CHECK_EQ(src.num_elements(), dst.num_elements());
  CudaBackend& peer = static_cast<CudaBackend&>(from);
  EnablePeerAccess(peer.ordinal_);
  // The source is complete in the peer's stream order: this stream waits for
  // the peer's work so far, then copies.
  PSTRAIN_CUDA_CHECK(cudaSetDevice(peer.ordinal_));
  PSTRAIN_CUDA_CHECK(cudaEventRecord(peer.peer_event_, peer.stream_));
  SetDevice();
  PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_, peer.peer_event_, 0));
  PSTRAIN_CUDA_CHECK(
      cudaMemcpyPeerAsync(dst.data(), ordinal_, src.data(), peer.ordinal_, dst.bytes(), stream_));
  // And the peer's later work (which may write the source) waits for the copy.
  PSTRAIN_CUDA_CHECK(cudaEventRecord(copied_event_, stream_));
  PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(peer.stream_, copied_event_, 0));
}

void CudaBackend::EnablePeerAccess(int peer) {
  if (peer == ordinal_) return;  // the same GPU listed twice
  {
    MutexLock lock(&peers_mu_);
    if (!peers_seen_.insert(peer).second) return;
  }
  int there = 0, back = 0;
  PSTRAIN_CUDA_CHECK(cudaDeviceCanAccessPeer(&there, ordinal_, peer));
  PSTRAIN_CUDA_CHECK(cudaDeviceCanAccessPeer(&back, peer, ordinal_));
  if (!there || !back) {
    LOG(INFO) << name_ << " and GPU " << peer
              << " cannot access each other's memory: copies between them pass through the host";
    return;
  }
  // Access is the process's (per pair and direction): another backend on the
  // same GPUs may have enabled it already.
  for (const auto& [from, to] : {std::pair{ordinal_, peer}, std::pair{peer, ordinal_}}) {
    PSTRAIN_CUDA_CHECK(cudaSetDevice(from));
    const cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: cleared, so no later check sees it
      LOG_IF(WARNING, e != cudaErrorPeerAccessAlreadyEnabled)
          << "GPU " << from << " cannot map GPU " << to << "'s memory (" << cudaGetErrorName(e)
          << ": " << cudaGetErrorString(e) << "): copies between them pass through the host";
    }
  }
  SetDevice();
}

void CudaBackend::Fill(const Tensor& t, float value) {
  SetDevice();
  cuda::Fill(t.data(), t.num_elements(), value, stream_);
}

void CudaBackend::Add(const Tensor& src, const Tensor& dst) {
  CHECK_EQ(src.num_elements(), dst.num_elements());
  SetDevice();
  cuda::Add(src.data(), dst.data(), dst.num_elements(), stream_);
}

namespace {

cuda::UpdateRule RuleOnDevice(Optimizer::Rule r) {
  switch (r) {
    case Optimizer::Rule::kSgd:
      return cuda::UpdateRule::kSgd;
    case Optimizer::Rule::kTest:
      return cuda::UpdateRule::kTest;
    case Optimizer::Rule::kNag:
      return cuda::UpdateRule::kNag;
    case Optimizer::Rule::kAdam:
      return cuda::UpdateRule::kAdam;
    case Optimizer::Rule::kRmsProp:
      return cuda::UpdateRule::kRmsProp;
    case Optimizer::Rule::kRmsPropCentered:
      return cuda::UpdateRule::kRmsPropCentered;
    case Optimizer::Rule::kAdaGrad:
      return cuda::UpdateRule::kAdaGrad;
  }
  LOG(FATAL) << "optimizer rule " << static_cast<int>(r);
}

}  // namespace

void CudaBackend::ApplyOptimizerStep(const Optimizer::Step& step, const Tensor& grad,
                                     const Tensor& weight, const Tensor& state) {
  CHECK_EQ(grad.num_elements(), weight.num_elements());
  const int64_t n = weight.num_elements();
  float* slots = nullptr;
  if (step.num_slots() > 0) {
    CHECK_EQ(state.num_elements(), step.num_slots() * n);
    slots = state.data();
  }
  SetDevice();
  cuda::UpdateArgs a{};
  a.rule = RuleOnDevice(step.rule);
  a.rescale = step.rescale;
  a.lr = step.lr;
  a.wd = step.wd;
  a.clip = step.clip;
  a.do_clip = step.do_clip;
  a.momentum = step.mom;
  a.beta1 = step.beta1;
  a.beta2 = step.beta2;
  a.gamma1 = step.gamma1;
  a.gamma2 = step.gamma2;
  a.eps = step.eps;
  a.clip_weights = step.clip_weights;
  a.do_clip_weights = step.do_clip_weights;
  a.param = step.param;
  a.flags = step_flags_device_;
  cuda::OptimizerUpdate(a, grad.data(), weight.data(), slots, n, stream_);
}

StepCheck CudaBackend::TakeStepCheck() {
  // A word the kernel set after the load below is cleared unseen: that is a
  // later bad update than the one reported (the first, which stops a job).
  StepCheck c;
  for (int k = 0; k < 2; ++k) {
    const unsigned long long v = __atomic_load_n(&step_flags_[k], __ATOMIC_ACQUIRE);
    if (v == 0) continue;
    __atomic_store_n(&step_flags_[k], 0ull, __ATOMIC_RELEASE);
    const int param = static_cast<int>(static_cast<uint32_t>(v));
    if (k == 0) {
      c.bad_grad = true;
      c.grad_param = param;
    } else {
      c.bad_weight = true;
      c.weight_param = param;
    }
  }
  return c;
}

void CudaBackend::StartTiming() {
  SetDevice();
  PSTRAIN_CUDA_CHECK(cudaEventRecord(timing_start_, stream_));
}

double CudaBackend::StopTiming() {
  SetDevice();
  PSTRAIN_CUDA_CHECK(cudaEventRecord(timing_stop_, stream_));
  AwaitEvent(timing_stop_, "the work timed");
  float ms = 0;
  PSTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, timing_start_, timing_stop_));
  return ms / 1e3;
}

void CudaBackend::Synchronize() {
  SetDevice();
  AwaitStream(stream_, "the work queued on the compute stream");
  // The downloads (the uploads are before the compute stream's work).
  AwaitStream(download_stream_, "the copies queued to the host");
}

void CudaBackend::Await(const std::function<bool()>& done, const char* what) const {
  const bool finished = PollUntil(done, Deadline::In(kDeviceWaitTimeout), kDriverSpin);
  // As a device error does (PSTRAIN_CUDA_CHECK): the job cannot go on, and
  // the tracker sees this worker end.
  LOG_IF(FATAL, !finished)
      << device().ToString() << " (" << name_ << "): " << what << " did not finish in "
      << std::chrono::duration_cast<std::chrono::seconds>(kDeviceWaitTimeout).count()
      << " s: the device is hung or far slower than expected";
}

void CudaBackend::AwaitEvent(cudaEvent_t event, const char* what) const {
  SetDevice();
  Await([event] { return EventDone(event); }, what);
}

void CudaBackend::AwaitStream(cudaStream_t stream, const char* what, bool cleanup) const {
  SetDevice();
  Await([stream, what,
         cleanup] { return Finished(cudaStreamQuery(stream), cleanup ? what : nullptr); },
        what);
}

}  // namespace pstrain::internal
