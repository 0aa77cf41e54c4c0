#pragma once
// kompress::stash_options: the budget, the policy, the segment size and the codec's options.

#include <kompress/bound.hpp>
#include <kompress/stash/policy.hpp>

#include <cstddef>
#include <cstdint>

namespace kompress {
inline namespace v0 {

struct stash_options {
  /// The stash's device memory in bytes: one pool allocated when the stash is made, holding
  /// the compression workspace and every stored stream. Nothing else is allocated in the
  /// execution space's memory space.
  std::size_t budget_bytes = 0;
  budget_policy policy = budget_policy::throw_error();
  /// A save compresses its View in segments of at most this many bytes, each one stream. The
  /// workspace is one segment's worst case, so this bounds the memory a save needs beyond its
  /// compressed size. Larger segments mean fewer launches and fences per save.
  std::size_t segment_bytes = std::size_t(4) << 20;
  /// The codec's options for every stream: block_size (32, 64, 128), fill_value (values
  /// bit-identical to it come back bit-exact and stay out of a relative bound's range) and the
  /// codec of saves that do not name one (stash_save_options::codec). The bound is given per
  /// save: codec.bound must stay lossless() (its default), or the stash throws
  /// invalid_argument when made.
  compress_options codec{};
  /// stash_codec::automatic takes the ratio codec when its stream of a save's first segment is
  /// at least this fraction shorter than the fast codec's (it compresses and decompresses 2-3x
  /// slower: worth a fifth of the memory, not a few percent). In [0, 1).
  double ratio_codec_min_saving = 0.2;
  /// stash_codec::automatic measures a layer's codec again after this many saves of it (>= 1).
  std::uint32_t codec_remeasure_saves = 64;
  /// The most save_asyncs pending at once (>= 1): a save_async beyond it first settles the
  /// oldest, so the pool holds at most this many worst-case ranges besides the streams.
  std::size_t async_window = 2;
};

}  // namespace v0
}  // namespace kompress
