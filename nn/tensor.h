// Device, Shape and Tensor: the float32 arrays the engine computes on.
//
// A Tensor is a view (offset + shape) into a reference-counted Buffer. Copying
// a Tensor copies the view, never the bytes: both views see the same memory, and
// the memory lives until the last view goes away. Layout is dense row-major
// (NCHW for images: the last dimension is contiguous).
//
// Thread safety: a Tensor object is a value; concurrent reads are fine, writes
// to the same elements from two threads need the caller's synchronization.
#ifndef PSTRAIN_NN_TENSOR_H_
#define PSTRAIN_NN_TENSOR_H_

#include <glog/logging.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain {

enum class DeviceType { kCpu = 0, kGpu = 1 };

// Where a tensor lives and an operator runs. Passed explicitly (no global mode).
struct Device {
  DeviceType type = DeviceType::kCpu;
  int id = 0;  // GPU ordinal; 0 for the CPU

  static Device Cpu() { return Device{DeviceType::kCpu, 0}; }
  static Device Gpu(int id) { return Device{DeviceType::kGpu, id}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool operator==(const Device& o) const { return type == o.type && id == o.id; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string ToString() const;  // "cpu" or "gpu(1)"
};

// Dimensions of a dense array, outermost first. A Shape with no dimensions is
// a scalar (one element).
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int ndim() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  // Product of the dimensions (1 for a scalar).
  int64_t num_elements() const;
  // Product of dims [from, ndim).
  int64_t ProductFrom(int from) const;
  // This shape with `n` put in front: Shape{3,28,28}.WithBatch(128) = {128,3,28,28}.
  Shape WithBatch(int64_t n) const;
  // This shape without its first dimension. REQUIRES: ndim() >= 1.
  Shape WithoutBatch() const;

  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }
  std::string ToString() const;  // "(128,3,28,28)"

 private:
  std::vector<int64_t> dims_;
};

// Reference-counted memory on one device. CPU buffers are 64-byte aligned;
// memory on other devices comes from that device's Backend (nn/backend.h),
// which wraps it with the function that gives it back.
class Buffer {
 public:
  // Allocates `num_floats` uninitialized floats (64-byte aligned) in host
  // memory: ResourceExhausted, naming the bytes, when the host has no room.
  static StatusOr<std::shared_ptr<Buffer>> TryAllocate(size_t num_floats);
  // The bytes TryAllocate takes for num_floats floats (64-byte granules, at
  // least one). REQUIRES: num_floats fits (TryAllocate checks it).
  static size_t HostBytes(size_t num_floats) {
    return std::max<size_t>((num_floats * sizeof(float) + 63) / 64 * 64, 64);
  }
  // TryAllocate, CHECK-failing instead.
  // REQUIRES: device.is_cpu(): device memory comes from Backend::Allocate.
  static std::shared_ptr<Buffer> Allocate(size_t num_floats, Device device);
  // Takes `data` (num_floats floats on `device`); `release(data)` runs when the
  // last reference goes. For backends' allocators.
  static std::shared_ptr<Buffer> Wrap(float* data, size_t num_floats, Device device,
                                      std::function<void(float*)> release);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Device address: the CPU may dereference it only when device().is_cpu().
  float* data() const { return data_; }
  size_t num_floats() const { return num_floats_; }
  Device device() const { return device_; }

 private:
  Buffer(float* data, size_t n, Device d, std::function<void(float*)> release)
      : data_(data), num_floats_(n), device_(d), release_(std::move(release)) {}
  float* data_;
  size_t num_floats_;
  Device device_;
  std::function<void(float*)> release_;
};

class Tensor {
 public:
  // An empty tensor: no buffer, shape (), defined() is false.
  Tensor() = default;
  // A view of `shape` at float offset `offset` into `buffer`.
  // REQUIRES: offset + shape.num_elements() <= buffer->num_floats().
  Tensor(std::shared_ptr<Buffer> buffer, size_t offset, Shape shape);

  // A new host tensor with its own buffer: uninitialized / zero-filled.
  // (Tensors on a GPU come from Backend::Empty / Backend::Zeros.)
  static Tensor Empty(const Shape& shape);
  static Tensor Zeros(const Shape& shape);

  bool defined() const { return buffer_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t num_elements() const { return shape_.num_elements(); }
  size_t bytes() const { return static_cast<size_t>(num_elements()) * sizeof(float); }
  Device device() const { return buffer_ ? buffer_->device() : Device::Cpu(); }
  float* data() const { return buffer_ ? buffer_->data() + offset_ : nullptr; }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }
  size_t offset() const { return offset_; }

  // The same elements seen with another shape (no copy).
  // REQUIRES: new_shape.num_elements() == num_elements().
  Tensor Reshape(const Shape& new_shape) const;
  // Rows [begin, end) of the first dimension (no copy). REQUIRES: ndim >= 1.
  Tensor Slice(int64_t begin, int64_t end) const;

  // Element-wise helpers for host tensors (a Backend does these on its device).
  // REQUIRES: device().is_cpu().
  void Fill(float value) const;
  // Copies the elements of `src`. REQUIRES: same num_elements, both on the CPU.
  void CopyFrom(const Tensor& src) const;
  // REQUIRES: device().is_cpu().
  float at(int64_t i) const { return data()[i]; }

 private:
  std::shared_ptr<Buffer> buffer_;
  size_t offset_ = 0;
  Shape shape_;
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_TENSOR_H_
