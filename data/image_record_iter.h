// ImageRecordIter: MXNet's ImageRecordIter over a RecordIO file of image
// records, behind the DataIter interface.
//
// The iterator reads part `part_index` of `num_parts` of the .rec file. Without
// a .idx: the records that start in that part of its bytes, found by one scan
// of the record headers (as MXNet's RecordIO splitter). With a .idx: the
// records listed there, split by count as MXNet's indexed splitter does
// (parts of ceil(N/P) records in file order, the last ones shorter; a part
// left empty so is InvalidArgument). Instead of a .rec it can read
// an image folder through a .lst file (path_imglist + path_root, like MXNet's ImageIter); part p of
// P then holds list entries [N*p/P, N*(p+1)/P). A pool of `preprocess_threads` threads decodes and
// augments whole batches ahead of the consumer, into at most max(prefetch_buffer,
// preprocess_threads) batch buffers; Next() hands batches over in order by
// swapping buffers (no copy) and returns the caller's old buffers to the pool.
// The payloads are read from a memory mapping and decoded straight into the
// batch's float buffer.
//
// Order and augmentation are deterministic given `seed`: the order of pass e is
// a shuffle seeded by (seed, e) when `shuffle`, and example i of pass e is
// augmented with an Rng seeded by (seed, e, i), whatever thread runs it.
// The last batch of a pass wraps around to the first examples of the pass and
// reports them in Batch::pad.
//
// Threads: Next(), Reset() and the destructor are called by one consumer
// thread; the pool threads are internal.
#ifndef PSTRAIN_DATA_IMAGE_RECORD_ITER_H_
#define PSTRAIN_DATA_IMAGE_RECORD_ITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "data/augment.h"
#include "data/data_iter.h"
#include "data/im2rec.h"
#include "data/recordio.h"

namespace pstrain {

struct ImageRecordIterConfig {
  std::string path_imgrec;   // the .rec file; or else:
  std::string path_imglist;  // a .lst file whose paths are relative to path_root
  std::string path_root;
  std::string path_imgidx;  // the .idx file of path_imgrec; empty: scan the .rec
  int batch_size = 128;
  int label_width = 1;  // labels per example; records must carry at least this many
  bool shuffle = false;
  uint64_t seed = 0;
  int part_index = 0;
  int num_parts = 1;
  int preprocess_threads = 4;  // MXNet's default; --data-nthreads
  int prefetch_buffer = 4;     // batches decoded ahead
  // How long Next() waits for one batch before DeadlineExceeded.
  int64_t batch_timeout_ms = 600000;
  AugmentConfig aug;  // output shape, crop, mirror, normalization

  // InvalidArgument naming the field when a value is out of range.
  Status Validate() const;
};

class ImageRecordIter : public DataIter {
 public:
  // Opens the file, finds this part's records and sets up pass 0 (its
  // decoding starts at the first Next() or Reset()).
  // A missing file is NotFound; a corrupt header chain or .idx, or a part
  // without records, is an error naming the file (and byte offset).
  static StatusOr<std::unique_ptr<ImageRecordIter>> Create(const ImageRecordIterConfig& config);
  ~ImageRecordIter() override;  // stops and joins the pool

  // Starts the next pass (a new order when shuffling) without waiting: the
  // batches of the old pass still in the pool are dropped. Every call advances
  // the pass, so the order of the trainer's epoch e (which Resets once per
  // epoch) is the same whether or not the run was resumed. The pool starts
  // decoding at the first Reset() or Next(), so a Reset right after Create
  // wastes no work.
  void Reset() override;
  // A decode or corruption error for an example fails that batch with a
  // Status naming the .rec file and the record's byte offset; the next call
  // continues with the following batch.
  StatusOr<bool> Next(Batch* batch) override;
  int64_t num_examples() const override {
    return static_cast<int64_t>(file_ ? offsets_.size() : list_.size());
  }
  // The examples of all parts together: the same on every worker, so that
  // they agree on an epoch's size (fit.py's num_examples). A .lst or .idx
  // knows it; a bare .rec has the other parts' record headers scanned.
  StatusOr<int64_t> CountAllExamples() const;
  std::vector<int64_t> batch_shape() const override;
  std::string Describe() const override;

  const ImageRecordIterConfig& config() const { return config_; }

 private:
  enum class SlotState { kFree, kFilling, kReady };
  struct Slot {
    Batch batch;
    SlotState state = SlotState::kFree;
    int64_t seq = -1;
    Status status;
  };

  explicit ImageRecordIter(const ImageRecordIterConfig& config);
  // Opens path_imgrec and finds this part's record offsets.
  Status OpenRecordFile();
  void StartPassLocked() REQUIRES(mu_);
  void WorkerLoop(int worker);
  // Fills `batch` with batch `seq` of the pass (order `order`, pass `pass`).
  Status FillBatch(int64_t seq, int64_t pass, const std::vector<int64_t>& order,
                   AugmentScratch* scratch, Batch* batch) const;

  const ImageRecordIterConfig config_;
  std::unique_ptr<RecordIOFile> file_;      // null when reading a .lst
  std::vector<uint64_t> offsets_;           // record starts of this part, in file order
  std::vector<ImageListEntry> list_;        // this part's .lst entries (list mode)
  uint64_t part_begin_ = 0, part_end_ = 0;  // bytes of the .rec, or entries of the .lst
  int64_t listed_ = -1;                     // every part's entries of the .lst or .idx
  int64_t num_batches_ = 0;

  Mutex mu_;
  CondVar cv_{&mu_};
  bool stop_ GUARDED_BY(mu_) = false;
  bool started_ GUARDED_BY(mu_) = false;  // workers pick up work only once started
  int64_t pass_ GUARDED_BY(mu_) = 0;
  // The order of the current pass; a worker keeps its pass's order alive.
  std::shared_ptr<const std::vector<int64_t>> order_ GUARDED_BY(mu_);
  int64_t next_assign_ GUARDED_BY(mu_) = 0;
  int64_t next_deliver_ GUARDED_BY(mu_) = 0;
  std::vector<Slot> slots_ GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
};

// The per-pixel mean image (C x H x W of config.aug's output shape) of the
// part `config` reads, over one pass with centre crops and no mirror, resize
// and pad kept, as MXNet computes `mean_img` when its file is missing (with
// random-resized crops and no resize, each image's shorter side is resized to
// the output's larger side first: training resizes its windows, which may be
// larger than the image, to the output, so the mean is of images at that
// scale, and an image smaller than the output is not refused). Set it as AugmentConfig::mean_image
// to subtract it.
StatusOr<std::vector<float>> ComputeMeanImage(const ImageRecordIterConfig& config);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_IMAGE_RECORD_ITER_H_
