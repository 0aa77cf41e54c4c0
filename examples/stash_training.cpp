// Training through the compressed activation stash: a 784-1024-1024-10 ReLU MLP on MNIST,
// trained twice from the same initial weights in the same data order: once keeping the
// activations the backward pass needs as plain Views, once saving them through a
// kompress::stash at a relative bound (1e-2 by default) and restoring them in backward order.
// It prints per-epoch training loss, held-out loss and accuracy of both runs, the loss and
// accuracy of their final weights over the whole training set, the memory the saved activations
// took in each, and the compression ratio (docs/stash.md discusses them).
//
//   kompress_stash_training [--epochs 5] [--train 8000] [--eval 2000] [--batch 128]
//                           [--lr 1e-3] [--schedule cosine|constant] [--warmup 0.2]
//                           [--bound 1e-2] [--seed 1] [--data DIR] [--verify]
//                           [--mask bits|restored] [--async] [--quick] [--max-loss-gap PERCENT]
//
// The recipe: Adam, its learning rate rising linearly from 0 to --lr over the first --warmup of
// all steps (a fraction: 0.2, one epoch of five), then decaying to 0 along a cosine over the
// rest (--schedule constant keeps it at --lr after the warmup; --warmup 0 --schedule constant is
// the plain Adam 1e-3 of earlier versions). This is what lets the two runs end within 1% of
// each other on every seed tried, and both halves are needed: with a constant rate the end point
// is a different sample of the training's scatter in each run (2-14% apart), and without the
// warmup the runs can part early (1.6% apart on seed 1) (docs/stash.md, "Training through the
// stash").
//
// "Final training loss" is the loss of the final weights over the whole training set, one
// forward pass after training (also printed: the mean over the last epoch's minibatches, which
// mixes in the weights of the whole epoch).
//
// The ReLUs' backward needs to know which outputs were positive. By default the stash run
// keeps that as a 1-bit mask per value beside the compressed outputs (as ActNN does; counted in
// its memory); --mask restored takes it from the restored outputs instead, which zeroes the
// gradient through every output the bound rounds to 0 and biases training (docs/stash.md).
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
  bool mask_bits = true;  // stash run: ReLU masks as saved bits, not from restored outputs
  double max_loss_gap = -1.0;  // percent; < 0: not checked
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

/// The stash of the stash run: a budget of half what the plain run keeps, with 64 KiB segments
/// (a ~66 KB workspace); anything over would spill to host memory rather than fail (and be
/// counted).
std::unique_ptr<stash_type> make_stash(const exec_space& exec, std::size_t plain_bytes) {
  return std::make_unique<stash_type>(
      exec, kompress::stash_options{.budget_bytes = plain_bytes / 2,
                                    .policy = kompress::budget_policy::spill_to_host(),
                                    .segment_bytes = 64 * 1024});
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
  const double abs_bound = stash.info(handle).absolute_bound;
  stash.restore_and_drop(exec, handle, target);
  result.restore_seconds += seconds_since(start);
  if (s.verify) {
    double max_error = 0.0;
    Kokkos::parallel_reduce(
        "verify", Kokkos::RangePolicy<exec_space>(exec, 0, data.size()),
        KOKKOS_LAMBDA(std::size_t i, double& m) { m = Kokkos::max(m, double(Kokkos::abs(data(i) - copy(i)))); },
        Kokkos::Max<double>(max_error));
    if (max_error > abs_bound) {
      ++result.violations;
      std::printf("BOUND VIOLATED: restored activation %d off by %g, bound %g\n", which, max_error, abs_bound);
    }
    if (abs_bound > 0) result.max_error_over_bound = std::max(result.max_error_over_bound, max_error / abs_bound);
  }
}

/// The epochs (shuffled minibatches, then the held-out set) and the pass of the final weights
/// over the training set, printing as they go. `step(order, first, rows, training, adam_step,
/// loss_sum, correct_sum)` is one forward (+ backward and update when training) over rows
/// [first, first + rows) of `order`.
template <class Step>
void run_epochs(const settings& s, bool use_stash, run_result& result, Step&& step) {
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
                use_stash ? "stash" : "plain", epoch + 1, e.train_loss, e.eval_loss,
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
                use_stash ? "stash" : "plain", result.final_train_loss, 100.0 * result.final_train_accuracy,
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
}

/// Trains the MLP; with `use_stash`, the activations backward needs go through a stash.
run_result train(const settings& s, const dataset& data, bool use_stash) {
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
  const bool mask_bits = use_stash && s.mask_bits;
  Kokkos::View<int*, memory_space> labels("labels", batch), indices("indices", batch);
  auto labels_host = Kokkos::create_mirror_view(labels);
  auto indices_host = Kokkos::create_mirror_view(indices);

  // The stash: a budget of half what the plain run keeps (about 1.45 MB at batch 128). The
  // workspace and the compressed activations take under half of it.
  const std::size_t plain_bytes = std::size_t(batch) * (784 + 1024 + 1024) * sizeof(float);
  std::unique_ptr<stash_type> stash;
  if (use_stash) stash = make_stash(exec, plain_bytes);
  const auto bound = kompress::relative(s.bound);
  run_result result;
  const schedule learning_rate(s);

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
        KOKKOS_LAMBDA(int i, int j) { xm(i, j) = images(idx(i), j); });

    // Forward. What backward needs: x (fc1's input), a1 (fc2's input, ReLU 1's output),
    // a2 (fc3's input, ReLU 2's output).
    kompress::stash_handle saved[3];
    const matrix* kept[3] = {&xm, &a1m, &a2m};
    auto save = [&](int which) {
      if (!training) return;
      if (stash) {
        const auto start = clock_type::now();
        saved[which] = s.async_save ? stash->save_async(exec, *kept[which], bound)
                                    : stash->save(exec, *kept[which], bound);
        result.save_seconds += seconds_since(start);
      } else {
        result.peak_activation_bytes = std::max(result.peak_activation_bytes,
                                                std::size_t(rows) * (784 + 2048) * sizeof(float));
      }
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
    };
    restore(2);
    transpose(exec, a2m, matrix(a2t.data(), 1024, rows));
    gemm(exec, matrix(a2t.data(), 1024, rows), d3m, fc3.grad_t);  // dW3^T = a2^T d3
    column_sums(exec, d3m, fc3.bias.grad);
    transpose(exec, fc3.weight_t, fc3.weight_plain);
    gemm(exec, d3m, fc3.weight_plain, d2m);  // d a2 = d3 W3
    if (mask_bits) relu_backward_mask(exec, d2m, mask_matrix(mask2.data(), rows, 32));
    else relu_backward(exec, d2m, a2m);
    restore(1);
    transpose(exec, a1m, matrix(a1t.data(), 1024, rows));
    gemm(exec, matrix(a1t.data(), 1024, rows), d2m, fc2.grad_t);
    column_sums(exec, d2m, fc2.bias.grad);
    transpose(exec, fc2.weight_t, fc2.weight_plain);
    gemm(exec, d2m, fc2.weight_plain, d1m);
    if (mask_bits) relu_backward_mask(exec, d1m, mask_matrix(mask1.data(), rows, 32));
    else relu_backward(exec, d1m, a1m);
    restore(0);
    transpose(exec, xm, matrix(xt.data(), 784, rows));
    gemm(exec, matrix(xt.data(), 784, rows), d1m, fc1.grad_t);
    column_sums(exec, d1m, fc1.bias.grad);
    const float lr = learning_rate(adam_step);
    for (linear* layer : layers) {
      layer->weight.adam(exec, adam_step, lr);
      layer->bias.adam(exec, adam_step, lr);
    }
  };

  run_epochs(s, use_stash, result, step);
  if (stash) {
    stash_statistics(*stash, result);
    if (mask_bits) result.peak_activation_bytes += std::size_t(batch) * 2 * 32 * sizeof(std::uint32_t);
  }
  return result;
}

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
      if (how != "bits" && how != "restored") throw std::runtime_error("stash_training: --mask bits|restored");
      s.mask_bits = how == "bits";
    }
    else if (arg == "--max-loss-gap") s.max_loss_gap = std::stod(next());
    else if (arg == "--quick") s.epochs = 1, s.train = 1024, s.eval = 512, s.verify = true;
    else {
      std::fprintf(stderr, "stash_training: unknown argument '%s' (see the top of examples/stash_training.cpp)\n",
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

  const dataset data = load_mnist(s.data);
  std::printf("784-1024-1024-10 ReLU MLP, Adam lr %g (linear warmup over %g%% of the steps, then %s), batch %d, "
              "%d training / %d held-out MNIST images, %d epoch(s), %d thread(s)\n",
              s.lr, 100.0 * s.warmup, s.cosine ? "cosine decay to 0" : "constant", s.batch, s.train, s.eval, s.epochs,
              exec_space().concurrency());
  std::printf("plain: activations kept as Views\n");
  const run_result plain = train(s, data, false);
  std::printf("stash: activations saved through kompress::stash at REL %g (%s)\n", s.bound,
              s.async_save ? "save_async" : "save");
  const run_result stashed = train(s, data, true);

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
  std::printf("peak saved-activation memory: plain %.1f KB (Views), stash %.1f KB (pool high-water: "
              "streams %.1f KB + workspace%s%s)\n",
              plain.peak_activation_bytes / 1e3, stashed.peak_activation_bytes / 1e3,
              stashed.peak_stored_bytes / 1e3,
              s.async_save ? " + the worst-case ranges of saves in flight" : "",
              s.mask_bits ? "; + ReLU mask bits" : "");
  std::printf("memory ratio %.2fx; compression ratio over all saves %.2fx; spilled segments %zu\n",
              double(plain.peak_activation_bytes) / double(stashed.peak_activation_bytes), stashed.ratio,
              stashed.spilled);
  double plain_seconds = 0, stash_seconds = 0;
  for (const auto& e : plain.epochs) plain_seconds += e.seconds;
  for (const auto& e : stashed.epochs) stash_seconds += e.seconds;
  std::printf("training time: plain %.1f s, stash %.1f s (save %.2f s, restore %.2f s)\n", plain_seconds,
              stash_seconds, stashed.save_seconds, stashed.restore_seconds);
  if (s.verify && stashed.violations == 0)
    std::printf("every restored activation within its bound (largest error / bound: %.3f)\n",
                stashed.max_error_over_bound);
  if (stashed.violations > 0) return 1;  // "BOUND VIOLATED" was printed
  if (s.max_loss_gap >= 0 && !(gap <= s.max_loss_gap)) {
    std::printf("LOSS GAP %.3f%% exceeds %.3f%%\n", gap, s.max_loss_gap);
    return 1;
  }
  return 0;
}
