// SmallVec: a vector of trivially copyable elements that keeps up to N of them inline,
// and DimsRef: a non-owning view of int64 dims. Kernels use them for shapes and strides
// so a call allocates nothing for arrays of rank <= N (a compiled program's runs must
// not allocate). Past N elements a SmallVec moves to the heap, so any rank still works.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <vector>

namespace tessera {

template <typename T, size_t N = 8>
class SmallVec {
  static_assert(std::is_trivially_copyable_v<T>, "SmallVec holds trivially copyable elements");

 public:
  SmallVec() = default;
  explicit SmallVec(size_t n, T value = T()) { assign(n, value); }
  SmallVec(std::initializer_list<T> values) { assign(values.begin(), values.end()); }
  SmallVec(const SmallVec& other) { assign(other.begin(), other.end()); }
  SmallVec& operator=(const SmallVec& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  ~SmallVec() {
    if (data_ != inline_) delete[] data_;
  }

  void push_back(T value) {
    if (size_ == capacity_) grow(2 * capacity_);
    data_[size_++] = value;
  }
  void assign(size_t n, T value) {
    reserve(n);
    std::fill(data_, data_ + n, value);
    size_ = n;
  }
  void assign(const T* first, const T* last) {
    const auto n = static_cast<size_t>(last - first);
    reserve(n);
    if (n) std::memmove(data_, first, n * sizeof(T));
    size_ = n;
  }
  void resize(size_t n, T value = T()) {
    reserve(n);
    if (n > size_) std::fill(data_ + size_, data_ + n, value);
    size_ = n;
  }
  void reserve(size_t n) {
    if (n > capacity_) grow(n);
  }
  void clear() { size_ = 0; }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T& back() { return data_[size_ - 1]; }
  const T& back() const { return data_[size_ - 1]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

 private:
  void grow(size_t n) {
    T* bigger = new T[n];
    if (size_) std::memcpy(bigger, data_, size_ * sizeof(T));
    if (data_ != inline_) delete[] data_;
    data_ = bigger;
    capacity_ = n;
  }

  T inline_[N];
  T* data_ = inline_;
  size_t size_ = 0;
  size_t capacity_ = N;
};

// Shapes and strides as kernels build them per call.
using SmallDims = SmallVec<int64_t, 8>;

// A read-only view of int64 dims (strides or a shape): from a Shape / Strides vector, a
// SmallVec, or a braced list (which lives until the end of the call it is passed to).
class DimsRef {
 public:
  DimsRef() = default;
  DimsRef(const std::vector<int64_t>& v) : data_(v.data()), size_(v.size()) {}  // NOLINT: implicit on purpose
  template <size_t N>
  DimsRef(const SmallVec<int64_t, N>& v) : data_(v.data()), size_(v.size()) {}  // NOLINT
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"  // a parameter view: the list outlives the call
#endif
  DimsRef(std::initializer_list<int64_t> v) : data_(v.begin()), size_(v.size()) {}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  DimsRef(const int64_t* data, size_t size) : data_(data), size_(size) {}

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const int64_t* data() const { return data_; }
  const int64_t& operator[](size_t i) const { return data_[i]; }
  const int64_t& back() const { return data_[size_ - 1]; }
  const int64_t* begin() const { return data_; }
  const int64_t* end() const { return data_ + size_; }

 private:
  const int64_t* data_ = nullptr;
  size_t size_ = 0;
};

// Row-major contiguous strides of `shape`, into `out` (allocation-free for rank <= 8).
inline void contiguous_strides_into(DimsRef shape, SmallDims& out) {
  out.assign(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) out[i] = out[i + 1] * shape[i + 1];
}

// broadcast_strides (shape.h) into `out`: strides reading `shape` as `target`, 0 on
// broadcast dims. `shape` must broadcast to `target`.
inline void broadcast_strides_into(DimsRef shape, DimsRef target, SmallDims& out) {
  out.assign(target.size(), 0);
  const size_t offset = target.size() - shape.size();
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    out[offset + i] = shape[i] == 1 ? 0 : stride;
    stride *= shape[i];
  }
}

}  // namespace tessera
