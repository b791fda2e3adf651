#include "data/in_memory_iter.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <utility>

namespace pstrain {

Status ValidateIterOptions(const IterOptions& opts, int64_t num_examples) {
  if (opts.batch_size < 1) {
    return Status::InvalidArgument(StrCat("batch size ", opts.batch_size, " must be >= 1"));
  }
  if (opts.num_parts < 1 || opts.part_index < 0 || opts.part_index >= opts.num_parts) {
    return Status::InvalidArgument(StrCat("data part ", opts.part_index, " of ", opts.num_parts,
                                          ": need 0 <= part < num_parts"));
  }
  if (num_examples / opts.num_parts < 1) {
    return Status::InvalidArgument(StrCat("cannot split ", num_examples, " examples into ",
                                          opts.num_parts, " non-empty parts"));
  }
  return Status::Ok();
}

namespace {

class InMemoryIter : public DataIter {
 public:
  InMemoryIter(std::shared_ptr<const ExampleSet> examples, const IterOptions& opts,
               std::string what)
      : examples_(std::move(examples)), opts_(opts), what_(std::move(what)) {
    const int64_t n = examples_->count();
    begin_ = n * opts_.part_index / opts_.num_parts;
    end_ = n * (opts_.part_index + 1) / opts_.num_parts;
    order_.resize(end_ - begin_);
    std::iota(order_.begin(), order_.end(), begin_);
    Reset();
  }

  void Reset() override {
    if (opts_.shuffle) {
      std::iota(order_.begin(), order_.end(), begin_);
      std::mt19937_64 rng(opts_.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(passes_));
      std::shuffle(order_.begin(), order_.end(), rng);
    }
    ++passes_;
    cursor_ = 0;
  }

  StatusOr<bool> Next(Batch* batch) override {
    const int64_t n = static_cast<int64_t>(order_.size());
    if (cursor_ >= n) return false;
    const int64_t bs = opts_.batch_size;
    const int64_t esize = examples_->example_size();
    batch->shape = batch_shape();
    batch->data.resize(bs * esize);
    batch->label.resize(bs);
    batch->label_width = 1;
    batch->index.resize(bs);
    const uint8_t* pixels = examples_->pixels.data();
    const float scale = opts_.scale;
    for (int64_t i = 0; i < bs; ++i) {
      const int64_t src = order_[(cursor_ + i) % n];
      const uint8_t* in = pixels + src * esize;
      float* out = batch->data.data() + i * esize;
      for (int64_t k = 0; k < esize; ++k) out[k] = static_cast<float>(in[k]) * scale;
      batch->label[i] = examples_->labels[src];
      batch->index[i] = src;
    }
    batch->pad = static_cast<int>(std::max<int64_t>(0, cursor_ + bs - n));
    cursor_ += bs;
    return true;
  }

  int64_t num_examples() const override { return end_ - begin_; }

  std::vector<int64_t> batch_shape() const override {
    const auto& s = examples_->shape;
    if (opts_.flat) return {opts_.batch_size, s[0] * s[1] * s[2], 1, 1};
    return {opts_.batch_size, s[0], s[1], s[2]};
  }

  std::string Describe() const override {
    return StrCat(what_, " part ", opts_.part_index, "/", opts_.num_parts, ", ", num_examples(),
                  " examples, batch ", opts_.batch_size, opts_.shuffle ? ", shuffled" : "");
  }

 private:
  std::shared_ptr<const ExampleSet> examples_;
  IterOptions opts_;
  std::string what_;
  int64_t begin_ = 0;
  int64_t end_ = 0;
  std::vector<int64_t> order_;
  int64_t cursor_ = 0;
  int64_t passes_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<DataIter>> NewInMemoryIter(std::shared_ptr<const ExampleSet> examples,
                                                    const IterOptions& opts, std::string what) {
  if (examples == nullptr || examples->shape.size() != 3 || examples->example_size() <= 0) {
    return Status::InvalidArgument(StrCat(what, ": examples need a {C, H, W} shape"));
  }
  if (static_cast<int64_t>(examples->pixels.size()) !=
      examples->count() * examples->example_size()) {
    return Status::InvalidArgument(StrCat(what, ": ", examples->pixels.size(), " bytes for ",
                                          examples->count(), " examples of ",
                                          examples->example_size(), " bytes"));
  }
  RETURN_IF_ERROR(ValidateIterOptions(opts, examples->count()).WithContext(what));
  return std::unique_ptr<DataIter>(new InMemoryIter(std::move(examples), opts, std::move(what)));
}

}  // namespace pstrain
