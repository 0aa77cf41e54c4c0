#pragma once
// The butterfly schedules: recursive halving, then recursive doubling (Rabenseifner's
// algorithm), for p' = 2^k core ranks, with the r = p - p' extra ranks folded in first and
// handed their part last. allreduce runs both phases, reduce_scatter the halving alone,
// allgather the doubling alone. The same bytes as the ring in k steps per phase instead of
// p - 1: what wins where a step's latency and the codec's per-call cost add up, at many ranks
// or small messages.
//
//   fold     (r > 0) rank 2i (i < r) sends rank 2i+1 its whole vector (allreduce,
//            reduce_scatter: rank 2i+1 adds it) or its own block's stream (allgather); rank
//            2i+1 stands in the core for both, and rank 2i waits for the end.
//   halve    step j of k: core rank c and its partner split the values they both still hold
//            partial sums of; each sends the half it gives up (compressed once) and adds the
//            half it keeps. allreduce pairs the nearest first (c ^ 2^j): its largest halves
//            travel between neighbouring ranks, which MPI launchers place on one node, and only
//            the small ones between nodes (as MPICH's allreduce orders them); core rank c ends
//            with the sums of block c' (c's k bits reversed). reduce_scatter pairs the farthest
//            first (c ^ 2^(k-1-j)) and ends with its own group of rank blocks, a stretch of the
//            vector that nearest first would leave elsewhere.
//   double   step j of k, allreduce's halving undone (c ^ 2^(k-1) first): c and its partner
//            swap the final streams of the positions they hold (allgather: c's group at c').
//            A block's stream is compressed once (allreduce: by the core rank holding its sum;
//            allgather: by the rank it belongs to); every rank forwards and decodes those same
//            bytes, so every rank ends bit-identical.
//   unfold   (r > 0) rank 2i+1 sends rank 2i every final stream it lacks (allreduce,
//            allgather) or the sum of block 2i, compressed once (reduce_scatter).
//
// Error: a value's sum is built along a tree whose p - 1 edges are partial sums, each
// compressed once (the fold's r edges and the halving's p' - 1): allreduce compresses it once
// more as a final value (p e, the ring's bound), reduce_scatter only for a folded rank's block
// (p - 1 e, the ring's, where p is a power of two; p e otherwise). allgather compresses each
// block once (e). allreduce's blocks are the p' blocks of the vector; reduce_scatter's and
// allgather's the p blocks of MPI's placement, grouped two to a core rank where folded.
// Messages are cut into pieces as the ring's are (comm/detail/pipeline.hpp), each piece of a
// halving range or of a final block its own stream and its own MPI message. docs/collectives.md
// ("Schedules") gives the choice between the schedules, docs/scale.md the measurements.

#include <kompress/comm/detail/engine.hpp>
#include <kompress/comm/options.hpp>

#include <mpi.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace kompress::inline v0::detail {

/// The collective a butterfly schedule runs: which phases, and how its vector is blocked.
enum class butterfly_collective { allreduce, reduce_scatter, allgather };

/// Which ranks take part where: the core of p' = 2^floor(log2 p) ranks and the r folded ones,
/// and the blocks of the vector of `count` values (allreduce's n; reduce_scatter's send and
/// allgather's receive View, p blocks each).
struct butterfly_geometry {
  comm_shape shape;
  std::size_t count = 0;
  butterfly_collective collective = butterfly_collective::allreduce;

  int core_size() const { return int(std::bit_floor(unsigned(shape.size))); }
  int extra() const { return shape.size - core_size(); }
  /// Ranks 2i and 2i+1 (i < r) are folded: the odd one stands in the core for both.
  bool folded_out(int rank) const { return rank < 2 * extra() && rank % 2 == 0; }
  bool folds(int rank) const { return rank < 2 * extra(); }
  int core_rank(int rank) const { return rank < 2 * extra() ? rank / 2 : rank - extra(); }
  int rank_of_core(int core) const { return core < extra() ? 2 * core + 1 : core + extra(); }
  bool reduces() const { return collective != butterfly_collective::allgather; }
  bool gathers() const { return collective != butterfly_collective::reduce_scatter; }
  /// The blocks final streams travel in: allreduce's p' core blocks, else MPI's p rank blocks.
  int block_count() const { return collective == butterfly_collective::allreduce ? core_size() : shape.size; }
  std::size_t block_begin(int block) const {
    return std::size_t(block) * count / std::size_t(block_count());
  }
  /// The first rank block of core rank `core`'s group (core_size() for the end): the ranks it
  /// stands for (reduce_scatter, allgather).
  int group_begin(int core) const { return core < extra() ? 2 * core : core + extra(); }

  int levels() const { return std::countr_zero(unsigned(core_size())); }
  /// Whether the halving pairs the nearest core ranks first (allreduce; allgather's doubling
  /// undoes such a halving) or the farthest (reduce_scatter, whose core rank c must end with
  /// its own group: the vector's c-th stretch, where nearest first leaves it another).
  bool nearest_first() const { return collective != butterfly_collective::reduce_scatter; }
  /// The position core rank `core` holds after the halving (and starts the doubling from): its
  /// levels() bits reversed where the nearest pair first, else `core`. Its own inverse: also
  /// the core rank that holds position `core`.
  int position_of(int core) const {
    if (!nearest_first()) return core;
    unsigned reversed = 0;
    for (int bit = 0; bit < levels(); ++bit) reversed |= ((unsigned(core) >> bit) & 1u) << (levels() - 1 - bit);
    return int(reversed);
  }
  /// The blocks at position q are [first_block_at(q), end_block_at(q)): allreduce's block q of
  /// the vector, the others' the group of rank blocks of core rank position_of(q).
  int first_block_at(int q) const {
    return collective == butterfly_collective::allreduce ? q : group_begin(position_of(q));
  }
  int end_block_at(int q) const {
    return collective == butterfly_collective::allreduce ? q + 1 : group_begin(position_of(q) + 1);
  }
  /// The blocks of a final step's positions [begin, end), in the order they travel, less `skip`.
  std::vector<int> final_blocks(std::size_t begin, std::size_t end, int skip) const {
    std::vector<int> blocks;
    for (int q = int(begin); q < int(end); ++q)
      for (int block = first_block_at(q); block < end_block_at(q); ++block)
        if (block != skip) blocks.push_back(block);
    return blocks;
  }
  /// Where position q's values start in the vector (count for q = core_size()): the reduce
  /// steps' positions are contiguous stretches of it, in order.
  std::size_t values_at(int q) const { return q >= core_size() ? count : block_begin(first_block_at(q)); }
};

/// One step of one rank: what it sends to whom and what it receives from whom. Reduce steps
/// (fold, halve) move a value range [begin, end) of partial sums; final steps (double, unfold,
/// allgather's fold) the final streams of the blocks at the positions [begin, end), less block
/// `skip`.
struct butterfly_step {
  bool reduces = true;
  int send_peer = -1, receive_peer = -1;  ///< -1: nothing that way
  std::size_t send_begin = 0, send_end = 0, receive_begin = 0, receive_end = 0;
  bool reads_input = false;  ///< a reduce step on this rank's own values, before any sum was formed
  int skip = -1;             ///< a final step's block of those positions that does not travel
};

/// The steps rank `geometry.shape.rank` runs, in order.
inline std::vector<butterfly_step> butterfly_steps(const butterfly_geometry& geometry) {
  std::vector<butterfly_step> steps;
  const int rank = geometry.shape.rank, core_size = geometry.core_size();
  const bool folding = geometry.folds(rank), folded_out = geometry.folded_out(rank);
  const auto values = [&](int position) { return geometry.values_at(position); };
  const int core = geometry.core_rank(rank);
  const auto own_position = std::size_t(geometry.position_of(core));
  const auto all_positions = std::size_t(core_size);
  if (folding) {
    // A folded pair shares a core rank, so a position: the block of the pair's other rank skips.
    const int partner = folded_out ? rank + 1 : rank - 1;
    butterfly_step fold{.reduces = geometry.reduces(), .reads_input = geometry.reduces()};
    const std::size_t begin = geometry.reduces() ? 0 : own_position;
    const std::size_t end = geometry.reduces() ? geometry.count : own_position + 1;
    if (!geometry.reduces()) fold.skip = folded_out ? partner : rank;
    if (folded_out) fold.send_peer = partner, fold.send_begin = begin, fold.send_end = end;
    else fold.receive_peer = partner, fold.receive_begin = begin, fold.receive_end = end;
    steps.push_back(fold);
    if (folded_out) {
      butterfly_step unfold{.reduces = false, .receive_peer = partner, .receive_end = all_positions};
      if (geometry.collective == butterfly_collective::allgather) unfold.skip = rank;
      if (geometry.collective == butterfly_collective::reduce_scatter)
        unfold.receive_begin = own_position, unfold.receive_end = own_position + 1, unfold.skip = partner;
      steps.push_back(unfold);
      return steps;
    }
  }
  if (geometry.reduces()) {
    int low = 0, held = core_size;  // the positions [low, low + held) this rank holds partial sums of
    for (int level = 0; level < geometry.levels(); ++level) {
      const int d = geometry.nearest_first() ? 1 << level : core_size >> (level + 1);
      held /= 2;
      const bool keeps_upper = (core & d) != 0;
      const int kept = keeps_upper ? low + held : low, given = keeps_upper ? low : low + held;
      const int peer = geometry.rank_of_core(core ^ d);
      steps.push_back({.send_peer = peer,
                       .receive_peer = peer,
                       .send_begin = values(given),
                       .send_end = values(given + held),
                       .receive_begin = values(kept),
                       .receive_end = values(kept + held),
                       .reads_input = level == 0 && !folding});
      low = kept;
    }
  }
  if (geometry.gathers()) {
    for (int level = geometry.levels() - 1; level >= 0; --level) {
      const int d = 1 << level, held = core_size >> (level + 1), peer_core = core ^ d;
      // Before this step a core rank holds the positions the halving left it after step `level`.
      const auto mine = std::size_t(geometry.position_of(core) & ~(held - 1));
      const auto theirs = std::size_t(geometry.position_of(peer_core) & ~(held - 1));
      const int peer = geometry.rank_of_core(peer_core);
      steps.push_back({.reduces = false,
                       .send_peer = peer,
                       .receive_peer = peer,
                       .send_begin = mine,
                       .send_end = mine + std::size_t(held),
                       .receive_begin = theirs,
                       .receive_end = theirs + std::size_t(held)});
    }
  }
  if (folding) {
    const int partner = rank - 1;
    butterfly_step unfold{.reduces = false, .send_peer = partner, .send_end = all_positions};
    if (geometry.collective == butterfly_collective::allgather) unfold.skip = partner;
    if (geometry.collective == butterfly_collective::reduce_scatter)
      unfold.send_begin = own_position, unfold.send_end = own_position + 1, unfold.skip = rank;
    steps.push_back(unfold);
  }
  return steps;
}

/// Whether a collective of `bytes` (the whole vector: allreduce's input, reduce_scatter's send,
/// allgather's result) on `p` ranks runs the butterfly rather than the ring: as `schedule`
/// says, or (automatic) where the cost model predicts it faster. Both move the same bytes
/// through the codec and the link; the ring takes p - 1 steps of n/p per phase, the butterfly
/// log2 p' steps of n/2 ... n/p' (p' = 2^floor(log2 p)), and where p is no power of two a fold
/// and an unfold, each of the whole vector or of one block.
inline bool takes_halving_doubling(collective_schedule schedule, const wire_rule& rule, std::uint64_t bytes, int p,
                                   butterfly_collective collective = butterfly_collective::allreduce) {
  if (schedule != collective_schedule::automatic || p <= 1) return schedule == collective_schedule::halving_doubling;
  const cost_model& cost = rule.cost;
  const auto step = [&](std::uint64_t message) { return cost.step_seconds(message, rule.may_compress(message)); };
  const bool reduces = collective != butterfly_collective::allgather;
  const bool gathers = collective != butterfly_collective::reduce_scatter;
  const int phases = int(reduces) + int(gathers);
  const double ring = phases * (p - 1) * step(bytes / std::uint64_t(p));
  const int core = int(std::bit_floor(unsigned(p)));
  double butterfly = 0.0;
  if (core < p) {
    const std::uint64_t block = bytes / std::uint64_t(p);
    butterfly += step(reduces ? bytes : block);  // fold
    butterfly += step(gathers ? bytes : block);  // unfold
  }
  for (int d = core / 2; d >= 1; d /= 2) butterfly += phases * step(bytes * std::uint64_t(d) / std::uint64_t(core));
  return butterfly < ring;
}

/// The largest message recursive halving sends for a vector of `bytes` on `p` ranks: its first
/// step's half, or where p is no power of two the fold's whole vector.
inline std::uint64_t largest_halving_bytes(std::uint64_t bytes, int p) {
  return std::has_single_bit(unsigned(p)) ? bytes / 2 : bytes;
}

/// The wire rule of the butterfly's final blocks of `block_bytes` on `p` ranks. A final block is
/// compressed once, by its owner, and its stream then crosses p - 1 links, each copy decoded, so
/// automatic mode weighs that (cost_model::worth_compressing_forwarded) and, where it pays,
/// compresses every such block as compressed mode does. Where a decompression costs more than
/// the block's bytes take (batches_decodes, as on a GPU) a rank decodes its p - 1 blocks in one
/// batch per gathering step (log2 p', and an unfold where p is no power of two), so each
/// decoding pays that share of a call. Where the halving compresses (`halving_compresses`: its
/// largest message pays), kompress's schedule runs whatever the final blocks do, and they are
/// judged without the model's floor for a message alone (cost_model::min_message_bytes): each
/// crossing is priced with its chunk's cost. Final blocks alone keep the floor: below it, the
/// per-stream costs of decoding them, which the model leaves out, lost to MPI's own call
/// (docs/scale.md, "Ranks that share a node"). Both sides of a message derive it alike.
inline wire_rule final_block_rule(const wire_rule& rule, std::uint64_t block_bytes, int p,
                                  bool halving_compresses = false) {
  wire_rule finals = rule;
  if (rule.mode != transfer_mode::automatic || p <= 1) return finals;
  const auto receivers = std::uint64_t(p - 1);
  const int core = int(std::bit_floor(unsigned(p)));
  const double steps = double(std::countr_zero(unsigned(core)) + (core < p ? 1 : 0));
  const double share = rule.cost.batches_decodes(double(block_bytes)) ? std::min(1.0, steps / double(receivers)) : 1.0;
  cost_model model = rule.cost;
  if (halving_compresses) model.min_message_bytes = 0;
  if (model.worth_compressing_forwarded(block_bytes, receivers, share)) finals.mode = transfer_mode::compressed;
  return finals;
}

/// sums[i] = own[i] + incoming[i] for i < n, on `exec` (sums may be own), and waits.
template <class Exec, class T>
void add_partial_sums(const Exec& exec, T* sums, const T* own, const T* incoming, std::size_t n) {
  Kokkos::parallel_for("kompress::allreduce::add", Kokkos::RangePolicy<Exec>(exec, 0, n),
                       KOKKOS_LAMBDA(std::size_t i) { sums[i] = own[i] + incoming[i]; });
  exec.fence("kompress::allreduce: partial sum added");
}

/// The recompressing allreduce, reduce_scatter or allgather over the butterfly; one step in
/// flight at a time, its messages cut into pieces, arrivals decoded (and added) as they come. Its
/// scratch is in the execution space's memory; the bytes reach MPI through the transport seam.
/// `input` and `output` are the collective's Views: allgather's input is this rank's block,
/// reduce_scatter's output this rank's block.
template <class T, class Exec>
class halving_doubling_operation final : public operation {
  using memory = typename Exec::memory_space;

 public:
  halving_doubling_operation(const Exec& exec, butterfly_geometry geometry, wire_rule rule, compress_options codec,
                             double result_bound, const T* input, T* output, workspace_slot* leased, MPI_Comm comm,
                             bool nonblocking, transport how, bool measure_error, const char* who)
      : exec_(exec), who_(who), how_(how), geometry_(geometry), rule_(rule), codec_(codec), input_(input),
        output_(output), scratch_(leased, comm, nonblocking, who) {
    // Where allreduce's largest halving message may be compressed, the final blocks are judged
    // without the model's floor (final_block_rule).
    halving_compresses_ = geometry_.reduces() && geometry_.gathers() &&
                          rule_.may_compress(largest_halving_bytes(geometry_.count * sizeof(T), geometry_.shape.size));
    if (geometry_.count > 0) steps_ = butterfly_steps(geometry_);  // no values: no messages
    encoded_block_ = encoded_block();
    // Where a decompression costs more than a final piece's bytes (a GPU), the final streams a
    // step brings in are decoded together when it ends (docs/collectives.md, "Decoding what
    // arrives together").
    batch_finals_ = geometry_.gathers() && geometry_.count > 0 &&
                    rule_.cost.batches_decodes(double(final_plan(block_size(0)).chunk * sizeof(T)));
    report_.absolute_bound = result_bound;
    if (measure_error) max_error_ = 0.0;
    reserve();
    if (!steps_.empty()) start_step();
    else finish();
  }

  /// After a failure every later step still runs, its messages abort markers (every receive is
  /// matched); then it throws (again on each call).
  bool progress(bool block) override {
    while (step_ < steps_.size()) {
      if (!posted_->progress(block, who_, [&](int key, std::size_t bytes) { arrived(key, bytes); })) return false;
      decode_held_finals();
      ++step_;
      if (step_ < steps_.size()) start_step();
      else finish();
    }
    if (failure_.aborting()) failure_.raise(who_);
    return true;
  }

  const collective_report& report() const override { return report_; }

 private:
  /// One MPI message of a step: `values` values at position `begin` of the vector; for a final
  /// step, piece `piece` of block `block`.
  struct message {
    std::size_t begin = 0, values = 0;
    int block = -1;
    std::size_t piece = 0;
  };

  std::size_t block_size(int block) const { return geometry_.block_begin(block + 1) - geometry_.block_begin(block); }
  /// How a message of `values` values is cut, the same on both sides (from its own size).
  chunk_plan plan(std::size_t values) const { return rule_.plan(values, sizeof(T), values * sizeof(T)); }
  bool compressible(std::size_t values) const { return rule_.may_compress(values * sizeof(T)); }
  /// A final block of `values`: its rule (final_block_rule) and how it is cut into pieces.
  wire_rule final_rule(std::size_t values) const {
    return final_block_rule(rule_, values * sizeof(T), geometry_.shape.size, halving_compresses_);
  }
  chunk_plan final_plan(std::size_t values) const {
    return final_rule(values).plan(values, sizeof(T), values * sizeof(T));
  }

  /// The messages one side of a step moves, in the order they travel.
  std::vector<message> messages(const butterfly_step& step, bool sending) const {
    const std::size_t begin = sending ? step.send_begin : step.receive_begin;
    const std::size_t end = sending ? step.send_end : step.receive_end;
    std::vector<message> out;
    if ((sending ? step.send_peer : step.receive_peer) < 0) return out;
    if (step.reduces) {
      const chunk_plan pieces = plan(end - begin);
      for (std::size_t i = 0; i < pieces.count(); ++i) out.push_back({begin + pieces.begin(i), pieces.size(i)});
      return out;
    }
    for (const int block : geometry_.final_blocks(begin, end, step.skip)) {
      const chunk_plan pieces = final_plan(block_size(block));
      for (std::size_t i = 0; i < pieces.count(); ++i)
        out.push_back({geometry_.block_begin(block) + pieces.begin(i), pieces.size(i), block, i});
    }
    return out;
  }

  /// Scratch, sized by walking this rank's steps. Receive: a reduce arrival (raw size), then
  /// every block's final streams at their raw offsets. Decode: the partial sums, then one
  /// decoded arrival (or piece, measuring). Send: the pieces one step encodes (staged: one slot
  /// per message of a step).
  void reserve() {
    std::size_t widest = 0, arrival = 0, encoded = 0, sent = 0;
    for (const butterfly_step& step : steps_) {
      const std::vector<message> out = messages(step, true), in = messages(step, false);
      for (const message& m : out) widest = std::max(widest, m.values);
      for (const message& m : in) widest = std::max(widest, m.values);
      if (step.reduces) {
        arrival = std::max(arrival, step.receive_end - step.receive_begin);
        encoded = std::max(encoded, out.size());
      }
      sent = std::max(sent, out.size());
    }
    if (encoded_block_ >= 0) encoded = std::max(encoded, final_plan(block_size(encoded_block_)).count());
    piece_room_ = (max_compressed_size<T>(std::max<std::size_t>(widest, 1), codec_) + 7) / 8 * 8;
    arrival_bytes_ = (arrival * sizeof(T) + 7) / 8 * 8;
    const std::size_t count = geometry_.count, sums = geometry_.reduces() ? count : 0;
    const scratch_room room = scratch_->template reserve_in<memory>(
        std::max<std::size_t>(1, encoded) * piece_room_, arrival_bytes_ + count * sizeof(T),
        (sums + std::max(arrival, widest)) * sizeof(T));
    send_ = room.send;
    hop_ = room.receive;
    finals_ = room.receive + arrival_bytes_;
    sums_ = reinterpret_cast<T*>(room.decode);
    decoded_ = sums_ + sums;
    if (how_.staged)
      scratch_->reserve_staging(std::max<std::size_t>(1, sent) * piece_room_, arrival_bytes_ + count * sizeof(T));
    final_length_.resize(std::size_t(geometry_.block_count()));
    for (int block = 0; block < geometry_.block_count(); ++block)
      final_length_[std::size_t(block)].assign(final_plan(block_size(block)).count(), unknown_length);
  }

  /// The block whose final stream this rank compresses (-1: none): allreduce's core rank the
  /// block it holds the sum of, allgather's every rank its own, reduce_scatter's folding core
  /// rank the block of the rank folded into it.
  int encoded_block() const {
    const int rank = geometry_.shape.rank;
    if (geometry_.shape.size <= 1) return -1;
    switch (geometry_.collective) {
      case butterfly_collective::allreduce:
        return geometry_.folded_out(rank) ? -1 : geometry_.position_of(geometry_.core_rank(rank));
      case butterfly_collective::allgather:
        return rank;
      case butterfly_collective::reduce_scatter:
        return geometry_.folds(rank) && !geometry_.folded_out(rank) ? rank - 1 : -1;
    }
    return -1;
  }

  /// Where the value at position `begin` of the vector lands in the output (reduce_scatter's
  /// output is this rank's block alone).
  T* output_at(std::size_t begin) const {
    if (geometry_.collective != butterfly_collective::reduce_scatter) return output_ + begin;
    return output_ + (begin - geometry_.block_begin(geometry_.shape.rank));
  }
  /// The values a final stream is compressed from: the sums, or allgather's own block.
  const T* final_source(std::size_t begin) const {
    if (geometry_.reduces()) return sums_ + begin;
    return input_ + (begin - geometry_.block_begin(geometry_.shape.rank));
  }

  /// The values a reduce step sends from and adds to: this rank's input before a sum was formed.
  const T* source(const butterfly_step& step) const { return step.reads_input ? input_ : sums_; }

  std::byte* staged_twin(const std::byte* target) const {
    return scratch_->staged_receive.data() + (target - hop_);
  }
  std::byte* receive_target(const message& m, const butterfly_step& step) const {
    return step.reduces ? hop_ + (m.begin - step.receive_begin) * sizeof(T) : finals_ + m.begin * sizeof(T);
  }

  /// Posts the step's receives, then encodes and sends its messages one by one, decoding
  /// arrivals between them.
  void start_step() {
    const butterfly_step& step = steps_[step_];
    posted_.emplace(failure_);  // the previous step's requests have all completed
    incoming_ = messages(step, false);
    for (std::size_t i = 0; i < incoming_.size(); ++i) {
      std::byte* const target = receive_target(incoming_[i], step);
      posted_->receive(how_.staged ? staged_twin(target) : target, incoming_[i].values * sizeof(T), step.receive_peer,
                       scratch_->comm, who_, int(i));
    }
    const std::vector<message> outgoing = messages(step, true);
    if (outgoing.empty()) return;
    bool compressed = false;
    std::size_t raw = 0;
    send_chunks(
        *posted_, chunk_plan{outgoing.size(), 1}, step.send_peer, scratch_->comm, who_,
        [&](std::size_t i) {
          const message& m = outgoing[i];
          const std::span<const std::byte> payload = step.reduces ? encode_partial(step, m, i) : final_stream(m);
          compressed = compressed || payload.size() < m.values * sizeof(T);
          report_.wire_bytes += payload.size();
          ++report_.chunks;
          raw += m.values * sizeof(T);
          return to_mpi(i, payload);
        },
        [&] { posted_->progress(false, who_, [&](int key, std::size_t bytes) { arrived(key, bytes); }); });
    report_.payload_bytes += raw;
    if (compressed) ++report_.compressed_messages;
    ++report_.messages;
  }

  /// A piece of partial sums (or of this rank's own values), compressed once, in send scratch.
  std::span<const std::byte> encode_partial(const butterfly_step& step, const message& m, std::size_t i) {
    const bool whole_compressible = compressible(step.send_end - step.send_begin);
    // Raw: MPI reads the values where they are. The half a step sends is never written again
    // (arrivals add into the half it keeps; the gathering writes the output).
    if (!whole_compressible) return {reinterpret_cast<const std::byte*>(source(step) + m.begin), m.values * sizeof(T)};
    std::byte* const out = send_ + i * piece_room_;
    // measuring: the stream is decoded into decoded_, free while sending
    const std::size_t length = encode_message<memory>(exec_, rule_, codec_, whole_compressible, source(step) + m.begin,
                                                      m.values, out, decoded_, max_error_);
    return {out, length};
  }

  /// A final block's piece: the block this rank compresses is compressed the first time it is
  /// sent (and decoded from those bytes, as every other rank decodes them, where it is part of
  /// the output); every later step forwards the stored stream unchanged.
  std::span<const std::byte> final_stream(const message& m) {
    std::byte* const slot = finals_ + m.begin * sizeof(T);
    std::size_t& length = final_length_[std::size_t(m.block)][m.piece];
    if (length == unknown_length && m.block == encoded_block_) {
      std::byte* const out = send_ + m.piece * piece_room_;
      const wire_rule rule = final_rule(block_size(m.block));
      length = encode_message<memory>(exec_, rule, codec_, rule.may_compress(block_size(m.block) * sizeof(T)),
                                      final_source(m.begin), m.values, out, decoded_, max_error_);
      copy_values<memory>(exec_, slot, static_cast<const std::byte*>(out), length);
      if (geometry_.collective != butterfly_collective::reduce_scatter) decode_final(slot, length, m);
    }
    return {slot, length};
  }

  /// What MPI sends for message `i` of a step: the payload, or its copy in host staging.
  std::span<const std::byte> to_mpi(std::size_t i, std::span<const std::byte> payload) {
    if (!how_.staged) return payload;
    std::byte* const staged = scratch_->staged_send.data() + i * piece_room_;
    stage_out(exec_, staged, payload.data(), payload.size());
    return {staged, payload.size()};
  }

  /// Message `key` of this step arrived, `bytes` long: a partial sum decoded and added, or a
  /// final stream kept (to forward) and decoded into the output.
  void arrived(int key, std::size_t bytes) {
    const butterfly_step& step = steps_[step_];
    const message& m = incoming_[std::size_t(key)];
    std::byte* const landed = receive_target(m, step);
    if (how_.staged) stage_in(exec_, landed, staged_twin(landed), bytes);
    if (!step.reduces) {
      final_length_[std::size_t(m.block)][m.piece] = bytes;
      decode_final(landed, bytes, m);
      return;
    }
    // Raw values are added where they landed; a stream is decoded first.
    const T* incoming = reinterpret_cast<const T*>(landed);
    if (bytes != m.values * sizeof(T)) {
      T* const decoded = decoded_ + (m.begin - step.receive_begin);
      decode_message<memory>(exec_, landed, bytes, m.values, decoded, who_);
      incoming = decoded;
    }
    add_partial_sums(exec_, sums_ + m.begin, source(step) + m.begin, incoming, m.values);
  }

  /// A final piece's stream (or raw values) into the output: now, or held for the step's batch.
  void decode_final(const std::byte* stream, std::size_t length, const message& m) {
    if (batch_finals_) held_finals_.push_back({stream, length, output_at(m.begin), m.values});
    else decode_message<memory>(exec_, stream, length, m.values, output_at(m.begin), who_);
  }
  /// The step's held final pieces decoded as one batch; a failure is this rank's, as one on
  /// arrival is (the next steps send abort markers).
  void decode_held_finals() {
    if (held_finals_.empty()) return;
    try {
      if (!failure_.aborting())
        decode_messages<memory>(exec_, std::span<const stream_to_decode<T>>(held_finals_), who_);
    } catch (...) {
      failure_.record_local();
    }
    held_finals_.clear();
  }

  /// One rank: the result is the input. reduce_scatter's core rank: the sums of its block.
  /// Otherwise the output was written as the final streams were decoded.
  void finish() {
    if (failure_.aborting()) return;
    const int rank = geometry_.shape.rank;
    if (geometry_.shape.size == 1 && input_ != output_) {
      copy_values<memory>(exec_, output_, input_, geometry_.count);
    } else if (geometry_.collective == butterfly_collective::reduce_scatter && !geometry_.folded_out(rank)) {
      const std::size_t begin = geometry_.block_begin(rank);
      copy_values<memory>(exec_, output_, static_cast<const T*>(sums_ + begin), block_size(rank));
    }
    exec_.fence("kompress: halving-doubling result in place");
    report_.max_error = max_error_;
  }

  Exec exec_;
  const char* who_;
  transport how_;
  butterfly_geometry geometry_;
  wire_rule rule_;
  compress_options codec_;  ///< the bound already the per-step absolute bound
  const T* input_;          ///< this rank's values (never written)
  T* output_;
  call_scratch scratch_;
  std::vector<butterfly_step> steps_;
  std::size_t step_ = 0;
  std::vector<message> incoming_;  ///< this step's arrivals, by key
  T *sums_ = nullptr, *decoded_ = nullptr;
  std::byte *send_ = nullptr, *hop_ = nullptr, *finals_ = nullptr;
  std::size_t piece_room_ = 0, arrival_bytes_ = 0;
  static constexpr std::size_t unknown_length = std::numeric_limits<std::size_t>::max();
  std::vector<std::vector<std::size_t>> final_length_;  ///< per block, per piece; unknown: not yet held
  int encoded_block_ = -1;
  bool halving_compresses_ = false;  ///< allreduce's largest halving message may be compressed
  bool batch_finals_ = false;                       ///< final pieces decoded per step, together
  std::vector<stream_to_decode<T>> held_finals_;  ///< this step's, until it ends
  double max_error_ = NAN;  ///< measured when not NaN
  collective_report report_;
  call_failure failure_;                   ///< shared by every step's requests
  std::optional<posted_messages> posted_;  // last: completed (or cancelled) before the buffers go
};

}  // namespace kompress::inline v0::detail
