// SmallVector<T, N>: a std::vector-like array of trivially copyable T that keeps up to N elements inline and goes to
// the heap only beyond; Shape (qkv/core/shape.h) is SmallVector<int64_t, 6>, so views and reshapes allocate nothing.
#pragma once

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace qkv {

// The subset of std::vector's interface the library uses, with the same meaning. Iterators are pointers; any
// operation that grows past capacity() invalidates them, as in std::vector. A moved-from SmallVector is empty.
// Converts implicitly from std::vector<T>; vec() makes a std::vector<T> copy where an interface needs one.
template <typename T, size_t N>
class SmallVector {
  static_assert(N > 0, "SmallVector needs an inline capacity");
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "SmallVector moves its elements with memcpy");

 public:
  using value_type = T;
  using size_type = size_t;
  using difference_type = std::ptrdiff_t;
  using reference = T&;
  using const_reference = const T&;
  using pointer = T*;
  using const_pointer = const T*;
  using iterator = T*;
  using const_iterator = const T*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  static constexpr size_t inline_capacity = N;

  SmallVector() noexcept {}
  SmallVector(std::initializer_list<T> values) { assign(values.begin(), values.end()); }
  explicit SmallVector(size_type n) { resize(n); }
  SmallVector(size_type n, const T& value) { assign(n, value); }
  template <std::input_iterator It>
  SmallVector(It first, It last) { assign(first, last); }
  SmallVector(const std::vector<T>& values) { assign(values.begin(), values.end()); }  // NOLINT: implicit
  SmallVector(const SmallVector& other) { assign(other.begin(), other.end()); }
  SmallVector(SmallVector&& other) noexcept { take(other); }
  ~SmallVector() { release(); }

  SmallVector& operator=(const SmallVector& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  SmallVector& operator=(SmallVector&& other) noexcept {
    if (this != &other) {
      release();
      take(other);
    }
    return *this;
  }
  SmallVector& operator=(std::initializer_list<T> values) {
    assign(values.begin(), values.end());
    return *this;
  }

  std::vector<T> vec() const { return std::vector<T>(begin(), end()); }

  // --- size and capacity ----------------------------------------------------------------------------------
  size_type size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  size_type capacity() const noexcept { return capacity_; }
  bool is_inline() const noexcept { return data_ == inline_; }
  void reserve(size_type n) {
    if (n > capacity_) grow_to(n);
  }
  void clear() noexcept { size_ = 0; }
  void resize(size_type n) { resize(n, T{}); }
  void resize(size_type n, const T& value) {
    if (n > size_) {
      const T v = value;  // `value` may be an element of this vector
      reserve(n);
      std::fill(data_ + size_, data_ + n, v);
    }
    size_ = n;
  }

  // --- element access -------------------------------------------------------------------------------------
  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  T& operator[](size_type i) { return data_[i]; }
  const T& operator[](size_type i) const { return data_[i]; }
  T& at(size_type i) {
    if (i >= size_) throw std::out_of_range("SmallVector::at: index out of range");
    return data_[i];
  }
  const T& at(size_type i) const { return const_cast<SmallVector*>(this)->at(i); }
  T& front() { return data_[0]; }
  const T& front() const { return data_[0]; }
  T& back() { return data_[size_ - 1]; }
  const T& back() const { return data_[size_ - 1]; }

  // --- iterators ------------------------------------------------------------------------------------------
  iterator begin() noexcept { return data_; }
  const_iterator begin() const noexcept { return data_; }
  const_iterator cbegin() const noexcept { return data_; }
  iterator end() noexcept { return data_ + size_; }
  const_iterator end() const noexcept { return data_ + size_; }
  const_iterator cend() const noexcept { return data_ + size_; }
  reverse_iterator rbegin() noexcept { return reverse_iterator(end()); }
  const_reverse_iterator rbegin() const noexcept { return const_reverse_iterator(end()); }
  reverse_iterator rend() noexcept { return reverse_iterator(begin()); }
  const_reverse_iterator rend() const noexcept { return const_reverse_iterator(begin()); }

  // --- modifiers ------------------------------------------------------------------------------------------
  void assign(size_type n, const T& value) {
    const T v = value;
    size_ = 0;
    reserve(n);
    std::fill(data_, data_ + n, v);
    size_ = n;
  }
  template <std::input_iterator It>
  void assign(It first, It last) {
    if constexpr (std::forward_iterator<It>) {
      const auto n = static_cast<size_type>(std::distance(first, last));
      if (n > capacity_) {
        size_ = 0;
        grow_to(n);
      }
      std::copy(first, last, data_);
      size_ = n;
    } else {
      clear();
      for (; first != last; ++first) push_back(*first);
    }
  }
  void assign(std::initializer_list<T> values) { assign(values.begin(), values.end()); }

  void push_back(const T& value) {
    if (size_ == capacity_) {
      const T v = value;  // `value` may be an element of this vector
      grow_to(size_ + 1);
      data_[size_++] = v;
    } else {
      data_[size_++] = value;
    }
  }
  template <typename... Args>
  T& emplace_back(Args&&... args) {
    push_back(T(std::forward<Args>(args)...));
    return back();
  }
  void pop_back() { --size_; }

  iterator insert(const_iterator pos, const T& value) { return insert(pos, size_type{1}, value); }
  iterator insert(const_iterator pos, size_type n, const T& value) {
    const T v = value;
    T* p = open_gap(pos, n);
    std::fill(p, p + n, v);
    return p;
  }
  template <std::input_iterator It>
  iterator insert(const_iterator pos, It first, It last) {
    if constexpr (std::forward_iterator<It>) {
      if constexpr (std::is_pointer_v<It>) {  // a range inside this vector moves when the gap opens: copy it first
        const std::less<const T*> less;
        if (first != last && !less(&*first, data_) && less(&*first, data_ + size_)) {
          const SmallVector copy(first, last);
          return insert(pos, copy.begin(), copy.end());
        }
      }
      const auto n = static_cast<size_type>(std::distance(first, last));
      T* p = open_gap(pos, n);
      std::copy(first, last, p);
      return p;
    } else {
      const SmallVector copy(first, last);
      return insert(pos, copy.begin(), copy.end());
    }
  }
  iterator insert(const_iterator pos, std::initializer_list<T> values) {
    return insert(pos, values.begin(), values.end());
  }

  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    T* f = data_ + (first - data_);
    const size_type n = static_cast<size_type>(last - first);
    if (n != 0) {
      std::memmove(static_cast<void*>(f), f + n, static_cast<size_t>(end() - (f + n)) * sizeof(T));
      size_ -= n;
    }
    return f;
  }

  void swap(SmallVector& other) noexcept {
    SmallVector tmp(std::move(other));
    other = std::move(*this);
    *this = std::move(tmp);
  }

  // --- comparison (lexicographic, as std::vector) ------------------------------------------------------------
  friend bool operator==(const SmallVector& a, const SmallVector& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend auto operator<=>(const SmallVector& a, const SmallVector& b) {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  // Moves to a heap buffer of at least n elements (n > capacity_), keeping the first size_ elements.
  void grow_to(size_type n) {
    const size_type cap = std::max(n, 2 * capacity_);
    T* p = std::allocator<T>().allocate(cap);
    if (size_ != 0) std::memcpy(static_cast<void*>(p), data_, size_ * sizeof(T));
    release();
    data_ = p;
    capacity_ = cap;
  }
  void release() noexcept {
    if (data_ != inline_) std::allocator<T>().deallocate(data_, capacity_);
    data_ = inline_;
    capacity_ = N;
  }
  // Takes other's elements (its heap buffer, or a copy of its inline ones) and leaves it empty; *this is released.
  void take(SmallVector& other) noexcept {
    if (other.data_ == other.inline_) {
      if (other.size_ != 0) std::memcpy(static_cast<void*>(inline_), other.inline_, other.size_ * sizeof(T));
      data_ = inline_;
      capacity_ = N;
    } else {
      data_ = other.data_;
      capacity_ = other.capacity_;
      other.data_ = other.inline_;
      other.capacity_ = N;
    }
    size_ = other.size_;
    other.size_ = 0;
  }
  // Makes room for n elements at pos (shifting the tail right); returns the gap's first element.
  T* open_gap(const_iterator pos, size_type n) {
    const auto index = static_cast<size_type>(pos - data_);
    if (n == 0) return data_ + index;
    reserve(size_ + n);
    T* p = data_ + index;
    std::memmove(static_cast<void*>(p + n), p, (size_ - index) * sizeof(T));
    size_ += n;
    return p;
  }

  T* data_ = inline_;
  size_type size_ = 0;
  size_type capacity_ = N;
  T inline_[N];
};

}  // namespace qkv
