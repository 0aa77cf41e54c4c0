#pragma once
// The cost model of automatic mode and of pipelining: when compressing a message pays, and into
// how many chunks a compressed message is cut (docs/collectives.md).

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace kompress {
inline namespace v0 {
namespace detail {

/// The least k in [low, high] where f(k + 1) >= f(k): where a function that falls, then rises
/// (convex, or the larger of a falling and a rising line) is least, found by bisection.
template <class F>
std::uint64_t least_point(std::uint64_t low, std::uint64_t high, F&& f) {
  while (low < high) {
    const std::uint64_t k = low + (high - low) / 2;
    if (f(k + 1) < f(k))
      low = k + 1;
    else
      high = k;
  }
  return low;
}

}  // namespace detail

/// The cost model of automatic mode and of pipelining (docs/collectives.md). Every rank must
/// hold the same numbers: decisions (compress or not, the chunk size) are taken on each side
/// of a message without talking about them, so the collectives agree on the model before any
/// message is posted. kompress::measure_cost_model (kompress/comm/measure.hpp) measures the
/// rates and makes every rank agree on them.
struct cost_model {
  double link_bytes_per_second = 1.25e9;       ///< 10 Gb/s unless measured or stated
  double compress_bytes_per_second = 0.6e9;    ///< per rank, this machine's codec, 1 thread
  double decompress_bytes_per_second = 2.0e9;
  std::uint64_t min_message_bytes = 64 * 1024; ///< below this, latency dominates: send raw
  /// Automatic mode compresses only where the model predicts at least this gain over raw: its
  /// numbers are uncertain (a codec probe taken under other load, links that let a burst
  /// through unshaped, the REL bound's range pass it leaves out). The 2-rank sweeps of
  /// docs/performance.md compressed and lost at 1 MiB per peer and 5 Gb/s, predicted 1.25-1.40x,
  /// measured 0.77-0.98x; 1.5 sends those raw and keeps the decisions that paid well.
  double min_gain = 1.5;
  /// The compression ratio the model expects of the data (the chunk size and automatic mode's
  /// decision use it): 2 unless stated, or measured on a sample of the caller's data
  /// (measure_cost_model).
  double expected_ratio = 2.0;
  /// The link's latency: what one more step of a schedule costs beyond its bytes, seconds
  /// (the choice between the ring and recursive halving and doubling weighs it).
  double latency_seconds = 10e-6;
  /// What one codec call costs beyond its bytes, seconds, compressing and decompressing: a
  /// GPU's kernel launches and the read of the stream's length back to the host (about 90 us
  /// on an H200 whatever the size, docs/performance.md), a few microseconds on a CPU core.
  /// Every chunk pays it on both sides, so it sets how small chunks may be and whether a small
  /// message pays at all. measure_cost_model measures both from probes of two sizes.
  double compress_call_seconds = 0.0;
  double decompress_call_seconds = 0.0;

  /// Pipelining: a message that may be compressed is cut into chunks, each its own stream and
  /// its own MPI message, so that compressing chunk k+1, sending chunk k and decoding chunk
  /// k-1 overlap. False: one stream per message, compressed whole before it leaves.
  bool pipeline = true;
  /// Fixed cost of one more chunk beyond its codec calls' (an MPI message, a stream header, a
  /// poll), seconds; the default estimate also covers a CPU core's codec calls, whose own cost
  /// (compress_call_seconds, decompress_call_seconds) is 0 unless stated or measured.
  double chunk_seconds = 50e-6;
  std::uint64_t min_chunk_bytes = 256 * 1024;  ///< no chunk smaller (the last one aside)
  std::uint64_t max_chunks = 64;               ///< no message in more chunks
  /// A fixed chunk size in bytes (0: from the model, chunk_bytes below).
  std::uint64_t fixed_chunk_bytes = 0;
  /// A staged call's copies between its memory and host staging, one direction (PCIe 4.0 x16
  /// with pinned buffers moves about 25 GB/s): where the transport seam stages a call, every
  /// message crosses them twice, in series with the link (staged() below). 0: not counted.
  double staging_bytes_per_second = 25e9;

  /// The model of a staged call (docs/collectives.md, "The transport seam"): each message is
  /// copied to host staging on the sender and from it on the receiver, so the link a message
  /// sees is the link and two staging copies in series. Raw values pay the copies whole, a
  /// stream ratio-times less: automatic mode compresses where the copies tip the balance.
  cost_model staged() const {
    cost_model model = *this;
    if (staging_bytes_per_second > 0.0)
      model.link_bytes_per_second = 1.0 / (1.0 / link_bytes_per_second + 2.0 / staging_bytes_per_second);
    return model;
  }

  /// The three stages of a compressed message of `bytes` at ratio `ratio`, seconds: one codec
  /// call each way (its fixed cost and its bytes) and the stream on the link.
  double compress_seconds(double bytes) const { return compress_call_seconds + bytes / compress_bytes_per_second; }
  double wire_seconds(double bytes, double ratio) const { return bytes / (ratio * link_bytes_per_second); }
  double decompress_seconds(double bytes) const {
    return decompress_call_seconds + bytes / decompress_bytes_per_second;
  }

  /// Whether streams of `bytes` raw bytes that arrive together are decoded together (one
  /// batched decompression, docs/collectives.md "Decoding what arrives together"): where a
  /// decompression's fixed cost exceeds what its bytes take, as on a GPU. Otherwise each is
  /// decoded as it lands, overlapping the transfer of the next. A local choice: the bytes on
  /// the wire and the values decoded are the same either way.
  bool batches_decodes(double bytes) const {
    return decompress_call_seconds > 0.0 && decompress_call_seconds > bytes / decompress_bytes_per_second;
  }
  /// The same for compressing: whether chunks of `bytes` raw bytes that leave together are
  /// compressed together (one batched compression per round of chunks).
  bool batches_encodes(double bytes) const {
    return compress_call_seconds > 0.0 && compress_call_seconds > bytes / compress_bytes_per_second;
  }

  /// Predicted seconds of a compressed message of `bytes` at `ratio` cut into `k` chunks: the
  /// first chunk fills the pipeline (its three stages in turn), then every further chunk costs
  /// the slowest stage's time for a chunk and chunk_seconds. Without per-call costs that is
  /// T(k) = (c + w + d) / k + (k - 1) / k * max(c, w, d) + (k - 1) * chunk_seconds over the
  /// stages of the whole message; T is convex in k.
  double pipelined_seconds(double bytes, double ratio, std::uint64_t k) const {
    const double piece = bytes / double(k);
    const double c = compress_seconds(piece), w = wire_seconds(piece, ratio), d = decompress_seconds(piece);
    return c + w + d + double(k - 1) * (std::max({c, w, d}) + chunk_seconds);
  }

  /// Chunks for a compressed message of `bytes` (at expected_ratio, as worth_compressing): the
  /// k in [1, max_chunks], with chunks of at least min_chunk_bytes, where pipelined_seconds is
  /// least (the first such k; T's convexity lets a bisection find it).
  std::uint64_t chunks(std::uint64_t bytes) const {
    if (!pipeline || bytes == 0) return 1;
    if (fixed_chunk_bytes > 0) return (bytes + fixed_chunk_bytes - 1) / fixed_chunk_bytes;
    const double b = double(bytes);
    const std::uint64_t most =
        std::max<std::uint64_t>(1, std::min(max_chunks, bytes / std::max<std::uint64_t>(min_chunk_bytes, 1)));
    return detail::least_point(1, most, [&](std::uint64_t k) { return pipelined_seconds(b, expected_ratio, k); });
  }
  /// The chunk size for a message of `bytes`, in bytes (the last chunk may be shorter).
  std::uint64_t chunk_bytes(std::uint64_t bytes) const {
    const std::uint64_t k = chunks(bytes);
    return k <= 1 ? bytes : (bytes + k - 1) / k;
  }

  /// Predicted seconds of a message of `bytes` sent compressed at `ratio`, in chunks as above.
  double compressed_seconds(std::uint64_t bytes, double ratio) const {
    return pipelined_seconds(double(bytes), ratio, chunks(bytes));
  }

  /// True when compressing a message of `bytes` could pay, at expected_ratio: the message,
  /// pipelined as above, beats the raw values on the link by min_gain.
  bool worth_compressing(std::uint64_t bytes) const {
    if (bytes < min_message_bytes) return false;
    return compressed_seconds(bytes, expected_ratio) * min_gain < double(bytes) / link_bytes_per_second;
  }

  /// The model of streams that share codec calls: each pays `compress_share` of a compression's
  /// fixed cost and `decompress_share` of a decompression's (a batch of n streams compressed, or
  /// decoded, by one call: 1/n each; detail/compress_batch.hpp, detail/decompress_batch.hpp).
  cost_model sharing_calls(double compress_share, double decompress_share) const {
    cost_model model = *this;
    model.compress_call_seconds *= compress_share;
    model.decompress_call_seconds *= decompress_share;
    return model;
  }

  /// True when compressing a message of `bytes` once pays where its stream then crosses a link
  /// `sends` times, decoded at each end (an allgather's block: compressed by its owner alone,
  /// received and decoded by the p - 1 others): the first crossing as compressed_seconds, each
  /// further one its stream on the link and its decoding, against `sends` raw crossings, by
  /// min_gain. With one send it is worth_compressing. `decode_share`: the part of a
  /// decompression's fixed cost each decoding pays (1, or less where receivers decode the
  /// streams that arrive together in one batched call).
  bool worth_compressing_forwarded(std::uint64_t bytes, std::uint64_t sends, double decode_share = 1.0) const {
    const cost_model model = sharing_calls(1.0, decode_share);
    if (sends <= 1) return sends == 1 && model.worth_compressing(bytes);
    if (bytes < min_message_bytes) return false;
    const double b = double(bytes), forwards = double(sends - 1);
    const double forward = wire_seconds(b, expected_ratio) + model.decompress_seconds(b);
    const double compressed = model.compressed_seconds(bytes, expected_ratio) + forwards * forward;
    return compressed * min_gain < double(sends) * b / link_bytes_per_second;
  }

  /// The model an alltoall(v) prices and cuts a block of `bytes` to one of `peers` peers with:
  /// where a codec call costs more than a chunk's bytes take (batches_encodes, batches_decodes,
  /// as on a GPU), chunk i of every peer's block is compressed by one call and the arrivals are
  /// decoded by one, so each block pays 1/peers of those calls (docs/collectives.md,
  /// "alltoall and alltoallv").
  cost_model exchange_model(std::uint64_t bytes, std::uint64_t peers) const {
    if (peers <= 1) return *this;
    const double share = 1.0 / double(peers);
    const double chunk = double(sharing_calls(share, share).chunk_bytes(bytes));
    return sharing_calls(batches_encodes(chunk) ? share : 1.0, batches_decodes(chunk) ? share : 1.0);
  }

  /// An alltoall(v) whose `peers` blocks (each way) are `bytes` each, `compressed` of them
  /// compressed and the rest raw, seconds (docs/collectives.md, "Sharing the work with the
  /// link"). A rank's core compresses the blocks it sends and decodes as many it receives
  /// (chunked as exchange_model says), while its link carries the streams and the raw blocks;
  /// across the blocks the two overlap, so the call takes the larger of the two, plus one
  /// latency (every block is posted at once), the first chunk's compression and the last one's
  /// decoding, which nothing overlaps. Where calls are batched (a GPU's: batches_encodes,
  /// batches_decodes), a round of chunks pays one compression call however many blocks it
  /// holds, and the arrivals are decoded together after the last one, in series.
  double exchanged_seconds(std::uint64_t bytes, std::uint64_t peers, std::uint64_t compressed) const {
    const double b = double(bytes), c = double(compressed);
    const double link = (double(peers - compressed) * b + c * b / expected_ratio) / link_bytes_per_second;
    if (compressed == 0) return latency_seconds + link;
    const double k = double(exchange_model(bytes, peers).chunks(bytes)), piece = b / k;
    const double encode_calls = k * compress_call_seconds * (batches_encodes(piece) ? 1.0 : c);
    const double encode = c * b / compress_bytes_per_second + encode_calls;
    const double decode_bytes = c * b / decompress_bytes_per_second;
    if (batches_decodes(piece)) {
      const double decode = decompress_call_seconds + decode_bytes;
      return latency_seconds + std::max(encode, link) + decode + compress_seconds(piece);
    }
    const double decode = decode_bytes + k * c * decompress_call_seconds;
    return latency_seconds + std::max(encode + decode, link) + compress_seconds(piece) + decompress_seconds(piece);
  }

  /// How many of an alltoall(v)'s `peers` blocks of `bytes` to compress, at least one: the count
  /// where exchanged_seconds is least. Compressing a block moves work from the link to the
  /// codec; where the codec is the slower side, the rest go raw (automatic mode's raw share).
  std::uint64_t exchanged_compressed_blocks(std::uint64_t bytes, std::uint64_t peers) const {
    if (peers <= 1) return peers;
    // exchanged_seconds is the larger of a falling and a rising line in the count (plus terms
    // the count leaves alone): least near where they cross.
    return detail::least_point(1, peers, [&](std::uint64_t c) { return exchanged_seconds(bytes, peers, c); });
  }

  /// True when an alltoall(v)'s blocks of `bytes` to `peers` peers are worth compressing:
  /// kompress's engine, posting every block at once and compressing
  /// exchanged_compressed_blocks of them (exchanged_seconds), beats by min_gain the faster of
  /// MPI's own exchange (for large blocks MPICH's and Open MPI's run one pairwise step after
  /// another, each a latency and the block) and the engine sending every block raw: the gain
  /// must come from compressing, not from posting at once. For one peer, worth_compressing.
  bool worth_compressing_exchanged(std::uint64_t bytes, std::uint64_t peers) const {
    if (peers <= 1) return worth_compressing(bytes);
    if (bytes < min_message_bytes) return false;
    const double compressed = exchanged_seconds(bytes, peers, exchanged_compressed_blocks(bytes, peers));
    const double pairwise = double(peers) * (latency_seconds + double(bytes) / link_bytes_per_second);
    return compressed * min_gain < std::min(pairwise, exchanged_seconds(bytes, peers, 0));
  }

  /// Predicted seconds of one step of a schedule that moves a message of `bytes` (and takes one
  /// in): the latency, then the message compressed and pipelined at expected_ratio, or raw.
  double step_seconds(std::uint64_t bytes, bool compressed) const {
    if (bytes == 0) return latency_seconds;
    return latency_seconds +
           (compressed ? compressed_seconds(bytes, expected_ratio) : double(bytes) / link_bytes_per_second);
  }

  /// True when `wire_bytes` compressed beat `raw_bytes` raw, the compression already done.
  bool compressed_wins(std::uint64_t raw_bytes, std::uint64_t wire_bytes) const {
    return double(wire_bytes) / link_bytes_per_second + decompress_seconds(double(raw_bytes)) <
           double(raw_bytes) / link_bytes_per_second;
  }
};

}  // namespace v0
}  // namespace kompress
