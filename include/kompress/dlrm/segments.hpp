#pragma once
// The DLRM exchange's message format, a Messages policy of the one exchange engine
// (comm/detail/engine.hpp): a message between two ranks is a list of segments, row blocks of a
// row-major matrix, one per embedding table. Each segment is packed contiguous and compressed
// on its own with its table's bound; a message is the segments' streams back to back or, when
// that would not be smaller, the packed raw values (the engine's wire rule: the receiver tells
// by the length). Packing, the codec and unpacking run on the call's execution space, in its
// memory (`Memory`).

#include <kompress/comm/detail/engine.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace kompress::inline v0::detail {

/// rows x cols values starting at `base`, `stride` values between row starts.
template <class T>
struct segment {
  T* base = nullptr;
  std::size_t stride = 0, rows = 0, cols = 0;
  double abs_bound = 0.0;  ///< sending side only
  std::size_t size() const { return rows * cols; }
};

template <class T>
struct peer_segments {
  std::vector<segment<T>> send, receive;
  std::size_t send_values() const {
    std::size_t n = 0;
    for (const auto& s : send) n += s.size();
    return n;
  }
  std::size_t receive_values() const {
    std::size_t n = 0;
    for (const auto& s : receive) n += s.size();
    return n;
  }
};

/// Copies a segment's rows between a strided block and a packed one, on `exec`.
template <class T, class Exec>
void copy_rows(const Exec& exec, const T* from, std::size_t from_stride, T* to, std::size_t to_stride,
               std::size_t rows, std::size_t cols) {
  Kokkos::parallel_for("kompress::dlrm::copy_rows", Kokkos::RangePolicy<Exec>(exec, 0, rows),
                       KOKKOS_LAMBDA(std::size_t row) {
                         for (std::size_t c = 0; c < cols; ++c) to[row * to_stride + c] = from[row * from_stride + c];
                       });
}

/// The value range of a strided block's finite values (empty if none), read on `exec` where the
/// block is: a table's REL bound resolves against it.
template <class Exec, class T>
kompress::detail::value_range strided_range(const Exec& exec, const T* base, std::size_t stride, std::size_t rows,
                                            std::size_t cols) {
  if (rows == 0 || cols == 0) return {};
  Kokkos::MinMaxScalar<double> range;
  // A row per iteration: no division per value (flat indices cost i / cols and i % cols each,
  // about 20% of an exchange of DLRM tables under Open MPI), and a loop the compiler vectorises.
  Kokkos::parallel_reduce(
      "kompress::dlrm::table_range", Kokkos::RangePolicy<Exec>(exec, 0, rows),
      KOKKOS_LAMBDA(std::size_t row, Kokkos::MinMaxScalar<double>& r) {
        const T* values = base + row * stride;
        for (std::size_t c = 0; c < cols; ++c) {
          const double x = double(values[c]);
          if (Kokkos::isfinite(x)) {
            r.min_val = x < r.min_val ? x : r.min_val;
            r.max_val = x > r.max_val ? x : r.max_val;
          }
        }
      },
      Kokkos::MinMax<double>(range));
  return {range.min_val, range.max_val};  // the reduction's identity (+max, -max) when none is finite
}

/// Room for a packed message and its streams, rounded so the next peer's room stays aligned.
inline std::size_t aligned_room(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

template <class T, class Memory = Kokkos::HostSpace>
struct segment_messages {
  std::vector<peer_segments<T>> peers;
  wire_rule rule;
  compress_options codec;  ///< block size and fill value; the bound is each segment's
  int rank = 0;
  const char* who = "kompress::dlrm::embedding_exchange";

  std::size_t raw_bytes_to(int peer) const { return peers[std::size_t(peer)].send_values() * sizeof(T); }
  std::size_t raw_bytes_from(int peer) const { return peers[std::size_t(peer)].receive_values() * sizeof(T); }
  bool receives_in_place(int) const { return false; }  // segments are strided: always staged
  std::byte* place_from(int) const { return nullptr; }
  bool measures_error() const { return false; }
  /// Room to decode the largest received segment into before it is scattered to its rows.
  std::size_t decode_room() const {
    std::size_t largest = 0;
    for (const auto& p : peers)
      for (const auto& s : p.receive) largest = std::max(largest, s.size());
    return largest * sizeof(T);
  }
  std::size_t send_room(int peer) const {
    const std::size_t raw = raw_bytes_to(peer);
    std::size_t room = aligned_room(raw);
    if (rule.may_compress(raw))
      for (const auto& s : peers[std::size_t(peer)].send) room += max_compressed_size<T>(s.size(), codec);
    return aligned_room(room);
  }

  template <class Exec>
  void copy_self(const Exec& exec) const {
    const auto& own = peers[std::size_t(rank)];
    for (std::size_t i = 0; i < own.send.size(); ++i) {
      const segment<T>& from = own.send[i];
      const segment<T>& to = own.receive[i];
      copy_rows(exec, static_cast<const T*>(from.base), from.stride, to.base, to.stride, from.rows, from.cols);
    }
    exec.fence("kompress::dlrm: own segments copied");
  }

  template <class Exec>
  std::span<const std::byte> encode(const Exec& exec, int peer, std::byte* room, collective_report&) const {
    const std::size_t raw = raw_bytes_to(peer);
    T* const packed = reinterpret_cast<T*>(room);
    std::size_t at = 0;
    for (const auto& s : peers[std::size_t(peer)].send) {
      copy_rows(exec, static_cast<const T*>(s.base), s.stride, packed + at, s.cols, s.rows, s.cols);
      at += s.size();
    }
    exec.fence("kompress::dlrm: segments packed");
    if (!rule.may_compress(raw)) return {room, raw};
    std::byte* const streams = room + aligned_room(raw);
    std::size_t used = 0;
    const T* values = packed;
    for (const auto& s : peers[std::size_t(peer)].send) {
      compress_options options = codec;
      options.bound = absolute(s.abs_bound);
      const std::size_t room_bytes = max_compressed_size<T>(s.size(), codec);
      used += compress(exec, values_in<const T, Memory>(values, s.size()),
                       values_in<std::byte, Memory>(streams + used, room_bytes), options);
      values += s.size();
    }
    if (rule.send_compressed(raw, used)) return {streams, used};
    return {room, raw};
  }

  template <class Exec>
  double finish(const Exec& exec, int peer, const std::byte* landed, std::size_t length, std::byte* room) const {
    T* const scratch = reinterpret_cast<T*>(room);
    const auto& segments = peers[std::size_t(peer)].receive;
    if (length == raw_bytes_from(peer)) {
      const T* values = reinterpret_cast<const T*>(landed);
      for (const auto& s : segments) {
        copy_rows(exec, values, s.cols, s.base, s.stride, s.rows, s.cols);
        values += s.size();
      }
      exec.fence("kompress::dlrm: segments unpacked");
      return 0.0;
    }
    const std::byte* at = landed;
    const std::byte* const end = landed + length;
    double bound = 0.0;
    for (const auto& s : segments) {
      // The header and chunk tables read and checked once (format_error if damaged).
      const stream_header header =
          read_header(exec, values_in<const std::byte, Memory>(at, std::size_t(end - at)), who);
      const stream_info info = to_info(header);
      if (info.count != s.size() || info.compressed_bytes > std::size_t(end - at))
        throw format_error(std::string(who) + ": a segment from rank " + std::to_string(peer) + " holds " +
                           std::to_string(info.count) + " values; expected " + std::to_string(s.size()));
      decompress_parsed(exec, values_in<const std::byte, Memory>(at, info.compressed_bytes), header,
                        values_in<T, Memory>(scratch, s.size()), who);
      copy_rows(exec, static_cast<const T*>(scratch), s.cols, s.base, s.stride, s.rows, s.cols);
      exec.fence("kompress::dlrm: segment unpacked");
      bound = std::max(bound, info.absolute_bound);
      at += info.compressed_bytes;
    }
    if (at != end)
      throw format_error(std::string(who) + ": trailing bytes after the segments from rank " + std::to_string(peer));
    return bound;
  }
};

}  // namespace kompress::inline v0::detail
