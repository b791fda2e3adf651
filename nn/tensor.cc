#include "nn/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace pstrain {

std::string Device::ToString() const {
  return type == DeviceType::kCpu ? "cpu" : "gpu(" + std::to_string(id) + ")";
}

int64_t Shape::num_elements() const { return ProductFrom(0); }

int64_t Shape::ProductFrom(int from) const {
  int64_t n = 1;
  for (int i = from; i < ndim(); ++i) n *= dims_[i];
  return n;
}

Shape Shape::WithBatch(int64_t n) const {
  std::vector<int64_t> d;
  d.reserve(dims_.size() + 1);
  d.push_back(n);
  d.insert(d.end(), dims_.begin(), dims_.end());
  return Shape(std::move(d));
}

Shape Shape::WithoutBatch() const {
  CHECK_GE(ndim(), 1);
  return Shape(std::vector<int64_t>(dims_.begin() + 1, dims_.end()));
}

std::string Shape::ToString() const {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < ndim(); ++i) os << (i ? "," : "") << dims_[i];
  os << ")";
  return os.str();
}

StatusOr<std::shared_ptr<Buffer>> Buffer::TryAllocate(size_t num_floats) {
  if (num_floats > (SIZE_MAX - 63) / sizeof(float)) {
    return Status::ResourceExhausted(StrCat("host: ", num_floats, " floats do not fit in memory"));
  }
  const size_t bytes = HostBytes(num_floats);
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) {
    return Status::ResourceExhausted(StrCat("out of host memory allocating ", bytes, " bytes"));
  }
  return std::shared_ptr<Buffer>(new Buffer(static_cast<float*>(p), num_floats, Device::Cpu(),
                                            [](float* d) { std::free(d); }));
}

std::shared_ptr<Buffer> Buffer::Allocate(size_t num_floats, Device device) {
  CHECK(device.is_cpu()) << "Buffer::Allocate is for host memory; memory on " << device.ToString()
                         << " comes from its Backend";
  StatusOr<std::shared_ptr<Buffer>> b = TryAllocate(num_floats);
  CHECK(b.ok()) << b.status();
  return std::move(b).value();
}

std::shared_ptr<Buffer> Buffer::Wrap(float* data, size_t num_floats, Device device,
                                     std::function<void(float*)> release) {
  CHECK(release != nullptr);
  return std::shared_ptr<Buffer>(new Buffer(data, num_floats, device, std::move(release)));
}

Buffer::~Buffer() { release_(data_); }

Tensor::Tensor(std::shared_ptr<Buffer> buffer, size_t offset, Shape shape)
    : buffer_(std::move(buffer)), offset_(offset), shape_(std::move(shape)) {
  CHECK(buffer_ != nullptr);
  CHECK_LE(offset_ + static_cast<size_t>(shape_.num_elements()), buffer_->num_floats())
      << "view " << shape_.ToString() << " at " << offset_ << " exceeds its buffer";
}

Tensor Tensor::Empty(const Shape& shape) {
  return Tensor(Buffer::Allocate(shape.num_elements(), Device::Cpu()), 0, shape);
}

Tensor Tensor::Zeros(const Shape& shape) {
  Tensor t = Empty(shape);
  t.Fill(0.0f);
  return t;
}

Tensor Tensor::Reshape(const Shape& new_shape) const {
  CHECK_EQ(new_shape.num_elements(), num_elements())
      << shape_.ToString() << " -> " << new_shape.ToString();
  return Tensor(buffer_, offset_, new_shape);
}

Tensor Tensor::Slice(int64_t begin, int64_t end) const {
  CHECK_GE(shape_.ndim(), 1);
  CHECK(0 <= begin && begin <= end && end <= shape_[0]) << begin << ":" << end;
  Shape s = shape_;
  s[0] = end - begin;
  return Tensor(buffer_, offset_ + begin * shape_.ProductFrom(1), s);
}

void Tensor::Fill(float value) const {
  CHECK(device().is_cpu()) << "Tensor::Fill on " << device().ToString() << ": use Backend::Fill";
  float* p = data();
  const int64_t n = num_elements();
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void Tensor::CopyFrom(const Tensor& src) const {
  CHECK_EQ(src.num_elements(), num_elements());
  CHECK(device().is_cpu() && src.device().is_cpu())
      << "Tensor::CopyFrom " << src.device().ToString() << " -> " << device().ToString()
      << ": copies to or from a device go through its Backend";
  if (src.data() != data()) std::memcpy(data(), src.data(), bytes());
}

}  // namespace pstrain
