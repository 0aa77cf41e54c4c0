// Training through the compressed activation stash: a 784-1024-1024-10 ReLU MLP on MNIST,
// trained twice from the same initial weights in the same data order: once keeping the
// activations the backward pass needs as plain Views, once saving them through a
// kompress::stash at a relative bound (1e-2 by default) and restoring them in backward order.
// It prints per-epoch training loss, held-out loss and accuracy of both runs, the loss and
// accuracy of their final weights over the whole training set, the memory the saved activations
// took in each, and the compression ratio (docs/stash.md discusses them).
//
//   bench_stash_training [--epochs 5] [--train 8000] [--eval 2000] [--batch 128]
//                           [--lr 1e-3] [--schedule cosine|constant] [--warmup 0.2]
//                           [--bound 1e-2] [--seed 1] [--data DIR] [--verify]
//                           [--mask stash|bits|restored] [--async] [--quick] [--max-loss-gap PERCENT]
//                           [--model mlp|cnn|transformer] [--check-gradients]
//                           [--codec fast|ratio|auto] [--rounding nearest|stochastic] [--segment-bytes 65536]
//                           [--adaptive-bounds CEILING] [--tolerance 0.05] [--check-every 50] [--baselines]
//                           [--tensor-bounds REL,REL,...] [--group-relative]
//
// --model cnn trains a small CNN instead of the MLP, with everything else the same (recipe,
// batch, data, both runs, the report): conv 3x3 pad 1 1->8, ReLU, maxpool 2x2 (28->14); conv
// 3x3 pad 1 8->16, ReLU, maxpool 2x2 (14->7); Linear 784->10; PyTorch's default
// initialisation. The convolutions run as the same matrix product over an im2col matrix.
// Saved for backward, through the stash in the stash run: the input of each layer with weights
// (the image, pool 1's output, pool 2's output), with keep_sign in the stash run. Kept beside
// them in both runs and counted in both runs' memory: the pools' argmax (which of the 2x2
// window's four won), 2 bits per output. No ReLU mask is kept: the gradient reaches a ReLU
// output only at its window's argmax, where the output is the pooled one, so the mask there is
// "pooled output > 0", which the saved output (its sign exact) gives. --check-gradients
// compares the CNN's backward pass with central differences of the loss at a few entries of
// every parameter on the plain run's first step (float precision and the kinks of ReLU and max
// bound how well they agree). The CNN's
// measured loss gaps and memory are in docs/stash.md, "The small CNN".
//
// --model transformer trains a small vision-transformer block instead, again with everything
// else the same: 49 patches of 4x4 embedded to 128 plus a learned position embedding; one
// pre-norm block (4-head self-attention, then an MLP 128->512->128 with GELU); a final
// LayerNorm, the mean over the tokens, Linear 128->10. Its kernels, what it saves and what it
// keeps plain are in bench/stash_training_transformer.hpp; its --check-gradients fails the run
// (exit status 1, "GRADIENT CHECK FAILED") when backward and central differences disagree.
// Measured: docs/stash.md, "The transformer block".
//
// The recipe: Adam, its learning rate rising linearly from 0 to --lr over the first --warmup of
// all steps (a fraction: 0.2, one epoch of five), then decaying to 0 along a cosine over the
// rest (--schedule constant keeps it at --lr after the warmup; --warmup 0 --schedule constant is
// plain Adam at 1e-3). Both halves are needed for the plain and stashed
// runs to end close together: with a constant rate the end point is a different sample of the
// training's scatter in each run, and without the warmup the runs can part early (docs/stash.md,
// "Training through the stash", has the measurements).
//
// "Final training loss" is the loss of the final weights over the whole training set, one
// forward pass after training (also printed: the mean over the last epoch's minibatches, which
// mixes in the weights of the whole epoch).
//
// The ReLUs' backward needs to know which outputs were positive. By default (--mask stash) the
// MLP's stash run saves the ReLU outputs with keep_sign: the stash keeps a bit per value and
// restores every value on its saved side of 0, so the mask is taken from the restored outputs
// and is exact (counted in the stash's memory). The image is saved with keep_sign too: its
// pixels are >= 0, so its zeros, like the ReLU outputs', are stored as sign bits alone.
// --mask bits keeps the mask as the caller's own bits beside the compressed outputs (as ActNN
// does; counted too); --mask restored takes it from
// restored outputs saved without keep_sign, which zeroes the gradient through every output the
// bound rounds to 0 and biases training (docs/stash.md).
//
// --codec picks the stash's codec per save (auto: measured per layer, stash_codec::automatic),
// --rounding its rounding (stochastic: unbiased restored values, one bit more per value),
// --group-relative takes every bound relative to each group of 256 values' range instead of
// the tensor's (stash_save_options::group_relative, docs/stash.md).
// --adaptive-bounds CEILING (MLP) chooses each saved tensor's bound with kompress::layer_bounds,
// from --bound up to CEILING: on check steps the run keeps exact copies of the saved tensors
// (which the memory ratio does not count), computes each weight gradient from both, and reports
// their distance; the bounds' changes are printed at the end. --tensor-bounds gives the saved
// tensors their own bounds instead, fixed, in the order they are saved (the MLP's and the CNN's
// three, the transformer's nine as listed below); tensors past the list take --bound.
// --segment-bytes sizes the stash's segments (and its workspace).
//
// --baselines trains the model twice more from the same weights in the same order, its saved
// tensors kept as ActNN-style 2-bit codes (groups of 256, stochastic rounding; a ReLU's mask as
// bits beside them, as ActNN keeps it: the MLP's two, the CNN's pooled outputs') and as binary16
// casts, and prints the four runs' final losses and memory side by side.
//
// --async saves with save_async, which enqueues the compression and returns (the backward
// pass's restores settle the entries). It compresses each activation as one stream instead of
// 64 KiB segments, so the restored values differ in their rounding (each within the bound),
// and the budget has to hold the worst case of a save in flight (docs/stash.md, "Asynchronous
// saves").
//
// --quick is the ctest run: 1 epoch on the first 1024 training images, 512 held-out ones,
// with --verify (every restored activation checked against the bound, "BOUND VIOLATED" if
// not). --max-loss-gap fails the run (exit status 1) when the stash run's final training loss
// (of the final weights) is further than PERCENT from the plain run's.
//
// Data: mnist_t10k_images_10000x28x28.u8 and mnist_t10k_labels_10000.u8 from the data folder
// (KOMPRESS_DATA_DIR, else ../shared/data beside the repository): the first images train, the
// last ones evaluate, as the activations in that folder were made.
//
// Everything runs in Kokkos on the default execution space: the matrix products are a
// register-blocked kernel (4 x 8 tiles of the output, one per work item), the rest are plain
// parallel loops; the initialisation is PyTorch's default.

#include "activation_baselines.hpp"
#include "support.hpp"

#include <kompress/stash.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <utility>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef KOMPRESS_DEFAULT_DATA_DIR
#define KOMPRESS_DEFAULT_DATA_DIR ""
#endif

namespace {

namespace fs = std::filesystem;
using exec_space = Kokkos::DefaultExecutionSpace;
using memory_space = exec_space::memory_space;
using matrix = Kokkos::View<float**, Kokkos::LayoutRight, memory_space>;
using vector = Kokkos::View<float*, memory_space>;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// --- the kernels ------------------------------------------------------------------------------

/// C = A B (A: M x K, B: K x N, C: M x N, row-major). Each work item computes a 4 x 8 tile of
/// C over the whole of K with its accumulators in registers; tiles that share a column panel
/// of B are consecutive, so the panel stays in cache.
void gemm(const exec_space& exec, const matrix& a, const matrix& b, const matrix& c) {
  constexpr int tile_m = 4, tile_n = 8;
  const int m = int(a.extent(0)), k = int(a.extent(1)), n = int(b.extent(1));
  const int tiles_m = (m + tile_m - 1) / tile_m, tiles_n = (n + tile_n - 1) / tile_n;
  const float* const a_data = a.data();
  const float* const b_data = b.data();
  float* const c_data = c.data();
  Kokkos::parallel_for(
      "gemm", Kokkos::RangePolicy<exec_space>(exec, 0, tiles_m * tiles_n), KOKKOS_LAMBDA(int tile) {
        const int row = (tile % tiles_m) * tile_m, column = (tile / tiles_m) * tile_n;
        if (row + tile_m <= m && column + tile_n <= n) {
          float acc[tile_m][tile_n] = {};
          for (int p = 0; p < k; ++p) {
            const float* b_row = b_data + std::size_t(p) * n + column;
            for (int i = 0; i < tile_m; ++i) {
              const float a_value = a_data[std::size_t(row + i) * k + p];
              for (int j = 0; j < tile_n; ++j) acc[i][j] += a_value * b_row[j];
            }
          }
          for (int i = 0; i < tile_m; ++i)
            for (int j = 0; j < tile_n; ++j) c_data[std::size_t(row + i) * n + column + j] = acc[i][j];
        } else {  // an edge tile
          for (int i = row; i < Kokkos::min(row + tile_m, m); ++i)
            for (int j = column; j < Kokkos::min(column + tile_n, n); ++j) {
              float sum = 0.0f;
              for (int p = 0; p < k; ++p) sum += a_data[std::size_t(i) * k + p] * b_data[std::size_t(p) * n + j];
              c_data[std::size_t(i) * n + j] = sum;
            }
        }
      });
}

void transpose(const exec_space& exec, const matrix& in, const matrix& out) {
  Kokkos::parallel_for(
      "transpose",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {in.extent(0), in.extent(1)}),
      KOKKOS_LAMBDA(int i, int j) { out(j, i) = in(i, j); });
}

/// z += bias (per column); then relu in place if asked.
void bias_activation(const exec_space& exec, const matrix& z, const vector& bias, bool relu) {
  Kokkos::parallel_for(
      "bias_activation",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {z.extent(0), z.extent(1)}),
      KOKKOS_LAMBDA(int i, int j) {
        const float v = z(i, j) + bias(j);
        z(i, j) = relu ? (v > 0.0f ? v : 0.0f) : v;
      });
}

/// grad *= (activation > 0): the ReLU's backward, its mask taken from the (restored) output.
void relu_backward(const exec_space& exec, const matrix& grad, const matrix& activation) {
  Kokkos::parallel_for(
      "relu_backward",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {grad.extent(0), grad.extent(1)}),
      KOKKOS_LAMBDA(int i, int j) {
        if (!(activation(i, j) > 0.0f)) grad(i, j) = 0.0f;
      });
}

using mask_matrix = Kokkos::View<std::uint32_t**, Kokkos::LayoutRight, memory_space>;

/// One bit per value of a ReLU output: value > 0 (ActNN's saved ReLU mask).
void pack_mask(const exec_space& exec, const matrix& activation, const mask_matrix& mask) {
  const int columns = int(activation.extent(1));
  Kokkos::parallel_for(
      "pack_mask",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {activation.extent(0), mask.extent(1)}),
      KOKKOS_LAMBDA(int i, int w) {
        std::uint32_t bits = 0;
        for (int b = 0; b < 32 && 32 * w + b < columns; ++b)
          bits |= std::uint32_t(activation(i, 32 * w + b) > 0.0f) << b;
        mask(i, w) = bits;
      });
}

/// grad *= mask: the ReLU's backward from the saved bits.
void relu_backward_mask(const exec_space& exec, const matrix& grad, const mask_matrix& mask) {
  Kokkos::parallel_for(
      "relu_backward_mask",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {grad.extent(0), grad.extent(1)}),
      KOKKOS_LAMBDA(int i, int j) {
        if (!((mask(i, j / 32) >> (j % 32)) & 1u)) grad(i, j) = 0.0f;
      });
}

void column_sums(const exec_space& exec, const matrix& grad, const vector& sums) {
  const int rows = int(grad.extent(0));
  Kokkos::parallel_for(
      "column_sums", Kokkos::RangePolicy<exec_space>(exec, 0, grad.extent(1)), KOKKOS_LAMBDA(int j) {
        float s = 0.0f;
        for (int i = 0; i < rows; ++i) s += grad(i, j);
        sums(j) = s;
      });
}

/// Mean softmax cross-entropy of the logits; writes its gradient into `grad`; returns the
/// summed loss and the number of correct predictions.
std::pair<double, int> softmax_cross_entropy(const exec_space& exec, const matrix& logits,
                                             const Kokkos::View<int*, memory_space>& labels,
                                             const matrix& grad, int scale_rows) {
  double loss = 0.0;
  int correct = 0;
  const int classes = int(logits.extent(1));
  Kokkos::parallel_reduce(
      "softmax_cross_entropy", Kokkos::RangePolicy<exec_space>(exec, 0, logits.extent(0)),
      KOKKOS_LAMBDA(int i, double& loss_sum, int& correct_sum) {
        float top = logits(i, 0);
        int best = 0;
        for (int c = 1; c < classes; ++c)
          if (logits(i, c) > top) top = logits(i, c), best = c;
        double sum = 0.0;
        for (int c = 0; c < classes; ++c) sum += std::exp(double(logits(i, c) - top));
        const double log_sum = std::log(sum) + top;
        loss_sum += log_sum - logits(i, labels(i));
        correct_sum += best == labels(i) ? 1 : 0;
        if (grad.extent(0) != 0)
          for (int c = 0; c < classes; ++c)
            grad(i, c) = float((std::exp(double(logits(i, c)) - log_sum) - (c == labels(i) ? 1.0 : 0.0)) /
                               scale_rows);
      },
      loss, correct);
  return {loss, correct};
}

// --- the model ------------------------------------------------------------------------------

struct parameter {
  vector value, m, v, grad;
  explicit parameter(const std::string& name, std::size_t size)
      : value(name, size), m(name + ".m", size), v(name + ".v", size), grad(name + ".grad", size) {}
  void adam(const exec_space& exec, int step, float lr) {
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float c1 = 1.0f - std::pow(b1, float(step)), c2 = 1.0f - std::pow(b2, float(step));
    auto w = value, mm = m, vv = v, g = grad;
    Kokkos::parallel_for(
        "adam", Kokkos::RangePolicy<exec_space>(exec, 0, w.size()), KOKKOS_LAMBDA(std::size_t i) {
          mm(i) = b1 * mm(i) + (1.0f - b1) * g(i);
          vv(i) = b2 * vv(i) + (1.0f - b2) * g(i) * g(i);
          w(i) -= lr * (mm(i) / c1) / (std::sqrt(vv(i) / c2) + eps);
        });
  }
};

/// PyTorch's default for Linear and Conv2d (kaiming-uniform with a = sqrt(5)):
/// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias, the weight drawn first.
void pytorch_default_init(parameter& weight, parameter& bias, int fan_in, std::mt19937& rng) {
  const float limit = 1.0f / std::sqrt(float(fan_in));
  std::uniform_real_distribution<float> uniform(-limit, limit);
  auto w = Kokkos::create_mirror_view(weight.value);
  auto b = Kokkos::create_mirror_view(bias.value);
  for (std::size_t i = 0; i < w.size(); ++i) w(i) = uniform(rng);
  for (std::size_t i = 0; i < b.size(); ++i) b(i) = uniform(rng);
  Kokkos::deep_copy(weight.value, w);
  Kokkos::deep_copy(bias.value, b);
}

/// A Linear layer, its weight stored transposed ([in, out]) so the forward product is X W.
struct linear {
  int in, out;
  parameter weight, bias;  // weight.value is W^T, [in, out]
  matrix weight_t, weight_plain, grad_t;  // views of weight.value / weight.grad as matrices, W [out, in]
  linear(int in_, int out_, std::mt19937& rng, const std::string& name)
      : in(in_), out(out_), weight(name + ".weight", std::size_t(in_) * out_), bias(name + ".bias", out_),
        weight_t(weight.value.data(), in_, out_), weight_plain(name + ".W", out_, in_),
        grad_t(weight.grad.data(), in_, out_) {
    pytorch_default_init(weight, bias, in_, rng);
  }
};

struct dataset {
  matrix images;  // [n, 784], pixels / 255
  std::vector<int> labels;
};

/// A minibatch's labels and images, gathered in `order` from the dataset (both models).
struct batch_loader {
  Kokkos::View<int*, memory_space> labels, indices;
  Kokkos::View<int*, memory_space>::host_mirror_type labels_host, indices_host;

  explicit batch_loader(int batch)
      : labels("labels", batch), indices("indices", batch),
        labels_host(Kokkos::create_mirror_view(labels)),
        indices_host(Kokkos::create_mirror_view(indices)) {}

  /// Rows [first, first + rows) of `order`: labels into `labels`, images into `x` ([rows, 784]).
  void load(const exec_space& exec, const dataset& data, const std::vector<int>& order, int first,
            int rows, const matrix& x) const {
    for (int i = 0; i < rows; ++i) {
      indices_host(i) = order[std::size_t(first + i)];
      labels_host(i) = data.labels[std::size_t(order[std::size_t(first + i)])];
    }
    Kokkos::deep_copy(exec, indices, indices_host);
    Kokkos::deep_copy(exec, labels, labels_host);
    const auto images = data.images;
    const auto idx = indices;
    Kokkos::parallel_for(
        "gather", Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {rows, 784}),
        KOKKOS_LAMBDA(int i, int j) { x(i, j) = images(idx(i), j); });
  }
};

dataset load_mnist(const fs::path& dir) {
  const fs::path images_path = dir / "mnist_t10k_images_10000x28x28.u8";
  const fs::path labels_path = dir / "mnist_t10k_labels_10000.u8";
  std::vector<unsigned char> pixels(10000 * 784), labels(10000);
  std::ifstream images_file(images_path, std::ios::binary), labels_file(labels_path, std::ios::binary);
  if (!images_file.read(reinterpret_cast<char*>(pixels.data()), std::streamsize(pixels.size())) ||
      !labels_file.read(reinterpret_cast<char*>(labels.data()), std::streamsize(labels.size())))
    throw std::runtime_error("stash_training: cannot read the MNIST files in '" + dir.string() +
                             "' (set KOMPRESS_DATA_DIR or pass --data)");
  dataset data{matrix("images", 10000, 784), std::vector<int>(labels.begin(), labels.end())};
  auto host = Kokkos::create_mirror_view(data.images);
  for (std::size_t i = 0; i < pixels.size(); ++i) host.data()[i] = float(pixels[i]) / 255.0f;
  Kokkos::deep_copy(data.images, host);
  return data;
}

struct settings {
  int epochs = 5, train = 8000, eval = 2000, batch = 128;
  double lr = 1e-3;
  bool cosine = true;   // learning rate after the warmup: cosine decay to 0 (else constant)
  double warmup = 0.2;  // the fraction of all steps that warm up linearly before the decay
  double bound = 1e-2;
  unsigned seed = 1;
  bool verify = false;
  bool async_save = false;  // stash run: save_async instead of save
  // The MLP's stash run: where its ReLUs' backward takes their masks from (the --mask comment).
  enum class mask_source { stash, bits, restored } mask = mask_source::stash;
  kompress::stash_codec codec = kompress::stash_codec::fast;
  kompress::rounding_mode rounding = kompress::rounding_mode::nearest;
  bool group_relative = false;
  std::size_t segment_bytes = 64 * 1024;
  double adaptive_ceiling = 0;  // > 0: kompress::layer_bounds from `bound` up to this
  std::vector<double> tensor_bounds;  // --tensor-bounds: REL per saved tensor, in save order
  /// The relative bound saved tensor `which` is stored at (without --adaptive-bounds).
  kompress::error_bound bound_of(std::size_t which) const {
    return kompress::relative(which < tensor_bounds.size() ? tensor_bounds[which] : bound);
  }
  double tolerance = 0.05;
  std::uint64_t check_every = 50;
  bool baselines = false;  // --baselines: also train through ActNN-style 2-bit codes and fp16
  double max_loss_gap = -1.0;  // percent; < 0: not checked
  bool cnn = false;  // --model cnn: the small CNN instead of the MLP
  bool transformer = false;  // --model transformer: the transformer block instead of the MLP
  bool check_gradients = false;  // --check-gradients (cnn, transformer): backward against central differences
  fs::path data;
};

struct epoch_result {
  double train_loss = 0, eval_loss = 0, eval_accuracy = 0, seconds = 0;
};

struct run_result {
  std::vector<epoch_result> epochs;
  double final_train_loss = 0, final_train_accuracy = 0;  // the final weights over the training set
  std::size_t peak_activation_bytes = 0;  // saved activations between forward and backward
  std::size_t peak_stored_bytes = 0;      // stash only: streams
  double ratio = 0;
  double save_seconds = 0, restore_seconds = 0;
  std::size_t spilled = 0;
  double max_error_over_bound = 0;
  int violations = 0;
  double gradient_check_worst = 0;  // --check-gradients (transformer): largest relative difference
  std::uint64_t saves = 0, ratio_codec_saves = 0;
  std::vector<kompress::layer_bound_change> bound_log;  // --adaptive-bounds
  std::vector<double> final_bounds;                     // --adaptive-bounds: per saved tensor
};

/// The learning rate of Adam step `step` (1-based): the first s.warmup of all steps rise
/// linearly to s.lr, the rest follow a cosine from s.lr towards 0 (the last step's is just
/// above 0), or stay at s.lr.
struct schedule {
  const settings& s;
  int total_steps, warmup;
  explicit schedule(const settings& s_)
      : s(s_), total_steps(s_.epochs * ((s_.train + s_.batch - 1) / s_.batch)),
        warmup(std::min(int(std::lround(s_.warmup * total_steps)), total_steps - 1)) {}
  float operator()(int step) const {
    const int t = step - 1;
    if (t < warmup) return float(s.lr * (t + 1) / warmup);
    if (!s.cosine) return float(s.lr);
    const double progress = double(t - warmup) / double(total_steps - warmup);
    return float(s.lr * 0.5 * (1.0 + std::cos(3.14159265358979323846 * progress)));
  }
};

using stash_type = kompress::stash<exec_space>;

/// The stash of the stash run: a budget of half what the plain run keeps, with --segment-bytes
/// segments (64 KiB: a ~66 KB workspace); anything over would spill to host memory rather than
/// fail (and be counted). Stochastic rounding draws from --seed.
std::unique_ptr<stash_type> make_stash(const exec_space& exec, std::size_t plain_bytes, const settings& s) {
  kompress::stash_options options{.budget_bytes = plain_bytes / 2,
                                  .policy = kompress::budget_policy::spill_to_host(),
                                  .segment_bytes = s.segment_bytes};
  options.codec.rounding_seed = s.seed;
  return std::make_unique<stash_type>(exec, options);
}

/// Restores saved activation `which` into `target` (the buffer the forward wrote it in; in a
/// framework that buffer would have been freed), timed; with --verify, checks it against a copy
/// of what was saved (taken into `check`, at least target.size() floats) and the bound.
template <class View>
void restore_checked(stash_type& stash, const exec_space& exec, const settings& s,
                     const kompress::stash_handle& handle, const View& target, float* check,
                     run_result& result, int which) {
  using flat = Kokkos::View<float*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const flat data(target.data(), target.size()), copy(check, target.size());
  if (s.verify) Kokkos::deep_copy(exec, copy, data);
  const auto start = clock_type::now();
  const kompress::stash_entry_info info = stash.info(handle);
  stash.restore_and_drop(exec, handle, target);
  result.restore_seconds += seconds_since(start);
  if (!s.verify) return;
  // The largest error over its bound: the entry's, or (group_relative) each group's own,
  // computed from the saved copy as docs/stash.md defines it.
  double worst = 0.0;
  if (info.group_relative) {
    const double r = info.used_bound.value;
    const std::size_t n = data.size();
    Kokkos::parallel_reduce(
        "verify groups", Kokkos::RangePolicy<exec_space>(exec, 0, (n + 255) / 256),
        KOKKOS_LAMBDA(std::size_t g, double& m) {
          const std::size_t first = 256 * g, last = Kokkos::min(n, first + 256);
          double low = Kokkos::Experimental::infinity_v<double>, high = -low, largest = 0.0;
          for (std::size_t i = first; i < last; ++i) {
            const double c = copy(i);
            if (!Kokkos::isfinite(c)) continue;
            low = Kokkos::min(low, c);
            high = Kokkos::max(high, c);
            largest = Kokkos::max(largest, Kokkos::abs(c));
          }
          const int k = kompress::detail::clamped_floor_log2(high > low ? high - low : largest, -100, 127);
          const double bound = r * Kokkos::exp2(double(k));
          for (std::size_t i = first; i < last; ++i)
            if (Kokkos::isfinite(copy(i))) m = Kokkos::max(m, double(Kokkos::abs(data(i) - copy(i))) / bound);
        },
        Kokkos::Max<double>(worst));
  } else {
    double max_error = 0.0;
    Kokkos::parallel_reduce(
        "verify", Kokkos::RangePolicy<exec_space>(exec, 0, data.size()),
        KOKKOS_LAMBDA(std::size_t i, double& m) { m = Kokkos::max(m, double(Kokkos::abs(data(i) - copy(i)))); },
        Kokkos::Max<double>(max_error));
    worst = info.absolute_bound > 0 ? max_error / info.absolute_bound : max_error > 0 ? INFINITY : 0.0;
  }
  if (worst > 1.0) {
    ++result.violations;
    std::printf("BOUND VIOLATED: restored activation %d off by %g times its bound\n", which, worst);
  }
  result.max_error_over_bound = std::max(result.max_error_over_bound, worst);
}

/// Saves activation `which` (`view`) into `handle`, timed, through save or save_async (--async);
/// the plain run (no stash) instead takes `plain_bytes`, what it holds saved by now, as its peak.
template <class View>
void save_timed(stash_type* stash, const exec_space& exec, const settings& s, kompress::stash_handle& handle,
                const View& view, const kompress::error_bound& bound, run_result& result, int which,
                std::size_t plain_bytes, bool keep_sign = false) {
  if (!stash) {
    result.peak_activation_bytes = std::max(result.peak_activation_bytes, plain_bytes);
    return;
  }
  const auto start = clock_type::now();
  const kompress::stash_save_options options{
      .codec = s.codec,
      .layer = std::uint32_t(which),
      .keep_sign = keep_sign,
      .rounding = s.rounding,
      .group_relative = s.group_relative};
  handle = s.async_save ? stash->save_async(exec, view, bound, options) : stash->save(exec, view, bound, options);
  result.save_seconds += seconds_since(start);
}

/// The epochs (shuffled minibatches, then the held-out set) and the pass of the final weights
/// over the training set, printing as they go. `step(order, first, rows, training, adam_step,
/// loss_sum, correct_sum)` is one forward (+ backward and update when training) over rows
/// [first, first + rows) of `order`.
template <class Step>
void run_epochs(const settings& s, const char* run_name, run_result& result, Step&& step) {
  const int batch = s.batch;
  std::vector<int> train_order(std::size_t(s.train)), eval_order(std::size_t(s.eval));
  std::iota(train_order.begin(), train_order.end(), 0);
  std::iota(eval_order.begin(), eval_order.end(), 10000 - s.eval);
  std::mt19937 shuffle_rng(s.seed + 1);
  int adam_step = 0;
  for (int epoch = 0; epoch < s.epochs; ++epoch) {
    const auto start = clock_type::now();
    std::shuffle(train_order.begin(), train_order.end(), shuffle_rng);
    double loss_sum = 0;
    int correct = 0;
    for (int first = 0; first < s.train; first += batch)
      step(train_order, first, std::min(batch, s.train - first), true, ++adam_step, loss_sum, correct);
    epoch_result e;
    e.train_loss = loss_sum / s.train;
    e.seconds = seconds_since(start);
    double eval_loss = 0;
    int eval_correct = 0;
    for (int first = 0; first < s.eval; first += batch)
      step(eval_order, first, std::min(batch, s.eval - first), false, 0, eval_loss, eval_correct);
    e.eval_loss = eval_loss / s.eval;
    e.eval_accuracy = double(eval_correct) / s.eval;
    result.epochs.push_back(e);
    std::printf("  %-6s epoch %d  train loss %.5f  held-out loss %.5f  accuracy %.2f%%  (%.1f s)\n",
                run_name, epoch + 1, e.train_loss, e.eval_loss,
                100.0 * e.eval_accuracy, e.seconds);
    std::fflush(stdout);
  }
  // The final weights over the whole training set, in order, forward only.
  {
    const auto start = clock_type::now();
    std::vector<int> in_order(std::size_t(s.train));
    std::iota(in_order.begin(), in_order.end(), 0);
    double loss = 0;
    int correct = 0;
    for (int first = 0; first < s.train; first += batch)
      step(in_order, first, std::min(batch, s.train - first), false, 0, loss, correct);
    result.final_train_loss = loss / s.train;
    result.final_train_accuracy = double(correct) / s.train;
    std::printf("  %-6s final weights: training-set loss %.5f  accuracy %.2f%%  (%.1f s)\n",
                run_name, result.final_train_loss, 100.0 * result.final_train_accuracy,
                seconds_since(start));
  }
}

/// The stash run's memory and compression from the stash's statistics.
void stash_statistics(const stash_type& stash, run_result& result) {
  const auto stats = stash.stats();
  result.peak_activation_bytes = stats.peak_pool_bytes;
  result.peak_stored_bytes = stats.peak_stored_bytes;
  result.ratio = stats.ratio();
  result.spilled = stats.spilled_segments;
  result.saves = stats.saves;
  result.ratio_codec_saves = stats.ratio_codec_saves;
}

/// What the MLP's training keeps its saved activations as between forward and backward.
enum class storage {
  plain,    ///< the Views themselves
  stash,    ///< kompress::stash, within the bound
  actnn2,   ///< ActNN-style 2-bit per-group codes, stochastic rounding, ReLU masks as bits
  float16,  ///< IEEE binary16 casts (masks from the restored outputs)
};

const char* storage_name(storage how) {
  switch (how) {
    case storage::plain: return "plain";
    case storage::stash: return "stash";
    case storage::actnn2: return "actnn2";
    case storage::float16: return "fp16";
  }
  return "?";
}

/// The baselines' encoded copy of one saved activation (n values): ActNN-style codes or halves,
/// and with `positive_bits` which values were > 0 (1 bit each: ActNN keeps a ReLU's mask so; a
/// backward that takes the mask from the restored values, as the CNN's pooling does, then finds
/// it exact: a positive value restored as 0 comes back as the smallest normal float).
struct baseline_copy {
  using quantizer = kompress_bench::group_quantizer<2>;
  Kokkos::View<std::byte*, memory_space> codes;
  Kokkos::View<std::uint16_t*, memory_space> halves;  // binary16 bits
  Kokkos::View<std::uint32_t*, memory_space> positive;

  baseline_copy(storage how, std::size_t n, bool positive_bits = false) {
    if (how == storage::actnn2) codes = decltype(codes)("actnn2 codes", quantizer::bytes(n));
    if (how == storage::float16) halves = decltype(halves)("halves", n);
    if (positive_bits) positive = decltype(positive)("positive bits", (n + 31) / 32);
  }
  /// The bytes holding `n` values.
  std::size_t bytes(storage how, std::size_t n) const {
    return (how == storage::actnn2 ? quantizer::bytes(n) : how == storage::float16 ? n * sizeof(std::uint16_t) : 0) +
           (positive.size() > 0 ? (n + 31) / 32 * sizeof(std::uint32_t) : 0);
  }
  void save(const exec_space& exec, const float* values, std::size_t n, std::uint64_t seed) const {
    if (codes.size() > 0) {
      std::byte* const out = codes.data();
      Kokkos::parallel_for("actnn2 encode", Kokkos::RangePolicy<exec_space>(exec, 0, quantizer::groups(n)),
                           KOKKOS_LAMBDA(std::size_t g) { quantizer::encode_group(values, n, g, out, seed); });
    } else {
      std::uint16_t* const out = halves.data();
      Kokkos::parallel_for("fp16 encode", Kokkos::RangePolicy<exec_space>(exec, 0, n),
                           KOKKOS_LAMBDA(std::size_t i) { out[i] = kompress_bench::to_half_bits(values[i]); });
    }
    if (positive.size() > 0) {
      std::uint32_t* const bits = positive.data();
      Kokkos::parallel_for(
          "positive bits", Kokkos::RangePolicy<exec_space>(exec, 0, (n + 31) / 32), KOKKOS_LAMBDA(std::size_t w) {
            std::uint32_t word = 0;
            for (std::size_t b = 0; b < 32 && 32 * w + b < n; ++b)
              word |= std::uint32_t(values[32 * w + b] > 0.0f) << b;
            bits[w] = word;
          });
    }
  }
  void restore(const exec_space& exec, float* values, std::size_t n) const {
    if (codes.size() > 0) {
      const std::byte* const in = codes.data();
      Kokkos::parallel_for("actnn2 decode", Kokkos::RangePolicy<exec_space>(exec, 0, quantizer::groups(n)),
                           KOKKOS_LAMBDA(std::size_t g) { quantizer::decode_group(in, n, g, values); });
    } else {
      const std::uint16_t* const in = halves.data();
      Kokkos::parallel_for("fp16 decode", Kokkos::RangePolicy<exec_space>(exec, 0, n),
                           KOKKOS_LAMBDA(std::size_t i) { values[i] = kompress_bench::from_half_bits(in[i]); });
    }
    if (positive.size() > 0) {
      const std::uint32_t* const bits = positive.data();
      Kokkos::parallel_for(
          "apply positive bits", Kokkos::RangePolicy<exec_space>(exec, 0, n), KOKKOS_LAMBDA(std::size_t i) {
            const bool was_positive = (bits[i / 32] >> (i % 32)) & 1u;
            if (!was_positive) values[i] = Kokkos::min(values[i], 0.0f);
            else if (!(values[i] > 0.0f)) values[i] = Kokkos::Experimental::norm_min_v<float>;
          });
    }
  }
};

/// A baseline run's copies of one step's saved tensors, in the order the model saves them: the
/// time they take and the bytes they hold (the largest sum over a step, plus `side_bytes`).
struct baseline_saves {
  storage how;
  std::vector<baseline_copy> copies;
  std::vector<std::size_t> held;  // bytes per copy this step

  /// `sizes[k]`: the most values save k holds; `positive_bits[k]`: keep its positive bits.
  baseline_saves(storage how, const std::vector<std::size_t>& sizes, const std::vector<bool>& positive_bits = {})
      : how(how), held(sizes.size(), 0) {
    for (std::size_t k = 0; k < sizes.size(); ++k)
      copies.emplace_back(how, sizes[k], k < positive_bits.size() && positive_bits[k]);
  }
  void save(const exec_space& exec, int which, const float* values, std::size_t n, int adam_step,
            std::size_t side_bytes, run_result& result) {
    const auto start = clock_type::now();
    const auto k = std::size_t(which);
    copies[k].save(exec, values, n, std::uint64_t(adam_step) * copies.size() + k);
    exec.fence();
    result.save_seconds += seconds_since(start);
    if (which == 0) std::fill(held.begin(), held.end(), 0);
    held[k] = copies[k].bytes(how, n);
    result.peak_activation_bytes =
        std::max(result.peak_activation_bytes, std::accumulate(held.begin(), held.end(), side_bytes));
  }
  void restore(const exec_space& exec, int which, float* values, std::size_t n, run_result& result) const {
    const auto start = clock_type::now();
    copies[std::size_t(which)].restore(exec, values, n);
    exec.fence();
    result.restore_seconds += seconds_since(start);
  }
};

/// Trains the MLP, keeping the activations backward needs as `how` says.
run_result train(const settings& s, const dataset& data, storage how) {
  const bool use_stash = how == storage::stash;
  const bool baseline = how == storage::actnn2 || how == storage::float16;
  const exec_space exec;
  std::mt19937 rng(s.seed);
  linear fc1(784, 1024, rng, "fc1"), fc2(1024, 1024, rng, "fc2"), fc3(1024, 10, rng, "fc3");
  linear* layers[3] = {&fc1, &fc2, &fc3};
  const int batch = s.batch;
  // Working buffers (both runs): inputs and outputs of each layer, their gradients.
  matrix x("x", batch, 784), a1("a1", batch, 1024), a2("a2", batch, 1024), logits("logits", batch, 10);
  matrix d3("d3", batch, 10), d2("d2", batch, 1024), d1("d1", batch, 1024);
  matrix xt("xt", 784, batch), a1t("a1t", 1024, batch), a2t("a2t", 1024, batch);
  matrix check("check", batch, 1024);  // --verify: a copy of what was saved
  mask_matrix mask1("mask1", batch, 32), mask2("mask2", batch, 32);
  const bool mask_bits = (use_stash && s.mask == settings::mask_source::bits) || how == storage::actnn2;
  const bool stash_signs = use_stash && s.mask == settings::mask_source::stash;
  batch_loader loader(batch);
  const auto labels = loader.labels;

  // The stash: a budget of half what the plain run keeps (about 1.45 MB at batch 128). The
  // workspace and the compressed activations take under half of it.
  const std::size_t plain_bytes = std::size_t(batch) * (784 + 1024 + 1024) * sizeof(float);
  std::unique_ptr<stash_type> stash;
  if (use_stash) stash = make_stash(exec, plain_bytes, s);
  std::optional<baseline_saves> copies;
  if (baseline) copies.emplace(how, std::vector<std::size_t>{std::size_t(batch) * 784, std::size_t(batch) * 1024,
                                                              std::size_t(batch) * 1024});
  run_result result;
  const schedule learning_rate(s);
  // --adaptive-bounds: each saved tensor's bound from the training (kompress::layer_bounds);
  // on check steps exact copies of the saved tensors and one weight gradient's worth of room.
  std::optional<kompress::layer_bounds> bounds;
  if (use_stash && s.adaptive_ceiling > 0)
    bounds.emplace(kompress::layer_bounds_options{.initial = kompress::relative(s.bound),
                                                  .ceiling = kompress::relative(s.adaptive_ceiling),
                                                  .tolerance = s.tolerance,
                                                  .check_every = s.check_every});
  matrix exact_x, exact_a1, exact_a2, exact_grad;
  if (bounds) {
    exact_x = matrix("exact x", batch, 784);
    exact_a1 = matrix("exact a1", batch, 1024);
    exact_a2 = matrix("exact a2", batch, 1024);
    exact_grad = matrix("exact grad", 1024, 1024);
  }

  // One forward (+ backward when training) over rows [first, first + rows) of `order`.
  auto step = [&](const std::vector<int>& order, int first, int rows, bool training, int adam_step,
                  double& loss_sum, int& correct_sum) {
    auto xb = Kokkos::subview(x, std::pair(0, rows), Kokkos::ALL);
    auto a1b = Kokkos::subview(a1, std::pair(0, rows), Kokkos::ALL);
    auto a2b = Kokkos::subview(a2, std::pair(0, rows), Kokkos::ALL);
    auto logitsb = Kokkos::subview(logits, std::pair(0, rows), Kokkos::ALL);
    auto d3b = Kokkos::subview(d3, std::pair(0, rows), Kokkos::ALL);
    auto d2b = Kokkos::subview(d2, std::pair(0, rows), Kokkos::ALL);
    auto d1b = Kokkos::subview(d1, std::pair(0, rows), Kokkos::ALL);
    // Contiguous row blocks of LayoutRight matrices: as matrices of their own.
    const matrix xm(xb.data(), rows, 784), a1m(a1b.data(), rows, 1024), a2m(a2b.data(), rows, 1024),
        logitsm(logitsb.data(), rows, 10), d3m(d3b.data(), rows, 10), d2m(d2b.data(), rows, 1024),
        d1m(d1b.data(), rows, 1024);
    loader.load(exec, data, order, first, rows, xm);

    // Forward. What backward needs: x (fc1's input), a1 (fc2's input, ReLU 1's output),
    // a2 (fc3's input, ReLU 2's output).
    kompress::stash_handle saved[3];
    const matrix* kept[3] = {&xm, &a1m, &a2m};
    const matrix exact[3] = {matrix(exact_x.data(), rows, 784), matrix(exact_a1.data(), rows, 1024),
                             matrix(exact_a2.data(), rows, 1024)};
    const bool checking = training && bounds && bounds->check_due(std::uint64_t(adam_step));
    auto save = [&](int which) {
      if (!training) return;
      if (copies) {  // never with a stash
        copies->save(exec, which, kept[which]->data(), kept[which]->size(), adam_step,
                     mask_bits ? std::size_t(rows) * 2 * 32 * sizeof(std::uint32_t) : 0, result);
        return;
      }
      if (checking) Kokkos::deep_copy(exec, exact[which], *kept[which]);  // only a stash run has bounds
      const auto bound = bounds ? bounds->bound(std::uint32_t(which)) : s.bound_of(std::size_t(which));
      save_timed(stash.get(), exec, s, saved[which], *kept[which], bound, result, which,
                 std::size_t(rows) * (784 + 2048) * sizeof(float), stash_signs);
    };
    save(0);
    gemm(exec, xm, fc1.weight_t, a1m);
    bias_activation(exec, a1m, fc1.bias.value, true);
    if (training && mask_bits) pack_mask(exec, a1m, mask_matrix(mask1.data(), rows, 32));
    save(1);
    gemm(exec, a1m, fc2.weight_t, a2m);
    bias_activation(exec, a2m, fc2.bias.value, true);
    if (training && mask_bits) pack_mask(exec, a2m, mask_matrix(mask2.data(), rows, 32));
    save(2);
    gemm(exec, a2m, fc3.weight_t, logitsm);
    bias_activation(exec, logitsm, fc3.bias.value, false);
    const auto [loss, correct] =
        softmax_cross_entropy(exec, logitsm, labels, training ? d3m : matrix(), rows);
    loss_sum += loss;
    correct_sum += correct;
    if (!training) return;

    // Backward, in reverse order of the saves: restore each activation into its own buffer
    // (the forward wrote it there; in a framework that buffer would have been freed).
    auto restore = [&](int which) {
      if (stash) restore_checked(*stash, exec, s, saved[which], *kept[which], check.data(), result, which);
      if (copies) copies->restore(exec, which, kept[which]->data(), kept[which]->size(), result);
    };
    // A check step: the weight gradient from the exact copy too, and their distance. The
    // deltas are exact in both (the ReLUs' masks are), so this is all compression changes.
    auto check_gradient = [&](int which, const matrix& transposed, const matrix& delta, const linear& layer) {
      if (!checking) return;
      transpose(exec, exact[which], transposed);
      const matrix grad(exact_grad.data(), layer.in, layer.out);
      gemm(exec, transposed, delta, grad);
      bounds->report(std::uint64_t(adam_step), std::uint32_t(which),
                     kompress::layer_bounds::deviation(exec, grad, layer.grad_t));
    };
    restore(2);
    transpose(exec, a2m, matrix(a2t.data(), 1024, rows));
    gemm(exec, matrix(a2t.data(), 1024, rows), d3m, fc3.grad_t);  // dW3^T = a2^T d3
    check_gradient(2, matrix(a2t.data(), 1024, rows), d3m, fc3);
    column_sums(exec, d3m, fc3.bias.grad);
    transpose(exec, fc3.weight_t, fc3.weight_plain);
    gemm(exec, d3m, fc3.weight_plain, d2m);  // d a2 = d3 W3
    if (mask_bits) relu_backward_mask(exec, d2m, mask_matrix(mask2.data(), rows, 32));
    else relu_backward(exec, d2m, a2m);
    restore(1);
    transpose(exec, a1m, matrix(a1t.data(), 1024, rows));
    gemm(exec, matrix(a1t.data(), 1024, rows), d2m, fc2.grad_t);
    check_gradient(1, matrix(a1t.data(), 1024, rows), d2m, fc2);
    column_sums(exec, d2m, fc2.bias.grad);
    transpose(exec, fc2.weight_t, fc2.weight_plain);
    gemm(exec, d2m, fc2.weight_plain, d1m);
    if (mask_bits) relu_backward_mask(exec, d1m, mask_matrix(mask1.data(), rows, 32));
    else relu_backward(exec, d1m, a1m);
    restore(0);
    transpose(exec, xm, matrix(xt.data(), 784, rows));
    gemm(exec, matrix(xt.data(), 784, rows), d1m, fc1.grad_t);
    check_gradient(0, matrix(xt.data(), 784, rows), d1m, fc1);
    column_sums(exec, d1m, fc1.bias.grad);
    const float lr = learning_rate(adam_step);
    for (linear* layer : layers) {
      layer->weight.adam(exec, adam_step, lr);
      layer->bias.adam(exec, adam_step, lr);
    }
  };

  run_epochs(s, storage_name(how), result, step);
  if (stash) {
    stash_statistics(*stash, result);
    if (mask_bits) result.peak_activation_bytes += std::size_t(batch) * 2 * 32 * sizeof(std::uint32_t);
  }
  if (bounds) {
    result.bound_log = bounds->log();
    for (std::uint32_t which = 0; which < 3; ++which) result.final_bounds.push_back(bounds->bound(which).value);
  }
  return result;
}

// --- the CNN (--model cnn) ----------------------------------------------------------------------

using tensor = Kokkos::View<float****, Kokkos::LayoutRight, memory_space>;  // NCHW
/// Which of each 2x2 pooling window's four values won, 2 bits per pooled value, four to a byte
/// in the pooled tensor's NCHW order.
using argmax_bits = Kokkos::View<std::uint8_t*, memory_space>;

/// A 3x3 convolution with padding 1 (stride 1) on size x size images, its weight
/// [out, in * 9] row-major ([out, in, 3, 3]). It runs as matrix products over the im2col
/// matrix (one row per output position, one column per weight of an output channel), with
/// buffers for a batch.
struct conv3x3 {
  int in, out, size;
  parameter weight, bias;
  matrix cols;      // [batch * size^2, in * 9]: the input's 3x3 neighbourhoods
  matrix out_rows;  // [batch * size^2, out]: the output (or its gradient), one row per position
  matrix grad_t;    // [out, batch * size^2]: the output's gradient, one row per channel
  matrix weight_t;  // [in * 9, out]
  matrix weight_m;  // weight.value as [out, in * 9]
  matrix weight_grad_m;  // weight.grad as [out, in * 9]
  conv3x3(int in_, int out_, int size_, int batch, std::mt19937& rng, const std::string& name)
      : in(in_), out(out_), size(size_), weight(name + ".weight", std::size_t(out_) * in_ * 9),
        bias(name + ".bias", out_), cols(name + ".cols", std::size_t(batch) * size_ * size_, in_ * 9),
        out_rows(name + ".out_rows", std::size_t(batch) * size_ * size_, out_),
        grad_t(name + ".grad_t", out_, std::size_t(batch) * size_ * size_), weight_t(name + ".W^T", in_ * 9, out_),
        weight_m(weight.value.data(), out_, in_ * 9), weight_grad_m(weight.grad.data(), out_, in_ * 9) {
    pytorch_default_init(weight, bias, in_ * 9, rng);
  }
  matrix cols_of(int rows) const { return matrix(cols.data(), std::size_t(rows) * size * size, in * 9); }
  matrix out_rows_of(int rows) const { return matrix(out_rows.data(), std::size_t(rows) * size * size, out); }
  matrix grad_t_of(int rows) const { return matrix(grad_t.data(), out, std::size_t(rows) * size * size); }
};

/// cols((n * H + h) * W + x, ci * 9 + kh * 3 + kw) = in(n, ci, h + kh - 1, x + kw - 1), 0 outside.
void im2col(const exec_space& exec, const tensor& in, const matrix& cols) {
  const int height = int(in.extent(2)), width = int(in.extent(3));
  Kokkos::parallel_for(
      "im2col", Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {cols.extent(0), cols.extent(1)}),
      KOKKOS_LAMBDA(int row, int column) {
        const int x = row % width, h = (row / width) % height, n = row / (width * height);
        const int ci = column / 9, ih = h + (column % 9) / 3 - 1, iw = x + column % 3 - 1;
        cols(row, column) = ih >= 0 && ih < height && iw >= 0 && iw < width ? in(n, ci, ih, iw) : 0.0f;
      });
}

/// out = relu(conv(in) + bias): im2col, then [positions, in * 9] x W^T.
void conv3x3_relu_forward(const exec_space& exec, const tensor& in, conv3x3& layer, const tensor& out) {
  const int rows = int(in.extent(0));
  const matrix cols = layer.cols_of(rows), out_rows = layer.out_rows_of(rows);
  im2col(exec, in, cols);
  transpose(exec, layer.weight_m, layer.weight_t);
  gemm(exec, cols, layer.weight_t, out_rows);
  const int hw = layer.size * layer.size;
  const auto b = layer.bias.value;
  Kokkos::parallel_for(
      "conv_bias_relu",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<3>>(exec, {0, 0, 0}, {rows, layer.out, hw}),
      KOKKOS_LAMBDA(int n, int co, int p) {
        const float v = out_rows(std::size_t(n) * hw + p, co) + b(co);
        out.data()[(std::size_t(n) * out.extent(1) + co) * hw + p] = v > 0.0f ? v : 0.0f;
      });
}

/// dW = dout^T cols (cols: conv3x3_relu_forward's im2col of this input, rebuilt from `in`),
/// db = sum of dout; with `din`, din = col2im(dout W).
void conv3x3_backward(const exec_space& exec, const tensor& in, const tensor& dout, conv3x3& layer,
                      const tensor& din) {
  const int rows = int(in.extent(0)), hw = layer.size * layer.size, cout = layer.out;
  const matrix cols = layer.cols_of(rows), grad_t = layer.grad_t_of(rows), out_rows = layer.out_rows_of(rows);
  im2col(exec, in, cols);
  Kokkos::parallel_for(
      "conv_grad_layout",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<3>>(exec, {0, 0, 0}, {rows, cout, hw}),
      KOKKOS_LAMBDA(int n, int co, int p) {
        const float g = dout.data()[(std::size_t(n) * cout + co) * hw + p];
        grad_t(co, std::size_t(n) * hw + p) = g;
        out_rows(std::size_t(n) * hw + p, co) = g;
      });
  gemm(exec, grad_t, cols, layer.weight_grad_m);  // dW = dout^T cols
  column_sums(exec, out_rows, layer.bias.grad);
  if (din.extent(0) == 0) return;
  gemm(exec, out_rows, layer.weight_m, cols);  // the im2col matrix's gradient, in place of it
  const int cin = layer.in, height = layer.size, width = layer.size;
  Kokkos::parallel_for(
      "col2im",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<4>>(exec, {0, 0, 0, 0}, {rows, cin, height, width}),
      KOKKOS_LAMBDA(int n, int ci, int ih, int iw) {
        float sum = 0.0f;
        for (int kh = 0; kh < 3; ++kh) {
          const int h = ih - kh + 1;
          if (h < 0 || h >= height) continue;
          for (int kw = 0; kw < 3; ++kw) {
            const int x = iw - kw + 1;
            if (x < 0 || x >= width) continue;
            sum += cols((std::size_t(n) * height + h) * width + x, ci * 9 + kh * 3 + kw);
          }
        }
        din(n, ci, ih, iw) = sum;
      });
}

/// 2x2 max pooling (stride 2); `argmax` keeps which of the window's four won (dy * 2 + dx,
/// the first of equal ones). One thread per byte of `argmax`: four pooled values.
void maxpool_forward(const exec_space& exec, const tensor& in, const tensor& out, const argmax_bits& argmax) {
  const std::size_t channels = out.extent(1), height = out.extent(2), width = out.extent(3), count = out.size();
  Kokkos::parallel_for(
      "maxpool_forward", Kokkos::RangePolicy<exec_space>(exec, 0, (count + 3) / 4), KOKKOS_LAMBDA(std::size_t byte) {
        std::uint8_t bits = 0;
        for (std::size_t k = 0; k < 4 && 4 * byte + k < count; ++k) {
          const std::size_t f = 4 * byte + k;
          const int x = int(f % width), h = int(f / width % height), c = int(f / (width * height) % channels),
                    n = int(f / (width * height * channels));
          float top = in(n, c, 2 * h, 2 * x);
          int best = 0;
          for (int w = 1; w < 4; ++w) {
            const float v = in(n, c, 2 * h + w / 2, 2 * x + w % 2);
            if (v > top) top = v, best = w;
          }
          out(n, c, h, x) = top;
          bits |= std::uint8_t(best << (2 * k));
        }
        argmax(byte) = bits;
      });
}

/// din = dout routed to each window's argmax, 0 elsewhere, and 0 where the pooled output is
/// not positive: the window's max is the ReLU output there, so this is the ReLU's backward too.
void maxpool_relu_backward(const exec_space& exec, const tensor& dout, const argmax_bits& argmax, const tensor& pooled,
                           const tensor& din) {
  const std::size_t channels = dout.extent(1), height = dout.extent(2), width = dout.extent(3);
  Kokkos::parallel_for(
      "maxpool_relu_backward",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<4>>(exec, {0, 0, 0, 0},
                                                         {din.extent(0), din.extent(1), din.extent(2), din.extent(3)}),
      KOKKOS_LAMBDA(int n, int c, int h, int x) {
        const std::size_t f = ((std::size_t(n) * channels + std::size_t(c)) * height + std::size_t(h / 2)) * width +
                              std::size_t(x / 2);
        const int best = (argmax(f / 4) >> (2 * (f % 4))) & 3;
        din(n, c, h, x) =
            best == (h % 2) * 2 + x % 2 && pooled(n, c, h / 2, x / 2) > 0.0f ? dout(n, c, h / 2, x / 2) : 0.0f;
      });
}

/// Trains the CNN: conv 3x3 1->8, ReLU, maxpool 2 (28 -> 14); conv 3x3 8->16, ReLU, maxpool 2
/// (14 -> 7); Linear 784 -> 10. With `use_stash`, the inputs of the three layers with weights
/// (the image, pool 1's output, pool 2's output) go through a stash, with keep_sign; both runs
/// keep the pools' argmax as 2 bits per pooled value, and no ReLU mask (maxpool_relu_backward).
run_result train_cnn(const settings& s, const dataset& data, storage how) {
  const bool use_stash = how == storage::stash;
  const exec_space exec;
  std::mt19937 rng(s.seed);
  const int batch = s.batch;
  conv3x3 conv1(1, 8, 28, batch, rng, "conv1"), conv2(8, 16, 14, batch, rng, "conv2");
  linear fc(784, 10, rng, "fc");
  constexpr int p1_size = 8 * 14 * 14, p2_size = 16 * 7 * 7;
  // Working buffers: the layers' outputs and their gradients, NCHW.
  matrix x("x", batch, 784), p2("p2", batch, p2_size), logits("logits", batch, 10), d3("d3", batch, 10),
      dp2("dp2", batch, p2_size), p2t("p2t", p2_size, batch);
  tensor c1("c1", batch, 8, 28, 28), p1("p1", batch, 8, 14, 14), c2("c2", batch, 16, 14, 14);
  tensor dc1("dc1", batch, 8, 28, 28), dp1("dp1", batch, 8, 14, 14), dc2("dc2", batch, 16, 14, 14);
  argmax_bits arg1("arg1", std::size_t(batch) * p1_size / 4), arg2("arg2", std::size_t(batch) * p2_size / 4);
  vector check("check", std::size_t(batch) * p1_size);  // --verify: a copy of what was saved
  batch_loader loader(batch);
  const auto labels = loader.labels;

  // Saved for backward: the image, pool 1's output, pool 2's output (as floats: 12.5 KB an
  // image); beside them, in both runs, the argmax (588 bytes).
  static_assert(p1_size % 4 == 0 && p2_size % 4 == 0, "an image's argmax bits fill whole bytes");
  const std::size_t saved_floats = 784 + p1_size + p2_size;
  const std::size_t side_bytes = (p1_size + p2_size) / 4;
  const std::size_t plain_bytes = std::size_t(batch) * saved_floats * sizeof(float);
  std::unique_ptr<stash_type> stash;
  if (use_stash) stash = make_stash(exec, plain_bytes, s);
  // The baselines: ActNN keeps the pooled ReLU outputs' masks as bits (the image is no ReLU's).
  std::optional<baseline_saves> copies;
  if (how == storage::actnn2 || how == storage::float16)
    copies.emplace(how, std::vector<std::size_t>{std::size_t(batch) * 784, std::size_t(batch) * p1_size,
                                                 std::size_t(batch) * p2_size},
                   std::vector<bool>{false, how == storage::actnn2, how == storage::actnn2});
  run_result result;
  const schedule learning_rate(s);
  parameter* parameters[6] = {&conv1.weight, &conv1.bias, &conv2.weight, &conv2.bias, &fc.weight, &fc.bias};

  // The batch's rows of the layers' buffers (contiguous: Views of their own).
  struct rows_of {
    matrix x, p2, logits, d3, dp2;
    tensor x4, c1, p1, c2, p2_4, dc1, dp1, dc2, dp2_4;
    argmax_bits arg1, arg2;
  };
  auto rows_view = [&](int rows) {
    rows_of r;
    r.x = matrix(x.data(), rows, 784);
    r.p2 = matrix(p2.data(), rows, p2_size);
    r.logits = matrix(logits.data(), rows, 10);
    r.d3 = matrix(d3.data(), rows, 10);
    r.dp2 = matrix(dp2.data(), rows, p2_size);
    r.x4 = tensor(x.data(), rows, 1, 28, 28);
    r.c1 = tensor(c1.data(), rows, 8, 28, 28);
    r.p1 = tensor(p1.data(), rows, 8, 14, 14);
    r.c2 = tensor(c2.data(), rows, 16, 14, 14);
    r.p2_4 = tensor(p2.data(), rows, 16, 7, 7);
    r.dc1 = tensor(dc1.data(), rows, 8, 28, 28);
    r.dp1 = tensor(dp1.data(), rows, 8, 14, 14);
    r.dc2 = tensor(dc2.data(), rows, 16, 14, 14);
    r.dp2_4 = tensor(dp2.data(), rows, 16, 7, 7);
    r.arg1 = argmax_bits(arg1.data(), std::size_t(rows) * p1_size / 4);
    r.arg2 = argmax_bits(arg2.data(), std::size_t(rows) * p2_size / 4);
    return r;
  };

  // The forward pass over the gathered batch; returns the summed loss and the number correct
  // (and with `gradient`, the loss's gradient in d3). `save(which)` is called as each weighted
  // layer's input is complete: the image (0), pool 1's output (1), pool 2's output (2).
  auto forward = [&](const rows_of& r, bool /*training: nothing to keep beyond the saves*/, bool gradient,
                     auto&& save) {
    const int rows = int(r.x.extent(0));
    save(0);
    conv3x3_relu_forward(exec, r.x4, conv1, r.c1);
    maxpool_forward(exec, r.c1, r.p1, r.arg1);
    save(1);
    conv3x3_relu_forward(exec, r.p1, conv2, r.c2);
    maxpool_forward(exec, r.c2, r.p2_4, r.arg2);
    save(2);
    gemm(exec, r.p2, fc.weight_t, r.logits);
    bias_activation(exec, r.logits, fc.bias.value, false);
    return softmax_cross_entropy(exec, r.logits, labels, gradient ? r.d3 : matrix(), rows);
  };

  auto backward = [&](const rows_of& r, auto&& restore) {
    const int rows = int(r.x.extent(0));
    restore(2);
    transpose(exec, r.p2, matrix(p2t.data(), p2_size, rows));
    gemm(exec, matrix(p2t.data(), p2_size, rows), r.d3, fc.grad_t);  // dW^T = p2^T d3
    column_sums(exec, r.d3, fc.bias.grad);
    transpose(exec, fc.weight_t, fc.weight_plain);
    gemm(exec, r.d3, fc.weight_plain, r.dp2);  // d p2 = d3 W
    maxpool_relu_backward(exec, r.dp2_4, r.arg2, r.p2_4, r.dc2);
    restore(1);
    conv3x3_backward(exec, r.p1, r.dc2, conv2, r.dp1);
    maxpool_relu_backward(exec, r.dp1, r.arg1, r.p1, r.dc1);
    restore(0);
    conv3x3_backward(exec, r.x4, r.dc1, conv1, tensor());
  };

  // --check-gradients: central differences of the batch's mean loss against the backward
  // pass's gradient, at a few entries of every parameter (the plain run's first step).
  auto check_gradients = [&](const rows_of& r, int rows) {
    const auto no_save = [](int) {};
    for (int k = 0; k < 6; ++k) {
      parameter& p = *parameters[k];
      auto value = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p.value);
      auto grad = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p.grad);
      double worst = 0.0;
      for (int t = 0; t < 5; ++t) {
        const std::size_t i = (p.value.size() - 1) * t / 4;
        const float eps = 1e-4f, original = value(i);
        auto loss_at = [&](float v) {
          Kokkos::deep_copy(Kokkos::subview(p.value, i), v);
          return forward(r, false, false, no_save).first / rows;
        };
        const double numeric = (loss_at(original + eps) - loss_at(original - eps)) / (2.0 * eps);
        Kokkos::deep_copy(Kokkos::subview(p.value, i), original);
        const double error = std::fabs(numeric - grad(i)) / std::max(1e-3, std::fabs(numeric) + std::fabs(grad(i)));
        worst = std::max(worst, error);
        std::printf("    gradient check %-12s [%6zu] backward %+.6e  central difference %+.6e\n",
                    p.value.label().c_str(), i, double(grad(i)), numeric);
      }
      std::printf("  gradient check %s: largest relative difference %.2e\n", p.value.label().c_str(), worst);
    }
  };

  auto step = [&](const std::vector<int>& order, int first, int rows, bool training, int adam_step,
                  double& loss_sum, int& correct_sum) {
    const rows_of r = rows_view(rows);
    const matrix xm = r.x;
    loader.load(exec, data, order, first, rows, xm);

    kompress::stash_handle saved[3];
    const tensor kept[3] = {r.x4, r.p1, r.p2_4};
    auto save = [&](int which) {
      if (training && copies)
        copies->save(exec, which, kept[which].data(), kept[which].size(), adam_step,
                     std::size_t(rows) * side_bytes, result);
      else if (training)
        save_timed(stash.get(), exec, s, saved[which], kept[which], s.bound_of(std::size_t(which)), result, which,
                   std::size_t(rows) * saved_floats * sizeof(float), true);
    };
    const auto [loss, correct] = forward(r, training, training, save);
    loss_sum += loss;
    correct_sum += correct;
    if (!training) return;
    backward(r, [&](int which) {
      if (stash) restore_checked(*stash, exec, s, saved[which], kept[which], check.data(), result, which);
      if (copies) copies->restore(exec, which, kept[which].data(), kept[which].size(), result);
    });
    if (s.check_gradients && adam_step == 1 && !stash) check_gradients(r, rows);
    const float lr = learning_rate(adam_step);
    for (parameter* p : parameters) p->adam(exec, adam_step, lr);
  };
  run_epochs(s, storage_name(how), result, step);
  if (stash) stash_statistics(*stash, result);
  if (!copies) result.peak_activation_bytes += std::size_t(batch) * side_bytes;
  return result;
}

// --- the transformer block (--model transformer) ------------------------------------------------

#include "stash_training_transformer.hpp"

fs::path default_data_dir() {
  if (const char* env = std::getenv("KOMPRESS_DATA_DIR"); env && *env) return env;
  return KOMPRESS_DEFAULT_DATA_DIR;
}

}  // namespace

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  settings s;
  s.data = default_data_dir();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("stash_training: " + arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--epochs") s.epochs = std::stoi(next());
    else if (arg == "--train") s.train = std::stoi(next());
    else if (arg == "--eval") s.eval = std::stoi(next());
    else if (arg == "--batch") s.batch = std::stoi(next());
    else if (arg == "--lr") s.lr = std::stod(next());
    else if (arg == "--schedule") {
      const std::string how = next();
      if (how != "cosine" && how != "constant") throw std::runtime_error("stash_training: --schedule cosine|constant");
      s.cosine = how == "cosine";
    }
    else if (arg == "--warmup") s.warmup = std::stod(next());
    else if (arg == "--bound") s.bound = std::stod(next());
    else if (arg == "--seed") s.seed = unsigned(std::stoul(next()));
    else if (arg == "--data") s.data = next();
    else if (arg == "--verify") s.verify = true;
    else if (arg == "--async") s.async_save = true;
    else if (arg == "--mask") {
      const std::string how = next();
      if (how != "stash" && how != "bits" && how != "restored")
        throw std::runtime_error("stash_training: --mask stash|bits|restored");
      s.mask = how == "stash" ? settings::mask_source::stash
               : how == "bits" ? settings::mask_source::bits
                               : settings::mask_source::restored;
    }
    else if (arg == "--max-loss-gap") s.max_loss_gap = std::stod(next());
    else if (arg == "--model") {
      const std::string which = next();
      if (which != "mlp" && which != "cnn" && which != "transformer")
        throw std::runtime_error("stash_training: --model mlp|cnn|transformer");
      s.cnn = which == "cnn";
      s.transformer = which == "transformer";
    }
    else if (arg == "--check-gradients") s.check_gradients = true;
    else if (arg == "--codec") {
      const std::string which = next();
      if (which != "fast" && which != "ratio" && which != "auto")
        throw std::runtime_error("stash_training: --codec fast|ratio|auto");
      s.codec = which == "fast"    ? kompress::stash_codec::fast
                : which == "ratio" ? kompress::stash_codec::ratio
                                   : kompress::stash_codec::automatic;
    }
    else if (arg == "--rounding") {
      const std::string which = next();
      if (which != "nearest" && which != "stochastic")
        throw std::runtime_error("stash_training: --rounding nearest|stochastic");
      s.rounding = which == "stochastic" ? kompress::rounding_mode::stochastic : kompress::rounding_mode::nearest;
    }
    else if (arg == "--group-relative") s.group_relative = true;
    else if (arg == "--segment-bytes") s.segment_bytes = std::stoul(next());
    else if (arg == "--adaptive-bounds") s.adaptive_ceiling = std::stod(next());
    else if (arg == "--tolerance") s.tolerance = std::stod(next());
    else if (arg == "--check-every") s.check_every = std::stoull(next());
    else if (arg == "--baselines") s.baselines = true;
    else if (arg == "--tensor-bounds") {
      for (const std::string& value : kompress_bench::split(next(), ',')) s.tensor_bounds.push_back(std::stod(value));
    }
    else if (arg == "--quick") s.epochs = 1, s.train = 1024, s.eval = 512, s.verify = true;
    else {
      std::fprintf(stderr, "stash_training: unknown argument '%s' (see the top of bench/stash_training.cpp)\n",
                   arg.c_str());
      return 2;
    }
  }
  if (s.train < 1 || s.train + s.eval > 10000 || s.eval < 1 || s.batch < 1 || s.epochs < 1 ||
      !(s.warmup >= 0 && s.warmup < 1) || !(s.lr > 0)) {
    std::fprintf(stderr, "stash_training: need 1 <= train, 1 <= eval, train + eval <= 10000, batch >= 1, "
                         "0 <= warmup < 1, lr > 0\n");
    return 2;
  }
  const std::size_t saved_tensors = s.transformer ? 9 : 3;
  if (s.tensor_bounds.size() > saved_tensors || (!s.tensor_bounds.empty() && s.adaptive_ceiling > 0)) {
    std::fprintf(stderr, "stash_training: --tensor-bounds takes at most %zu bounds for this model, and no "
                         "--adaptive-bounds beside it\n", saved_tensors);
    return 2;
  }
  if (s.cnn && s.mask != settings::mask_source::stash) {
    std::fprintf(stderr, "stash_training: --model cnn takes its ReLU masks from the pooled outputs (no --mask)\n");
    return 2;
  }
  if (s.transformer && s.mask != settings::mask_source::stash) {
    std::fprintf(stderr, "stash_training: --model transformer has no ReLU (no --mask restored)\n");
    return 2;
  }

  // The repository's data sample has no MNIST (data/README.md): say so, and exit with the
  // status ctest counts as skipped.
  if (!fs::exists(s.data / "mnist_t10k_images_10000x28x28.u8") && fs::exists(s.data / "sample.json")) {
    std::printf("skipped: needs MNIST, which only the full data set has; '%s' is the repository's sample "
                "(set KOMPRESS_DATA_DIR or --data to the full set, ../shared/data)\n", s.data.c_str());
    return 77;
  }
  const dataset data = load_mnist(s.data);
  std::printf("%s, Adam lr %g (linear warmup over %g%% of the steps, then %s), batch %d, "
              "%d training / %d held-out MNIST images, %d epoch(s), %d thread(s)\n",
              s.transformer ? "transformer block (49 patches of 4x4 -> 128, pre-norm, 4 heads, MLP 512 GELU; "
                              "mean over tokens, Linear 128-10)"
              : s.cnn       ? "CNN (conv 3x3 1-8, ReLU, maxpool 2; conv 3x3 8-16, ReLU, maxpool 2; Linear 784-10)"
                            : "784-1024-1024-10 ReLU MLP",
              s.lr, 100.0 * s.warmup, s.cosine ? "cosine decay to 0" : "constant", s.batch, s.train, s.eval, s.epochs,
              exec_space().concurrency());
  std::printf("plain: activations kept as Views\n");
  const auto train_model = [&](storage how) {
    return s.transformer ? train_transformer(s, data, how) : s.cnn ? train_cnn(s, data, how) : train(s, data, how);
  };
  const run_result plain = train_model(storage::plain);
  std::printf("stash: activations saved through kompress::stash at REL %g%s (%s, %s rounding)\n", s.bound,
              s.group_relative ? " of each group of 256 values" : "", s.async_save ? "save_async" : "save",
              s.rounding == kompress::rounding_mode::stochastic ? "stochastic" : "nearest");
  if (!s.tensor_bounds.empty()) {
    std::printf("  per saved tensor, in save order: REL");
    for (const double b : s.tensor_bounds) std::printf(" %g", b);
    std::printf(" (the rest: %g)\n", s.bound);
  }
  const run_result stashed = train_model(storage::stash);

  const double last_plain = plain.epochs.back().train_loss, last_stash = stashed.epochs.back().train_loss;
  const double final_plain = plain.final_train_loss, final_stash = stashed.final_train_loss;
  const double gap = 100.0 * std::fabs(final_stash - final_plain) / final_plain;
  std::printf("\n%-6s %12s %12s %12s %10s\n", "epoch", "plain loss", "stash loss", "gap", "acc p/s");
  for (std::size_t e = 0; e < plain.epochs.size(); ++e)
    std::printf("%-6zu %12.5f %12.5f %11.3f%% %5.2f/%5.2f\n", e + 1, plain.epochs[e].train_loss,
                stashed.epochs[e].train_loss,
                100.0 * (stashed.epochs[e].train_loss - plain.epochs[e].train_loss) / plain.epochs[e].train_loss,
                100.0 * plain.epochs[e].eval_accuracy, 100.0 * stashed.epochs[e].eval_accuracy);
  std::printf("last epoch's mean training loss: plain %.5f, stash %.5f (%+.3f%%); held-out accuracy %.2f%% vs %.2f%%\n",
              last_plain, last_stash, 100.0 * (last_stash - last_plain) / last_plain,
              100.0 * plain.epochs.back().eval_accuracy, 100.0 * stashed.epochs.back().eval_accuracy);
  std::printf("final training loss (final weights, whole training set): plain %.5f, stash %.5f (%+.3f%%)\n",
              final_plain, final_stash, 100.0 * (final_stash - final_plain) / final_plain);
  std::printf("peak saved-activation memory: plain %.1f KB (Views%s), stash %.1f KB (pool high-water: "
              "streams %.1f KB + workspace%s%s)\n",
              plain.peak_activation_bytes / 1e3,
              s.transformer ? " + LayerNorm rstd" : s.cnn ? " + pool argmax bits" : "",
              stashed.peak_activation_bytes / 1e3, stashed.peak_stored_bytes / 1e3,
              s.async_save ? " + the worst-case ranges of saves in flight" : "",
              s.transformer ? "; + LayerNorm rstd"
              : s.cnn       ? "; the sign bits included; + pool argmax bits"
              : s.mask == settings::mask_source::bits ? "; + ReLU mask bits"
              : s.mask == settings::mask_source::stash ? "; the ReLU outputs' sign bits included"
                            : "");
  std::printf("memory ratio %.2fx; compression ratio over all saves %.2fx; spilled segments %zu; "
              "saves with the ratio codec %llu of %llu\n",
              double(plain.peak_activation_bytes) / double(stashed.peak_activation_bytes), stashed.ratio,
              stashed.spilled, (unsigned long long)stashed.ratio_codec_saves, (unsigned long long)stashed.saves);
  if (!stashed.final_bounds.empty()) {
    std::printf("adaptive bounds (tolerance %g, checks every %llu steps once settled): final REL", s.tolerance,
                (unsigned long long)s.check_every);
    for (double b : stashed.final_bounds) std::printf(" %g", b);
    // The check steps' exact copies are the whole batch's: this run shows which bounds the
    // checks choose, not what they cost (kompress.torch.LayerBounds checks a few rows at a time).
    std::printf("\n  (the memory ratio counts the stash; check steps also hold exact copies of the batch's "
                "saved tensors, %.1f KB)\n",
                double(std::size_t(s.batch) * (784 + 2 * 1024) * sizeof(float)) / 1e3);
    for (const auto& change : stashed.bound_log)
      std::printf("  step %4llu  saved tensor %u  REL %g -> %g  (gradient deviation %.4f)\n",
                  (unsigned long long)change.step, change.layer, change.from.value, change.to.value, change.deviation);
  }
  double plain_seconds = 0, stash_seconds = 0;
  for (const auto& e : plain.epochs) plain_seconds += e.seconds;
  for (const auto& e : stashed.epochs) stash_seconds += e.seconds;
  std::printf("training time: plain %.1f s, stash %.1f s (save %.2f s, restore %.2f s)\n", plain_seconds,
              stash_seconds, stashed.save_seconds, stashed.restore_seconds);
  if (s.baselines) {
    std::vector<std::pair<storage, run_result>> baselines;
    for (const storage how : {storage::actnn2, storage::float16}) {
      std::printf("%s: activations stored as %s\n", storage_name(how),
                  how == storage::actnn2 ? (s.transformer ? "ActNN-style 2-bit codes (groups of 256, stochastic "
                                                            "rounding)"
                                                          : "ActNN-style 2-bit codes (groups of 256, stochastic "
                                                            "rounding; ReLU masks as bits)")
                                         : "IEEE binary16");
      baselines.emplace_back(how, train_model(how));
    }
    std::printf("\nthe same training, the saved activations stored by each method:\n");
    std::printf("%-8s %12s %10s %12s %13s %9s\n", "method", "final loss", "gap", "memory (KB)", "memory ratio",
                "held-out");
    const auto row = [&](const char* name, const run_result& r) {
      std::printf("%-8s %12.5f %+9.3f%% %12.1f %12.2fx %8.2f%%\n", name, r.final_train_loss,
                  100.0 * (r.final_train_loss - final_plain) / final_plain, r.peak_activation_bytes / 1e3,
                  double(plain.peak_activation_bytes) / double(r.peak_activation_bytes),
                  100.0 * r.epochs.back().eval_accuracy);
    };
    row("plain", plain);
    row("stash", stashed);
    for (const auto& [how, result] : baselines) row(storage_name(how), result);
  }
  if (s.verify && stashed.violations == 0)
    std::printf("every restored activation within its bound (largest error / bound: %.3f)\n",
                stashed.max_error_over_bound);
  if (stashed.violations > 0) return 1;  // "BOUND VIOLATED" was printed
  if (s.transformer && s.check_gradients) {
    std::printf("gradient check: largest relative difference %.2e (limit %.0e)\n", plain.gradient_check_worst,
                transformer_gradient_tolerance);
    if (!(plain.gradient_check_worst <= transformer_gradient_tolerance)) {
      std::printf("GRADIENT CHECK FAILED\n");
      return 1;
    }
  }
  if (s.max_loss_gap >= 0 && !(gap <= s.max_loss_gap)) {
    std::printf("LOSS GAP %.3f%% exceeds %.3f%%\n", gap, s.max_loss_gap);
    return 1;
  }
  return 0;
}
