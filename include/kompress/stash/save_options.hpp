#pragma once
// kompress::stash_save_options: how one save is stored (its codec, its layer, its sign bits,
// its rounding) and whether its relative bound is relative to each group of values' range
// (docs/stash.md, "Per-save options" and "Bounds relative to each group").

#include <kompress/bound.hpp>

#include <cstdint>
#include <optional>

namespace kompress {
inline namespace v0 {

/// The codec a save's streams use.
enum class stash_codec : std::uint8_t {
  fast,       ///< codec_mode::fast: the SZx-style blocks
  ratio,      ///< codec_mode::ratio: fewer bytes, about a third of the speed
  automatic,  ///< measured on the save's first segment (remembered per layer): the ratio codec
              ///< where its stream is at least stash_options::ratio_codec_min_saving shorter
};

struct stash_save_options {
  /// Nothing: the stash's options().codec.codec.
  std::optional<stash_codec> codec = std::nullopt;
  /// The tensor's role (a layer's output, say). stash_codec::automatic remembers its choice
  /// per layer and measures again every stash_options::codec_remeasure_saves saves of it;
  /// without a layer every automatic save measures.
  std::optional<std::uint32_t> layer = std::nullopt;
  /// Keep x > 0 as one bit per value beside the streams: restored values are then on the
  /// saved side of 0 (x'' > 0 exactly where x > 0), still within the bound. What a ReLU's
  /// backward needs to take its mask from the restored output. Where the values are all
  /// positive or +0, the zeros are kept in the bits alone, and the bits coded in less where
  /// zeros or positive values are rare (docs/stash.md, "Coded sign bits").
  bool keep_sign = false;
  /// Nothing: the stash's options().codec.rounding. rounding_mode::stochastic makes every
  /// restored value an unbiased estimate of the saved one (E[x''] = x, within the same bound),
  /// for one bit more per value: what a weight gradient summed over a batch needs at loose
  /// bounds (docs/stash.md, "Rounding"). Each stream is seeded from
  /// options().codec.rounding_seed and the save's number, so every save draws afresh and a run
  /// repeats exactly. With keep_sign, a positive value that came back 0 restores as the
  /// smallest positive value, which keeps the estimate unbiased.
  std::optional<rounding_mode> rounding = std::nullopt;
  /// A relative bound r taken relative to each group of 256 consecutive values (in memory
  /// order) instead of the whole View: group g's values are kept within r 2^k_g, 2^k_g the
  /// largest power of two at most the range of its finite values (its magnitude's for a constant
  /// group; k_g within [-100, 127] for float, [-1000, 1023] for double). A group of small values
  /// then keeps their digits where the View's range would round them all to one code: what
  /// ActNN's per-group 2-bit codes do, here with a bound. Costs 2 bytes a group (counted in the
  /// stored bytes); r must be 0 (lossless) or at least 2^-28, and the bound relative.
  bool group_relative = false;
};

}  // namespace v0
}  // namespace kompress
