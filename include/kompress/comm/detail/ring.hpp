#pragma once
// The engine behind allreduce: a ring of two phases over p chunks. The reduce-scatter phase
// carries compressed partial sums (decompress, add, recompress) until rank r holds the sum of
// chunk r+1; the allgather phase compresses each final chunk once on its owner and forwards
// those bytes unchanged, so every rank decodes the same bytes and ends bit-identical.
// allreduce chains the two; a reduce_scatter or allgather is one phase alone. The codec and
// the adds run on the call's execution space, in its memory (host or device), and the hops
// reach MPI through the transport seam (comm/detail/transport.hpp), directly or staged.
// docs/collectives.md gives the schedule and the error argument.

#include <kompress/comm/detail/engine.hpp>
#include <kompress/comm/detail/homomorphic.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>
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

/// What a ring operation does beyond the recompressing sum: the homomorphic reduction (the
/// grid every rank quantizes on; comm/detail/homomorphic.hpp) and error measurement.
struct ring_extras {
  std::optional<code_grid> homomorphic;
  bool measure_error = false;
};

/// The two phases' steps. Reduce-scatter step s (0 .. p-2) sends chunk rank - s and receives
/// rank - s - 1; allgather step s sends chunk rank + 1 - s and receives rank - s. Each hop's
/// message is cut into pieces (comm/detail/pipeline.hpp): piece i of a ring chunk is its own
/// stream or raw values and its own MPI message, so that encoding piece i+1, sending piece i
/// and decoding (and adding) the pieces that came in overlap within one hop. Its scratch is in
/// the execution space's memory; the homomorphic reduction needs host memory.
template <class T, class Exec>
class ring_phases {
  using memory = typename Exec::memory_space;
  /// The homomorphic reduction runs on the host; for device memory the callers refuse it first.
  using homomorphic_exec = std::conditional_t<host_memory_space<memory>, Exec, Kokkos::DefaultHostExecutionSpace>;

 public:
  /// `input`: this rank's values, all `count` of them, or with `gathers_only` (allgather) its
  /// own chunk's. The ring reads them where they are (no copy into scratch) until a chunk
  /// holds a sum; the homomorphic reduction quantizes from a copy in the sums.
  ring_phases(const Exec& exec, ring_geometry geometry, wire_rule rule, compress_options codec, workspace_slot& slot,
              const T* input, T* output, const ring_extras& extras = {}, bool gathers_only = false)
      : exec_(exec), ring_(geometry), rule_(rule), codec_(codec), slot_(slot), output_(output), input_(input),
        input_begin_(gathers_only ? ring_.begin(allgather_sent(0)) : 0), gathers_only_(gathers_only) {
    const std::size_t largest = ring_.largest();
    // send: one hop's pieces; receive: one hop's arrival, then every final chunk (raw size
    // each); decode: the partial sums (the input may be the output), then one decoded hop,
    // then the homomorphic reduction's scratch.
    const chunk_plan widest = plan(largest);
    // Rounded to 8 bytes: the homomorphic reduction stages raw values there.
    piece_room_ = (max_compressed_size<T>(widest.chunk, codec_) + 7) / 8 * 8;
    const std::size_t sums_bytes = (ring_.count + largest) * sizeof(T);
    const std::size_t homomorphic_bytes =
        extras.homomorphic
            ? homomorphic_sums<T, homomorphic_exec>::scratch_bytes(ring_.count, widest.chunk, codec_.block_size) + 8
            : 0;
    send_room_ = std::max<std::size_t>(1, widest.count()) * piece_room_;
    receive_room_ = (largest + ring_.count) * sizeof(T);
    const scratch_room room =
        slot_.template reserve_in<memory>(send_room_, receive_room_, sums_bytes + homomorphic_bytes);
    send_ = room.send;
    sums_ = reinterpret_cast<T*>(room.decode);
    incoming_ = sums_ + ring_.count;
    hop_ = room.receive;
    finals_ = room.receive + largest * sizeof(T);
    final_length_.resize(std::size_t(ring_.p()));
    for (int c = 0; c < ring_.p(); ++c) final_length_[std::size_t(c)].assign(plan(ring_.size(c)).count(), 0);
    // --- homomorphic reduction hook (comm/detail/homomorphic.hpp): it reads the input there ---
    if (extras.homomorphic) {
      if constexpr (host_memory_space<memory>) {
        std::memcpy(sums_, input, ring_.count * sizeof(T));
        homomorphic_.emplace(exec_, *extras.homomorphic, codec_.block_size, ring_.count, widest.chunk, sums_,
                             room.decode + (sums_bytes + 7) / 8 * 8);
      } else {
        throw invalid_argument("kompress: the homomorphic reduction runs on host memory only");
      }
    }
    if (extras.measure_error) {
      max_error_ = 0.0;
      if (homomorphic_) homomorphic_->measure();
    }
  }

  /// The largest error this rank's compressions introduced (NaN unless measured).
  double max_error() const { return homomorphic_ ? homomorphic_->max_error() : max_error_; }

  /// reduce_scatter's result: this rank's chunk once the last arrival was added.
  const T* own_result() {
    if (homomorphic_) {  // the codes of each piece, as they were added
      const int own = allgather_sent(0);
      const chunk_plan pieces = plan_of(own);
      for (std::size_t piece = 0; piece < pieces.count(); ++piece)
        homomorphic_->values(ring_.begin(own) + pieces.begin(piece), pieces.size(piece),
                             own_chunk() + pieces.begin(piece));
    }
    return own_chunk();
  }

  /// How a ring chunk of `values` elements is cut: the same on both sides of a hop, from the
  /// agreed per-hop size.
  chunk_plan plan(std::size_t values) const {
    return rule_.plan(values, sizeof(T), ring_.count * sizeof(T) / std::size_t(ring_.p()));
  }
  chunk_plan plan_of(int chunk) const { return plan(ring_.size(chunk)); }

  /// The scratch one hop sends from (piece i at i * piece_room()) and receives into (the
  /// targets below, at their offset from receive_base()), in bytes.
  std::size_t send_room() const { return send_room_; }
  std::size_t receive_room() const { return receive_room_; }
  std::size_t piece_room() const { return piece_room_; }
  const std::byte* receive_base() const { return hop_; }

  /// This rank's chunk (ring chunk rank + 1, the one it owns at the allgather phase):
  /// reduce_scatter reads its result here.
  T* own_chunk() { return sums_ + ring_.begin(allgather_sent(0)); }
  std::size_t own_size() const { return ring_.size(allgather_sent(0)); }

  // --- reduce-scatter ---------------------------------------------------------------------
  int reduce_scatter_sent(int s) const { return ring_.wrap(ring_.shape.rank - s); }
  int reduce_scatter_received(int s) const { return ring_.wrap(ring_.shape.rank - s - 1); }
  std::span<const std::byte> reduce_scatter_send(int s, std::size_t piece) {
    const int chunk = reduce_scatter_sent(s);
    const chunk_plan pieces = plan_of(chunk);
    std::byte* const out = send_ + piece * piece_room_;
    // Step 0 sends this rank's own values; later steps the sums formed on arrival.
    const std::size_t length = encode_span(ring_.begin(chunk) + pieces.begin(piece), pieces.size(piece), s > 0, out);
    return {out, length};
  }
  std::byte* reduce_scatter_target(int) { return hop_; }
  void reduce_scatter_arrived(int s, std::size_t piece, std::size_t length, const char* who) {
    const int chunk = reduce_scatter_received(s);
    const chunk_plan pieces = plan_of(chunk);
    const std::size_t n = pieces.size(piece), at = pieces.begin(piece);
    if (homomorphic_) {  // --- homomorphic reduction hook: codes added as they arrive ---
      homomorphic_->add(ring_.begin(chunk) + at, n, hop_ + at * sizeof(T), length, who);
      return;
    }
    decode_message<memory>(exec_, hop_ + at * sizeof(T), length, n, incoming_ + at, who);
    // The first (and only) arrival of this chunk at this rank: its sum is born here.
    T* const sums = sums_ + ring_.begin(chunk) + at;
    const T* const own = contribution(ring_.begin(chunk) + at);
    const T* const incoming = incoming_ + at;
    Kokkos::parallel_for("kompress::allreduce::add", Kokkos::RangePolicy<Exec>(exec_, 0, n),
                         KOKKOS_LAMBDA(std::size_t i) { sums[i] = own[i] + incoming[i]; });
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
      std::byte* const out = send_ + piece * piece_room_;
      length = encode_span(ring_.begin(chunk) + pieces.begin(piece), pieces.size(piece), !gathers_only_, out);
      copy_values<memory>(exec_, slot, static_cast<const std::byte*>(out), length);
      decode_final(slot, length, ring_.begin(chunk) + pieces.begin(piece), pieces.size(piece), who);
    }
    return {slot, length};
  }
  std::byte* allgather_target(int s) { return finals_ + ring_.begin(allgather_received(s)) * sizeof(T); }
  void allgather_arrived(int s, std::size_t piece, std::size_t length, const char* who) {
    const int chunk = allgather_received(s);
    const chunk_plan pieces = plan_of(chunk);
    final_length_[std::size_t(chunk)][piece] = length;
    decode_final(allgather_target(s) + pieces.begin(piece) * sizeof(T), length,
                 ring_.begin(chunk) + pieces.begin(piece), pieces.size(piece), who);
  }

  const ring_geometry& geometry() const { return ring_; }

 private:
  /// The message for `count` values: a stream in `out` when the wire rule says so, else the
  /// raw values copied there.
  std::size_t encode(const T* values, std::size_t count, std::byte* out) {
    // measuring: the stream is decoded into incoming_, free while sending
    return encode_message<memory>(exec_, rule_, codec_, may_compress(), values, count, out, incoming_, max_error_);
  }
  bool may_compress() const { return rule_.may_compress(ring_.count * sizeof(T) / std::size_t(ring_.p())); }

  /// The message for the values [begin, begin + count) of the sums in `out`: `reduced` when
  /// they hold sums (an arrival was added), else this rank's own values.
  std::size_t encode_span(std::size_t begin, std::size_t count, bool reduced, std::byte* out) {
    if (homomorphic_)  // --- homomorphic reduction hook ---
      return homomorphic_->encode(begin, count, reduced, may_compress(), rule_, out);
    return encode(reduced ? sums_ + begin : contribution(begin), count, out);
  }
  /// This rank's own values from position `begin` of the whole message on.
  const T* contribution(std::size_t begin) const { return input_ + (begin - input_begin_); }
  /// Decodes a message of final values [begin, begin + count) into the output.
  void decode_final(const std::byte* in, std::size_t length, std::size_t begin, std::size_t count, const char* who) {
    if (homomorphic_) homomorphic_->decode(in, length, count, output_ + begin, who);  // --- homomorphic hook ---
    else decode_message<memory>(exec_, in, length, count, output_ + begin, who);
  }

  Exec exec_;
  ring_geometry ring_;
  wire_rule rule_;
  compress_options codec_;  ///< the bound already the per-hop absolute bound
  workspace_slot& slot_;
  T* output_;
  const T* input_;                ///< this rank's values (never written)
  std::size_t input_begin_ = 0;   ///< the position of input_[0] in the whole message
  bool gathers_only_ = false;     ///< allgather: input_ is the own chunk, no sums are formed
  T *sums_ = nullptr, *incoming_ = nullptr;
  std::byte *send_ = nullptr, *hop_ = nullptr, *finals_ = nullptr;
  std::size_t piece_room_ = 0;                          ///< send scratch per piece
  std::size_t send_room_ = 0, receive_room_ = 0;
  std::vector<std::vector<std::size_t>> final_length_;  ///< per ring chunk, per piece
  double max_error_ = NAN;                              ///< measured when not NaN
  std::optional<homomorphic_sums<T, homomorphic_exec>> homomorphic_;
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
                           bool nonblocking, transport how, const char* who,
                           ring_schedule schedule = ring_schedule::allreduce, const ring_extras& extras = {})
      : exec_(exec), who_(who), how_(how), schedule_(schedule), input_(input), output_(output),
        scratch_(leased, comm, nonblocking, who),
        phases_(exec, geometry, rule, codec, *scratch_, input, output, extras, schedule == ring_schedule::allgather) {
    report_.absolute_bound = result_bound;
    if (how_.staged) scratch_->reserve_staging(phases_.send_room(), phases_.receive_room());
    if (total_steps() > 0) start_step();
    else finish();
  }

  /// After a failure every later step still runs, its messages abort markers (so the abort
  /// travels the ring hop by hop and every receive is matched); then it throws (again on each
  /// call).
  bool progress(bool block) override {
    while (step_ < total_steps()) {
      // The arrivals may come in one call and the sends' completion in a later one.
      if (!posted_->progress(block, who_, [&](int piece, std::size_t bytes) { arrived(piece, bytes); })) return false;
      ++step_;
      if (step_ < total_steps()) start_step();
      else finish();
    }
    if (failure_.aborting()) failure_.raise(who_);
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

  /// reduce_scatter: the own chunk's sum is the result (the last arrival was added to it). One
  /// rank (staged calls take the ring there too): the result is the input.
  void finish() {
    if (failure_.aborting()) return;
    using memory = typename Exec::memory_space;
    const std::size_t count = phases_.geometry().count;
    if (phases_.geometry().p() == 1) {
      if (input_ != output_) copy_values<memory>(exec_, output_, input_, count);
    } else if (schedule_ == ring_schedule::reduce_scatter && phases_.own_size() > 0) {
      copy_values<memory>(exec_, output_, static_cast<const T*>(phases_.own_result()), phases_.own_size());
    }
    exec_.fence("kompress: ring result in place");
    report_.max_error = phases_.max_error();
  }

  /// Where this step's incoming piece `piece` lands (in the execution space's memory).
  std::byte* landing(int piece) const { return receive_target_ + incoming_.begin(std::size_t(piece)) * sizeof(T); }
  /// The host staging twin of a receive address (the same offset from the scratch's start).
  std::byte* staged_twin(const std::byte* target) const {
    return scratch_->staged_receive.data() + (target - phases_.receive_base());
  }

  /// Piece `piece` of this step's incoming chunk arrived, `bytes` long.
  void arrived(int piece, std::size_t bytes) {
    if (how_.staged) {
      std::byte* const landed = landing(piece);
      stage_in(exec_, landed, staged_twin(landed), bytes);
    }
    if (scatter(step_)) phases_.reduce_scatter_arrived(step_, std::size_t(piece), bytes, who_);
    else phases_.allgather_arrived(gather_step(step_), std::size_t(piece), bytes, who_);
  }

  /// What MPI sends for outgoing piece `piece`: the payload, or its copy in host staging.
  std::span<const std::byte> to_mpi(std::size_t piece, std::span<const std::byte> payload) {
    if (!how_.staged) return payload;
    std::byte* const staged = scratch_->staged_send.data() + piece * phases_.piece_room();
    stage_out(exec_, staged, payload.data(), payload.size());
    return {staged, payload.size()};
  }

  /// Posts this step's receives (one per piece), then encodes and sends the outgoing pieces
  /// one by one, decoding arrivals between them.
  void start_step() {
    const ring_geometry& ring = phases_.geometry();
    const bool scatter = this->scatter(step_);
    const int s = scatter ? step_ : gather_step(step_);
    const int out_chunk = scatter ? phases_.reduce_scatter_sent(s) : phases_.allgather_sent(s);
    const int in_chunk = scatter ? phases_.reduce_scatter_received(s) : phases_.allgather_received(s);
    posted_.emplace(failure_);  // the previous step's requests have all completed
    receive_target_ = scatter ? phases_.reduce_scatter_target(s) : phases_.allgather_target(s);
    incoming_ = phases_.plan_of(in_chunk);
    post_chunk_receives(*posted_, incoming_, sizeof(T), how_.staged ? staged_twin(receive_target_) : receive_target_,
                        ring.left(), scratch_->comm, who_, [](std::size_t piece) { return int(piece); });
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
          return to_mpi(piece, payload);
        },
        [&] { posted_->progress(false, who_, [&](int piece, std::size_t bytes) { arrived(piece, bytes); }); });
    report_.payload_bytes += ring.size(out_chunk) * sizeof(T);
    if (compressed) ++report_.compressed_messages;
    ++report_.messages;
  }

  Exec exec_;
  const char* who_;
  transport how_;
  ring_schedule schedule_;
  const T* input_;
  T* output_;
  call_scratch scratch_;
  ring_phases<T, Exec> phases_;
  int step_ = 0;
  std::byte* receive_target_ = nullptr;  ///< where this step's arrivals land
  chunk_plan incoming_{};                ///< how this step's arrival is cut
  collective_report report_;
  call_failure failure_;                   ///< shared by every step's requests
  std::optional<posted_messages> posted_;  // last: completed (or cancelled) before the buffers go
};

}  // namespace kompress::inline v0::detail
