#pragma once
// The stash's allocator: address-ordered first fit with immediate coalescing over one arena.
//
// It keeps host-side bookkeeping only (a sorted vector of free ranges) and hands out byte
// offsets into an arena someone else owns: the stash's device pool, a host spill arena, or the
// spill file. Why this one (docs/stash.md, "The pool"):
//   - Backward order is LIFO. Under LIFO use the free list is a single range, the top of the
//     arena: allocating takes its front and dropping the newest entry merges back into it, so
//     first fit degenerates into a bump allocator at O(1) with no fragmentation.
//   - Out-of-order drops (a framework freeing a tensor early) leave holes that first fit reuses
//     and coalescing repairs once the neighbours go; nothing needs compaction.
//   - A save reserves a worst-case range, compresses into it and gives the unused tail back
//     (shrink), which in LIFO use simply moves the top back down.
//   - The bookkeeping vector is reserved up front and only grows when the number of holes
//     exceeds any seen before: no allocation per save once warm.
// Every range is aligned to `alignment` bytes: 16, what the sign bits' sum (a complex<double>
// after their words) and the codec's 8-byte header fields need. A cache line (64) cost a
// small save's streams 32 bytes each on average, 3% of the MNIST MLP's peak (docs/stash.md).

#include <kompress/error.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace kompress::inline v0::detail {

class first_fit_allocator {
 public:
  static constexpr std::size_t alignment = 16;

  static constexpr std::size_t round_up(std::size_t bytes) {
    return (bytes + alignment - 1) / alignment * alignment;
  }

  first_fit_allocator() { free_.reserve(64); }
  explicit first_fit_allocator(std::size_t capacity) : first_fit_allocator() { grow(capacity); }

  /// Arena size managed (a multiple of the alignment).
  std::size_t capacity() const { return capacity_; }
  /// Bytes handed out and not yet freed (aligned sizes).
  std::size_t in_use() const { return in_use_; }
  std::size_t free_bytes() const { return capacity_ - in_use_; }
  /// Number of free ranges (1 or 0 under LIFO use).
  std::size_t free_ranges() const { return free_.size(); }

  std::size_t largest_free() const {
    std::size_t largest = 0;
    for (const range& r : free_) largest = std::max(largest, r.size);
    return largest;
  }

  /// The lowest-addressed range of at least `bytes` (rounded up), or nothing.
  std::optional<std::size_t> allocate(std::size_t bytes) {
    const std::size_t size = round_up(bytes == 0 ? 1 : bytes);
    for (std::size_t i = 0; i < free_.size(); ++i) {
      range& r = free_[i];
      if (r.size < size) continue;
      const std::size_t offset = r.offset;
      r.offset += size;
      r.size -= size;
      if (r.size == 0) free_.erase(free_.begin() + std::ptrdiff_t(i));
      in_use_ += size;
      return offset;
    }
    return std::nullopt;
  }

  /// Gives back the tail of the range [offset, offset + old_bytes) past new_bytes.
  void shrink(std::size_t offset, std::size_t old_bytes, std::size_t new_bytes) {
    const std::size_t old_size = round_up(old_bytes == 0 ? 1 : old_bytes);
    const std::size_t new_size = round_up(new_bytes == 0 ? 1 : new_bytes);
    if (new_size >= old_size) return;
    release(offset + new_size, old_size - new_size);
  }

  /// Frees a range that allocate returned (with the size asked for then, or shrunk to).
  void free(std::size_t offset, std::size_t bytes) { release(offset, round_up(bytes == 0 ? 1 : bytes)); }

  /// Extends the arena by new bytes at its end (host spill arenas and the spill file grow).
  void grow(std::size_t new_capacity) {
    new_capacity = new_capacity / alignment * alignment;
    if (new_capacity <= capacity_) return;
    const std::size_t old = capacity_;
    capacity_ = new_capacity;
    in_use_ += new_capacity - old;  // release() below subtracts it again
    release(old, new_capacity - old);
  }

 private:
  struct range {
    std::size_t offset;
    std::size_t size;
  };

  void release(std::size_t offset, std::size_t size) {
    if (offset % alignment != 0 || offset + size > capacity_ || size > in_use_)
      throw error("kompress::detail::first_fit_allocator: freeing a range it did not hand out "
                  "(offset " + std::to_string(offset) + ", " + std::to_string(size) + " bytes)");
    auto next = std::lower_bound(free_.begin(), free_.end(), offset,
                                 [](const range& r, std::size_t o) { return r.offset < o; });
    const bool overlaps_next = next != free_.end() && offset + size > next->offset;
    const bool overlaps_previous =
        next != free_.begin() && std::prev(next)->offset + std::prev(next)->size > offset;
    if (overlaps_next || overlaps_previous)
      throw error("kompress::detail::first_fit_allocator: range at offset " +
                  std::to_string(offset) + " freed twice");
    in_use_ -= size;
    const bool joins_previous =
        next != free_.begin() && std::prev(next)->offset + std::prev(next)->size == offset;
    const bool joins_next = next != free_.end() && offset + size == next->offset;
    if (joins_previous && joins_next) {
      auto previous = std::prev(next);
      previous->size += size + next->size;
      free_.erase(next);
    } else if (joins_previous) {
      std::prev(next)->size += size;
    } else if (joins_next) {
      next->offset = offset;
      next->size += size;
    } else {
      free_.insert(next, range{offset, size});
    }
  }

  std::vector<range> free_;  ///< sorted by offset; no two adjacent
  std::size_t capacity_ = 0;
  std::size_t in_use_ = 0;
};

}  // namespace kompress::inline v0::detail
