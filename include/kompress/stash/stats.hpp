#pragma once
// kompress::stash_stats: what a stash holds now, what it held at most, and what it has done.

#include <cstddef>
#include <cstdint>

namespace kompress {
inline namespace v0 {

struct stash_stats {
  // --- now ---
  std::size_t budget_bytes = 0;     ///< the pool's size: all the device memory the stash holds
  std::size_t workspace_bytes = 0;  ///< the part of the pool kept as compression workspace
  std::size_t entries = 0;          ///< live entries
  std::size_t raw_bytes = 0;        ///< live entries, uncompressed: what plain Views would hold
  std::size_t stored_bytes = 0;     ///< live entries' streams and sign bits, wherever they are
                                    ///< (a pending save_async's stream counts once settled)
  std::size_t sign_bytes = 0;       ///< of stored_bytes, the sign bits (keep_sign saves)
  std::size_t pool_bytes = 0;       ///< pool bytes held: the workspace, the streams and the
                                    ///< ranges reserved by pending save_asyncs and by a packed
                                    ///< keep_sign stream being written (16-byte aligned); not the
                                    ///< worst-case ranges a save borrows from free space while it
                                    ///< compresses in place (the workspace could serve those)
  std::size_t pending_saves = 0;    ///< save_asyncs not yet settled (stash::fence settles them)
  std::size_t reserved_bytes = 0;   ///< of pool_bytes, those reserved worst-case ranges
  std::size_t padding_bytes = 0;    ///< of pool_bytes, the streams' rounding up to 16 bytes: with
                                    ///< the workspace and the reservations, all that is not stream
  std::size_t host_spilled_bytes = 0;  ///< live streams spilled to host memory
  std::size_t file_spilled_bytes = 0;  ///< live streams spilled to the spill file
  // --- high-water marks since construction or reset_peaks() ---
  std::size_t peak_raw_bytes = 0;     ///< of raw_bytes
  std::size_t peak_stored_bytes = 0;  ///< of the streams in the pool (without alignment)
  std::size_t peak_pool_bytes = 0;    ///< of pool_bytes: the budget this run needed (fragmentation
                                      ///< aside, a pool this size would have held every stream)
  // --- totals since construction ---
  std::uint64_t saves = 0;
  std::uint64_t restores = 0;
  std::uint64_t drops = 0;
  std::uint64_t spilled_segments = 0;  ///< to host or file
  std::uint64_t loosened_saves = 0;    ///< saves stored with a looser bound than asked
  std::uint64_t ratio_codec_saves = 0; ///< saves stored with codec_mode::ratio
  std::uint64_t codec_measurements = 0;  ///< stash_codec::automatic's trials of both codecs
  std::uint64_t moved_streams = 0;     ///< settled save_async streams moved down the pool
  std::size_t total_raw_bytes = 0;     ///< over every save
  std::size_t total_stored_bytes = 0;  ///< over every save

  /// Compression ratio over every save so far: total_raw_bytes / total_stored_bytes.
  double ratio() const {
    return total_stored_bytes ? double(total_raw_bytes) / double(total_stored_bytes) : 0.0;
  }
};

}  // namespace v0
}  // namespace kompress
