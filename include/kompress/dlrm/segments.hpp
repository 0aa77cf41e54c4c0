#pragma once
// A message between two ranks as a list of segments: row blocks of a row-major matrix, one
// per embedding table. Each segment is packed contiguous and compressed on its own with its
// table's bound; a message is the segments' streams back to back, or, when that would not be
// smaller, the packed raw values (the receiver tells by the length, as in comm/exchange.hpp).

#include <kompress/comm/options.hpp>
#include <kompress/comm/request.hpp>
#include <kompress/compress.hpp>
#include <kompress/detail/mpi.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cstring>
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

template <class T, class Exec>
void pack_segment(const Exec& exec, const segment<T>& s, T* out) {
  const segment<T> from = s;
  Kokkos::parallel_for("kompress::dlrm::pack", Kokkos::RangePolicy<Exec>(exec, 0, from.rows),
                       KOKKOS_LAMBDA(std::size_t row) {
                         for (std::size_t c = 0; c < from.cols; ++c) out[row * from.cols + c] = from.base[row * from.stride + c];
                       });
}

template <class T, class Exec>
void unpack_segment(const Exec& exec, const T* in, const segment<T>& s) {
  const segment<T> to = s;
  Kokkos::parallel_for("kompress::dlrm::unpack", Kokkos::RangePolicy<Exec>(exec, 0, to.rows),
                       KOKKOS_LAMBDA(std::size_t row) {
                         for (std::size_t c = 0; c < to.cols; ++c) to.base[row * to.stride + c] = in[row * to.cols + c];
                       });
}

/// One exchange of segment lists with every peer, in flight.
template <class T, class Exec>
class segment_exchange final : public operation {
 public:
  segment_exchange(const Exec& exec, std::vector<peer_segments<T>> peers, MPI_Comm comm, bool compress_messages,
                   int block_size, bool duplicate, const char* who)
      : exec_(exec), peers_(std::move(peers)), compress_(compress_messages), block_size_(block_size), who_(who) {
    if (duplicate) owned_ = owned_comm(comm, who);
    comm_ = duplicate ? owned_.get() : comm;
    shape_ = shape_of(comm_, who);
    start();
  }

  bool progress(bool block) override {
    const bool received = drain_receives(receives_, pending_, block, who_, [&](int index, const MPI_Status& status) {
      int length = 0;
      check_mpi(MPI_Get_count(&status, MPI_BYTE, &length), who_, "MPI_Get_count");
      unpack_message(receive_peer_[index], std::size_t(length));
    });
    if (!received) return false;
    exec_.fence("kompress::dlrm: segments unpacked");
    return complete_sends(sends_, block, who_);
  }

  const collective_report& report() const override { return report_; }

 private:
  void start() {
    const int p = shape_.size, rank = shape_.rank;
    // Receives first: one staging slot of the raw size per peer.
    std::size_t total = 0;
    std::vector<std::size_t> offset(p, 0);
    for (int peer = 0; peer < p; ++peer) {
      offset[peer] = total;
      if (peer != rank) total += peers_[peer].receive_values() * sizeof(T);
    }
    receive_offset_ = offset;
    receive_staging_ = Kokkos::View<std::byte*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::dlrm::receive"), total);
    for (int peer = 0; peer < p; ++peer) {
      const std::size_t bytes = peers_[peer].receive_values() * sizeof(T);
      if (peer == rank || bytes == 0) continue;
      receives_.push_back(MPI_REQUEST_NULL);
      receive_peer_.push_back(peer);
      check_mpi(MPI_Irecv(receive_staging_.data() + offset[peer], byte_count(bytes, who_), MPI_BYTE, peer,
                          collective_tag, comm_, &receives_.back()),
                who_, "MPI_Irecv");
    }
    pending_ = receives_.size();

    // Pack everything this rank sends (its own block included) once.
    std::size_t packed_values = 0, stream_room = 0;
    for (int peer = 0; peer < p; ++peer) {
      packed_values += peers_[peer].send_values();
      if (peer != rank)
        for (const auto& s : peers_[peer].send) stream_room += max_compressed_size<T>(s.size(), block_size_);
    }
    packed_ = Kokkos::View<T*, Kokkos::HostSpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::dlrm::packed"),
                                                  packed_values);
    send_staging_ = Kokkos::View<std::byte*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::dlrm::send"), stream_room);
    std::vector<std::size_t> packed_offset(p, 0);
    std::size_t at = 0;
    for (int peer = 0; peer < p; ++peer) {
      packed_offset[peer] = at;
      for (const auto& s : peers_[peer].send) {
        pack_segment(exec_, s, packed_.data() + at);
        at += s.size();
      }
    }
    exec_.fence("kompress::dlrm: segments packed");

    // This rank's own segments: exact.
    const T* own = packed_.data() + packed_offset[rank];
    for (const auto& s : peers_[rank].receive) {
      unpack_segment(exec_, own, s);
      own += s.size();
    }

    std::size_t room_at = 0;
    for (int step = 1; step < p; ++step) {
      const int peer = (rank + step) % p;
      const std::size_t values = peers_[peer].send_values();
      if (values == 0) continue;
      const std::size_t raw_bytes = values * sizeof(T);
      const void* payload = packed_.data() + packed_offset[peer];
      std::size_t length = raw_bytes;
      if (compress_) {
        std::byte* const begin = send_staging_.data() + room_at;
        std::size_t used = 0;
        const T* values_at = packed_.data() + packed_offset[peer];
        for (const auto& s : peers_[peer].send) {
          const std::size_t room = max_compressed_size<T>(s.size(), block_size_);
          used += compress(exec_, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(values_at, s.size()),
                           Kokkos::View<std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(begin + used, room),
                           compress_options{.bound = absolute(s.abs_bound), .block_size = block_size_});
          values_at += s.size();
          room_at += room;
        }
        if (used < raw_bytes) {
          payload = begin;
          length = used;
          ++report_.compressed_messages;
        }
      }
      report_.payload_bytes += raw_bytes;
      report_.wire_bytes += length;
      ++report_.messages;
      sends_.push_back(MPI_REQUEST_NULL);
      check_mpi(MPI_Isend(payload, byte_count(length, who_), MPI_BYTE, peer, collective_tag, comm_, &sends_.back()), who_,
                "MPI_Isend");
    }
  }

  void unpack_message(int peer, std::size_t length) {
    const std::byte* at = receive_staging_.data() + receive_offset_[peer];
    const std::size_t raw_bytes = peers_[peer].receive_values() * sizeof(T);
    if (length == raw_bytes) {
      const T* values = reinterpret_cast<const T*>(at);
      for (const auto& s : peers_[peer].receive) {
        unpack_segment(exec_, values, s);
        values += s.size();
      }
      return;
    }
    const std::byte* const end = at + length;
    std::size_t largest = 0;
    for (const auto& s : peers_[peer].receive) largest = std::max(largest, s.size());
    if (scratch_.size() < largest)
      scratch_ = Kokkos::View<T*, Kokkos::HostSpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::dlrm::scratch"),
                                                     largest);
    for (const auto& s : peers_[peer].receive) {
      const Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> rest(at, std::size_t(end - at));
      const stream_info info = inspect(rest);  // throws format_error on a damaged stream
      const Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> stream(at, info.compressed_bytes);
      decompress(exec_, stream, Kokkos::subview(scratch_, std::pair<std::size_t, std::size_t>(0, s.size())));
      unpack_segment(exec_, scratch_.data(), s);
      exec_.fence("kompress::dlrm: segment unpacked");
      report_.absolute_bound = std::max(report_.absolute_bound, info.absolute_bound);
      at += info.compressed_bytes;
    }
    if (at != end) throw format_error(std::string(who_) + ": trailing bytes after the segments from rank " + std::to_string(peer));
  }

  Exec exec_;
  std::vector<peer_segments<T>> peers_;
  bool compress_;
  int block_size_;
  const char* who_;
  owned_comm owned_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  comm_shape shape_;
  Kokkos::View<T*, Kokkos::HostSpace> packed_, scratch_;
  Kokkos::View<std::byte*, Kokkos::HostSpace> send_staging_, receive_staging_;
  std::vector<std::size_t> receive_offset_;
  std::vector<MPI_Request> receives_, sends_;
  std::vector<int> receive_peer_;
  std::size_t pending_ = 0;
  collective_report report_;
};

}  // namespace kompress::inline v0::detail
