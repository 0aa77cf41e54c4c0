#pragma once
// Options and per-call reports of the compressed collectives.

#include <kompress/bound.hpp>
#include <kompress/comm/cost_model.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace kompress {
inline namespace v0 {

/// Whether a collective compresses what it sends.
enum class transfer_mode {
  compressed,  ///< compress every message (a message that would grow is sent raw)
  raw,         ///< plain MPI, no compression
  automatic,   ///< compress only where the cost model says it pays
};

/// What the allreduce bound means.
enum class allreduce_bound {
  per_hop,  ///< every compression is within the bound; the result within p times it
  total,    ///< the result is within the bound; every compression gets bound / p
};

/// How allreduce and reduce_scatter form partial sums on the way (allgather and alltoall(v)
/// have none; docs/collectives.md).
enum class reduction_method {
  recompress,   ///< decode each arrival, add in floating point, compress again for the next hop
  homomorphic,  ///< quantize once on one grid shared by all ranks; hops add the integer codes
};

/// The order of the messages of allreduce, reduce_scatter and allgather (docs/collectives.md,
/// "Schedules"). Both move the same bytes; allreduce and allgather have the same bound either
/// way, reduce_scatter too where p is a power of two (elsewhere halving gives p e for p - 1).
enum class collective_schedule {
  automatic,         ///< by the cost model: the one predicted faster for this size and p
  ring,              ///< p - 1 steps of n / p values per phase, between neighbours
  halving_doubling,  ///< recursive halving (reduce), doubling (gather): log2 p steps per phase, + 2 where p is
                     ///< no power of two
};

/// How a collective's bytes reach MPI (docs/collectives.md, "The transport seam"). The bytes on
/// the wire are the same either way; the ranks of a collective must agree on whether they stage
/// (a mismatch is invalid_argument on every rank), those of the DLRM exchange may differ.
enum class transport_mode {
  /// Host-accessible memory straight to MPI; device memory straight where the MPI reports that
  /// it moves CUDA memory itself (MPIX_Query_cuda_support), else staged.
  automatic,
  /// MPI reads and writes the Views' memory itself: host memory, or device memory under an MPI
  /// the caller knows to be device-aware.
  direct,
  /// Through host staging buffers (pinned where the backend has them), even for host memory:
  /// only the bytes a message holds are copied, the stream when it is compressed.
  staged,
};

struct collective_options {
  /// The codec's options for every message: bound (REL resolves against the sender's whole
  /// send View; for allreduce against all ranks' inputs), block size, fill value (alltoall(v)
  /// only: a sum has no fill value).
  compress_options codec{.bound = relative(1e-3), .block_size = 32};
  transfer_mode mode = transfer_mode::compressed;
  allreduce_bound reduction_bound = allreduce_bound::per_hop;
  /// allreduce and reduce_scatter: homomorphic adds codes without recompressing; the result is
  /// within p times the per-rank bound (docs/collectives.md, "Homomorphic reduction").
  reduction_method reduction = reduction_method::recompress;
  /// allreduce, reduce_scatter, allgather: the ring or recursive halving and doubling (the
  /// homomorphic reduction takes the ring whatever this says).
  collective_schedule schedule = collective_schedule::automatic;
  cost_model cost{};
  /// Report the largest error this rank's own compressions introduced (collective_report::
  /// max_error): decodes what it sends (one decompression per stream); homomorphic: the largest
  /// quantization error of its own values.
  bool measure_error = false;
  /// How the bytes reach MPI: for device Views, staged through host memory unless the MPI
  /// moves device memory (automatic) or the caller says it does (direct).
  transport_mode transport = transport_mode::automatic;
  /// alltoall(v): how many peers' messages a rank expects at once. It posts the receives of that
  /// many peers, in the order they send to it, and those of the next peer as each peer's message
  /// completes (docs/collectives.md, "alltoall and alltoallv"). 0: every peer's at once. Ranks
  /// may choose differently.
  std::size_t exchange_window = 0;
};

/// What one call did on the calling rank.
struct collective_report {
  std::uint64_t payload_bytes = 0;      ///< bytes of values this rank sent to other ranks
  std::uint64_t wire_bytes = 0;         ///< bytes it put on the wire for them
  std::uint64_t messages = 0;           ///< messages it sent (one per peer and hop)
  std::uint64_t compressed_messages = 0;  ///< messages of which at least one chunk was compressed
  std::uint64_t chunks = 0;             ///< MPI messages those were cut into (pipelining)
  double absolute_bound = 0.0;          ///< guaranteed |error| of every value this call delivers
  double max_error = NAN;               ///< measured, with collective_options::measure_error

  double ratio() const { return wire_bytes ? double(payload_bytes) / double(wire_bytes) : 1.0; }
  bool sent_raw() const { return compressed_messages == 0; }
};

}  // namespace v0
}  // namespace kompress
