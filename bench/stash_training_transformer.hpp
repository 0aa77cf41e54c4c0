// The transformer block of bench_stash_training --model transformer. Part of
// bench/stash_training.cpp, which includes it inside its anonymous namespace after everything it
// uses (gemm, transpose, column_sums, bias_activation, softmax_cross_entropy, parameter, linear,
// batch_loader, settings, run_result, make_stash, save_timed, restore_checked, run_epochs,
// stash_statistics); not a header of its own.
//
// The model, on the shapes of ../shared/data/act_transformer_meta.json (d_model 128, 4 heads,
// MLP hidden 512, GELU, pre-norm): the 28x28 image cut into 49 patches of 4x4, each embedded by
// a Linear 16->128, plus a learned position embedding (49x128); one block,
//   h = h + out_proj(attention(qkv(LN1(h))))      4 heads of 32, softmax(q k^T / sqrt(32)) v
//   h = h + fc2(GELU(fc1(LN2(h))))                128->512->128, GELU in its tanh form
// then a final LayerNorm, the mean over the 49 tokens and a Linear 128->10. Linears have
// PyTorch's default initialisation, LayerNorms weight 1 and bias 0, the position embedding
// N(0, 0.02).
//
// Saved for backward (through the stash in the stash run, as plain Views in the plain run): the
// image (the patch embedding's input), the three LayerNorms' normalised outputs x^ = (x - mean)
// * rstd (backward recomputes LN1's and LN2's outputs gamma x^ + beta, the QKV projection's and
// fc1's inputs, from them), the QKV projection's output (q, k, v), the attention probabilities,
// the attention's context (the output projection's input), the GELU's input (backward recomputes
// the GELU's output, fc2's input, from it) and the pooled features (the classifier's input).
// Kept as plain Views in both runs and counted in both runs' memory: each LayerNorm's rstd per
// token (its mean is not needed once x^ is kept).

namespace vit {
constexpr int tokens = 49, patch_values = 16, width = 128, heads = 4, head_width = 32, hidden = 512;
constexpr int classes = 10, image_values = 784;
constexpr float layernorm_epsilon = 1e-5f;
}  // namespace vit

/// patches(n * 49 + t, ky * 4 + kx) = image n's pixel (4 (t / 7) + ky, 4 (t % 7) + kx).
void patchify(const exec_space& exec, const matrix& images, const matrix& patches) {
  Kokkos::parallel_for(
      "patchify",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {patches.extent(0), patches.extent(1)}),
      KOKKOS_LAMBDA(int row, int k) {
        const int n = row / vit::tokens, t = row % vit::tokens;
        patches(row, k) = images(n, (4 * (t / 7) + k / 4) * 28 + 4 * (t % 7) + k % 4);
      });
}

/// h(n * 49 + t, j) += bias(j) + position(t * 128 + j).
void add_bias_and_position(const exec_space& exec, const matrix& h, const vector& bias, const vector& position) {
  Kokkos::parallel_for(
      "add_bias_and_position",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {h.extent(0), h.extent(1)}),
      KOKKOS_LAMBDA(int row, int j) {
        h(row, j) += bias(j) + position((row % vit::tokens) * vit::width + j);
      });
}

/// position_grad(t * 128 + j) = the sum over the batch of grad(n * 49 + t, j).
void sum_over_batch(const exec_space& exec, const matrix& grad, const vector& position_grad) {
  const int images = int(grad.extent(0)) / vit::tokens;
  Kokkos::parallel_for(
      "sum_over_batch",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {vit::tokens, vit::width}),
      KOKKOS_LAMBDA(int t, int j) {
        float sum = 0.0f;
        for (int n = 0; n < images; ++n) sum += grad(n * vit::tokens + t, j);
        position_grad(t * vit::width + j) = sum;
      });
}

/// h += update (a residual connection).
void add_into(const exec_space& exec, const matrix& h, const matrix& update) {
  Kokkos::parallel_for(
      "add_into", Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {h.extent(0), h.extent(1)}),
      KOKKOS_LAMBDA(int i, int j) { h(i, j) += update(i, j); });
}

/// Per row: normalised = (in - mean) * rstd with rstd = 1 / sqrt(variance + 1e-5) (the biased
/// variance, as PyTorch's LayerNorm), out = gamma * normalised + beta.
void layernorm_forward(const exec_space& exec, const matrix& in, const vector& gamma, const vector& beta,
                       const matrix& normalised, const matrix& out, const vector& rstd) {
  const int columns = int(in.extent(1));
  Kokkos::parallel_for(
      "layernorm_forward", Kokkos::RangePolicy<exec_space>(exec, 0, in.extent(0)), KOKKOS_LAMBDA(int i) {
        double sum = 0.0;
        for (int j = 0; j < columns; ++j) sum += in(i, j);
        const double mean = sum / columns;
        double squares = 0.0;
        for (int j = 0; j < columns; ++j) squares += (in(i, j) - mean) * (in(i, j) - mean);
        const float r = float(1.0 / Kokkos::sqrt(squares / columns + double(vit::layernorm_epsilon)));
        rstd(i) = r;
        for (int j = 0; j < columns; ++j) {
          const float x = float(in(i, j) - mean) * r;
          normalised(i, j) = x;
          out(i, j) = gamma(j) * x + beta(j);
        }
      });
}

/// out = gamma * normalised + beta: a LayerNorm's output again from its saved normalised values.
void layernorm_affine(const exec_space& exec, const matrix& normalised, const vector& gamma, const vector& beta,
                      const matrix& out) {
  Kokkos::parallel_for(
      "layernorm_affine",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {out.extent(0), out.extent(1)}),
      KOKKOS_LAMBDA(int i, int j) { out(i, j) = gamma(j) * normalised(i, j) + beta(j); });
}

/// A LayerNorm's backward from its normalised output x^ and rstd: gamma's and beta's gradients,
/// and din = rstd (g - mean(g) - x^ mean(g x^)) with g = dout * gamma, added to din when
/// `accumulate` (a residual stream's gradient), else written.
void layernorm_backward(const exec_space& exec, const matrix& normalised, const vector& rstd, parameter& gamma,
                        parameter& beta, const matrix& dout, const matrix& din, bool accumulate) {
  const int rows = int(normalised.extent(0)), columns = int(normalised.extent(1));
  const auto gamma_value = gamma.value, gamma_grad = gamma.grad, beta_grad = beta.grad;
  Kokkos::parallel_for(
      "layernorm_parameter_grads", Kokkos::RangePolicy<exec_space>(exec, 0, columns), KOKKOS_LAMBDA(int j) {
        float dgamma = 0.0f, dbeta = 0.0f;
        for (int i = 0; i < rows; ++i) {
          dgamma += dout(i, j) * normalised(i, j);
          dbeta += dout(i, j);
        }
        gamma_grad(j) = dgamma;
        beta_grad(j) = dbeta;
      });
  Kokkos::parallel_for(
      "layernorm_backward", Kokkos::RangePolicy<exec_space>(exec, 0, rows), KOKKOS_LAMBDA(int i) {
        float sum = 0.0f, sum_times_normalised = 0.0f;
        for (int j = 0; j < columns; ++j) {
          const float g = dout(i, j) * gamma_value(j);
          sum += g;
          sum_times_normalised += g * normalised(i, j);
        }
        const float mean = sum / columns, mean_times_normalised = sum_times_normalised / columns;
        for (int j = 0; j < columns; ++j) {
          const float d =
              rstd(i) * (dout(i, j) * gamma_value(j) - mean - normalised(i, j) * mean_times_normalised);
          din(i, j) = accumulate ? din(i, j) + d : d;
        }
      });
}

/// Multi-head self-attention over each image's 49 tokens. qkv: [rows, 384], q, k, v side by
/// side, head h in columns h * 32 ... h * 32 + 31 of each. probs: [rows * 4, 49], the row of
/// (image n, head h, query i) at (n * 4 + h) * 49 + i. ctx: [rows, 128], the heads side by side.
/// One work item per (image, head, query).
void attention_forward(const exec_space& exec, const matrix& qkv, const matrix& probs, const matrix& ctx) {
  using namespace vit;
  const float scale = 1.0f / std::sqrt(float(head_width));
  Kokkos::parallel_for(
      "attention_forward", Kokkos::RangePolicy<exec_space>(exec, 0, probs.extent(0)), KOKKOS_LAMBDA(int item) {
        const int i = item % tokens, h = (item / tokens) % heads, n = item / (tokens * heads);
        const int first = n * tokens;
        float score[tokens];
        float top = -3.0e38f;
        for (int j = 0; j < tokens; ++j) {
          float dot = 0.0f;
          for (int d = 0; d < head_width; ++d)
            dot += qkv(first + i, h * head_width + d) * qkv(first + j, width + h * head_width + d);
          score[j] = dot * scale;
          top = Kokkos::max(top, score[j]);
        }
        float sum = 0.0f;
        for (int j = 0; j < tokens; ++j) sum += (score[j] = Kokkos::exp(score[j] - top));
        float acc[head_width] = {};
        for (int j = 0; j < tokens; ++j) {
          const float p = score[j] / sum;
          probs(item, j) = p;
          for (int d = 0; d < head_width; ++d) acc[d] += p * qkv(first + j, 2 * width + h * head_width + d);
        }
        for (int d = 0; d < head_width; ++d) ctx(first + i, h * head_width + d) = acc[d];
      });
}

/// The attention's backward from q, k, v, the probabilities and the context's gradient dctx:
/// dqkv, with dscores ([rows * 4, 49]) as scratch. dA = dctx v^T, dS = A * (dA - rowsum(dA * A)),
/// dq = dS k / sqrt(32) (per query), dk = dS^T q / sqrt(32) and dv = A^T dctx (per key).
void attention_backward(const exec_space& exec, const matrix& qkv, const matrix& probs, const matrix& dctx,
                        const matrix& dscores, const matrix& dqkv) {
  using namespace vit;
  const float scale = 1.0f / std::sqrt(float(head_width));
  Kokkos::parallel_for(
      "attention_backward_queries", Kokkos::RangePolicy<exec_space>(exec, 0, probs.extent(0)),
      KOKKOS_LAMBDA(int item) {
        const int i = item % tokens, h = (item / tokens) % heads, n = item / (tokens * heads);
        const int first = n * tokens;
        float dprob[tokens];
        float weighted = 0.0f;
        for (int j = 0; j < tokens; ++j) {
          float dot = 0.0f;
          for (int d = 0; d < head_width; ++d)
            dot += dctx(first + i, h * head_width + d) * qkv(first + j, 2 * width + h * head_width + d);
          dprob[j] = dot;
          weighted += dot * probs(item, j);
        }
        float acc[head_width] = {};
        for (int j = 0; j < tokens; ++j) {
          const float dscore = probs(item, j) * (dprob[j] - weighted);
          dscores(item, j) = dscore;
          for (int d = 0; d < head_width; ++d) acc[d] += dscore * qkv(first + j, width + h * head_width + d);
        }
        for (int d = 0; d < head_width; ++d) dqkv(first + i, h * head_width + d) = scale * acc[d];
      });
  Kokkos::parallel_for(
      "attention_backward_keys", Kokkos::RangePolicy<exec_space>(exec, 0, probs.extent(0)),
      KOKKOS_LAMBDA(int item) {
        const int j = item % tokens, h = (item / tokens) % heads, n = item / (tokens * heads);
        const int first = n * tokens, rows_of_head = (n * heads + h) * tokens;
        float dk[head_width] = {}, dv[head_width] = {};
        for (int i = 0; i < tokens; ++i) {
          const float dscore = dscores(rows_of_head + i, j), p = probs(rows_of_head + i, j);
          for (int d = 0; d < head_width; ++d) {
            dk[d] += dscore * qkv(first + i, h * head_width + d);
            dv[d] += p * dctx(first + i, h * head_width + d);
          }
        }
        for (int d = 0; d < head_width; ++d) {
          dqkv(first + j, width + h * head_width + d) = scale * dk[d];
          dqkv(first + j, 2 * width + h * head_width + d) = dv[d];
        }
      });
}

// GELU in its tanh form (PyTorch's approximate="tanh"): 0.5 z (1 + tanh(sqrt(2 / pi) (z + 0.044715 z^3))).
KOKKOS_INLINE_FUNCTION float gelu_inner(float z) { return 0.7978845608f * (z + 0.044715f * z * z * z); }

void gelu_forward(const exec_space& exec, const matrix& z, const matrix& out) {
  Kokkos::parallel_for(
      "gelu_forward", Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {z.extent(0), z.extent(1)}),
      KOKKOS_LAMBDA(int i, int j) {
        const float x = z(i, j);
        out(i, j) = 0.5f * x * (1.0f + Kokkos::tanh(gelu_inner(x)));
      });
}

/// grad *= GELU'(z).
void gelu_backward(const exec_space& exec, const matrix& z, const matrix& grad) {
  Kokkos::parallel_for(
      "gelu_backward",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {z.extent(0), z.extent(1)}),
      KOKKOS_LAMBDA(int i, int j) {
        const float x = z(i, j), t = Kokkos::tanh(gelu_inner(x));
        const float derivative =
            0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
        grad(i, j) *= derivative;
      });
}

/// pooled(n, j) = the mean over image n's 49 tokens of in(n * 49 + t, j).
void mean_over_tokens(const exec_space& exec, const matrix& in, const matrix& pooled) {
  Kokkos::parallel_for(
      "mean_over_tokens",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {pooled.extent(0), pooled.extent(1)}),
      KOKKOS_LAMBDA(int n, int j) {
        float sum = 0.0f;
        for (int t = 0; t < vit::tokens; ++t) sum += in(n * vit::tokens + t, j);
        pooled(n, j) = sum / vit::tokens;
      });
}

/// grad(n * 49 + t, j) = dpooled(n, j) / 49: the mean's backward.
void spread_over_tokens(const exec_space& exec, const matrix& dpooled, const matrix& grad) {
  Kokkos::parallel_for(
      "spread_over_tokens",
      Kokkos::MDRangePolicy<exec_space, Kokkos::Rank<2>>(exec, {0, 0}, {grad.extent(0), grad.extent(1)}),
      KOKKOS_LAMBDA(int row, int j) { grad(row, j) = dpooled(row / vit::tokens, j) / float(vit::tokens); });
}

/// out = in W^T + bias (the Linear's weight is stored as W^T).
void linear_forward(const exec_space& exec, const matrix& in, const linear& layer, const matrix& out) {
  gemm(exec, in, layer.weight_t, out);
  bias_activation(exec, out, layer.bias.value, false);
}

/// The Linear's weight and bias gradients from its input and its output's gradient (in^T
/// through `scratch`, at least in.size() floats); with `din`, din = dout W.
void linear_backward(const exec_space& exec, const matrix& in, const matrix& dout, linear& layer,
                     const vector& scratch, const matrix& din) {
  const matrix in_t(scratch.data(), in.extent(1), in.extent(0));
  transpose(exec, in, in_t);
  gemm(exec, in_t, dout, layer.grad_t);
  column_sums(exec, dout, layer.bias.grad);
  if (din.extent(0) == 0) return;
  transpose(exec, layer.weight_t, layer.weight_plain);
  gemm(exec, dout, layer.weight_plain, din);
}

/// --check-gradients fails the run when backward and central differences differ by more than
/// this, relative (see check_gradients in train_transformer).
constexpr double transformer_gradient_tolerance = 2e-2;

/// Trains the transformer block; with `use_stash`, the tensors backward needs (above) go through
/// a stash; both runs keep the LayerNorms' rstd as Views.
run_result train_transformer(const settings& s, const dataset& data, storage how) {
  using namespace vit;
  const bool use_stash = how == storage::stash;
  const exec_space exec;
  std::mt19937 rng(s.seed);
  const int batch = s.batch;
  const std::size_t token_rows = std::size_t(batch) * tokens;

  linear embed(patch_values, width, rng, "embed");
  parameter position("position", std::size_t(tokens) * width);
  {
    std::normal_distribution<float> normal(0.0f, 0.02f);
    auto host = Kokkos::create_mirror_view(position.value);
    for (std::size_t i = 0; i < host.size(); ++i) host(i) = normal(rng);
    Kokkos::deep_copy(position.value, host);
  }
  linear qkv_proj(width, 3 * width, rng, "qkv"), out_proj(width, width, rng, "out_proj");
  linear fc1(width, hidden, rng, "fc1"), fc2(hidden, width, rng, "fc2"), head(width, classes, rng, "head");
  parameter ln1_gamma("ln1.weight", width), ln1_beta("ln1.bias", width), ln2_gamma("ln2.weight", width),
      ln2_beta("ln2.bias", width), lnf_gamma("lnf.weight", width), lnf_beta("lnf.bias", width);
  for (parameter* gamma : {&ln1_gamma, &ln2_gamma, &lnf_gamma}) Kokkos::deep_copy(gamma->value, 1.0f);
  parameter* parameters[19] = {&embed.weight, &embed.bias, &position, &ln1_gamma, &ln1_beta, &qkv_proj.weight,
                               &qkv_proj.bias, &out_proj.weight, &out_proj.bias, &ln2_gamma, &ln2_beta,
                               &fc1.weight, &fc1.bias, &fc2.weight, &fc2.bias, &lnf_gamma, &lnf_beta,
                               &head.weight, &head.bias};

  // Working buffers, one row per token (or per image), for a whole batch.
  matrix x("x", batch, image_values), patches("patches", token_rows, patch_values), h("h", token_rows, width);
  matrix normalised1("normalised1", token_rows, width), normalised2("normalised2", token_rows, width),
      normalised_final("normalised_final", token_rows, width), y("y", token_rows, width);
  matrix qkv("qkv", token_rows, 3 * width), probs("probs", token_rows * heads, tokens), ctx("ctx", token_rows, width);
  matrix projected("projected", token_rows, width), z("z", token_rows, hidden),
      activated("activated", token_rows, hidden);
  matrix pooled("pooled", batch, width), logits("logits", batch, classes);
  vector rstd1("rstd1", token_rows), rstd2("rstd2", token_rows), rstd_final("rstd_final", token_rows);
  matrix dlogits("dlogits", batch, classes), dpooled("dpooled", batch, width), dy("dy", token_rows, width),
      dh("dh", token_rows, width), dactivated("dactivated", token_rows, hidden), dctx("dctx", token_rows, width),
      dqkv("dqkv", token_rows, 3 * width), dscores("dscores", token_rows * heads, tokens);
  vector scratch("scratch", token_rows * hidden);  // transposed layer inputs
  vector check("check", token_rows * hidden);      // --verify: a copy of what was saved
  batch_loader loader(batch);
  const auto labels = loader.labels;

  // Saved for backward, per image: the image, the three normalised LayerNorm outputs, q k v,
  // the probabilities, the context, the GELU's input and the pooled features (318 KB as floats);
  // beside them, in both runs, the three LayerNorms' rstd (588 bytes).
  const std::size_t saved_floats = image_values + std::size_t(tokens) * (3 * width + 3 * width + width + hidden) +
                                   std::size_t(heads) * tokens * tokens + width;
  const std::size_t side_bytes = 3 * std::size_t(tokens) * sizeof(float);
  const std::size_t plain_bytes = std::size_t(batch) * saved_floats * sizeof(float);
  std::unique_ptr<stash_type> stash;
  if (use_stash) stash = make_stash(exec, plain_bytes, s);
  std::optional<baseline_saves> copies;  // no ReLU: ActNN keeps no mask here
  if (how == storage::actnn2 || how == storage::float16) {
    const std::size_t t = std::size_t(batch) * tokens;
    copies.emplace(how, std::vector<std::size_t>{std::size_t(batch) * image_values, t * width, t * 3 * width,
                                                 t * heads * tokens, t * width, t * width, t * hidden, t * width,
                                                 std::size_t(batch) * width});
  }
  run_result result;
  const schedule learning_rate(s);

  // The first `rows` images' rows of a per-token buffer, of a per-image one, of the
  // probabilities (contiguous, so Views of their own).
  auto token_view = [](const matrix& m, int rows) { return matrix(m.data(), std::size_t(rows) * tokens, m.extent(1)); };
  auto image_view = [](const matrix& m, int rows) { return matrix(m.data(), rows, m.extent(1)); };
  auto head_view = [](const matrix& m, int rows) {
    return matrix(m.data(), std::size_t(rows) * heads * tokens, tokens);
  };

  // The forward pass over the gathered batch; returns the summed loss and the number correct
  // (and with `gradient`, the loss's gradient in dlogits). `save(which)` is called as each
  // saved tensor is complete, in the order of saved_views below.
  auto forward = [&](int rows, bool gradient, auto&& save) {
    auto tok = [&](const matrix& m) { return token_view(m, rows); };
    save(0);
    patchify(exec, image_view(x, rows), tok(patches));
    gemm(exec, tok(patches), embed.weight_t, tok(h));
    add_bias_and_position(exec, tok(h), embed.bias.value, position.value);
    layernorm_forward(exec, tok(h), ln1_gamma.value, ln1_beta.value, tok(normalised1), tok(y), rstd1);
    save(1);
    linear_forward(exec, tok(y), qkv_proj, tok(qkv));
    save(2);
    attention_forward(exec, tok(qkv), head_view(probs, rows), tok(ctx));
    save(3);
    save(4);
    linear_forward(exec, tok(ctx), out_proj, tok(projected));
    add_into(exec, tok(h), tok(projected));
    layernorm_forward(exec, tok(h), ln2_gamma.value, ln2_beta.value, tok(normalised2), tok(y), rstd2);
    save(5);
    linear_forward(exec, tok(y), fc1, tok(z));
    save(6);
    gelu_forward(exec, tok(z), tok(activated));
    linear_forward(exec, tok(activated), fc2, tok(projected));
    add_into(exec, tok(h), tok(projected));
    layernorm_forward(exec, tok(h), lnf_gamma.value, lnf_beta.value, tok(normalised_final), tok(y), rstd_final);
    save(7);
    mean_over_tokens(exec, tok(y), image_view(pooled, rows));
    save(8);
    linear_forward(exec, image_view(pooled, rows), head, image_view(logits, rows));
    return softmax_cross_entropy(exec, image_view(logits, rows), labels,
                                 gradient ? image_view(dlogits, rows) : matrix(), rows);
  };

  // Backward, restoring each saved tensor into the buffer the forward wrote it in (in a
  // framework that buffer would have been freed) just before its first use, in reverse order.
  auto backward = [&](int rows, auto&& restore) {
    auto tok = [&](const matrix& m) { return token_view(m, rows); };
    restore(8);
    linear_backward(exec, image_view(pooled, rows), image_view(dlogits, rows), head, scratch,
                    image_view(dpooled, rows));
    restore(7);
    spread_over_tokens(exec, image_view(dpooled, rows), tok(dy));
    layernorm_backward(exec, tok(normalised_final), rstd_final, lnf_gamma, lnf_beta, tok(dy), tok(dh), false);
    // The MLP: h += fc2(GELU(fc1(LN2(h)))).
    restore(6);
    gelu_forward(exec, tok(z), tok(activated));  // fc2's input again, from the restored GELU input
    linear_backward(exec, tok(activated), tok(dh), fc2, scratch, tok(dactivated));
    gelu_backward(exec, tok(z), tok(dactivated));
    restore(5);
    layernorm_affine(exec, tok(normalised2), ln2_gamma.value, ln2_beta.value, tok(y));  // fc1's input
    linear_backward(exec, tok(y), tok(dactivated), fc1, scratch, tok(dy));
    layernorm_backward(exec, tok(normalised2), rstd2, ln2_gamma, ln2_beta, tok(dy), tok(dh), true);
    // The attention: h += out_proj(attention(qkv(LN1(h)))).
    restore(4);
    linear_backward(exec, tok(ctx), tok(dh), out_proj, scratch, tok(dctx));
    restore(3);
    restore(2);
    attention_backward(exec, tok(qkv), head_view(probs, rows), tok(dctx), head_view(dscores, rows), tok(dqkv));
    restore(1);
    layernorm_affine(exec, tok(normalised1), ln1_gamma.value, ln1_beta.value, tok(y));  // the QKV's input
    linear_backward(exec, tok(y), tok(dqkv), qkv_proj, scratch, tok(dy));
    layernorm_backward(exec, tok(normalised1), rstd1, ln1_gamma, ln1_beta, tok(dy), tok(dh), true);
    // The embedding: h = patches W^T + bias + position.
    restore(0);
    patchify(exec, image_view(x, rows), tok(patches));
    linear_backward(exec, tok(patches), tok(dh), embed, scratch, matrix());
    sum_over_batch(exec, tok(dh), position.grad);
  };

  // --check-gradients: central differences of the batch's mean loss against the backward
  // pass's gradient, at the entry of every parameter with the largest gradient and four spread
  // over it (the plain run's first step). The model is smooth (no ReLU or max), so a step of
  // 1e-2 keeps the truncation error small while lifting the differences above float rounding.
  // The difference is relative to the two values' sum, or to a tenth of the parameter's largest
  // gradient where that is more: float rounding leaves an absolute error of the loss, and entries
  // much smaller than the largest would otherwise measure only that.
  auto check_gradients = [&](int rows) {
    const auto no_save = [](int) {};
    for (parameter* p : parameters) {
      auto value = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p->value);
      auto grad = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p->grad);
      std::size_t largest = 0;
      for (std::size_t i = 1; i < grad.size(); ++i)
        if (std::fabs(grad(i)) > std::fabs(grad(largest))) largest = i;
      double worst = 0.0;
      for (int t = 0; t < 5; ++t) {
        const std::size_t i = t == 0 ? largest : (p->value.size() - 1) * (t - 1) / 3;
        const float eps = 1e-2f, original = value(i);
        auto loss_at = [&](float v) {
          Kokkos::deep_copy(Kokkos::subview(p->value, i), v);
          return forward(rows, false, no_save).first / rows;
        };
        const double numeric = (loss_at(original + eps) - loss_at(original - eps)) / (2.0 * eps);
        Kokkos::deep_copy(Kokkos::subview(p->value, i), original);
        const double error = std::fabs(numeric - grad(i)) /
                             std::max(0.1 * std::fabs(grad(largest)), std::fabs(numeric) + std::fabs(grad(i)));
        worst = std::max(worst, error);
        std::printf("    gradient check %-16s [%6zu] backward %+.6e  central difference %+.6e\n",
                    p->value.label().c_str(), i, double(grad(i)), numeric);
      }
      std::printf("  gradient check %s: largest relative difference %.2e\n", p->value.label().c_str(), worst);
      result.gradient_check_worst = std::max(result.gradient_check_worst, worst);
    }
  };

  auto step = [&](const std::vector<int>& order, int first, int rows, bool training, int adam_step,
                  double& loss_sum, int& correct_sum) {
    loader.load(exec, data, order, first, rows, image_view(x, rows));
    kompress::stash_handle saved[9];
    const matrix saved_views[9] = {image_view(x, rows),         token_view(normalised1, rows),
                                   token_view(qkv, rows),       head_view(probs, rows),
                                   token_view(ctx, rows),       token_view(normalised2, rows),
                                   token_view(z, rows),         token_view(normalised_final, rows),
                                   image_view(pooled, rows)};
    auto save = [&](int which) {
      if (training && copies)
        copies->save(exec, which, saved_views[which].data(), saved_views[which].size(), adam_step,
                     std::size_t(rows) * side_bytes, result);
      else if (training)
        save_timed(stash.get(), exec, s, saved[which], saved_views[which], s.bound_of(std::size_t(which)), result,
                   which,
                   std::size_t(rows) * saved_floats * sizeof(float));
    };
    const auto [loss, correct] = forward(rows, training, save);
    loss_sum += loss;
    correct_sum += correct;
    if (!training) return;
    backward(rows, [&](int which) {
      if (stash) restore_checked(*stash, exec, s, saved[which], saved_views[which], check.data(), result, which);
      if (copies) copies->restore(exec, which, saved_views[which].data(), saved_views[which].size(), result);
    });
    if (s.check_gradients && adam_step == 1 && !stash) check_gradients(rows);
    const float lr = learning_rate(adam_step);
    for (parameter* p : parameters) p->adam(exec, adam_step, lr);
  };
  run_epochs(s, storage_name(how), result, step);
  if (stash) stash_statistics(*stash, result);
  if (!copies) result.peak_activation_bytes += std::size_t(batch) * side_bytes;
  return result;
}
