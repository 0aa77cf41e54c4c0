#pragma once
// The engine behind allreduce: a ring of two phases over p chunks. The reduce-scatter phase
// carries compressed partial sums (decompress, add, recompress) until rank r holds the sum of
// chunk r+1; the allgather phase compresses each final chunk once on its owner and forwards
// those bytes unchanged, so every rank decodes the same bytes and ends bit-identical.
// allreduce chains the two; a reduce_scatter or allgather is one phase alone.
// docs/collectives.md gives the schedule and the error argument.

#include <kompress/comm/detail/engine.hpp>

#include <mpi.h>

#include <optional>
#include <vector>

namespace kompress::inline v0::detail {

/// p chunks of `count` values over a ring. Ring chunk c lies at memory block
/// wrap(c + rotation), block k being [k * count / p, (k + 1) * count / p). allreduce uses no
/// rotation; reduce_scatter and allgather rotate by -1 so that the chunk rank r owns after the
/// reduce-scatter phase (ring chunk r + 1) is memory block r, as MPI places it.
struct ring_geometry {
  comm_shape shape;
  std::size_t count = 0;
  int rotation = 0;
  int p() const { return shape.size; }
  std::size_t block_begin(int block) const { return std::size_t(block) * count / std::size_t(p()); }
  std::size_t begin(int chunk) const { return block_begin(wrap(chunk + rotation)); }
  std::size_t size(int chunk) const {
    const int block = wrap(chunk + rotation);
    return block_begin(block + 1) - block_begin(block);
  }
  int wrap(int i) const { return ((i % p()) + p()) % p(); }
  int right() const { return wrap(shape.rank + 1); }
  int left() const { return wrap(shape.rank - 1); }
  std::size_t largest() const {
    std::size_t n = 0;
    for (int c = 0; c < p(); ++c) n = std::max(n, size(c));
    return n;
  }
};

/// The two phases' steps. Reduce-scatter step s (0 .. p-2) sends chunk rank - s and receives
/// rank - s - 1; allgather step s sends chunk rank + 1 - s and receives rank - s. Each hop's
/// message is cut into pieces (comm/detail/pipeline.hpp): piece i of a ring chunk is its own
/// stream or raw values and its own MPI message, so that encoding piece i+1, sending piece i
/// and decoding (and adding) the pieces that came in overlap within one hop.
template <class T, class Exec>
class ring_phases {
 public:
  ring_phases(const Exec& exec, ring_geometry geometry, wire_rule rule, compress_options codec, workspace_slot& slot,
              const T* input, T* output)
      : exec_(exec), ring_(geometry), rule_(rule), codec_(codec), slot_(slot), output_(output) {
    const std::size_t largest = ring_.largest();
    // send: one hop's pieces; receive: one hop's arrival, then every final chunk (raw size
    // each); decode: the partial sums (the input may be the output), then one decoded hop.
    const chunk_plan widest = plan(largest);
    piece_room_ = max_compressed_size<T>(widest.chunk, codec_.block_size);
    slot_.reserve(std::max<std::size_t>(1, widest.count()) * piece_room_, (largest + ring_.count) * sizeof(T),
                  (ring_.count + largest) * sizeof(T));
    sums_ = reinterpret_cast<T*>(slot_.decode.data());
    incoming_ = sums_ + ring_.count;
    hop_ = slot_.receive.data();
    finals_ = slot_.receive.data() + largest * sizeof(T);
    final_length_.resize(std::size_t(ring_.p()));
    for (int c = 0; c < ring_.p(); ++c) final_length_[std::size_t(c)].assign(plan(ring_.size(c)).count(), 0);
    if (input) std::memcpy(sums_, input, ring_.count * sizeof(T));
  }

  /// How a ring chunk of `values` elements is cut: the same on both sides of a hop, from the
  /// agreed per-hop size.
  chunk_plan plan(std::size_t values) const {
    return rule_.plan(values, sizeof(T), ring_.count * sizeof(T) / std::size_t(ring_.p()));
  }
  chunk_plan plan_of(int chunk) const { return plan(ring_.size(chunk)); }

  /// This rank's chunk (ring chunk rank + 1, the one it owns at the allgather phase): with a
  /// null input, allgather loads its contribution here; reduce_scatter reads its result here.
  T* own_chunk() { return sums_ + ring_.begin(allgather_sent(0)); }
  std::size_t own_size() const { return ring_.size(allgather_sent(0)); }

  // --- reduce-scatter ---------------------------------------------------------------------
  int reduce_scatter_sent(int s) const { return ring_.wrap(ring_.shape.rank - s); }
  int reduce_scatter_received(int s) const { return ring_.wrap(ring_.shape.rank - s - 1); }
  std::span<const std::byte> reduce_scatter_send(int s, std::size_t piece) {
    const int chunk = reduce_scatter_sent(s);
    const chunk_plan pieces = plan_of(chunk);
    std::byte* const out = slot_.send.data() + piece * piece_room_;
    const std::size_t length = encode(sums_ + ring_.begin(chunk) + pieces.begin(piece), pieces.size(piece), out);
    return {out, length};
  }
  std::byte* reduce_scatter_target(int) { return hop_; }
  void reduce_scatter_arrived(int s, std::size_t piece, std::size_t length, const char* who) {
    const int chunk = reduce_scatter_received(s);
    const chunk_plan pieces = plan_of(chunk);
    const std::size_t n = pieces.size(piece), at = pieces.begin(piece);
    decode_message(exec_, hop_ + at * sizeof(T), length, n, incoming_ + at, who);
    T* const sums = sums_ + ring_.begin(chunk) + at;
    const T* const incoming = incoming_ + at;
    Kokkos::parallel_for("kompress::allreduce::add", Kokkos::RangePolicy<Exec>(exec_, 0, n),
                         KOKKOS_LAMBDA(std::size_t i) { sums[i] += incoming[i]; });
    exec_.fence("kompress::allreduce: partial sum added");
  }

  // --- allgather --------------------------------------------------------------------------
  int allgather_sent(int s) const { return ring_.wrap(ring_.shape.rank + 1 - s); }
  int allgather_received(int s) const { return ring_.wrap(ring_.shape.rank - s); }
  std::span<const std::byte> allgather_send(int s, std::size_t piece, const char* who) {
    const int chunk = allgather_sent(s);
    const chunk_plan pieces = plan_of(chunk);
    std::byte* const slot = finals_ + (ring_.begin(chunk) + pieces.begin(piece)) * sizeof(T);
    std::size_t& length = final_length_[std::size_t(chunk)][piece];
    if (s == 0) {
      // This rank owns the final value of chunk rank + 1: compress it once; every rank, this
      // one included, decodes these same bytes.
      std::byte* const out = slot_.send.data() + piece * piece_room_;
      length = encode(sums_ + ring_.begin(chunk) + pieces.begin(piece), pieces.size(piece), out);
      std::memcpy(slot, out, length);
      decode_message(exec_, slot, length, pieces.size(piece), output_ + ring_.begin(chunk) + pieces.begin(piece), who);
    }
    return {slot, length};
  }
  std::byte* allgather_target(int s) { return finals_ + ring_.begin(allgather_received(s)) * sizeof(T); }
  void allgather_arrived(int s, std::size_t piece, std::size_t length, const char* who) {
    const int chunk = allgather_received(s);
    const chunk_plan pieces = plan_of(chunk);
    final_length_[std::size_t(chunk)][piece] = length;
    decode_message(exec_, allgather_target(s) + pieces.begin(piece) * sizeof(T), length, pieces.size(piece),
                   output_ + ring_.begin(chunk) + pieces.begin(piece), who);
  }

  const ring_geometry& geometry() const { return ring_; }

 private:
  /// The message for `count` values: a stream in `out` when the wire rule says so, else the
  /// raw values copied there.
  std::size_t encode(const T* values, std::size_t count, std::byte* out) {
    const std::size_t raw = count * sizeof(T);
    if (rule_.may_compress(ring_.count * sizeof(T) / std::size_t(ring_.p())) && count > 0) {
      const std::size_t length = compress(exec_, host_values<const T>(values, count),
                                          host_bytes(out, max_compressed_size<T>(count, codec_.block_size)), codec_);
      if (rule_.send_compressed(raw, length)) return length;
    }
    std::memcpy(out, values, raw);
    return raw;
  }

  Exec exec_;
  ring_geometry ring_;
  wire_rule rule_;
  compress_options codec_;  ///< the bound already the per-hop absolute bound
  workspace_slot& slot_;
  T* output_;
  T *sums_ = nullptr, *incoming_ = nullptr;
  std::byte *hop_ = nullptr, *finals_ = nullptr;
  std::size_t piece_room_ = 0;                          ///< send staging per piece
  std::vector<std::vector<std::size_t>> final_length_;  ///< per ring chunk, per piece
};

/// Which phases a ring operation runs.
enum class ring_schedule {
  allreduce,       ///< reduce-scatter, then allgather
  reduce_scatter,  ///< reduce-scatter only; the own chunk's sum is copied to the output
  allgather,       ///< allgather only; `input` is this rank's own chunk (own_size() values)
};

/// One hop in flight at a time over the phases the schedule names.
template <class T, class Exec>
class ring_allreduce_operation final : public operation {
 public:
  ring_allreduce_operation(const Exec& exec, ring_geometry geometry, wire_rule rule, compress_options codec,
                           double result_bound, const T* input, T* output, workspace_slot* leased, MPI_Comm comm,
                           bool nonblocking, const char* who, ring_schedule schedule = ring_schedule::allreduce)
      : who_(who), schedule_(schedule), output_(output), scratch_(leased, comm, nonblocking, who),
        phases_(exec, geometry, rule, codec, *scratch_, schedule == ring_schedule::allgather ? nullptr : input,
                output) {
    if (schedule_ == ring_schedule::allgather) std::memcpy(phases_.own_chunk(), input, phases_.own_size() * sizeof(T));
    report_.absolute_bound = result_bound;
    if (total_steps() > 0) start_step();
    else finish();
  }

  bool progress(bool block) override {
    while (step_ < total_steps()) {
      // The arrivals may come in one call and the sends' completion in a later one.
      if (!posted_->progress(block, who_, [&](int piece, std::size_t bytes) { arrived(piece, bytes); })) return false;
      ++step_;
      if (step_ < total_steps()) start_step();
      else finish();
    }
    return true;
  }

  const collective_report& report() const override { return report_; }

 private:
  int phase_steps() const { return phases_.geometry().p() - 1; }
  int total_steps() const { return schedule_ == ring_schedule::allreduce ? 2 * phase_steps() : phase_steps(); }
  bool scatter(int step) const {
    return schedule_ == ring_schedule::reduce_scatter || (schedule_ == ring_schedule::allreduce && step < phase_steps());
  }
  int gather_step(int step) const { return schedule_ == ring_schedule::allreduce ? step - phase_steps() : step; }

  /// reduce_scatter: the own chunk's sum is the result (the last arrival was added to it).
  void finish() {
    if (schedule_ == ring_schedule::reduce_scatter && phases_.own_size() > 0)
      std::memcpy(output_, phases_.own_chunk(), phases_.own_size() * sizeof(T));
  }

  /// Piece `piece` of this step's incoming chunk arrived, `bytes` long.
  void arrived(int piece, std::size_t bytes) {
    if (scatter(step_)) phases_.reduce_scatter_arrived(step_, std::size_t(piece), bytes, who_);
    else phases_.allgather_arrived(gather_step(step_), std::size_t(piece), bytes, who_);
  }

  /// Posts this step's receives (one per piece), then encodes and sends the outgoing pieces
  /// one by one, decoding arrivals between them.
  void start_step() {
    const ring_geometry& ring = phases_.geometry();
    const bool scatter = this->scatter(step_);
    const int s = scatter ? step_ : gather_step(step_);
    const int out_chunk = scatter ? phases_.reduce_scatter_sent(s) : phases_.allgather_sent(s);
    const int in_chunk = scatter ? phases_.reduce_scatter_received(s) : phases_.allgather_received(s);
    posted_.emplace();  // the previous step's requests have all completed
    post_chunk_receives(*posted_, phases_.plan_of(in_chunk), sizeof(T),
                        scatter ? phases_.reduce_scatter_target(s) : phases_.allgather_target(s), ring.left(),
                        scratch_->comm, who_, [](std::size_t piece) { return int(piece); });
    const chunk_plan pieces = phases_.plan_of(out_chunk);
    bool compressed = false;
    send_chunks(
        *posted_, pieces, ring.right(), scratch_->comm, who_,
        [&](std::size_t piece) {
          const std::span<const std::byte> payload =
              scatter ? phases_.reduce_scatter_send(s, piece) : phases_.allgather_send(s, piece, who_);
          // Shorter than the raw values means a stream: allgather hops forward streams too.
          compressed = compressed || payload.size() < pieces.size(piece) * sizeof(T);
          report_.wire_bytes += payload.size();
          ++report_.chunks;
          return payload;
        },
        [&] { posted_->progress(false, who_, [&](int piece, std::size_t bytes) { arrived(piece, bytes); }); });
    report_.payload_bytes += ring.size(out_chunk) * sizeof(T);
    if (compressed) ++report_.compressed_messages;
    ++report_.messages;
  }

  const char* who_;
  ring_schedule schedule_;
  T* output_;
  call_scratch scratch_;
  ring_phases<T, Exec> phases_;
  int step_ = 0;
  collective_report report_;
  std::optional<posted_messages> posted_;  // last: completed or cancelled before the buffers go
};

}  // namespace kompress::inline v0::detail
