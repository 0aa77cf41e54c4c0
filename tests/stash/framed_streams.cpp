// Streams kept in the stash's pool without their headers (detail/piece_frame.hpp): a framed
// stream decodes to the values of the stream it was cut from, a frame or chunk table that is
// not the stream's is refused before anything is decoded, and a stash that frames its streams
// restores the bytes of one that does not, in 72 bytes less a stream (a packed piece's in one
// range with its sign bits), whether the streams stay in the pool or some spill.
#include <kompress/stash.hpp>

#include "support/stash_views.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

using exec_space = Kokkos::DefaultExecutionSpace;
using memory_space = exec_space::memory_space;
using kompress::test::to_vector;
using kompress::test::to_view;
namespace detail = kompress::detail;

template <class T>
std::vector<T> positives(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::exponential_distribution<double> exponential(1.0);
  std::vector<T> values(count);
  for (T& v : values) v = T(exponential(rng));
  return values;
}

/// A stream of `values` compressed with `codec`, framed in place; the framed bytes start at
/// stream.data() + piece_frame_offset.
template <class T>
Kokkos::View<std::byte*, memory_space> framed_stream(const std::vector<T>& values, const kompress::compress_options& codec,
                                                     std::size_t& length) {
  const exec_space exec;
  const auto in = to_view(values);
  Kokkos::View<std::byte*, memory_space> stream("stream", kompress::max_compressed_size(in, codec));
  length = kompress::compress(exec, in, stream, codec);
  detail::write_piece_frame(exec, stream.data(), stream.data() + detail::piece_frame_offset,
                            kompress::inspect_header(exec, stream));
  exec.fence();
  return stream;
}

/// The framed bytes of `stream` with byte `at` (counted from the frame) XORed with `flip`,
/// copied into a fresh View that starts 72 bytes before them, as the pool holds them.
Kokkos::View<std::byte*, memory_space> with_flip(const Kokkos::View<std::byte*, memory_space>& stream,
                                                 std::size_t length, std::size_t at, std::uint8_t flip) {
  auto bytes = to_vector(stream);
  bytes.resize(length);
  bytes[detail::piece_frame_offset + at] ^= std::byte(flip);
  return to_view(bytes);
}

}  // namespace

TEST_CASE_TEMPLATE("a framed stream decodes to its stream's values; a wrong frame or table is refused", T, float,
                   double) {
  const exec_space exec;
  for (const auto mode : {kompress::codec_mode::fast, kompress::codec_mode::ratio}) {
    for (const std::size_t count : {std::size_t(1), std::size_t(100), std::size_t(4096), std::size_t(70001)}) {
      CAPTURE(int(mode));
      CAPTURE(count);
      const auto values = positives<T>(count, unsigned(count));
      const kompress::compress_options codec{.bound = kompress::absolute(1e-2), .codec = mode};
      Kokkos::View<T*, memory_space> expected("expected", count);
      {
        const auto in = to_view(values);
        const auto whole = kompress::compress(exec, in, codec);
        kompress::decompress(exec, whole, expected);
      }
      std::size_t length = 0;
      const auto stream = framed_stream(values, codec, length);
      const std::byte* const framed = stream.data() + detail::piece_frame_offset;
      const std::size_t bytes = detail::framed_bytes(length);
      CHECK(bytes == length - 72);
      const auto header = detail::read_framed_header<T>(exec, framed, bytes, count, codec, "test");
      Kokkos::View<T*, memory_space> out("out", count);
      detail::decompress_framed(exec, framed, header, out, "test");
      const auto x = to_vector(out), y = to_vector(expected);
      CHECK(std::memcmp(x.data(), y.data(), count * sizeof(T)) == 0);

      // The frame's count is checked against the entry, the frame's check covers its step, the
      // header it stands for (the entry's codec) and the chunk tables, which are also checked
      // as decompress checks them; the chunks by their checksums.
      const auto refused = [&](std::size_t at, std::uint8_t flip) {
        const auto damaged = with_flip(stream, length, at, flip);
        const std::byte* const f = damaged.data() + detail::piece_frame_offset;
        try {
          const auto h = detail::read_framed_header<T>(exec, f, bytes, count, codec, "test");
          detail::decompress_framed(exec, f, h, out, "test");
        } catch (const kompress::format_error&) {
          return true;
        }
        return false;
      };
      CHECK(refused(0, 0x01));   // the step's lowest bit
      CHECK(refused(7, 0x40));   // its exponent
      CHECK(refused(8, 0x01));   // the count
      CHECK(refused(12, 0x02));  // the check
      CHECK(refused(15, 0x80));
      CHECK(refused(16, 0x08));  // the first chunk's end
      CHECK(refused(16 + 8 * header.layout().chunk_count(), 0x10));  // its checksum
      CHECK(refused(bytes - 1, 0x80));                                // its last byte
      CHECK_THROWS_AS(detail::read_framed_header<T>(exec, framed, bytes - 1, count, codec, "test"),
                      kompress::format_error);
      CHECK_THROWS_AS(detail::read_framed_header<T>(exec, framed, 8, count, codec, "test"), kompress::format_error);
      CHECK_THROWS_AS(detail::read_framed_header<T>(exec, framed, bytes, count + 1, codec, "test"),
                      kompress::format_error);
      auto other = codec;
      other.codec = mode == kompress::codec_mode::fast ? kompress::codec_mode::ratio : kompress::codec_mode::fast;
      CHECK_THROWS_AS(detail::read_framed_header<T>(exec, framed, bytes, count, other, "test"),
                      kompress::format_error);
    }
  }
}

TEST_CASE_TEMPLATE("stash keep_sign: framed pieces restore the bytes of whole streams, 72 bytes less a piece", T,
                   float, double) {
  const exec_space exec;
  std::mt19937 rng(11);
  std::exponential_distribution<double> exponential(1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (const std::size_t segment : {std::size_t(4) << 10, std::size_t(16) << 10, std::size_t(1) << 20}) {
    kompress::stash_options o;
    o.budget_bytes = std::size_t(16) << 20;
    o.segment_bytes = segment;
    auto framing = detail::tuned_stash(exec, o, {});
    auto whole = detail::tuned_stash(exec, o, {.frame_streams = false});
    for (const double zeros : {0.1, 0.5, 0.9}) {
      for (const auto mode : {kompress::stash_codec::fast, kompress::stash_codec::ratio}) {
        CAPTURE(segment);
        CAPTURE(zeros);
        CAPTURE(int(mode));
        const std::size_t count = 100003;
        std::vector<T> values(count);
        for (T& v : values) v = uniform(rng) < zeros ? T(0) : T(exponential(rng));
        const auto view = to_view(values);
        const kompress::stash_save_options how{.codec = mode, .keep_sign = true};
        const auto a = framing.save(exec, view, kompress::relative(1e-2), how);
        const auto b = whole.save(exec, view, kompress::relative(1e-2), how);
        const auto framed_info = framing.info(a), whole_info = whole.info(b);
        // Every piece holds positive values (none is all zeros at these densities).
        CHECK(framed_info.segments == whole_info.segments);
        CHECK(framed_info.sign_bytes == whole_info.sign_bytes);
        CHECK(framed_info.stored_bytes + 72 * framed_info.segments == whole_info.stored_bytes);
        CHECK(framing.stats().stored_bytes == framed_info.stored_bytes);
        CHECK(framing.stats().pool_bytes < whole.stats().pool_bytes);
        Kokkos::View<T*, memory_space> from_framed("from_framed", count), from_whole("from_whole", count);
        framing.restore_and_drop(exec, a, from_framed);
        whole.restore_and_drop(exec, b, from_whole);
        const auto x = to_vector(from_framed), y = to_vector(from_whole);
        CHECK(std::memcmp(x.data(), y.data(), count * sizeof(T)) == 0);
        const auto errors = kompress::test::count_errors(values, x, framed_info.absolute_bound);
        CHECK(errors.flips == 0);
        CHECK(errors.outside == 0);
        // Dropped, the pool holds the workspace alone again: the shared range was freed whole.
        CHECK(framing.stats().pool_bytes == framing.stats().workspace_bytes);
      }
    }
  }
}

TEST_CASE_TEMPLATE("stash: framed whole streams restore the bytes of whole ones, in the pool or spilled", T, float,
                   double) {
  const exec_space exec;
  std::mt19937 rng(13);
  std::normal_distribution<double> normal(0.0, 1.0);
  const std::size_t count = 60001;
  std::vector<T> values(count);
  for (T& v : values) v = T(normal(rng));
  const auto view = to_view(values);
  for (const bool keep_sign : {false, true}) {
    for (const auto mode : {kompress::stash_codec::fast, kompress::stash_codec::ratio}) {
      CAPTURE(keep_sign);
      CAPTURE(int(mode));
      kompress::stash_options o;
      o.budget_bytes = std::size_t(4) << 20;
      o.segment_bytes = std::size_t(16) << 10;
      auto framing = detail::tuned_stash(exec, o, {});
      auto whole = detail::tuned_stash(exec, o, {.frame_streams = false});
      const kompress::stash_save_options how{.codec = mode, .keep_sign = keep_sign};
      const auto a = framing.save(exec, view, kompress::relative(1e-2), how);
      const auto b = whole.save(exec, view, kompress::relative(1e-2), how);
      const auto framed_info = framing.info(a), whole_info = whole.info(b);
      CHECK(framed_info.segments == whole_info.segments);
      CHECK(framed_info.segments > 1);
      CHECK(framed_info.stored_bytes + 72 * framed_info.segments == whole_info.stored_bytes);
      Kokkos::View<T*, memory_space> from_framed("from_framed", count), from_whole("from_whole", count);
      framing.restore_and_drop(exec, a, from_framed);
      whole.restore_and_drop(exec, b, from_whole);
      const auto x = to_vector(from_framed), y = to_vector(from_whole);
      CHECK(std::memcmp(x.data(), y.data(), count * sizeof(T)) == 0);
      CHECK(kompress::test::count_errors(values, x, framed_info.absolute_bound).outside == 0);
      CHECK(framing.stats().pool_bytes == framing.stats().workspace_bytes);
    }
  }
  // A pool too small for the whole save: what does not fit spills to host memory whole, the
  // rest stays framed, and the save restores as one from a pool large enough for all of it.
  kompress::stash_options roomy;
  roomy.budget_bytes = std::size_t(4) << 20;
  roomy.segment_bytes = std::size_t(16) << 10;
  auto reference = detail::tuned_stash(exec, roomy, {});
  const auto r = reference.save(exec, view, kompress::relative(1e-2));
  kompress::stash_options tight = roomy;
  tight.budget_bytes = (reference.stats().workspace_bytes + reference.info(r).stored_bytes / 2 + 4095) / 4096 * 4096;
  tight.policy = kompress::budget_policy::spill_to_host();
  auto spilling = detail::tuned_stash(exec, tight, {});
  const auto h = spilling.save(exec, view, kompress::relative(1e-2));
  const auto placement = spilling.info(h).placement;
  CHECK(placement.pool_segments > 0);
  CHECK(placement.host_segments > 0);
  Kokkos::View<T*, memory_space> from_reference("from_reference", count), from_spilled("from_spilled", count);
  reference.restore_and_drop(exec, r, from_reference);
  spilling.restore_and_drop(exec, h, from_spilled);
  const auto x = to_vector(from_spilled), y = to_vector(from_reference);
  CHECK(std::memcmp(x.data(), y.data(), count * sizeof(T)) == 0);
}
