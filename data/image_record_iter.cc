#include "data/image_record_iter.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <new>
#include <numeric>

#include "data/file_bytes.h"
#include "data/image_recordio.h"

namespace pstrain {
namespace {

uint64_t Mix(uint64_t a, uint64_t b) {
  Rng r(a * 0x9E3779B97F4A7C15ull + b);
  r.Next();
  return r.Next();
}

// Idle workers re-check for shutdown at this period; every wait is bounded.
constexpr int64_t kWorkerPollMillis = 200;

}  // namespace

Status ImageRecordIterConfig::Validate() const {
  if (path_imgrec.empty() == path_imglist.empty()) {
    return Status::InvalidArgument(
        "give exactly one of a .rec file and a .lst file (--data-train)");
  }
  if (batch_size <= 0) return Status::InvalidArgument(StrCat("batch size ", batch_size));
  if (label_width <= 0) return Status::InvalidArgument(StrCat("label width ", label_width));
  if (num_parts <= 0 || part_index < 0 || part_index >= num_parts) {
    return Status::InvalidArgument(
        StrCat("part ", part_index, " of ", num_parts, " (need 0 <= part < parts)"));
  }
  if (preprocess_threads <= 0 || preprocess_threads > 256) {
    return Status::InvalidArgument(
        StrCat("data threads must be in [1, 256], got ", preprocess_threads));
  }
  if (prefetch_buffer <= 0) return Status::InvalidArgument(StrCat("prefetch ", prefetch_buffer));
  if (batch_timeout_ms <= 0) return Status::InvalidArgument("batch timeout must be positive");
  return aug.Validate();
}

ImageRecordIter::ImageRecordIter(const ImageRecordIterConfig& config) : config_(config) {}

StatusOr<std::unique_ptr<ImageRecordIter>> ImageRecordIter::Create(
    const ImageRecordIterConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<ImageRecordIter> it(new ImageRecordIter(config));
  if (!config.path_imglist.empty()) {
    ASSIGN_OR_RETURN(std::vector<ImageListEntry> all, ReadImageList(config.path_imglist));
    const size_t n = all.size(), p = config.part_index, parts = config.num_parts;
    it->list_.assign(all.begin() + n * p / parts, all.begin() + n * (p + 1) / parts);
    it->part_begin_ = n * p / parts;
    it->part_end_ = n * (p + 1) / parts;
    it->listed_ = static_cast<int64_t>(n);
    if (it->list_.empty()) {
      return Status::InvalidArgument(StrCat(config.path_imglist, ": part ", config.part_index,
                                            " of ", config.num_parts, " holds no images"));
    }
    // A wrong root is found now, not in a worker thread after the job began.
    const std::filesystem::path first =
        std::filesystem::path(config.path_root) / it->list_.front().path;
    std::error_code ec;
    if (!std::filesystem::exists(first, ec)) {
      return Status::NotFound(StrCat(
          config.path_imglist, ": its image '", it->list_.front().path, "' is not under '",
          config.path_root.empty() ? std::string(".") : config.path_root,
          "', the folder its paths are read relative to (the .lst's folder unless --data-root "
          "names another)"));
    }
  } else {
    RETURN_IF_ERROR(it->OpenRecordFile());
  }
  it->num_batches_ = (it->num_examples() + config.batch_size - 1) / config.batch_size;
  {
    MutexLock lock(&it->mu_);
    it->slots_.resize(std::max(config.prefetch_buffer, config.preprocess_threads));
    it->StartPassLocked();
  }
  for (int w = 0; w < config.preprocess_threads; ++w) {
    it->workers_.emplace_back([p = it.get(), w] { p->WorkerLoop(w); });
  }
  return it;
}

Status ImageRecordIter::OpenRecordFile() {
  ASSIGN_OR_RETURN(file_, RecordIOFile::Open(config_.path_imgrec));
  auto range = file_->PartitionRange(config_.part_index, config_.num_parts);
  part_begin_ = range.first;
  part_end_ = range.second;
  if (!config_.path_imgidx.empty()) {
    ASSIGN_OR_RETURN(std::vector<RecordIndexEntry> idx, ReadRecordIndex(config_.path_imgidx));
    std::vector<uint64_t> all;
    all.reserve(idx.size());
    for (const RecordIndexEntry& e : idx) {
      if (e.offset >= file_->size()) {
        return Status::Corruption(StrCat(config_.path_imgidx, ": key ", e.key, " has offset ",
                                         e.offset, " past the end of ", config_.path_imgrec, " (",
                                         file_->size(), " bytes)"));
      }
      all.push_back(e.offset);
    }
    // A record listed twice is read once.
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    listed_ = static_cast<int64_t>(all.size());
    // By count, as dmlc's indexed RecordIO splitter that MXNet uses with a
    // .idx: parts of ceil(N / P) records, the last ones shorter (or empty).
    const uint64_t step = (all.size() + config_.num_parts - 1) / config_.num_parts;
    const uint64_t first = std::min<uint64_t>(step * config_.part_index, all.size());
    const uint64_t last = std::min<uint64_t>(first + step, all.size());
    offsets_.assign(all.begin() + static_cast<std::ptrdiff_t>(first),
                    all.begin() + static_cast<std::ptrdiff_t>(last));
    if (offsets_.empty()) {
      return Status::InvalidArgument(StrCat(
          config_.path_imgidx, ": part ", config_.part_index, " of ", config_.num_parts,
          " holds none of the ", all.size(), " records it lists (with a .idx, parts of ceil(",
          all.size(), "/", config_.num_parts, ") = ", step,
          " records, as MXNet's indexed splitter): use fewer parts or no .idx"));
    }
    part_begin_ = offsets_.front();
    part_end_ = last < all.size() ? all[last] : file_->size();
  } else {
    ASSIGN_OR_RETURN(offsets_, file_->ScanRecordStarts(range.first, range.second));
  }
  if (offsets_.empty()) {
    return Status::InvalidArgument(StrCat(config_.path_imgrec, ": part ", config_.part_index,
                                          " of ", config_.num_parts, " (bytes ", range.first, "-",
                                          range.second, ") holds no records"));
  }
  return Status::Ok();
}

StatusOr<int64_t> ImageRecordIter::CountAllExamples() const {
  if (listed_ >= 0) return listed_;
  // The parts before and after this one start at record starts (PartitionRange).
  ASSIGN_OR_RETURN(uint64_t before, file_->CountRecords(0, part_begin_));
  ASSIGN_OR_RETURN(uint64_t after, file_->CountRecords(part_end_, file_->size()));
  return static_cast<int64_t>(before + offsets_.size() + after);
}

ImageRecordIter::~ImageRecordIter() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  for (std::thread& t : workers_) t.join();
}

void ImageRecordIter::StartPassLocked() {
  auto order = std::make_shared<std::vector<int64_t>>(num_examples());
  std::iota(order->begin(), order->end(), 0);
  if (config_.shuffle) {
    Rng rng(Mix(config_.seed, static_cast<uint64_t>(pass_)));
    for (size_t i = order->size(); i > 1; --i) {
      std::swap((*order)[i - 1], (*order)[rng.Next() % i]);
    }
  }
  order_ = std::move(order);
  // Batches being filled for the old pass are freed by their worker.
  for (Slot& s : slots_) {
    if (s.state == SlotState::kReady) {
      s.state = SlotState::kFree;
      s.status = Status::Ok();
    }
  }
  next_assign_ = 0;
  next_deliver_ = 0;
}

void ImageRecordIter::Reset() {
  {
    MutexLock lock(&mu_);
    ++pass_;
    started_ = true;
    StartPassLocked();
  }
  cv_.SignalAll();
}

void ImageRecordIter::WorkerLoop(int worker) {
  AugmentScratch scratch;
  while (true) {
    Slot* slot = nullptr;
    int64_t seq = 0, pass = 0;
    std::shared_ptr<const std::vector<int64_t>> order;
    {
      MutexLock lock(&mu_);
      while (slot == nullptr) {
        if (stop_) return;
        if (started_ && next_assign_ < num_batches_) {
          for (Slot& s : slots_) {
            if (s.state == SlotState::kFree) {
              slot = &s;
              break;
            }
          }
        }
        if (slot == nullptr) {
          cv_.WaitUntil(Deadline::InMillis(kWorkerPollMillis), [this]() REQUIRES(mu_) {
            if (stop_) return true;
            if (!started_ || next_assign_ >= num_batches_) return false;
            for (const Slot& s : slots_) {
              if (s.state == SlotState::kFree) return true;
            }
            return false;
          });
        }
      }
      slot->state = SlotState::kFilling;
      slot->seq = seq = next_assign_++;
      pass = pass_;
      order = order_;
    }
    // A record too big to allocate for must fail its batch, not the process.
    Status status;
    try {
      status = FillBatch(seq, pass, *order, &scratch, &slot->batch);
    } catch (const std::bad_alloc&) {
      status = Status::ResourceExhausted(
          StrCat(config_.path_imgrec.empty() ? config_.path_imglist : config_.path_imgrec,
                 ": batch ", seq, " (pass ", pass, "): out of memory decoding its images"));
    }
    {
      MutexLock lock(&mu_);
      if (pass == pass_) {
        slot->state = SlotState::kReady;
        slot->status = std::move(status);
      } else {
        slot->state = SlotState::kFree;
      }
    }
    cv_.SignalAll();
  }
}

Status ImageRecordIter::FillBatch(int64_t seq, int64_t pass, const std::vector<int64_t>& order,
                                  AugmentScratch* scratch, Batch* batch) const {
  const AugmentConfig& aug = config_.aug;
  const int64_t B = config_.batch_size, n = static_cast<int64_t>(order.size());
  const int64_t example = static_cast<int64_t>(aug.channels) * aug.out_height * aug.out_width;
  const int lw = config_.label_width;
  batch->shape = {B, aug.channels, aug.out_height, aug.out_width};
  batch->data.resize(static_cast<size_t>(B * example));
  batch->label.resize(static_cast<size_t>(B * lw));
  batch->index.resize(static_cast<size_t>(B));
  batch->label_width = lw;
  batch->pad = 0;
  std::string scratch_record, where, file_bytes;
  ImageRecordView rec;
  for (int64_t i = 0; i < B; ++i) {
    int64_t pos = seq * B + i;
    if (pos >= n) {
      ++batch->pad;
      pos %= n;
    }
    const int64_t ex = order[pos];
    if (file_ != nullptr) {
      const uint64_t offset = offsets_[ex];
      where.assign(file_->path());
      where += ':';
      where += std::to_string(offset);
      std::string_view payload;
      RETURN_IF_ERROR(file_->ReadAt(offset, &payload, &scratch_record, nullptr));
      RETURN_IF_ERROR(ParseImageRecord(payload, where, &rec));
      batch->index[i] = static_cast<int64_t>(rec.header.id);
    } else {
      const ImageListEntry& entry = list_[ex];
      where = (std::filesystem::path(config_.path_root) / entry.path).string();
      RETURN_IF_ERROR(ReadRegularFile(where, kRecordIOMaxLength, &file_bytes));
      rec.labels = entry.labels;
      rec.image = file_bytes;
      batch->index[i] = entry.index;
    }
    // A record's label list is exactly the label width, as MXNet checks (the
    // extra labels were dropped silently); one label in the header is too few
    // for a wider one.
    const bool listed = file_ != nullptr && rec.header.flag > 0;
    if (static_cast<int>(rec.labels.size()) < lw ||
        (listed && static_cast<int>(rec.labels.size()) != lw)) {
      return Status::Corruption(
          StrCat(where, ": has ", rec.labels.size(), " labels, the label width is ", lw));
    }
    std::copy(rec.labels.begin(), rec.labels.begin() + lw, batch->label.begin() + i * lw);
    Rng rng(Mix(Mix(config_.seed, static_cast<uint64_t>(pass)), static_cast<uint64_t>(ex)));
    RETURN_IF_ERROR(
        AugmentImage(aug, rec.image, where, &rng, scratch, batch->data.data() + i * example));
  }
  return Status::Ok();
}

StatusOr<bool> ImageRecordIter::Next(Batch* batch) {
  Status status;
  {
    MutexLock lock(&mu_);
    if (next_deliver_ >= num_batches_) return false;
    if (!started_) {
      started_ = true;
      cv_.SignalAll();
    }
    const int64_t want = next_deliver_;
    Slot* ready = nullptr;
    auto find = [&]() REQUIRES(mu_) {
      for (Slot& s : slots_) {
        if (s.state == SlotState::kReady && s.seq == want) {
          ready = &s;
          return true;
        }
      }
      return false;
    };
    if (!cv_.WaitUntil(Deadline::InMillis(config_.batch_timeout_ms), find)) {
      return Status::DeadlineExceeded(StrCat(Describe(), ": batch ", want, " not ready after ",
                                             config_.batch_timeout_ms, " ms"));
    }
    std::swap(*batch, ready->batch);
    status = std::move(ready->status);
    ready->status = Status::Ok();
    ready->state = SlotState::kFree;
    ++next_deliver_;
  }
  cv_.SignalAll();
  if (!status.ok()) return status;
  return true;
}

std::vector<int64_t> ImageRecordIter::batch_shape() const {
  return {config_.batch_size, config_.aug.channels, config_.aug.out_height, config_.aug.out_width};
}

std::string ImageRecordIter::Describe() const {
  const bool rec = file_ != nullptr;
  return StrCat("ImageRecordIter ", rec ? config_.path_imgrec : config_.path_imglist, " part ",
                config_.part_index, "/", config_.num_parts, rec ? " (bytes " : " (entries ",
                part_begin_, "-", part_end_, "), ", num_examples(), " examples, batch ",
                config_.batch_size, config_.shuffle ? ", shuffled, " : ", file order, ",
                config_.preprocess_threads, " threads");
}

StatusOr<std::vector<float>> ComputeMeanImage(const ImageRecordIterConfig& config) {
  ImageRecordIterConfig cfg = config;
  cfg.shuffle = false;
  AugmentConfig& aug = cfg.aug;
  if (aug.random_resized_crop && aug.resize <= 0) {
    // Training resizes its random windows to the output, so an image smaller
    // than the output is fine there; the mean's centre crops see each image
    // with its shorter side resized to the output's larger side instead.
    aug.resize = std::max(aug.out_height, aug.out_width);
  }
  aug.rand_crop = aug.rand_mirror = aug.random_resized_crop = false;
  aug.mean_image.clear();
  for (int c = 0; c < 3; ++c) {
    aug.mean_rgb[c] = 0.0f;
    aug.std_rgb[c] = 1.0f;
  }
  aug.scale = 1.0f;
  ASSIGN_OR_RETURN(std::unique_ptr<ImageRecordIter> it, ImageRecordIter::Create(cfg));
  const size_t example = static_cast<size_t>(aug.channels) * aug.out_height * aug.out_width;
  std::vector<double> sum(example, 0.0);
  int64_t count = 0;
  Batch batch;
  while (true) {
    ASSIGN_OR_RETURN(bool more, it->Next(&batch));
    if (!more) break;
    for (int64_t e = 0; e < batch.batch_size() - batch.pad; ++e) {
      const float* x = batch.data.data() + e * example;
      for (size_t i = 0; i < example; ++i) sum[i] += x[i];
      ++count;
    }
  }
  std::vector<float> mean(example);
  for (size_t i = 0; i < example; ++i) mean[i] = static_cast<float>(sum[i] / count);
  return mean;
}

}  // namespace pstrain
