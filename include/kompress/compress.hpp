#pragma once
// kompress::compress, decompress, max_compressed_size and inspect: error-bounded compression
// of contiguous Kokkos Views of float or double, of any rank.
//
// Sync points: compress returns the stream length, so it waits for its work on `exec`;
// compress_async enqueues the same work and returns (the length stays in device memory);
// decompress checks the stream before and after decoding, so it waits too. Both read the
// input and write the output only through `exec`: fence other instances that produced the
// input first.

#include <kompress/bound.hpp>
#include <kompress/concepts.hpp>
#include <kompress/detail/arguments.hpp>
#include <kompress/error.hpp>
#include <kompress/format.hpp>
#include <kompress/kernels/compress_kernels.hpp>
#include <kompress/kernels/range_pass.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Profiling_ScopedRegion.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace kompress {
inline namespace v0 {

/// The largest stream `compress` can write for `count` elements of T; compress never exceeds
/// it, incompressible data included.
template <class T>
std::size_t max_compressed_size(std::size_t count, int block_size = 32) {
  detail::validate_block_size(block_size, "kompress::max_compressed_size");
  return detail::stream_layout{count, sizeof(T), block_size, detail::default_blocks_per_chunk}
      .max_stream_bytes();
}

/// The same for the codec `options` names (codec_mode::ratio streams are never longer than
/// fast-mode ones of the same count and block size 32).
template <class T>
std::size_t max_compressed_size(std::size_t count, const compress_options& options) {
  if (options.codec == codec_mode::ratio)
    return detail::stream_layout{count, sizeof(T), detail::ratio_block_size,
                                 detail::ratio_blocks_per_chunk, true}
        .max_stream_bytes();
  return max_compressed_size<T>(count, options.block_size);
}

template <float_view InView>
std::size_t max_compressed_size(const InView& in, const compress_options& options = {}) {
  return max_compressed_size<typename InView::non_const_value_type>(in.size(), options);
}

namespace detail {

template <class F>
decltype(auto) dispatch_block_size(int block_size, F&& f) {
  switch (block_size) {
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    default: return f(std::integral_constant<int, 128>{});
  }
}

/// The View `allocate()` returns, `bytes` bytes of `what`; a failed allocation becomes
/// resource_error naming the size. Kokkos reports one as a std::runtime_error
/// (Kokkos::Experimental::BadAlloc in 5.x) and older releases' RawMemoryAllocationFailure was a
/// std::bad_alloc, so both are caught: `allocate` must do nothing else that throws either.
template <class Allocate>
auto allocate_or_throw(std::size_t bytes, const char* who, const char* what, Allocate&& allocate) {
  const auto fail = [&](const char* reason) {
    return resource_error(std::string(who) + ": could not allocate " + std::to_string(bytes) +
                              " bytes for " + what + " (" + reason + ")",
                          bytes);
  };
  try {
    return allocate();
  } catch (const std::bad_alloc& failure) {
    throw fail(failure.what());
  } catch (const std::runtime_error& failure) {
    throw fail(failure.what());
  }
}

/// A host-readable copy of a stream's first `bytes` bytes (no copy for host memory).
template <byte_view InView>
auto host_prefix(const InView& in, std::size_t bytes) {
  auto prefix = Kokkos::subview(in, std::pair<std::size_t, std::size_t>(0, bytes));
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, prefix);
}

/// The bytes a device stream's header is read with in one copy: the header and, for streams of
/// up to 250 chunks (half a million floats with the fast codec), its chunk tables too.
inline constexpr std::size_t header_prefetch_bytes = 4096;

/// Copies `bytes` bytes of memory `exec` can read into host memory through `exec`, and waits
/// for `exec` alone (a plain deep_copy would fence the whole device).
template <class MemorySpace, class ExecutionSpace>
void copy_to_host(const ExecutionSpace& exec, std::byte* to, const std::byte* from, std::size_t bytes) {
  Kokkos::deep_copy(exec, Kokkos::View<std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(to, bytes),
                    Kokkos::View<const std::byte*, MemorySpace, Kokkos::MemoryUnmanaged>(from, bytes));
  exec.fence("kompress: stream bytes copied to the host");
}

/// Parses and fully checks a stream's header and chunk tables; `prefix(bytes)` gives the
/// stream's first bytes where the host can read them.
template <class Prefix>
stream_header read_header_with(std::size_t size, const char* who, Prefix&& prefix) {
  if (size < header_bytes) parse_header(nullptr, 0, size, who);  // throws
  auto head = prefix(header_bytes);
  const stream_header partial = parse_header(head.data(), header_bytes, size, who);
  auto tables = prefix(partial.layout().data_offset());
  return parse_header(tables.data(), tables.size(), size, who);
}

/// Parses and fully checks a stream's header and chunk tables.
template <byte_view InView>
stream_header read_header(const InView& in, const char* who) {
  return read_header_with(in.size(), who, [&](std::size_t bytes) { return host_prefix(in, bytes); });
}

/// The same through `exec`. A stream outside HostSpace is copied into plain host memory (not a
/// Kokkos allocation): its first header_prefetch_bytes in one copy, and the rest of its chunk
/// tables in a second only where they run past those; each copy waits for `exec`, and nothing
/// else (memory the host could read directly, UVM, is copied too: `exec` may still write it).
template <class ExecutionSpace, byte_view InView>
stream_header read_header(const ExecutionSpace& exec, const InView& in, const char* who) {
  using memory_space = typename InView::memory_space;
  if constexpr (std::is_same_v<memory_space, Kokkos::HostSpace>) {
    return read_header(in, who);
  } else {
    if (in.size() < header_bytes) parse_header(nullptr, 0, in.size(), who);  // throws
    std::vector<std::byte> prefix(std::min(in.size(), header_prefetch_bytes));
    copy_to_host<memory_space>(exec, prefix.data(), in.data(), prefix.size());
    const std::size_t tables_end = parse_header(prefix.data(), header_bytes, in.size(), who).layout().data_offset();
    if (tables_end > prefix.size()) {
      const std::size_t copied = prefix.size();
      prefix.resize(tables_end);
      copy_to_host<memory_space>(exec, prefix.data() + copied, in.data() + copied, tables_end - copied);
    }
    return parse_header(prefix.data(), tables_end, in.size(), who);
  }
}

/// decompress's output must be of the stream's element type.
template <class T>
void require_element_type(const stream_header& header, const char* who) {
  if (header.type != element_type_of<T>())
    throw invalid_argument(std::string(who) + ": the stream holds " +
                           (header.type == element_type::float32 ? "float" : "double") +
                           " values but the output View is of " +
                           (std::is_same_v<T, float> ? "float" : "double"));
}

/// A field of a stream `exec` writes in `MemorySpace`, once `exec` has run: waits for `exec`,
/// then reads it directly where the host can, else copies it through `exec` first (one wait,
/// not two).
template <class U, class MemorySpace, class Exec>
U read_stream_field(const Exec& exec, const std::byte* stream, std::size_t offset) {
  U value{};
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible) {
    exec.fence("kompress: stream field read");
    std::memcpy(&value, stream + offset, sizeof(U));
  } else {
    copy_to_host<MemorySpace>(exec, reinterpret_cast<std::byte*>(&value), stream + offset, sizeof(U));
  }
  return value;
}

/// The data-independent header fields of a stream of `count` values compressed with `options`.
template <class T>
stream_header header_fields_of(const compress_options& options, std::size_t count) {
  stream_header header;
  header.type = element_type_of<T>();
  header.mode = options.bound.mode;
  header.count = count;
  header.user_bound = options.bound.value;
  header.block_size = options.block_size;
  header.rounding = options.rounding;
  header.rounding_seed = options.rounding_seed;
  if (options.fill_value) {
    header.flags = flag_fill_value;
    header.fill_bits = to_bits(static_cast<T>(*options.fill_value));
  }
  if (options.codec == codec_mode::ratio) {
    header.block_size = ratio_block_size;
    header.blocks_per_chunk = ratio_blocks_per_chunk;
    header.flags |= flag_ratio_codec | flag_rice_residuals;
  }
  return header;
}

/// Checks compress's arguments, fills in the data-independent header fields and enqueues the
/// kernels (kernels/compress_kernels.hpp). Throws before enqueueing anything. `known_range`
/// (host memory), when given, is the value range of exactly `in`'s values as
/// kernels/range_pass.hpp reads it: the kernels then skip their own range pass.
template <class ExecutionSpace, class InView, class OutView>
void enqueue_compression(const ExecutionSpace& exec, const InView& in, const OutView& out,
                         const compress_options& options, std::uint64_t* length, const char* who,
                         const packed_range<typename InView::non_const_value_type>* known_range = nullptr) {
  using T = typename InView::non_const_value_type;
  static_assert(!std::is_const_v<typename OutView::value_type>,
                "kompress::compress: the output View must not be const");
  static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, typename InView::memory_space>::accessible,
                "kompress::compress: the input View must be accessible from the execution space");
  static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, typename OutView::memory_space>::accessible,
                "kompress::compress: the output View must be accessible from the execution space");
  Kokkos::Profiling::ScopedRegion region(who);
  validate_options(options, who);
  require_contiguous(in, who, "the input View");
  require_contiguous(out, who, "the output View");
  require_disjoint(in, out, who, "the input and output Views");
  const std::size_t needed = max_compressed_size<T>(in.size(), options);
  if (out.size() < needed)
    throw invalid_argument(std::string(who) + ": output too small (got " +
                           std::to_string(out.size()) + " bytes, need " + std::to_string(needed) +
                           "; see kompress::max_compressed_size)");

  const stream_header header = header_fields_of<T>(options, in.size());
  if (options.codec == codec_mode::ratio) {
    enqueue_compress_kernels<T, ratio_block_size>(exec, in.data(), out.data(), header, length,
                                                  backend<ExecutionSpace>::tuning(),
                                                  ratio_shape_of(in), known_range);
    return;
  }
  dispatch_block_size(options.block_size, [&](auto block_size) {
    enqueue_compress_kernels<T, decltype(block_size)::value>(exec, in.data(), out.data(), header,
                                                             length, backend<ExecutionSpace>::tuning(), {},
                                                             known_range);
  });
}

}  // namespace detail


/// Enqueues the compression of `in` into `out` on `exec` and returns without waiting. `out`
/// must hold max_compressed_size(in) bytes. Once `exec` is fenced, `out` holds the stream;
/// its length is in the stream's header (kompress::inspect(out).compressed_bytes) and, in the overload
/// that takes one, in `length`, a rank-0 View of std::uint64_t that `exec` can write. Until
/// then `in` must not change and neither `out` nor `length` may be read. Argument errors
/// throw before anything is enqueued.
template <execution_space ExecutionSpace, float_view InView, byte_view OutView>
void compress_async(const ExecutionSpace& exec, const InView& in, const OutView& out,
                    const compress_options& options) {
  detail::enqueue_compression(exec, in, out, options, static_cast<std::uint64_t*>(nullptr),
                              "kompress::compress_async");
}

template <execution_space ExecutionSpace, float_view InView, byte_view OutView, class LengthView>
  requires(Kokkos::is_view_v<LengthView> && LengthView::rank == 0 &&
           std::is_same_v<typename LengthView::value_type, std::uint64_t>)
void compress_async(const ExecutionSpace& exec, const InView& in, const OutView& out,
                    const compress_options& options, const LengthView& length) {
  static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, typename LengthView::memory_space>::accessible,
                "kompress::compress_async: the length View must be accessible from the execution "
                "space");
  detail::require_disjoint(length, out, "kompress::compress_async", "the length and output Views");
  detail::require_disjoint(length, in, "kompress::compress_async", "the length and input Views");
  detail::enqueue_compression(exec, in, out, options, length.data(), "kompress::compress_async");
}

/// Compresses `in` into `out`, which must hold max_compressed_size(in) bytes; returns the
/// stream's length. Values are taken in memory order. Waits for `exec` (the length is read
/// back to the host); compress_async does not.
template <execution_space ExecutionSpace, float_view InView, byte_view OutView>
std::size_t compress(const ExecutionSpace& exec, const InView& in, const OutView& out,
                     const compress_options& options) {
  detail::enqueue_compression(exec, in, out, options, static_cast<std::uint64_t*>(nullptr),
                              "kompress::compress");
  return detail::read_stream_field<std::uint64_t, typename OutView::memory_space>(
      exec, out.data(), detail::stream_length_offset);
}

namespace detail {

/// compress, for values whose range the caller has read already (kernels/range_pass.hpp's
/// range_keys over exactly `in`, with `options`' fill value): the same stream, without the
/// compression's own range pass. The collectives' REL pass reads each chunk's range this way.
template <class ExecutionSpace, class InView, class OutView>
std::size_t compress_known_range(const ExecutionSpace& exec, const InView& in, const OutView& out,
                                 const compress_options& options,
                                 const packed_range<typename InView::non_const_value_type>& range) {
  enqueue_compression(exec, in, out, options, static_cast<std::uint64_t*>(nullptr), "kompress::compress", &range);
  return read_stream_field<std::uint64_t, typename OutView::memory_space>(exec, out.data(), stream_length_offset);
}

}  // namespace detail

template <execution_space ExecutionSpace, float_view InView, byte_view OutView>
std::size_t compress(const ExecutionSpace& exec, const InView& in, const OutView& out,
                     const error_bound& bound) {
  return compress(exec, in, out, compress_options{.bound = bound});
}

template <float_view InView, byte_view OutView, class Options>
  requires(std::is_same_v<Options, compress_options> || std::is_same_v<Options, error_bound>)
std::size_t compress(const InView& in, const OutView& out, const Options& options) {
  return compress(typename InView::execution_space{}, in, out, options);
}

/// Compresses into a new View of exactly the stream's length, in the input's memory space.
template <execution_space ExecutionSpace, float_view InView>
Kokkos::View<std::byte*, typename InView::memory_space> compress(const ExecutionSpace& exec,
                                                                 const InView& in,
                                                                 const compress_options& options) {
  using bytes_view = Kokkos::View<std::byte*, typename InView::memory_space>;
  constexpr const char* who = "kompress::compress";
  const std::size_t worst = max_compressed_size(in, options);
  const bytes_view scratch = detail::allocate_or_throw(worst, who, "the stream's scratch", [&] {
    return bytes_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::scratch"), worst);
  });
  const std::size_t length = compress(exec, in, scratch, options);
  const bytes_view stream = detail::allocate_or_throw(length, who, "the stream", [&] {
    return bytes_view(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kompress::stream"), length);
  });
  Kokkos::deep_copy(exec, stream, Kokkos::subview(scratch, std::pair<std::size_t, std::size_t>(0, length)));
  exec.fence("kompress::compress: stream copied");
  return stream;
}

template <execution_space ExecutionSpace, float_view InView>
Kokkos::View<std::byte*, typename InView::memory_space> compress(const ExecutionSpace& exec,
                                                                 const InView& in,
                                                                 const error_bound& bound) {
  return compress(exec, in, compress_options{.bound = bound});
}

/// The absolute bound compress(exec, in, out, options) promises for `in`: the bound itself
/// when absolute; when relative, that fraction of the range of in's finite values other than
/// the fill value. Waits for `exec` (the range is read back to the host).
template <execution_space ExecutionSpace, float_view InView>
double absolute_bound(const ExecutionSpace& exec, const InView& in, const compress_options& options) {
  using T = typename InView::non_const_value_type;
  constexpr const char* who = "kompress::absolute_bound";
  detail::validate_options(options, who);
  detail::require_contiguous(in, who, "the input View");
  if (options.bound.mode == bound_mode::absolute) return options.bound.value;
  return detail::bound_for(options, detail::range_keys(exec, in.data(), in.size(), options.fill_value.has_value(),
                                                       detail::fill_bits_of<T>(options)));
}

/// The header of a stream, checked (checksums of the header and chunk tables included).
template <byte_view InView>
stream_info inspect(const InView& stream) {
  return detail::to_info(detail::read_header(stream, "kompress::inspect"));
}

/// What a stream's header says, from its first 88 bytes only: the fields are checked for
/// consistency with each other and with stream.size(), but not the checksums of the header and
/// chunk tables (inspect and decompress check those). For a stream just written, e.g. by
/// compress_async once `exec` has run it: its length (compressed_bytes) and the absolute
/// bound used. Allocates nothing; for a stream the host cannot read, copies the header
/// through `exec` and waits for `exec`.
template <execution_space ExecutionSpace, byte_view InView>
stream_info inspect_header(const ExecutionSpace& exec, const InView& stream) {
  constexpr const char* who = "kompress::inspect_header";
  detail::require_contiguous(stream, who, "the stream View");
  std::byte header[detail::header_bytes];
  const std::size_t available = std::min<std::size_t>(stream.size(), detail::header_bytes);
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename InView::memory_space>::accessible) {
    if (available) std::memcpy(header, stream.data(), available);
  } else {
    detail::copy_to_host<typename InView::memory_space>(exec, header, stream.data(), available);
  }
  return detail::to_info(detail::parse_header(header, available, stream.size(), who));
}

namespace detail {

/// What the decoder needs of a stream's codec, from its header.
template <class T>
value_codec<T> decoding_codec(const stream_header& header) {
  value_codec<T> codec;
  codec.step = header.quant_step;
  codec.has_fill = (header.flags & flag_fill_value) != 0;
  codec.fill_bits = static_cast<bits_t<T>>(header.fill_bits);
  return codec;
}

/// decompress once the stream's `header` was read (read_header: parsed and checked once, by
/// the caller): the output's type and count checked, then the chunks decoded.
template <class ExecutionSpace, class InView, class OutView>
void decompress_parsed(const ExecutionSpace& exec, const InView& in, const stream_header& header, const OutView& out,
                       const char* who) {
  // Every decompression is this one region, whoever calls it (Kokkos Tools time the codec by it).
  Kokkos::Profiling::ScopedRegion region("kompress::decompress");
  using T = typename OutView::non_const_value_type;
  require_element_type<T>(header, who);
  if (header.count != out.size())
    throw invalid_argument(std::string(who) + ": the stream holds " + std::to_string(header.count) +
                           " values but the output View has " + std::to_string(out.size()));
  const value_codec<T> codec = decoding_codec<T>(header);
  if (header.ratio()) {
    decompress_ratio_chunks<T>(exec, in.data(), header, codec, out.data(), who, backend<ExecutionSpace>::tuning());
    return;
  }
  dispatch_block_size(header.block_size, [&](auto block_size) {
    decompress_chunks<T, decltype(block_size)::value>(exec, in.data(), header, codec, out.data(), who);
  });
}

}  // namespace detail

/// Decompresses `in` into `out`, which must be a contiguous View of the stream's element type
/// with exactly the stream's element count. Throws format_error for a malformed stream, and
/// then leaves `out` untouched unless the damage hides behind matching checksums.
template <execution_space ExecutionSpace, byte_view InView, float_view OutView>
void decompress(const ExecutionSpace& exec, const InView& in, const OutView& out) {
  constexpr const char* who = "kompress::decompress";
  static_assert(!std::is_const_v<typename OutView::value_type>,
                "kompress::decompress: the output View must not be const");
  static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, typename InView::memory_space>::accessible,
                "kompress::decompress: the input View must be accessible from the execution space");
  static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, typename OutView::memory_space>::accessible,
                "kompress::decompress: the output View must be accessible from the execution space");
  detail::require_contiguous(in, who, "the input View");
  detail::require_contiguous(out, who, "the output View");
  detail::require_disjoint(in, out, who, "the input and output Views");
  detail::decompress_parsed(exec, in, detail::read_header(exec, in, who), out, who);
}

template <byte_view InView, float_view OutView>
void decompress(const InView& in, const OutView& out) {
  decompress(typename OutView::execution_space{}, in, out);
}

/// Decompresses into a new rank-1 View in the stream's memory space. The header and chunk
/// tables are checked before anything is allocated: a stream too short for the values it
/// claims is a format_error, T other than the stream's element type an invalid_argument. A
/// well-formed stream can still decode to some 1560 times its size (docs/format.md, "Sizes"):
/// one that decodes to more than options.max_output_bytes is a resource_error, thrown before
/// allocating, as is an allocation that fails; requested_bytes() is the output's size.
template <class T, execution_space ExecutionSpace, byte_view InView>
Kokkos::View<T*, typename InView::memory_space> decompress(const ExecutionSpace& exec,
                                                           const InView& in,
                                                           const decompress_options& options = {}) {
  using out_view = Kokkos::View<T*, typename InView::memory_space>;
  constexpr const char* who = "kompress::decompress";
  detail::require_contiguous(in, who, "the input View");
  const detail::stream_header header = detail::read_header(exec, in, who);
  detail::require_element_type<T>(header, who);
  // parse_header bounds the count at 2^58 bytes of values: no overflow.
  const std::size_t bytes = std::size_t(header.count) * sizeof(T);
  if (bytes > options.max_output_bytes)
    throw resource_error(std::string(who) + ": the stream decodes to " + std::to_string(header.count) +
                             " values, " + std::to_string(bytes) +
                             " bytes, more than options.max_output_bytes allows (" +
                             std::to_string(options.max_output_bytes) + ")",
                         bytes);
  const out_view out = detail::allocate_or_throw(bytes, who, "the decoded values", [&] {
    return out_view(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kompress::decompressed"),
                    std::size_t(header.count));
  });
  decompress(exec, in, out);
  return out;
}

}  // namespace v0
}  // namespace kompress
