#pragma once
// Tuning of the stash, chosen per backend; the measured gain is written beside each value
// (bench/stash, docs/performance.md "Stash (CPU)").

namespace kompress::inline v0::detail {

struct stash_tuning {
  /// Compress a segment straight into the pool when a worst-case range is free, instead of
  /// into the workspace and then copying. OpenMP, 2 threads, act_* at REL 1e-2: the copy
  /// costs 1-3% of a save (it moves compressed bytes only); in place also lets concurrent
  /// saves skip the workspace's lock. Kept on; with frame_streams, taken only where another
  /// thread holds the workspace.
  bool compress_in_place = true;
  /// Restore keep_sign segments with the host's AVX2 where the CPU has it: packed positive
  /// floats through detail::unpack_word_avx2 (a masked load and a permute per 8 values instead
  /// of a step per positive value: 2x on the ReLU outputs), the fix-up of whole streams
  /// compiled for AVX2 (1.6x: as fast as a copy). Same values; off, the portable loops (what
  /// the tests compare them with).
  bool simd_restore = true;
  /// Save keep_sign segments with the host's AVX2 where the CPU has it: the sign loops
  /// (pack_signs, classify_signs) compiled for it, and a ReLU output's positive floats packed
  /// through detail::pack_word_avx2 (a permute per 8 values instead of a step per value). Same
  /// bytes; off, the portable loops.
  bool simd_save = true;
  /// Store a packed segment's sign bits coded by their rare value's gaps where that is shorter
  /// (detail/sign_code.hpp); off, always as they are (what the tests compare them with).
  bool code_sign_bits = true;
  /// Store the streams that go into the pool framed (their 88-byte headers cut to 16 bytes,
  /// detail/piece_frame.hpp; a packed segment's after its sign bits, in one range), compressed
  /// through the workspace: 72 bytes less a stream, for a copy of the compressed bytes where a
  /// free range of the pool would have taken them in place (compress_in_place, which then
  /// applies only while another thread holds the workspace). Off, whole (what the tests
  /// compare them with).
  bool frame_streams = true;
};

template <class ExecutionSpace>
constexpr stash_tuning default_stash_tuning() {
  return {};
}

}  // namespace kompress::inline v0::detail
