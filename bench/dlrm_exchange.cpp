// The DLRM embedding exchange on real tables: kompress's compressed all-to-all against plain
// MPI and against the 16-bit casts that production DLRM uses (TorchRec's quantized comms),
// measured in the same run, with the error each one puts on the embeddings and on what the
// model computes from them (the pairwise dot-product interaction).
//
//   mpiexec -n 4 bench_dlrm_exchange [--iterations 10] [--batch 1024] [--pooling 4]
//       [--zipf 1.05] [--seed 2024] [--bound 1e-2] [--block-size 32] [--per-table] [--csv PATH]
//
// The model: the ten trained tables of dim 128 of the data folder's DLRM
// (dlrm_flights_tables_10492x128.f32; table order and row offsets from dlrm_flights_meta.json),
// owned unevenly: rank 0 the two big ones (flight, tailnum), rank 1 doy and route, rank 2 three
// small ones (dest, hour, carrier), rank 3 three tiny ones (month, dow, origin); with fewer
// ranks the last rank takes the rest.
//
// The batches: iteration 0 is the real held-out batch of the data folder (its forward lookups
// as the pooled values, its loss gradient as the backward payload; tiled when --batch exceeds
// its samples, 1024 in the full set and 128 in the repository's sample).
// Iterations 1.. draw lookups the way recommendation traffic looks: per table, a Zipf(s) law
// over the rows (s = --zipf, popular rows chosen by a seeded permutation), 1 to --pooling
// lookups per sample and table, summed (sum pooling); their backward payload is the real
// gradient of randomly drawn real samples (a real gradient's values, not the gradient of this
// synthetic batch). Every rank draws every batch from the same seed, so every rank knows the
// exact result and the errors need no extra communication.
//
// The variants, forward then backward on the same batch, in an order rotated every iteration:
//   plain MPI         MPI_Alltoallv on the fp32 values: the baseline
//   kompress off      the embedding exchange with compression off (its raw path)
//   fp16 cast         values cast to IEEE half (round to nearest even; with the x86 F16C
//                     instructions where the CPU has them, as fast as a GPU's cast would
//                     be relative to the link), a real 16-bit MPI_Alltoallv on uint16
//                     data, cast back: TorchRec's FP16 qcomms
//   bf16 cast         the same with bfloat16 (TorchRec's BF16)
//   kompress =fp16 B  kompress at the REL bound that puts as many bytes on the wire as the
//                     fp16 cast (the largest compression at or below fp16's bytes; found by
//                     bisection on the real batch before timing)
//   kompress REL r    kompress at the recommended bound, REL 1e-2 per table (--bound)
// A rank's own block never travels and is copied exactly by every variant.
//
// Reported per variant: bytes on the wire per iteration (all ranks, forward + backward),
// ratio to plain, time of forward + backward (max over ranks; the median over iterations),
// speedup over plain MPI, the largest error of the exchanged embeddings (forward) and of the
// gradients (backward), each also as a fraction of its table's bound (the variant's own bound
// for kompress; the recommended REL bound for the casts, which have none), and the largest
// error of the interaction output. A kompress value outside its table's bound prints
// "BOUND VIOLATED"; an exact variant that is not bit-exact prints "NOT EXACT"; either makes
// the exit status 1.
//
// The link: the header says which. bench/dlrm_exchange_demo.sh (scripts/dev demo) runs this
// in a private network namespace whose loopback is rate-limited with tc and sets
// KOMPRESS_LINK_GBPS; without it the ranks talk over shared memory.

#include "data_sample.hpp"

#include <kompress/dlrm.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

using host = Kokkos::DefaultHostExecutionSpace;
using matrix = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;

void check_mpi(int code, const char* call) {
  if (code != MPI_SUCCESS) throw std::runtime_error(std::string("dlrm_exchange: ") + call + " failed");
}

// ---------------------------------------------------------------------------------------------
// Command line

struct settings {
  int iterations = 10;
  std::size_t batch = 1024;  // global batch
  int pooling = 4;
  double zipf = 1.05;
  std::uint64_t seed = 2024;
  double bound = 1e-2;
  int block_size = 32;
  bool per_table = false;
  std::string csv;
};

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--iterations") s.iterations = std::stoi(value());
    else if (arg == "--batch") s.batch = std::stoull(value());
    else if (arg == "--pooling") s.pooling = std::stoi(value());
    else if (arg == "--zipf") s.zipf = std::stod(value());
    else if (arg == "--seed") s.seed = std::stoull(value());
    else if (arg == "--bound") s.bound = std::stod(value());
    else if (arg == "--block-size") s.block_size = std::stoi(value());
    else if (arg == "--per-table") s.per_table = true;
    else if (arg == "--csv") s.csv = value();
    else throw std::invalid_argument("unknown option " + arg);
  }
  if (s.iterations < 1 || s.pooling < 1 || s.batch == 0 || !(s.bound > 0.0) || !(s.zipf > 0.0))
    throw std::invalid_argument("--iterations, --pooling, --batch, --bound and --zipf must be positive");
  return s;
}

// ---------------------------------------------------------------------------------------------
// The model: tables, owners, column layout

struct model {
  std::vector<std::string> names;
  std::vector<std::size_t> first_row, rows;
  std::size_t dim = 0;
  std::vector<float> weights;  // [all rows x dim], the tables stacked row-wise
};

// The few fields of dlrm_flights_meta.json this needs ("tables", "dim", "row_offsets"), read
// without a JSON library: the file is the data folder's own, written by json.dump(indent=1).
model load_model() {
  const auto meta_path = kompress::test::data_file("dlrm_flights_meta.json");
  std::ifstream file(meta_path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  const std::string text = buffer.str();
  const auto fail = [&](const std::string& what) {
    throw std::runtime_error("dlrm_exchange: " + meta_path.string() + ": " + what);
  };
  model m;
  std::size_t at = text.find("\"tables\"");
  const std::size_t end = at == std::string::npos ? at : text.find(']', at);
  if (end == std::string::npos) fail("no \"tables\" list");
  for (at = text.find('"', text.find('[', at)); at < end; at = text.find('"', at)) {
    const std::size_t close = text.find('"', at + 1);
    m.names.push_back(text.substr(at + 1, close - at - 1));
    at = close + 1;
  }
  at = text.find("\"dim\"");
  if (at == std::string::npos) fail("no \"dim\"");
  m.dim = std::strtoull(text.c_str() + text.find(':', at) + 1, nullptr, 10);
  const std::size_t offsets = text.find("\"row_offsets\"");
  if (offsets == std::string::npos) fail("no \"row_offsets\"");
  for (const auto& name : m.names) {
    at = text.find("\"" + name + "\"", offsets);
    if (at == std::string::npos) fail("no row offsets for table " + name);
    char* next = nullptr;
    const char* open = text.c_str() + text.find('[', at) + 1;
    m.first_row.push_back(std::strtoull(open, &next, 10));
    m.rows.push_back(std::strtoull(std::strchr(next, ',') + 1, nullptr, 10));
  }
  std::size_t total_rows = 0;
  for (std::size_t t = 0; t < m.names.size(); ++t) {
    if (m.first_row[t] != total_rows || m.rows[t] == 0) fail("tables are not stacked back to back");
    total_rows += m.rows[t];
  }
  // The data README: ten tables of dim 128, 10492 rows in all.
  if (m.names.size() != 10 || m.dim != 128 || total_rows != 10492)
    fail("expected 10 tables of dim 128 and 10492 rows, got " + std::to_string(m.names.size()) + " tables of dim " +
         std::to_string(m.dim) + " and " + std::to_string(total_rows) + " rows");
  m.weights = kompress::test::read_raw<float>("dlrm_flights_tables_10492x128.f32");
  if (m.weights.size() != total_rows * m.dim)
    fail("dlrm_flights_tables_10492x128.f32 holds " + std::to_string(m.weights.size()) + " values, the offsets say " +
         std::to_string(total_rows * m.dim));
  return m;
}

/// Who owns what, and where each table's columns sit.
struct layout {
  int ranks = 0, rank = 0;
  std::size_t tables = 0, dim = 0, local_batch = 0, global_batch = 0, total_width = 0;
  std::vector<int> owner;
  std::vector<std::size_t> global_column, local_column, width;  // width: local width of each rank
  std::size_t mine() const { return width[rank]; }
};

layout make_layout(const model& m, int ranks, int rank, std::size_t global_batch) {
  // On 4 ranks: rank 0 the two big tables, rank 1 the next two, ranks 2 and 3 three small ones
  // each. Fewer ranks: the last rank takes the rest.
  static constexpr int owner_on_4[10] = {0, 0, 1, 1, 2, 2, 2, 3, 3, 3};
  layout l;
  l.ranks = ranks;
  l.rank = rank;
  l.tables = m.names.size();
  l.dim = m.dim;
  l.global_batch = global_batch;
  l.local_batch = global_batch / std::size_t(ranks);
  l.width.assign(ranks, 0);
  for (std::size_t t = 0; t < l.tables; ++t) {
    const int owner = std::min(owner_on_4[t], ranks - 1);
    l.owner.push_back(owner);
    l.global_column.push_back(l.total_width);
    l.total_width += m.dim;
    l.local_column.push_back(l.width[owner]);
    l.width[owner] += m.dim;
  }
  return l;
}

// ---------------------------------------------------------------------------------------------
// Batches

struct batch {
  std::string label;
  std::vector<float> pooled, gradient;  // [global batch x tables x dim] each, the exact values
};

batch real_batch(const layout& l) {
  // The full set's batch has 1024 samples, the repository's sample its first 128: tiled to the
  // global batch either way.
  const auto forward_file = kompress::test::find_array("dlrm_flights_lookup_fwd");
  const auto backward_file = kompress::test::find_array("dlrm_flights_lookup_grad");
  const auto forward = kompress::test::read_raw<float>(forward_file.name);
  const auto backward = kompress::test::read_raw<float>(backward_file.name);
  const std::size_t row = l.tables * l.dim, samples = forward.size() / row;
  if (forward_file.shape.size() != 3 || forward_file.shape[1] * forward_file.shape[2] != row ||
      backward_file.shape != forward_file.shape)
    throw std::runtime_error("dlrm_exchange: the lookup files are not [samples x 10 x 128] both");
  batch b;
  b.label = l.global_batch == samples ? "real batch" : "real batch (tiled from " + std::to_string(samples) + ")";
  b.pooled.resize(l.global_batch * row);
  b.gradient.resize(l.global_batch * row);
  for (std::size_t s = 0; s < l.global_batch; ++s) {
    std::copy_n(forward.begin() + std::ptrdiff_t((s % samples) * row), row, b.pooled.begin() + std::ptrdiff_t(s * row));
    std::copy_n(backward.begin() + std::ptrdiff_t((s % samples) * row), row, b.gradient.begin() + std::ptrdiff_t(s * row));
  }
  return b;
}

/// Per table: a Zipf(s) law over its rows, the most popular rows picked by a permutation.
struct zipf_table {
  std::vector<double> cdf;
  std::vector<std::size_t> row_of_rank;
};

std::vector<zipf_table> make_zipf(const model& m, double s, std::uint64_t seed) {
  std::vector<zipf_table> laws(m.names.size());
  std::mt19937_64 rng(seed);
  for (std::size_t t = 0; t < laws.size(); ++t) {
    auto& law = laws[t];
    law.row_of_rank.resize(m.rows[t]);
    std::iota(law.row_of_rank.begin(), law.row_of_rank.end(), m.first_row[t]);
    std::shuffle(law.row_of_rank.begin(), law.row_of_rank.end(), rng);
    double sum = 0.0;
    for (std::size_t k = 0; k < m.rows[t]; ++k) law.cdf.push_back(sum += std::pow(double(k + 1), -s));
    for (double& c : law.cdf) c /= sum;
  }
  return laws;
}

batch zipf_batch(const model& m, const layout& l, const std::vector<zipf_table>& laws, const batch& real, int pooling,
                 std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::uniform_int_distribution<int> lookups(1, pooling);
  const std::size_t row = l.tables * l.dim, real_samples = real.gradient.size() / row;
  std::uniform_int_distribution<std::size_t> real_sample(0, std::min<std::size_t>(real_samples, 1024) - 1);
  batch b;
  b.label = "Zipf lookups";
  b.pooled.assign(l.global_batch * row, 0.0f);
  b.gradient.resize(l.global_batch * row);
  for (std::size_t s = 0; s < l.global_batch; ++s) {
    for (std::size_t t = 0; t < l.tables; ++t) {
      float* const out = b.pooled.data() + s * row + t * l.dim;
      for (int k = lookups(rng); k > 0; --k) {
        const auto& law = laws[t];
        const std::size_t rank = std::size_t(std::lower_bound(law.cdf.begin(), law.cdf.end(), uniform(rng)) - law.cdf.begin());
        const float* const weights = m.weights.data() + law.row_of_rank[std::min(rank, law.cdf.size() - 1)] * l.dim;
        for (std::size_t c = 0; c < l.dim; ++c) out[c] += weights[c];
      }
    }
    const std::size_t from = real_sample(rng);
    std::copy_n(real.gradient.begin() + std::ptrdiff_t(from * row), row, b.gradient.begin() + std::ptrdiff_t(s * row));
  }
  return b;
}

/// What every rank derives from a batch: its own inputs, the exact outputs, the ranges the
/// REL bounds resolve against, and the exact interaction of its batch slice.
struct prepared {
  matrix pooled_local, grad_in;        // this rank's inputs
  std::vector<double> forward_range;   // per table, over the global batch (what the owner sees)
  std::vector<double> backward_range;  // per table and sending rank, over that rank's slice
  std::vector<double> interaction;     // [local batch x pairs], exact
  double interaction_scale = 0.0;      // max |exact dot| over all ranks
};

double range_of(const float* base, std::size_t stride, std::size_t rows, std::size_t cols) {
  double lo = INFINITY, hi = -INFINITY;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) {
      const double x = double(base[r * stride + c]);
      if (std::isfinite(x)) {
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
    }
  return lo <= hi ? hi - lo : 0.0;
}

/// DLRM's dot interaction: every pair i < j of the tables' pooled vectors, per sample. (DLRM
/// also pairs them with the bottom MLP's output, which is computed data parallel and never
/// travels; it is left out here.) `at(sample, table)` gives the vector.
template <class Vector>
void interact(std::size_t samples, std::size_t tables, std::size_t dim, Vector&& at, std::vector<double>& z) {
  const std::size_t pairs = tables * (tables - 1) / 2;
  z.assign(samples * pairs, 0.0);
  for (std::size_t s = 0; s < samples; ++s) {
    std::size_t k = 0;
    for (std::size_t i = 0; i < tables; ++i)
      for (std::size_t j = i + 1; j < tables; ++j, ++k) {
        const float* a = at(s, i);
        const float* b = at(s, j);
        double dot = 0.0;
        for (std::size_t c = 0; c < dim; ++c) dot += double(a[c]) * double(b[c]);
        z[s * pairs + k] = dot;
      }
  }
}

prepared prepare(const layout& l, const batch& b) {
  prepared p;
  const std::size_t row = l.tables * l.dim;
  p.pooled_local = matrix(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pooled_local"), l.global_batch, l.mine());
  p.grad_in = matrix(Kokkos::view_alloc(Kokkos::WithoutInitializing, "grad_in"), l.local_batch, l.total_width);
  for (std::size_t t = 0; t < l.tables; ++t) {
    if (l.owner[t] == l.rank)
      for (std::size_t s = 0; s < l.global_batch; ++s)
        for (std::size_t c = 0; c < l.dim; ++c) p.pooled_local(s, l.local_column[t] + c) = b.pooled[s * row + t * l.dim + c];
    p.forward_range.push_back(range_of(b.pooled.data() + t * l.dim, row, l.global_batch, l.dim));
    for (int q = 0; q < l.ranks; ++q)
      p.backward_range.push_back(
          range_of(b.gradient.data() + std::size_t(q) * l.local_batch * row + t * l.dim, row, l.local_batch, l.dim));
  }
  const std::size_t first = std::size_t(l.rank) * l.local_batch;
  for (std::size_t s = 0; s < l.local_batch; ++s)
    for (std::size_t c = 0; c < l.total_width; ++c) p.grad_in(s, c) = b.gradient[(first + s) * row + c];
  interact(
      l.local_batch, l.tables, l.dim,
      [&](std::size_t s, std::size_t t) { return b.pooled.data() + (first + s) * row + t * l.dim; }, p.interaction);
  for (double z : p.interaction) p.interaction_scale = std::max(p.interaction_scale, std::fabs(z));
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &p.interaction_scale, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  return p;
}

// ---------------------------------------------------------------------------------------------
// The cast baselines: a real MPI_Alltoallv of the values as 16-bit words (or fp32 for plain)

// Each codec converts whole rows: encode(in, out, n) and decode(in, out, n).
struct fp32_codec {
  using wire = float;
  static MPI_Datatype type() { return MPI_FLOAT; }
  static void encode(const float* in, wire* out, std::size_t n) { std::memcpy(out, in, n * sizeof(float)); }
  static void decode(const wire* in, float* out, std::size_t n) { std::memcpy(out, in, n * sizeof(float)); }
};

/// IEEE binary16, round to nearest even, overflow to infinity, gradual underflow: in hardware
/// (x86 F16C, as a GPU would convert) where the CPU has it, else the portable code below,
/// which gives the same bits.
struct fp16_codec {
  using wire = std::uint16_t;
  static MPI_Datatype type() { return MPI_UINT16_T; }

  static wire encode_one(float x) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    const std::uint32_t sign = (bits >> 16) & 0x8000u, exponent = (bits >> 23) & 0xffu, mantissa = bits & 0x7fffffu;
    if (exponent == 0xffu) return wire(sign | 0x7c00u | (mantissa ? 0x200u | (mantissa >> 13) : 0u));
    const int e = int(exponent) - 112;  // the half exponent field
    if (e >= 31) return wire(sign | 0x7c00u);
    std::uint32_t significand, shift, base;
    if (e <= 0) {  // a half subnormal (or zero): value = h * 2^-24
      if (e < -10) return wire(sign);
      significand = mantissa | 0x800000u;
      shift = std::uint32_t(14 - e);
      base = 0;
    } else {
      significand = mantissa;
      shift = 13;
      base = std::uint32_t(e) << 10;
    }
    std::uint32_t h = base | (significand >> shift);
    const std::uint32_t rest = significand & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u))) ++h;  // a carry moves into the exponent, as it should
    return wire(sign | h);
  }
  static float decode_one(wire h) {
    const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
      const float magnitude = float(mantissa) * 0x1p-24f;
      return sign ? -magnitude : magnitude;
    }
    return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static bool hardware() {
    static const bool f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
    return f16c;
  }
  __attribute__((target("avx,f16c"))) static void encode_f16c(const float* in, wire* out, std::size_t n) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) out[i] = encode_one(in[i]);
  }
  __attribute__((target("avx,f16c"))) static void decode_f16c(const wire* in, float* out, std::size_t n) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
    for (; i < n; ++i) out[i] = decode_one(in[i]);
  }
#else
  static bool hardware() { return false; }
  static void encode_f16c(const float*, wire*, std::size_t) {}
  static void decode_f16c(const wire*, float*, std::size_t) {}
#endif

  static void encode(const float* in, wire* out, std::size_t n) {
    if (hardware()) return encode_f16c(in, out, n);
    for (std::size_t i = 0; i < n; ++i) out[i] = encode_one(in[i]);
  }
  static void decode(const wire* in, float* out, std::size_t n) {
    if (hardware()) return decode_f16c(in, out, n);
    for (std::size_t i = 0; i < n; ++i) out[i] = decode_one(in[i]);
  }
};

/// bfloat16: the upper half of the fp32 word, rounded to nearest even.
struct bf16_codec {
  using wire = std::uint16_t;
  static MPI_Datatype type() { return MPI_UINT16_T; }
  static wire encode_one(float x) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return wire((bits >> 16) | 0x40u);  // NaN stays NaN
    return wire((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
  static void encode(const float* in, wire* out, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) out[i] = encode_one(in[i]);
  }
  static void decode(const wire* in, float* out, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(std::uint32_t(in[i]) << 16);
  }
};

/// The forward and backward exchange as one MPI_Alltoallv each, values encoded by Codec. A
/// rank's own block is copied exactly; buffers are allocated once.
template <class Codec>
class cast_exchange {
  using wire = typename Codec::wire;

 public:
  explicit cast_exchange(const layout& l) : l_(l) {
    const int p = l.ranks;
    forward_send_.assign(p, 0), forward_receive_.assign(p, 0), backward_send_.assign(p, 0), backward_receive_.assign(p, 0);
    for (int q = 0; q < p; ++q) {
      if (q == l.rank) continue;
      forward_send_[q] = int(l.local_batch * l.mine());       // my tables, q's slice
      forward_receive_[q] = int(l.local_batch * l.width[q]);  // q's tables, my slice
      backward_send_[q] = forward_receive_[q];
      backward_receive_[q] = forward_send_[q];
    }
    forward_send_at_ = displacements(forward_send_), forward_receive_at_ = displacements(forward_receive_);
    backward_send_at_ = displacements(backward_send_), backward_receive_at_ = displacements(backward_receive_);
    send_ = Kokkos::View<wire*, Kokkos::HostSpace>("send", std::max(total(forward_send_), total(backward_send_)));
    receive_ = Kokkos::View<wire*, Kokkos::HostSpace>("receive", std::max(total(forward_receive_), total(backward_receive_)));
  }

  /// Bytes this rank puts on the wire per forward + backward.
  std::uint64_t wire_bytes() const { return (total(forward_send_) + total(backward_send_)) * sizeof(wire); }

  void forward(const matrix& in, const matrix& out) {
    const layout& l = l_;
    const std::size_t bl = l.local_batch, mine = l.mine(), total_width = l.total_width;
    wire* const send = send_.data();
    const float* const in_data = in.data();
    for (int q = 0; q < l.ranks; ++q) {
      if (q == l.rank || mine == 0) continue;
      const std::size_t to = std::size_t(forward_send_at_[q]), from_row = std::size_t(q) * bl;
      Kokkos::parallel_for("cast::forward::pack", Kokkos::RangePolicy<host>(0, bl),
                           [=](std::size_t b) { Codec::encode(in_data + (from_row + b) * mine, send + to + b * mine, mine); });
    }
    host().fence("cast::forward: packed");
    check_mpi(MPI_Alltoallv(send_.data(), forward_send_.data(), forward_send_at_.data(), Codec::type(), receive_.data(),
                            forward_receive_.data(), forward_receive_at_.data(), Codec::type(), MPI_COMM_WORLD),
              "MPI_Alltoallv");
    const wire* const receive = receive_.data();
    float* const out_data = out.data();
    for (std::size_t t = 0; t < l.tables; ++t) {
      const int q = l.owner[t];
      const std::size_t dim = l.dim, to_col = l.global_column[t], from_col = l.local_column[t];
      if (q == l.rank) {  // my own tables: exact
        const std::size_t first = std::size_t(l.rank) * bl;
        Kokkos::parallel_for("cast::forward::own", Kokkos::RangePolicy<host>(0, bl), [=](std::size_t b) {
          for (std::size_t c = 0; c < dim; ++c)
            out_data[b * total_width + to_col + c] = in_data[(first + b) * mine + from_col + c];
        });
      } else {
        const std::size_t from = std::size_t(forward_receive_at_[q]), width = l.width[q];
        Kokkos::parallel_for("cast::forward::unpack", Kokkos::RangePolicy<host>(0, bl), [=](std::size_t b) {
          Codec::decode(receive + from + b * width + from_col, out_data + b * total_width + to_col, dim);
        });
      }
    }
    host().fence("cast::forward: unpacked");
  }

  void backward(const matrix& grad_in, const matrix& grad_out) {
    const layout& l = l_;
    const std::size_t bl = l.local_batch, mine = l.mine(), total_width = l.total_width;
    wire* const send = send_.data();
    const float* const in_data = grad_in.data();
    float* const out_data = grad_out.data();
    for (std::size_t t = 0; t < l.tables; ++t) {
      const int q = l.owner[t];
      const std::size_t dim = l.dim, from_col = l.global_column[t], to_col = l.local_column[t];
      if (q == l.rank) {  // gradients of my own tables for my slice: exact
        const std::size_t first = std::size_t(l.rank) * bl;
        Kokkos::parallel_for("cast::backward::own", Kokkos::RangePolicy<host>(0, bl), [=](std::size_t b) {
          for (std::size_t c = 0; c < dim; ++c)
            out_data[(first + b) * mine + to_col + c] = in_data[b * total_width + from_col + c];
        });
      } else {
        const std::size_t to = std::size_t(backward_send_at_[q]), width = l.width[q];
        Kokkos::parallel_for("cast::backward::pack", Kokkos::RangePolicy<host>(0, bl), [=](std::size_t b) {
          Codec::encode(in_data + b * total_width + from_col, send + to + b * width + to_col, dim);
        });
      }
    }
    host().fence("cast::backward: packed");
    check_mpi(MPI_Alltoallv(send_.data(), backward_send_.data(), backward_send_at_.data(), Codec::type(), receive_.data(),
                            backward_receive_.data(), backward_receive_at_.data(), Codec::type(), MPI_COMM_WORLD),
              "MPI_Alltoallv");
    const wire* const receive = receive_.data();
    for (int q = 0; q < l.ranks; ++q) {
      if (q == l.rank || mine == 0) continue;
      const std::size_t from = std::size_t(backward_receive_at_[q]), first = std::size_t(q) * bl;
      Kokkos::parallel_for("cast::backward::unpack", Kokkos::RangePolicy<host>(0, bl),
                           [=](std::size_t b) { Codec::decode(receive + from + b * mine, out_data + (first + b) * mine, mine); });
    }
    host().fence("cast::backward: unpacked");
  }

 private:
  static std::vector<int> displacements(const std::vector<int>& counts) {
    std::vector<int> at(counts.size(), 0);
    for (std::size_t q = 1; q < counts.size(); ++q) at[q] = at[q - 1] + counts[q - 1];
    return at;
  }
  static std::size_t total(const std::vector<int>& counts) {
    return std::size_t(std::accumulate(counts.begin(), counts.end(), 0LL));
  }

  layout l_;
  std::vector<int> forward_send_, forward_receive_, backward_send_, backward_receive_;
  std::vector<int> forward_send_at_, forward_receive_at_, backward_send_at_, backward_receive_at_;
  Kokkos::View<wire*, Kokkos::HostSpace> send_, receive_;
};

// ---------------------------------------------------------------------------------------------
// The variants and what is measured of them

enum class kind { plain, kompress_off, fp16, bf16, kompress_equal, kompress_recommended };

struct result {
  std::vector<double> times;                                                         // per timed iteration, max over ranks
  std::uint64_t wire_bytes = 0;                                                      // this rank, summed over timed iterations
  std::vector<double> forward_error, forward_ratio, backward_error, backward_ratio;  // per table
  double interaction_error = 0.0, interaction_relative = 0.0;                        // the latter: over the batch's max |dot|
  std::uint64_t violations = 0;
};

struct variant {
  kind k;
  std::string name, short_name;
  double rel = 0.0;  // kompress: its REL bound; casts: the bound their error is compared with
  std::unique_ptr<kompress::dlrm::embedding_exchange> exchange;
  std::unique_ptr<cast_exchange<fp32_codec>> plain;
  std::unique_ptr<cast_exchange<fp16_codec>> half;
  std::unique_ptr<cast_exchange<bf16_codec>> brain;
  result r;
  bool exact() const { return k == kind::plain || k == kind::kompress_off; }
  bool bounded() const { return k == kind::kompress_equal || k == kind::kompress_recommended; }
};

std::unique_ptr<kompress::dlrm::embedding_exchange> make_exchange(const layout& l, bool compress, double rel, int block_size) {
  std::vector<kompress::dlrm::table> tables;
  for (std::size_t t = 0; t < l.tables; ++t) tables.push_back({l.owner[t], l.dim});
  kompress::dlrm::exchange_options options;
  options.forward = {.bound = kompress::relative(rel), .block_size = block_size};
  options.backward = {.bound = kompress::relative(rel), .block_size = block_size};
  options.compress_forward = compress;
  options.compress_backward = compress;
  return std::make_unique<kompress::dlrm::embedding_exchange>(MPI_COMM_WORLD, std::move(tables), l.local_batch, options);
}

/// Forward + backward of one variant; returns the bytes this rank put on the wire.
std::uint64_t run(variant& v, const prepared& in, const matrix& out, const matrix& grad_out) {
  switch (v.k) {
    case kind::plain:
      v.plain->forward(in.pooled_local, out);
      v.plain->backward(in.grad_in, grad_out);
      return v.plain->wire_bytes();
    case kind::fp16:
      v.half->forward(in.pooled_local, out);
      v.half->backward(in.grad_in, grad_out);
      return v.half->wire_bytes();
    case kind::bf16:
      v.brain->forward(in.pooled_local, out);
      v.brain->backward(in.grad_in, grad_out);
      return v.brain->wire_bytes();
    default: {
      const auto forward = v.exchange->forward(host(), in.pooled_local, out);
      const auto backward = v.exchange->backward(host(), in.grad_in, grad_out);
      return forward.wire_bytes + backward.wire_bytes;
    }
  }
}

std::uint64_t sum_over_ranks(std::uint64_t x) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  return x;
}
double max_over_ranks(double x) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  return x;
}

/// Errors of one run against the exact values; kompress variants checked against their bound.
void evaluate(variant& v, const layout& l, const batch& b, const prepared& p, const matrix& out, const matrix& grad_out) {
  const std::size_t row = l.tables * l.dim, bl = l.local_batch, first = std::size_t(l.rank) * bl;
  auto& r = v.r;
  r.forward_error.resize(l.tables, 0.0), r.forward_ratio.resize(l.tables, 0.0);
  r.backward_error.resize(l.tables, 0.0), r.backward_ratio.resize(l.tables, 0.0);
  const auto ratio = [](double error, double bound) { return error == 0.0 ? 0.0 : bound > 0.0 ? error / bound : INFINITY; };
  for (std::size_t t = 0; t < l.tables; ++t) {
    const double bound = v.rel * p.forward_range[t];
    for (std::size_t s = 0; s < bl; ++s)
      for (std::size_t c = 0; c < l.dim; ++c) {
        const double error =
            std::fabs(double(out(s, l.global_column[t] + c)) - double(b.pooled[(first + s) * row + t * l.dim + c]));
        r.forward_error[t] = std::max(r.forward_error[t], error);
        r.forward_ratio[t] = std::max(r.forward_ratio[t], ratio(error, bound));
        if (v.bounded() ? !(error <= bound) : v.exact() && error != 0.0) ++r.violations;
      }
    if (l.owner[t] != l.rank) continue;
    for (int q = 0; q < l.ranks; ++q) {
      const double bound_q = v.rel * p.backward_range[std::size_t(t) * l.ranks + q];
      for (std::size_t s = std::size_t(q) * bl; s < std::size_t(q + 1) * bl; ++s)
        for (std::size_t c = 0; c < l.dim; ++c) {
          const double error =
              std::fabs(double(grad_out(s, l.local_column[t] + c)) - double(b.gradient[s * row + t * l.dim + c]));
          r.backward_error[t] = std::max(r.backward_error[t], error);
          r.backward_ratio[t] = std::max(r.backward_ratio[t], ratio(error, bound_q));
          if (v.bounded() ? !(error <= bound_q) : v.exact() && error != 0.0) ++r.violations;
        }
    }
  }
  std::vector<double> z;
  interact(
      bl, l.tables, l.dim, [&](std::size_t s, std::size_t t) { return out.data() + s * l.total_width + l.global_column[t]; }, z);
  double error = 0.0;
  for (std::size_t k = 0; k < z.size(); ++k) error = std::max(error, std::fabs(z[k] - p.interaction[k]));
  r.interaction_error = std::max(r.interaction_error, error);
  r.interaction_relative = std::max(r.interaction_relative, error / p.interaction_scale);
}

// ---------------------------------------------------------------------------------------------
// The header: which link, which machine

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return int(std::thread::hardware_concurrency());
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

/// Ping-pong between ranks 0 and 1 (4 MiB, the best of 3): the link these ranks really have.
double measure_link_gbps() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int count = 1 << 20;  // floats: 4 MiB
  std::vector<float> buffer(count, 1.0f);
  double best = INFINITY;
  for (int rep = 0; rep < 3; ++rep) {
    check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    const double start = MPI_Wtime();
    if (rank == 0) {
      check_mpi(MPI_Send(buffer.data(), count, MPI_FLOAT, 1, 7, MPI_COMM_WORLD), "MPI_Send");
      check_mpi(MPI_Recv(buffer.data(), count, MPI_FLOAT, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
    } else if (rank == 1) {
      check_mpi(MPI_Recv(buffer.data(), count, MPI_FLOAT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
      check_mpi(MPI_Send(buffer.data(), count, MPI_FLOAT, 0, 7, MPI_COMM_WORLD), "MPI_Send");
    }
    best = std::min(best, MPI_Wtime() - start);
  }
  best = max_over_ranks(rank <= 1 ? best : 0.0);
  return 2.0 * 8.0 * double(count) * sizeof(float) / best / 1e9;
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.size() % 2 ? x[x.size() / 2] : 0.5 * (x[x.size() / 2 - 1] + x[x.size() / 2]);
}

int run_example(const settings& options) {
  int ranks = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const bool root = rank == 0;
  if (ranks < 2) throw std::invalid_argument("run on 2 or more ranks (mpiexec -n 4): one rank has nothing to exchange");
  if (options.batch % std::size_t(ranks) != 0)
    throw std::invalid_argument("the global batch (" + std::to_string(options.batch) + ") must divide evenly into " +
                                std::to_string(ranks) + " ranks: the exchange takes the local batch");

  const model m = load_model();
  const layout l = make_layout(m, ranks, rank, options.batch);
  const auto laws = make_zipf(m, options.zipf, options.seed);
  const batch real = real_batch(l);

  // --- header ------------------------------------------------------------------------------------
  const double measured_gbps = measure_link_gbps();
  const char* link_env = std::getenv("KOMPRESS_LINK_GBPS");
  const std::string link = link_env && *link_env ? std::string(link_env) + " Gb/s" : "shm";
  if (root) {
    std::printf(
        "kompress DLRM embedding exchange: %d ranks, %zu tables of dim %zu (the nycflights13 DLRM), global batch %zu "
        "(%zu per rank)\n",
        ranks, l.tables, l.dim, l.global_batch, l.local_batch);
    if (link_env && *link_env)
      std::printf(
          "link: %s Gb/s, rate-limited loopback TCP in a private network namespace (KOMPRESS_LINK_GBPS); "
          "measured ping-pong %.2f Gb/s\n",
          link_env, measured_gbps);
    else
      std::printf(
          "link: shared memory, not network-limited: speedups here understate a real network "
          "(measured ping-pong %.1f Gb/s)\n",
          measured_gbps);
    std::printf("cores: %d usable, %d ranks x %d OpenMP thread(s)%s; load average %s\n", usable_cores(), ranks,
                host().concurrency(), ranks * host().concurrency() > usable_cores() ? " (oversubscribed)" : "",
                load_average().c_str());
    std::printf("tables:");
    for (int q = 0; q < ranks; ++q) {
      std::printf("%s rank %d:", q ? ";" : "", q);
      for (std::size_t t = 0; t < l.tables; ++t)
        if (l.owner[t] == q) std::printf(" %s(%zu)", m.names[t].c_str(), m.rows[t]);
    }
    std::printf(
        "\nbatches: iteration 0 the real held-out batch; then Zipf(%.2f) lookups, 1-%d per sample and table, "
        "sum pooling, seed %llu (backward: real gradient rows of random real samples)\n",
        options.zipf, options.pooling, static_cast<unsigned long long>(options.seed));
  }

  // --- the variants ------------------------------------------------------------------------------
  const std::string bound_text = [&] {
    char text[32];
    std::snprintf(text, sizeof text, "%g", options.bound);
    return std::string(text);
  }();
  std::vector<variant> variants;
  variants.push_back({kind::plain,
                      "plain MPI (fp32 Alltoallv)",
                      "plain",
                      options.bound,
                      nullptr,
                      std::make_unique<cast_exchange<fp32_codec>>(l),
                      nullptr,
                      nullptr,
                      {}});
  variants.push_back({kind::kompress_off,
                      "kompress, compression off",
                      "kompress off",
                      options.bound,
                      make_exchange(l, false, options.bound, options.block_size),
                      nullptr,
                      nullptr,
                      nullptr,
                      {}});
  variants.push_back({kind::fp16,
                      "fp16 cast (16-bit Alltoallv)",
                      "fp16 cast",
                      options.bound,
                      nullptr,
                      nullptr,
                      std::make_unique<cast_exchange<fp16_codec>>(l),
                      nullptr,
                      {}});
  variants.push_back({kind::bf16,
                      "bf16 cast (16-bit Alltoallv)",
                      "bf16 cast",
                      options.bound,
                      nullptr,
                      nullptr,
                      nullptr,
                      std::make_unique<cast_exchange<bf16_codec>>(l),
                      {}});

  matrix out("out", l.local_batch, l.total_width), grad_out("grad_out", l.global_batch, l.mine());
  const prepared real_prepared = prepare(l, real);

  // The REL bound at fp16's bytes: bisection in log(bound) on the real batch, for the smallest
  // bound whose bytes are at most fp16's (bytes fall as the bound grows).
  const std::uint64_t fp16_bytes = sum_over_ranks(variants[2].half->wire_bytes());
  const auto kompress_bytes = [&](double rel) {
    variant probe{
        kind::kompress_equal, "", "", rel, make_exchange(l, true, rel, options.block_size), nullptr, nullptr, nullptr, {}};
    return sum_over_ranks(run(probe, real_prepared, out, grad_out));
  };
  double lo = std::log(1e-8), hi = std::log(0.5);
  std::uint64_t equal_bytes = kompress_bytes(std::exp(hi));
  const bool reachable = equal_bytes <= fp16_bytes;
  if (reachable) {
    while (hi - lo > std::log(1.02)) {  // to 2% of the bound: 10 steps
      const double mid = 0.5 * (lo + hi);
      const std::uint64_t bytes = kompress_bytes(std::exp(mid));
      if (bytes <= fp16_bytes) hi = mid, equal_bytes = bytes;
      else lo = mid;
    }
  }
  const double equal_rel = std::exp(hi);
  if (root)
    std::printf("fp16-equal bound: REL %.3g (bisection on the real batch: kompress %llu bytes vs fp16 %llu)%s\n", equal_rel,
                static_cast<unsigned long long>(equal_bytes), static_cast<unsigned long long>(fp16_bytes),
                reachable ? "" : "; NOT reached even at REL 0.5");
  char name[64], short_name[32];
  std::snprintf(name, sizeof name, "kompress REL %.2g (=fp16 bytes)", equal_rel);
  std::snprintf(short_name, sizeof short_name, "kompress %.2g", equal_rel);
  variants.push_back({kind::kompress_equal,
                      name,
                      short_name,
                      equal_rel,
                      make_exchange(l, true, equal_rel, options.block_size),
                      nullptr,
                      nullptr,
                      nullptr,
                      {}});
  variants.push_back({kind::kompress_recommended,
                      "kompress REL " + bound_text + (options.bound == 1e-2 ? " (recommended)" : ""),
                      "kompress " + bound_text,
                      options.bound,
                      make_exchange(l, true, options.bound, options.block_size),
                      nullptr,
                      nullptr,
                      nullptr,
                      {}});

  // Warm-up: every variant once, untimed (connections, first allocations).
  for (auto& v : variants) run(v, real_prepared, out, grad_out);

  // --- the timed iterations -------------------------------------------------------------------------
  for (int iteration = 0; iteration < options.iterations; ++iteration) {
    const batch b =
        iteration == 0 ? batch{} : zipf_batch(m, l, laws, real, options.pooling, options.seed + 1000 + std::uint64_t(iteration));
    const batch& current = iteration == 0 ? real : b;
    const prepared p = iteration == 0 ? prepared{} : prepare(l, b);
    const prepared& inputs = iteration == 0 ? real_prepared : p;
    for (std::size_t k = 0; k < variants.size(); ++k) {
      variant& v = variants[(k + std::size_t(iteration)) % variants.size()];
      Kokkos::deep_copy(out, -1.0f);
      Kokkos::deep_copy(grad_out, -1.0f);
      check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
      const double start = MPI_Wtime();
      v.r.wire_bytes += run(v, inputs, out, grad_out);
      const double elapsed = MPI_Wtime() - start;
      v.r.times.push_back(max_over_ranks(elapsed));
      evaluate(v, l, current, inputs, out, grad_out);
    }
  }

  // --- the table ---------------------------------------------------------------------------------
  std::uint64_t any_violation = 0;
  for (auto& v : variants) {
    auto& r = v.r;
    r.wire_bytes = sum_over_ranks(r.wire_bytes);
    r.violations = sum_over_ranks(r.violations);
    any_violation += r.violations;
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, r.forward_error.data(), int(l.tables), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
              "MPI_Allreduce");
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, r.forward_ratio.data(), int(l.tables), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
              "MPI_Allreduce");
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, r.backward_error.data(), int(l.tables), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
              "MPI_Allreduce");
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, r.backward_ratio.data(), int(l.tables), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
              "MPI_Allreduce");
    r.interaction_error = max_over_ranks(r.interaction_error);
    r.interaction_relative = max_over_ranks(r.interaction_relative);
  }

  const double plain_time = median(variants[0].r.times);
  const double plain_bytes = double(variants[0].r.wire_bytes);
  const double iterations = double(options.iterations);
  const auto max_of = [](const std::vector<double>& x) { return x.empty() ? 0.0 : *std::max_element(x.begin(), x.end()); };
  std::FILE* csv = nullptr;
  if (root && !options.csv.empty()) {
    csv = std::fopen(options.csv.c_str(), "w");
    if (!csv) throw std::runtime_error("cannot write " + options.csv);
    std::fprintf(csv,
                 "link,ranks,global_batch,iterations,variant,rel_bound,wire_bytes_per_iteration,ratio,time_ms_median,"
                 "time_ms_min,speedup_vs_plain,forward_max_error,forward_error_over_bound,backward_max_error,"
                 "backward_error_over_bound,interaction_max_error,interaction_relative_error,violations\n");
  }
  if (root) {
    std::printf(
        "\n%d timed iterations (forward + backward each, after one untimed warm-up); time = max over ranks, median over "
        "iterations; bytes = all ranks, per iteration;\nerr/bound = the largest error over the table's bound, worst "
        "table (kompress: its own bound; casts: the REL %s bound); interaction = max |dot - exact dot| "
        "(and / the batch's largest |dot|)\n\n",
        options.iterations, bound_text.c_str());
    std::printf("%-34s %10s %6s %9s %7s | %9s %8s | %9s %8s | %11s %8s\n", "variant", "wire MB", "ratio", "time ms", "speedup",
                "fwd err", "/bound", "bwd err", "/bound", "interaction", "/|dot|");
    std::printf("%s\n",
                std::string(34 + 1 + 10 + 1 + 6 + 1 + 9 + 1 + 7 + 3 + 9 + 1 + 8 + 3 + 9 + 1 + 8 + 3 + 11 + 1 + 8, '-').c_str());
  }
  for (const auto& v : variants) {
    const auto& r = v.r;
    const double bytes = double(r.wire_bytes) / iterations, time = median(r.times);
    const double fwd_error = max_of(r.forward_error), fwd_ratio = max_of(r.forward_ratio);
    const double bwd_error = max_of(r.backward_error), bwd_ratio = max_of(r.backward_ratio);
    if (root) {
      std::printf("%-34s %10.3f %6.2f %9.2f %6.2fx | %9.2e %8.3g | %9.2e %8.3g | %11.2e %8.2e%s\n", v.name.c_str(), bytes / 1e6,
                  plain_bytes / double(r.wire_bytes), time * 1e3, plain_time / time, fwd_error, fwd_ratio, bwd_error, bwd_ratio,
                  r.interaction_error, r.interaction_relative,
                  r.violations == 0 ? ""
                  : v.bounded()     ? "  BOUND VIOLATED"
                                    : "  NOT EXACT");
      if (csv)
        std::fprintf(csv, "%s,%d,%zu,%d,\"%s\",%g,%.0f,%.4f,%.4f,%.4f,%.4f,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%llu\n", link.c_str(),
                     ranks, l.global_batch, options.iterations, v.name.c_str(), v.exact() ? 0.0 : v.rel, bytes,
                     plain_bytes / double(r.wire_bytes), time * 1e3, *std::min_element(r.times.begin(), r.times.end()) * 1e3,
                     plain_time / time, fwd_error, fwd_ratio, bwd_error, bwd_ratio, r.interaction_error, r.interaction_relative,
                     static_cast<unsigned long long>(r.violations));
    }
  }
  if (csv) std::fclose(csv);

  if (root && options.per_table) {
    std::printf(
        "\nper table: largest error / the table's bound (kompress: its own; casts: REL %s), forward | backward;\n"
        "REL bound: the forward bound on the real batch\n",
        bound_text.c_str());
    std::printf("%-9s %5s %9s |", "table", "owner", "REL bound");
    for (std::size_t k = 2; k < variants.size(); ++k) std::printf(" %-18.18s", variants[k].short_name.c_str());
    std::printf("\n");
    for (std::size_t t = 0; t < l.tables; ++t) {
      std::printf("%-9s %5d %9.2e |", m.names[t].c_str(), l.owner[t], options.bound * real_prepared.forward_range[t]);
      for (std::size_t k = 2; k < variants.size(); ++k)
        std::printf(" %7.3g | %-8.3g", variants[k].r.forward_ratio[t], variants[k].r.backward_ratio[t]);
      std::printf("\n");
    }
  }

  if (root) {
    const auto& best = variants.back().r;
    const double speedup = plain_time / median(best.times), versus_fp16 = median(variants[2].r.times) / median(best.times);
    std::printf("\nkompress REL %s: %.2fx the speed of plain MPI, %.2fx the fp16 cast, %.1fx fewer bytes than plain%s\n",
                bound_text.c_str(), speedup, versus_fp16, plain_bytes / double(best.wire_bytes),
                link_env && *link_env ? "" : " (shared memory: see the link line above)");
    std::printf("%s\n", any_violation == 0 ? "every kompress value within its table's bound; plain variants bit-exact"
                                           : "FAILED: see the markers above");
  }
  return any_violation == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      status = run_example(parse(argc, argv));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_dlrm_exchange: %s\n", e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  MPI_Finalize();
  return status;
}
