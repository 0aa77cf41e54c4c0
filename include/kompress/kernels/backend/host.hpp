#pragma once
// The host backend (Serial, OpenMP, Threads: every execution space whose memory is
// HostSpace): on x86-64 the codec's loops (the value range, both codecs' chunk encoders and
// decoders) are compiled a second time for AVX2 + FMA and taken when the CPU has them, and all
// but the fast codec's decoder a third time for AVX-512, taken where the CPU has that. The
// quantize-and-verify and reconstruct loops then work on four or more doubles at once instead
// of two, and the value range's integer min/max on eight or more floats' keys (SSE2 has no
// 32-bit signed min/max and no 64-bit compare). Streams and decoded values are identical either
// way: the range is integer arithmetic, and no product in the codec can be fused with anything
// (docs/error-bound.md, "Verification"); the golden checksums in tests/codec/format.cpp,
// codec_adversarial's encoder and decoder comparisons and codec_ratio's check it. Not compiled
// when the whole build already targets AVX2 (nothing to gain), nor where detail/host_simd.hpp
// compiles no host SIMD (device compilers, the sanitizers).

#include <kompress/detail/host_simd.hpp>
#include <kompress/kernels/backend/portable.hpp>
#include <kompress/kernels/value_range.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>
#include <utility>

#if defined(KOMPRESS_HOST_X86_SIMD) && !defined(__AVX2__)
#define KOMPRESS_HOST_AVX2_DISPATCH 1
#endif

namespace kompress::inline v0::detail {

#ifdef KOMPRESS_HOST_AVX2_DISPATCH
template <class T, int BlockSize>
struct chunk_encoder_avx2 : chunk_encoder<T, BlockSize> {
  // flatten: the codec's functions are inlined here and so compiled for AVX2 too.
  __attribute__((target("avx2,fma"), flatten)) void operator()(std::uint64_t chunk) const {
    this->encode(chunk);
  }
};

template <class T>
struct ratio_chunk_encoder_avx2 : ratio_chunk_encoder<T> {
  __attribute__((target("avx2,fma"), flatten)) void operator()(std::uint64_t chunk) const {
    this->encode(chunk);
  }
};

template <class T, int BlockSize>
struct chunk_decoder_avx2 : chunk_decoder<T, BlockSize> {
  __attribute__((target("avx2,fma"), flatten)) void operator()(std::uint64_t chunk,
                                                                std::uint64_t& bad) const {
    this->decode(chunk, bad);
  }
};

// The ratio decoder takes BMI1 and POPCNT as well (every AVX2 CPU has them): the Rice reader's
// step per set bit is then a tzcnt and a blsr, and a word's count one popcnt.
template <class T>
struct ratio_chunk_decoder_avx2 : ratio_chunk_decoder<T> {
  __attribute__((target("avx2,fma,bmi,popcnt"), flatten)) void operator()(std::uint64_t chunk,
                                                                          std::uint64_t& bad) const {
    ratio_scratch scratch;
    if (!this->decode(chunk, scratch)) bad = chunk < bad ? chunk : bad;
  }
};

// The ratio codec's chunk loops, the fast codec's encoder and the value range once more for
// AVX-512: eight doubles a vector in the quantizers, sixteen 32-bit lanes in the ratio codec's
// residual passes (docs/performance.md, "AVX-512 and vector Rice remainders"). The fast codec's
// decoder stays AVX2: its AVX-512 compilation decoded 2-7% slower.
template <class T>
struct ratio_chunk_encoder_avx512 : ratio_chunk_encoder<T> {
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"), flatten)) void operator()(
      std::uint64_t chunk) const {
    this->encode(chunk);
  }
};

template <class T>
struct ratio_chunk_decoder_avx512 : ratio_chunk_decoder<T> {
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,bmi,popcnt"), flatten)) void operator()(
      std::uint64_t chunk, std::uint64_t& bad) const {
    ratio_scratch scratch;
    if (!this->decode(chunk, scratch)) bad = chunk < bad ? chunk : bad;
  }
};

template <class T, int BlockSize>
struct chunk_encoder_avx512 : chunk_encoder<T, BlockSize> {
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"), flatten)) void operator()(
      std::uint64_t chunk) const {
    this->encode(chunk);
  }
};

template <class T, int BlockSize>
struct chunk_encoder_into_avx512 : chunk_encoder<T, BlockSize> {
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"), flatten)) std::uint64_t encode_unsealed(
      std::uint64_t chunk, std::byte* to) const {
    return chunk_encoder<T, BlockSize>::encode_unsealed(chunk, to);
  }
};

template <class T>
struct value_range_segments_avx512 : value_range_segments<T> {
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"), flatten)) void operator()(
      std::uint64_t s, packed_range<T>& partial) const {
    this->reduce(s, partial);
  }
};

/// Whether `kind` takes the AVX-512 loops on this host.
inline bool takes_avx512(encoder_kind kind) { return kind == encoder_kind::avx512 && host_has_avx512(); }

/// Whether `kind` takes the AVX2 + FMA loops on this host (avx512 does, for the fast codec's
/// decoder, and elsewhere where the CPU lacks AVX-512).
inline bool takes_avx2_fma(encoder_kind kind) {
  return (kind == encoder_kind::avx2_fma || kind == encoder_kind::avx512) && host_has_avx2_fma();
}

template <class Batch>
struct batch_decoder_avx2 : Batch {
  __attribute__((target("avx2,fma"), flatten)) void operator()(std::uint64_t chunk, std::uint64_t& bad) const {
    if (!this->decode(chunk)) bad = chunk < bad ? chunk : bad;
  }
};

template <class T>
struct value_range_segments_avx2 : value_range_segments<T> {
  __attribute__((target("avx2,fma"), flatten)) void operator()(std::uint64_t s,
                                                                packed_range<T>& partial) const {
    this->reduce(s, partial);
  }
};

template <class T, int BlockSize>
struct chunk_encoder_into_avx2 : chunk_encoder<T, BlockSize> {
  __attribute__((target("avx2,fma"), flatten)) std::uint64_t encode_unsealed(
      std::uint64_t chunk, std::byte* to) const {
    return chunk_encoder<T, BlockSize>::encode_unsealed(chunk, to);
  }
};
#endif

/// A fused compression's counters (32-bit, in the header's spare bytes, zeroed by the
/// value-range launch): the census of the join, then one claim counter per segment.
enum fused_counter : int {
  workers_started,
  workers_finished,
  helpers_joined,  ///< finished workers that help the last one move the pieces
  helpers_left,
  move_units_claimed,
  first_segment_counter,
};
/// The header's bytes after the value range hold 17 such counters (72 bytes, 4-aligned).
inline constexpr int fused_counter_count = 17;
/// The most workers of a fused compression: two per segment counter.
inline constexpr int max_fused_workers = 2 * (fused_counter_count - first_segment_counter);

/// Where a fused compression keeps its counters: in the header's bytes after the value range,
/// 4-aligned for the atomics; zeroed by the value-range launch before the workers start.
inline std::uint32_t* fused_counters(std::byte* out) {
  const auto address = reinterpret_cast<std::uintptr_t>(out + 16);
  return reinterpret_cast<std::uint32_t*>((address + 3) & ~std::uintptr_t(3));
}

/// The value range, and the fused compression's counters zeroed by the work item of segment 0.
template <class Segments>
struct range_zeroing_counters : Segments {
  std::byte* out;
  void operator()(std::uint64_t s,
                  packed_range<typename Segments::element_type>& partial) const {
    if (s == 0)
      for (int i = 0; i < fused_counter_count; ++i) fused_counters(out)[i] = 0;
    Segments::operator()(s, partial);
  }
};

/// A value range known beforehand, stored where the reduction would have put it, and the
/// fused compression's counters zeroed.
template <class T>
struct known_range_zeroing_counters {
  packed_range<T> range;
  std::byte* out;
  void operator()(int) const {
    std::memcpy(out, &range, sizeof(range));
    for (int i = 0; i < fused_counter_count; ++i) fused_counters(out)[i] = 0;
  }
};

/// The fast codec's compression after the value range, in one launch of `workers` work items
/// (enqueue_fused_compression). The chunks are cut into ceil(workers / 2) segments; in each, an
/// even worker encodes chunks from the front, packed from the segment's first worst-case slot,
/// and the odd worker after it from the back, packed down from the segment's last slot end,
/// each chunk claimed through the segment's counter (so the two meet wherever the work
/// balances). A chunk goes at the front worker's position, which lies at or before its own
/// worst-case slot; the back worker encodes a chunk at its own slot, which lies below
/// everything it packed and after everything the front worker can reach, then moves it up.
/// Then the segments' pieces are joined in chunk order (each a memmove towards the front, over
/// space already read), lengths turned into ends and the header written, by the last worker to
/// finish, helped with the moves by the workers that finished before it when every worker has
/// started (join_pieces). A chunk's bytes depend on its values alone, so every worker count
/// writes the same stream; with one worker nothing moves. No worker waits for one that has not
/// started, so a serialized launch (one thread, nested parallelism) runs it as well.
template <class T, int BlockSize, class Encoder>
struct fused_compression {
  Encoder encoder;  ///< chunk_encoder or a variant of it compiled for other instructions
  std::byte* out;
  std::uint64_t* length;
  std::uint64_t chunks;
  int workers;

  /// Lengths of chunks the back worker wrote carry this bit until the join.
  static constexpr std::uint64_t from_back = std::uint64_t(1) << 63;
  /// Pieces that do not overlap one another are moved in units of this many bytes, claimed by
  /// whichever worker is free.
  static constexpr std::uint64_t move_unit_bytes = 64 * 1024;

  int segments() const { return (workers + 1) / 2; }
  std::uint64_t first_chunk(int segment) const { return chunks * segment / segments(); }
  /// The end of chunk c's worst-case slot, relative to the data.
  std::uint64_t slot_end(std::uint64_t chunk) const {
    return chunk * encoder.full_chunk_bytes +
           encoder.layout.max_chunk_bytes(encoder.layout.values_in_chunk(chunk));
  }
  std::atomic_ref<std::uint32_t> counter(int which) const {
    return std::atomic_ref<std::uint32_t>(fused_counters(out)[which]);
  }
  /// Chunks encoded but not yet checksummed: sealed four at a time (checksums_of), once
  /// their bytes no longer move before the join (which moves them whole).
  struct unsealed {
    const std::byte* span[4];
    std::size_t length[4];
    std::uint64_t chunk[4];
    int count = 0;
  };
  void add(unsealed& u, std::uint64_t chunk, const std::byte* span, std::uint64_t bytes) const {
    u.span[u.count] = span;
    u.length[u.count] = bytes;
    u.chunk[u.count] = chunk;
    if (++u.count == 4) seal(u);
  }
  void seal(unsealed& u) const {
    if (u.count == 0) return;
    for (int j = u.count; j < 4; ++j) {
      u.span[j] = u.span[0];
      u.length[j] = u.length[0];
    }
    std::uint64_t sums[4];
    checksums_of<4>(u.span, u.length, sums);
    for (int j = 0; j < u.count; ++j) store<std::uint64_t>(encoder.checksums + 8 * u.chunk[j], sums[j]);
    u.count = 0;
  }
  std::uint64_t recorded(std::uint64_t chunk) const {
    return load<std::uint64_t>(encoder.ends + 8 * chunk);
  }

  void operator()(int worker) const {
    counter(workers_started).fetch_add(1, std::memory_order_relaxed);
    encode_segment(worker);
    // A worker helps with the join only if every worker has started: then each one not yet
    // finished is encoding, which never waits, so the wait below ends. In a serialized launch
    // the workers after this one have not started yet.
    const bool helps = counter(workers_started).load(std::memory_order_relaxed) == std::uint32_t(workers);
    if (helps) counter(helpers_joined).fetch_add(1, std::memory_order_relaxed);
    if (counter(workers_finished).fetch_add(1, std::memory_order_acq_rel) + 1 == std::uint32_t(workers)) {
      const move_plan plan = plan_moves();
      move_pieces(plan);
      // The counters lie in the header: wait until every helper is done with them.
      const std::uint32_t helpers = counter(helpers_joined).load(std::memory_order_relaxed) - (helps ? 1 : 0);
      wait_for(helpers_left, helpers);
      write_ends_and_header();
    } else if (helps) {
      wait_for(workers_finished, std::uint32_t(workers));
      move_pieces(plan_moves());
      counter(helpers_left).fetch_add(1, std::memory_order_release);
    }
  }

  /// Encodes this worker's share of its segment: from the front for even workers, from the
  /// back for odd ones.
  void encode_segment(int worker) const {
    const int segment = worker / 2;
    const std::uint64_t first = first_chunk(segment), last = first_chunk(segment + 1);
    if (first == last) return;
    std::atomic_ref<std::uint32_t> claimed = counter(first_segment_counter + segment);
    std::byte* const data = encoder.data;
    unsealed pending;
    const std::uint64_t count = last - first;
    if (worker % 2 == 0) {
      std::byte* to = data + first * encoder.full_chunk_bytes;
      for (std::uint64_t taken = 0; claimed.fetch_add(1, std::memory_order_relaxed) < count;
           ++taken) {
        const std::uint64_t chunk = first + taken;
        const std::uint64_t bytes = encoder.encode_unsealed(chunk, to);
        store<std::uint64_t>(encoder.ends + 8 * chunk, bytes);
        add(pending, chunk, to, bytes);
        to += bytes;
      }
    } else {
      std::byte* low = data + slot_end(last - 1);
      for (std::uint64_t taken = 0; claimed.fetch_add(1, std::memory_order_relaxed) < count;
           ++taken) {
        const std::uint64_t chunk = last - 1 - taken;
        std::byte* const slot = data + chunk * encoder.full_chunk_bytes;
        const std::uint64_t bytes = encoder.encode_unsealed(chunk, slot);
        low -= bytes;
        std::memmove(low, slot, bytes);
        store<std::uint64_t>(encoder.ends + 8 * chunk, bytes | from_back);
        add(pending, chunk, low, bytes);
      }
    }
    seal(pending);
  }

  void wait_for(fused_counter which, std::uint32_t value) const {
    while (counter(which).load(std::memory_order_acquire) != value) std::this_thread::yield();
  }

  /// The moves that join the pieces, in chunk order: a segment's front piece, then its back.
  struct move_plan {
    struct piece {
      std::uint64_t from, to, bytes;
    };
    piece pieces[max_fused_workers];
    int count = 0;
    /// Whether every piece can move at once, in units: no piece's destination covers another
    /// piece's bytes or its own. Otherwise the pieces move whole, one after another, by one
    /// worker (each over space already read).
    bool in_units = true;
    std::uint64_t units() const {
      if (!in_units) return count > 0 ? 1 : 0;
      std::uint64_t n = 0;
      for (int p = 0; p < count; ++p) n += (pieces[p].bytes + move_unit_bytes - 1) / move_unit_bytes;
      return n;
    }
  };

  /// Reads the recorded lengths: every worker has finished, and none writes the ends before
  /// all helpers are done.
  move_plan plan_moves() const {
    move_plan plan;
    std::uint64_t placed = 0;
    for (int segment = 0; segment < segments(); ++segment) {
      const std::uint64_t first = first_chunk(segment), last = first_chunk(segment + 1);
      if (first == last) continue;
      std::uint64_t front_bytes = 0, back_bytes = 0;
      for (std::uint64_t chunk = first; chunk < last; ++chunk) {
        const std::uint64_t r = recorded(chunk);
        (r & from_back ? back_bytes : front_bytes) += r & ~from_back;
      }
      const std::uint64_t front = first * encoder.full_chunk_bytes;
      const std::uint64_t back = slot_end(last - 1) - back_bytes;
      for (const auto& [from, bytes] : {std::pair{front, front_bytes}, std::pair{back, back_bytes}}) {
        if (bytes > 0 && from != placed) plan.pieces[plan.count++] = {from, placed, bytes};
        placed += bytes;
      }
    }
    for (int p = 0; p < plan.count; ++p)
      for (int q = 0; q < plan.count; ++q) {
        const auto &to = plan.pieces[p], &from = plan.pieces[q];
        if (to.to < from.from + from.bytes && from.from < to.to + to.bytes) plan.in_units = false;
      }
    return plan;
  }

  void move_pieces(const move_plan& plan) const {
    std::byte* const data = encoder.data;
    const std::uint64_t units = plan.units();
    for (std::uint64_t unit; (unit = counter(move_units_claimed).fetch_add(1, std::memory_order_relaxed)) < units;) {
      if (!plan.in_units) {
        for (int p = 0; p < plan.count; ++p)
          std::memmove(data + plan.pieces[p].to, data + plan.pieces[p].from, plan.pieces[p].bytes);
        continue;
      }
      for (int p = 0; p < plan.count; ++p) {
        const auto& piece = plan.pieces[p];
        const std::uint64_t piece_units = (piece.bytes + move_unit_bytes - 1) / move_unit_bytes;
        if (unit >= piece_units) {
          unit -= piece_units;
          continue;
        }
        const std::uint64_t offset = unit * move_unit_bytes;
        const std::uint64_t bytes = std::min(move_unit_bytes, piece.bytes - offset);
        std::memcpy(data + piece.to + offset, data + piece.from + offset, bytes);
        break;
      }
    }
  }

  void write_ends_and_header() const {
    std::uint64_t end = 0;
    for (std::uint64_t chunk = 0; chunk < chunks; ++chunk) {
      end += recorded(chunk) & ~from_back;
      store<std::uint64_t>(encoder.ends + 8 * chunk, end);
    }
    write_stream_header<T>(out, range_slot<T, Kokkos::DefaultHostExecutionSpace>(out), encoder.base,
                           encoder.layout, end, length);
  }
};

/// Whether this build can run the encoder `kind` on this host.
inline bool host_runs(encoder_kind kind) {
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
  if (kind == encoder_kind::avx2_fma) return host_has_avx2_fma();
  if (kind == encoder_kind::avx512) return host_has_avx512();
#endif
  return kind == encoder_kind::portable;
}

/// Host kernels of at most this many work items (chunks: 128 KiB of floats; range segments:
/// 256 KiB) run on the calling thread where the instance has one thread (runs_on_caller).
/// There a launch's 1.3 us is 4% of the work or more; above it, the launch is kept, and with it
/// what Kokkos Tools see of a large kernel.
inline constexpr std::uint64_t caller_items_max = 16;

/// Whether a host kernel of `items` work items runs on the calling thread rather than through a
/// Kokkos launch: where it has one item, or the instance one thread and the kernel at most
/// caller_items_max items. An OpenMP launch costs about 1.3 us even for a team of one thread
/// (libgomp ends each parallel region with a futex wake, a system call) and 3.3 us on two
/// threads, while 4 KiB of floats compress in about 1.5 us: a collective's per-peer codec calls
/// paid more for their launches than for their values (docs/performance.md, "Codec calls on one
/// thread"). The results are the same: no kernel's result depends on how its items are shared
/// out. Kokkos Tools see the codec's regions (kompress::compress, kompress::decompress) but not
/// such a kernel.
template <class Exec>
bool runs_on_caller(const Exec& exec, std::uint64_t items) {
  return items <= 1 || (items <= caller_items_max && exec.concurrency() == 1);
}

/// Kokkos::parallel_for over [0, items), or the same loop on the calling thread where
/// runs_on_caller(exec, work) (`work`: the kernel's items of work, where its launch range
/// counts workers).
template <class Exec, class Functor>
void host_for(const char* label, const Exec& exec, std::uint64_t items, const Functor& functor,
              std::uint64_t work = 0) {
  if (runs_on_caller(exec, work ? work : items)) {
    for (std::uint64_t i = 0; i < items; ++i) functor(i);
    return;
  }
  Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec>(exec, 0, items), functor);
}

/// The smallest chunk a checking kernel over items [0, items) reports bad (functor(i, bad)
/// lowers `bad`), or `none`: items handed out one at a time (they take very different times),
/// or looped over on the calling thread (runs_on_caller).
template <class Exec, class Functor>
std::uint64_t host_first_bad(const char* label, const Exec& exec, std::uint64_t items, std::uint64_t none,
                             const Functor& functor) {
  std::uint64_t bad = none;
  if (runs_on_caller(exec, items)) {
    for (std::uint64_t i = 0; i < items; ++i) functor(i, bad);
  } else {
    Kokkos::parallel_reduce(
        label, Kokkos::RangePolicy<Exec, Kokkos::Schedule<Kokkos::Dynamic>>(exec, 0, items, Kokkos::ChunkSize(1)),
        functor, Kokkos::Min<std::uint64_t>(bad));
  }
  return bad < none ? bad : none;
}

/// enqueue_range_reduction, or the same reduction on the calling thread (runs_on_caller).
template <class Exec, class Segments, class ResultView>
void host_range_reduction(const Exec& exec, const Segments& segments, const ResultView& result) {
  using T = typename Segments::element_type;
  if (!runs_on_caller(exec, segments.segments())) return enqueue_range_reduction(exec, segments, result);
  const range_reducer<T, typename ResultView::memory_space> reducer{result};
  packed_range<T> range;
  reducer.init(range);
  for (std::uint64_t s = 0; s < segments.segments(); ++s) segments(s, range);
  reducer.reference() = range;
}

template <class Exec>
  requires std::is_same_v<typename Exec::memory_space, Kokkos::HostSpace>
struct backend<Exec> {
  // Each value against its alternatives, bench_kernel_tuning on 5 real files, REL 1e-3,
  // 2-core EPYC at load average ~10 (docs/performance.md, "Kernel tuning"):
  static kernel_tuning tuning() {
    kernel_tuning t;
    // 1024 / 16384 / 65536: no difference beyond the noise (mpas_surface_pressure, the
    // steadiest file: within 0.5%); 4096 keeps a work item at 16-32 KB.
    t.range_segment = 4096;
    // The AVX2 + FMA encoder: 1.46x the portable one (geometric mean, one thread; 1.33-1.8x).
    // The value range follows it (see docs/performance.md, "Kernel tuning", for its gain).
    // Where the CPU has AVX-512, the encoders, the ratio codec's decoder and the value range
    // take it: the ratio codec's chunk encoding 1.15x on the activation files, decoding
    // 1.0-1.05x, a stash save 1.03x more from the range, the fast codec's compression 1.18x
    // (1.15-1.23x per file, "Kernel tuning"); the same bytes (docs/performance.md, "AVX-512
    // and vector Rice remainders").
    t.encoder = host_runs(encoder_kind::avx512)     ? encoder_kind::avx512
                : host_runs(encoder_kind::avx2_fma) ? encoder_kind::avx2_fma
                                                    : encoder_kind::portable;
    // The AVX2 + FMA decoder (docs/performance.md, "Kernel tuning").
    t.decoder = t.encoder;
    // (The ratio codec's assembly, and the fast codec's beyond max_fused_workers threads.)
    // Four waves move 94-100% of the moved bytes in parallel (one wave: 48-92%). On 2 cores
    // the move is about 1% of a compression (the moved bytes at memcpy's speed), so the gain
    // is below the noise here; it is the serial part that would grow with the thread count.
    t.assemble_waves = max_assemble_waves;
    // The fast codec's compression in two launches, one worker per thread (fused_compression):
    // two threads 1.78 -> 1.91x one thread, one thread 2.36 -> 2.43 GB/s (nothing moves);
    // docs/performance.md, the two-thread sections of the CPU codec.
    t.fused_workers = -1;
    return t;
  }

  template <class T, class ResultView>
  static void enqueue_value_range(const Exec& exec, const value_range_segments<T>& segments,
                                  const ResultView& result, encoder_kind kind) {
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
    if (takes_avx512(kind))
      return host_range_reduction(exec, value_range_segments_avx512<T>{segments}, result);
    if (takes_avx2_fma(kind))
      return host_range_reduction(exec, value_range_segments_avx2<T>{segments}, result);
#endif
    (void)kind;
    host_range_reduction(exec, segments, result);
  }

  /// The fast codec's compression in two launches instead of four to eight: the value range
  /// (which also zeroes the counters; a one-item launch when `known_range` gives it), then
  /// fused_compression's workers, one per thread unless tuning.fused_workers says otherwise.
  template <class T, int BlockSize, class ResultView>
  static bool enqueue_fused_compression(const Exec& exec, const value_range_segments<T>& segments,
                                        const ResultView& result,
                                        const chunk_encoder<T, BlockSize>& encoder, std::byte* out,
                                        std::uint64_t* length, const kernel_tuning& tuning,
                                        const packed_range<T>* known_range) {
    const std::uint64_t chunks = encoder.layout.chunk_count();
    const int asked = tuning.fused_workers < 0 ? int(exec.concurrency()) : tuning.fused_workers;
    // The claim counters are 32-bit and may overshoot a segment's chunk count by two.
    if (asked < 1 || asked > max_fused_workers || chunks >= (std::uint64_t(1) << 31))
      return false;
    // No more workers than chunks: one would find nothing to encode.
    const int workers = int(std::min<std::uint64_t>(std::uint64_t(asked), chunks));
    const auto run = [&](const auto& range_segments, const auto& chunk_encoder_variant) {
      using range_type = std::remove_cvref_t<decltype(range_segments)>;
      using encoder_type = std::remove_cvref_t<decltype(chunk_encoder_variant)>;
      if (known_range)
        host_for("kompress::compress::known_range", exec, 1, known_range_zeroing_counters<T>{*known_range, out});
      else
        host_range_reduction(exec, range_zeroing_counters<range_type>{range_segments, out}, result);
      host_for("kompress::compress::fused_chunks", exec, std::uint64_t(workers),
               fused_compression<T, BlockSize, encoder_type>{chunk_encoder_variant, out, length, chunks, workers},
               chunks);
    };
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
    if constexpr (BlockSize == 32) {
      if (takes_avx512(tuning.encoder)) {
        run(value_range_segments_avx512<T>{segments}, chunk_encoder_into_avx512<T, BlockSize>{encoder});
        return true;
      }
      if (takes_avx2_fma(tuning.encoder)) {
        run(value_range_segments_avx2<T>{segments}, chunk_encoder_into_avx2<T, BlockSize>{encoder});
        return true;
      }
    }
#endif
    run(segments, encoder);
    return true;
  }

  template <class T, int BlockSize>
  static void encode_chunks(const Exec& exec, std::uint64_t chunks,
                            const chunk_encoder<T, BlockSize>& encoder, encoder_kind kind) {
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
    // The default block size only: each variant compiles the encoder once more.
    if constexpr (BlockSize == 32) {
      if (takes_avx512(kind))
        return host_for("kompress::compress::encode_chunks", exec, chunks, chunk_encoder_avx512<T, BlockSize>{encoder});
      if (takes_avx2_fma(kind))
        return host_for("kompress::compress::encode_chunks", exec, chunks, chunk_encoder_avx2<T, BlockSize>{encoder});
    }
#endif
    (void)kind;
    host_for("kompress::compress::encode_chunks", exec, chunks, encoder);
  }

  template <class T>
  static void encode_ratio_chunks(const Exec& exec, std::uint64_t chunks,
                                  const ratio_chunk_encoder<T>& encoder, encoder_kind kind) {
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
    if (takes_avx512(kind))
      return host_for("kompress::compress::encode_ratio_chunks", exec, chunks, ratio_chunk_encoder_avx512<T>{encoder});
    if (takes_avx2_fma(kind))
      return host_for("kompress::compress::encode_ratio_chunks", exec, chunks, ratio_chunk_encoder_avx2<T>{encoder});
#endif
    (void)kind;
    host_for("kompress::compress::encode_ratio_chunks", exec, chunks, encoder);
  }

  /// Chunks verified four at a time (checksums_of: four hash chains side by side), each group
  /// handed out on its own.
  static std::uint64_t verify_chunks(const Exec& exec, std::uint64_t chunks, const std::byte* data,
                                     const std::byte* ends, const std::byte* checksums) {
    constexpr int group = 4;
    const auto check = [=](std::uint64_t g, std::uint64_t& bad) {
      const std::byte* spans[group];
      std::size_t lengths[group];
      std::uint64_t sums[group];
      for (int j = 0; j < group; ++j) {
        // A short last group checks its last chunk again.
        const std::uint64_t chunk = g * group + j < chunks ? g * group + j : chunks - 1;
        const std::uint64_t begin = chunk ? load<std::uint64_t>(ends + 8 * (chunk - 1)) : 0;
        spans[j] = data + begin;
        lengths[j] = load<std::uint64_t>(ends + 8 * chunk) - begin;
      }
      checksums_of<group>(spans, lengths, sums);
      for (int j = group - 1; j >= 0; --j) {
        const std::uint64_t chunk = g * group + j < chunks ? g * group + j : chunks - 1;
        if (sums[j] != load<std::uint64_t>(checksums + 8 * chunk)) bad = chunk < bad ? chunk : bad;
      }
    };
    return host_first_bad("kompress::decompress::verify", exec, (chunks + group - 1) / group, chunks, check);
  }

  /// Chunks decode at very different speeds (constant runs against raw blocks): handed out one
  /// at a time (host_first_bad), not in equal contiguous shares.
  template <class T, int BlockSize>
  static std::uint64_t decode_chunks(const Exec& exec, std::uint64_t chunks,
                                     const chunk_decoder<T, BlockSize>& decoder,
                                     encoder_kind kind) {
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
    if constexpr (BlockSize == 32) {
      if (takes_avx2_fma(kind))
        return host_first_bad("kompress::decompress::decode_chunks", exec, chunks, chunks,
                              chunk_decoder_avx2<T, BlockSize>{decoder});
    }
#endif
    (void)kind;
    return host_first_bad("kompress::decompress::decode_chunks", exec, chunks, chunks, decoder);
  }

  template <class T>
  static std::uint64_t decode_ratio_chunks(const Exec& exec, std::uint64_t chunks,
                                           const ratio_chunk_decoder<T>& decoder, encoder_kind kind) {
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
    if (takes_avx512(kind) && host_has_bmi_popcnt())
      return host_first_bad("kompress::decompress::decode_ratio_chunks", exec, chunks, chunks,
                            ratio_chunk_decoder_avx512<T>{decoder});
    if (takes_avx2_fma(kind) && host_has_bmi_popcnt())
      return host_first_bad("kompress::decompress::decode_ratio_chunks", exec, chunks, chunks,
                            ratio_chunk_decoder_avx2<T>{decoder});
#endif
    (void)kind;
    return host_first_bad("kompress::decompress::decode_ratio_chunks", exec, chunks, chunks, decoder);
  }

  /// decode_chunks over every chunk of a stream_batch (kernels/decode_batch.hpp).
  template <class Batch>
  static std::uint64_t decode_batch_chunks(const Exec& exec, const Batch& batch, encoder_kind kind) {
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
    if (Batch::block_size == 32 && takes_avx2_fma(kind))
      return host_first_bad("kompress::decompress::decode_batch", exec, batch.chunks, batch.chunks,
                            batch_decoder_avx2<Batch>{batch});
#endif
    (void)kind;
    return host_first_bad("kompress::decompress::decode_batch", exec, batch.chunks, batch.chunks, batch);
  }
};

}  // namespace kompress::inline v0::detail
