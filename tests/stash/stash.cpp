// The activation stash: round trips within the bound on the real activations, shapes and
// layouts, handles, zero-size and strided Views, the pool's allocator, no allocation once warm,
// and concurrent saves on two execution space instances.
#include <kompress/stash.hpp>

#include "support/codec_checks.hpp"
#include "support/data_checks.hpp"
#include "support/stash_views.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

using exec_space = Kokkos::DefaultExecutionSpace;
using memory_space = exec_space::memory_space;
using stash_type = kompress::stash<exec_space>;
using kompress::test::to_vector;
using kompress::test::to_view;

// The MLP's second ReLU output, 1024 x 1024 (the sample's 128 rows repeated; data/README.md).
std::vector<float> relu_activation() { return kompress::test::read_array<float>("act_mlp_relu2_out", 1024 * 1024); }

template <class T>
std::vector<T> random_values(std::size_t count, unsigned seed, double zero_fraction = 0.5) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<T> values(count);
  for (T& v : values) v = uniform(rng) < zero_fraction ? T(0) : T(std::fabs(normal(rng)) * 3.0);
  return values;
}

template <class T>
void require_within(std::span<const T> original, std::span<const T> decoded, double abs_bound) {
  const auto check = kompress::test::check_bound<T>(original, decoded, abs_bound);
  if (check.violations) {
    const std::size_t i = check.first_violation;
    FAIL(check.violations << " values out of bound " << abs_bound << "; first at " << i << ": "
                          << double(original[i]) << " -> " << double(decoded[i]));
  }
}

template <class T>
bool bit_identical(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

kompress::stash_options options(std::size_t budget, std::size_t segment_bytes = std::size_t(4) << 20) {
  return {.budget_bytes = budget, .segment_bytes = segment_bytes};
}

}  // namespace

// --- the allocator ------------------------------------------------------------------------------

TEST_CASE("stash pool: LIFO use is a bump allocator with one free range") {
  kompress::detail::first_fit_allocator pool(1 << 20);
  CHECK(pool.capacity() == (1 << 20));
  std::vector<std::pair<std::size_t, std::size_t>> live;
  for (std::size_t i = 1; i <= 20; ++i) {
    const std::size_t bytes = 1000 * i + 7;
    auto offset = pool.allocate(bytes);
    REQUIRE(offset);
    CHECK(*offset % kompress::detail::first_fit_allocator::alignment == 0);
    if (!live.empty()) CHECK(*offset == live.back().first + pool.round_up(live.back().second));
    live.emplace_back(*offset, bytes);
    CHECK(pool.free_ranges() == 1);
  }
  while (!live.empty()) {
    pool.free(live.back().first, live.back().second);
    live.pop_back();
    CHECK(pool.free_ranges() == 1);
  }
  CHECK(pool.in_use() == 0);
  CHECK(pool.largest_free() == pool.capacity());
}

TEST_CASE("stash pool: out-of-order frees coalesce, first fit reuses holes, shrink gives tails back") {
  kompress::detail::first_fit_allocator pool(64 * 100);
  std::vector<std::size_t> offsets;
  for (int i = 0; i < 10; ++i) offsets.push_back(*pool.allocate(640));  // the whole pool
  CHECK_FALSE(pool.allocate(64 * 1));
  pool.free(offsets[3], 640);
  pool.free(offsets[5], 640);
  CHECK(pool.free_ranges() == 2);
  CHECK(pool.largest_free() == 640);
  CHECK_FALSE(pool.allocate(641));
  pool.free(offsets[4], 640);  // joins both neighbours
  CHECK(pool.free_ranges() == 1);
  CHECK(pool.largest_free() == 3 * 640);
  const auto hole = pool.allocate(1000);  // first fit: the hole at offsets[3]
  REQUIRE(hole);
  CHECK(*hole == offsets[3]);
  pool.shrink(*hole, 1000, 100);  // 1000 -> 100 bytes (rounded up): the tail joins the hole's rest
  CHECK(pool.largest_free() == 3 * 640 - kompress::detail::first_fit_allocator::round_up(100));
  CHECK_THROWS_AS(pool.free(offsets[4], 640), kompress::error);  // never handed out as such
  pool.free(*hole, 100);
  for (int i : {0, 1, 2, 6, 7, 8, 9}) pool.free(offsets[std::size_t(i)], 640);
  CHECK(pool.in_use() == 0);
  CHECK(pool.free_ranges() == 1);
  CHECK_THROWS_AS(pool.free(offsets[0], 640), kompress::error);  // twice
  pool.grow(64 * 200);
  CHECK(pool.free_ranges() == 1);
  CHECK(pool.largest_free() == 64 * 200);
}

// --- round trips ----------------------------------------------------------------------------------

TEST_CASE("stash: every real activation and gradient comes back within the bound") {
  const exec_space exec;
  for (const auto& file : kompress::test::float_data_files()) {
    if (file.family != "activation") continue;
    const std::vector<float> values = kompress::test::read_raw<float>(file.name);
    const auto view = to_view(values);
    // One segment per View, and 256 KiB segments (a relative bound resolved over the whole View).
    for (std::size_t segment_bytes : {std::size_t(64) << 20, std::size_t(256) << 10}) {
      stash_type stash(exec, options(std::size_t(160) << 20, segment_bytes));
      const bool one_segment = segment_bytes > values.size() * 4;
      std::vector<kompress::error_bound> bounds{kompress::relative(1e-2), kompress::relative(1e-4)};
      if (one_segment) bounds.insert(bounds.end(), {kompress::absolute(1e-3), kompress::lossless()});
      for (const kompress::error_bound bound : bounds) {
        CAPTURE(file.name);
        CAPTURE(segment_bytes);
        CAPTURE(bound.value);
        const auto handle = stash.save(exec, view, bound);
        const auto info = stash.info(handle);
        const double expected = kompress::test::expected_abs_bound<float>(values, bound);
        CHECK(info.absolute_bound <= expected);
        CHECK(info.used_bound.value == bound.value);
        CHECK(info.segments == (values.size() * 4 + segment_bytes - 1) / segment_bytes);
        CHECK(info.placement.pool_segments == info.segments);
        auto back = stash.restore<Kokkos::View<float*, memory_space>>(exec, handle);
        const auto decoded = to_vector(back);
        require_within<float>(values, decoded, expected);
        if (bound.value == 0.0) CHECK(bit_identical(values, decoded));
        if (bound.mode == kompress::bound_mode::relative && bound.value == 1e-2 && one_segment) {
          // One segment is exactly kompress::compress's stream, framed: its header cut to a
          // 16-byte frame.
          const auto direct = kompress::test::round_trip<float>(values, {.bound = bound});
          CHECK(info.stored_bytes + 72 == direct.stream.size());
          CHECK(bit_identical(direct.decoded, decoded));
          MESSAGE(file.name << ": ratio " << info.ratio() << " at REL 1e-2");
        }
        stash.drop(handle);
      }
      const auto stats = stash.stats();
      CHECK(stats.entries == 0);
      CHECK(stats.pool_bytes == stats.workspace_bytes);
    }
  }
}

TEST_CASE_TEMPLATE("stash: sizes around blocks, chunks and segments", T, float, double) {
  const exec_space exec;
  // 16 KiB segments: 4096 floats or 2048 doubles (one chunk of 32-value blocks is 2048).
  stash_type stash(exec, options(std::size_t(8) << 20, std::size_t(16) << 10));
  const std::size_t segment = std::is_same_v<T, float> ? 4096 : 2048;
  for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(31), std::size_t(32),
                            std::size_t(33), std::size_t(2047), std::size_t(2049), segment - 1,
                            segment, segment + 1, 3 * segment + 5, std::size_t(300001)}) {
    CAPTURE(count);
    const auto values = random_values<T>(count, unsigned(count));
    const auto view = to_view(values);
    for (const auto bound : {kompress::relative(1e-2), kompress::absolute(1e-5)}) {
      const auto handle = stash.save(exec, view, bound);
      Kokkos::View<T*, memory_space> back("back", count);
      stash.restore_and_drop(exec, handle, back);
      require_within<T>(values, to_vector(back), kompress::test::expected_abs_bound<T>(values, bound));
      CHECK_FALSE(stash.contains(handle));
    }
  }
}

TEST_CASE_TEMPLATE("stash: the ratio codec, with any block size option, sync and async", T, float, double) {
  // Ratio streams have their own worst case (block size 32 whatever block_size says): the
  // workspace and every reservation must be sized for it.
  const exec_space exec;
  for (const int block_size : {32, 128}) {
    CAPTURE(block_size);
    auto o = options(std::size_t(8) << 20, std::size_t(16) << 10);
    o.codec.codec = kompress::codec_mode::ratio;
    o.codec.block_size = block_size;
    stash_type stash(exec, o);
    for (std::size_t count : {std::size_t(1), std::size_t(4097), std::size_t(300001)}) {
      CAPTURE(count);
      const auto values = random_values<T>(count, unsigned(count) + 3);
      const auto view = to_view(values);
      const auto bound = kompress::relative(1e-2);
      const auto handle = stash.save(exec, view, bound);
      const auto async_handle = stash.save_async(exec, view, bound);
      for (const auto& h : {async_handle, handle}) {
        Kokkos::View<T*, memory_space> back("back", count);
        stash.restore_and_drop(exec, h, back);
        require_within<T>(values, to_vector(back), kompress::test::expected_abs_bound<T>(values, bound));
      }
    }
  }
}

TEST_CASE("stash: any rank and layout; the output's shape and element order are checked") {
  const exec_space exec;
  stash_type stash(exec, options(std::size_t(16) << 20));
  const auto values = random_values<float>(6 * 5 * 4, 7);

  SUBCASE("LayoutLeft rank 3 into LayoutLeft, rank 1; not LayoutRight") {
    Kokkos::View<float***, Kokkos::LayoutLeft, memory_space> view("left", 6, 5, 4);
    const auto original = Kokkos::create_mirror_view(view);
    std::copy(values.begin(), values.end(), original.data());
    Kokkos::deep_copy(view, original);
    const auto handle = stash.save(exec, view, kompress::absolute(1e-3));
    const auto info = stash.info(handle);
    CHECK(info.rank == 3);
    CHECK(info.extents[0] == 6);
    CHECK(info.extents[2] == 4);
    auto back = stash.restore<Kokkos::View<float***, Kokkos::LayoutLeft, memory_space>>(exec, handle);
    CHECK(back.extent(0) == 6);
    CHECK(back.extent(1) == 5);
    const auto restored = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, back);
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 5; ++j)
        for (int i = 0; i < 6; ++i) CHECK(std::fabs(restored(i, j, k) - original(i, j, k)) <= 1e-3);
    Kokkos::View<float*, memory_space> flat("flat", view.size());
    stash.restore(exec, handle, flat);
    require_within<float>(values, to_vector(flat), 1e-3);
    Kokkos::View<float***, Kokkos::LayoutRight, memory_space> right("right", 6, 5, 4);
    CHECK_THROWS_AS(stash.restore(exec, handle, right), kompress::invalid_argument);
    Kokkos::View<float***, Kokkos::LayoutLeft, memory_space> other("other", 5, 6, 4);
    CHECK_THROWS_AS(stash.restore(exec, handle, other), kompress::invalid_argument);
    CHECK_THROWS_AS((stash.restore<Kokkos::View<float**, Kokkos::LayoutLeft, memory_space>>(exec, handle)),
                    kompress::invalid_argument);
    Kokkos::View<double*, memory_space> wrong_type("double", view.size());
    CHECK_THROWS_WITH_AS(stash.restore(exec, handle, wrong_type),
                         doctest::Contains("holds float values but the output View is of double"),
                         kompress::invalid_argument);
    Kokkos::View<float*, memory_space> short_view("short", view.size() - 1);
    CHECK_THROWS_AS(stash.restore(exec, handle, short_view), kompress::invalid_argument);
    stash.drop(handle);
  }
  SUBCASE("a rank-0 View") {
    Kokkos::View<double, memory_space> scalar("scalar");
    const auto value = Kokkos::create_mirror_view(scalar);
    value() = 3.25;
    Kokkos::deep_copy(scalar, value);
    const auto handle = stash.save(scalar, kompress::relative(1e-2));
    Kokkos::View<double, memory_space> back("back");
    stash.restore(handle, back);
    double restored = 0.0;
    Kokkos::deep_copy(restored, back);
    CHECK(restored == 3.25);  // a constant: REL resolves to 0, lossless
  }
  SUBCASE("strided Views are rejected, contiguous subviews accepted") {
    Kokkos::View<float**, Kokkos::LayoutRight, memory_space> matrix("matrix", 8, 16);
    auto columns = Kokkos::subview(matrix, Kokkos::ALL, std::pair<int, int>(0, 8));
    CHECK_THROWS_WITH_AS(stash.save(exec, columns, kompress::relative(1e-2)),
                         doctest::Contains("must be contiguous"), kompress::invalid_argument);
    auto rows = Kokkos::subview(matrix, std::pair<int, int>(2, 4), Kokkos::ALL);
    const auto handle = stash.save(exec, rows, kompress::relative(1e-2));
    Kokkos::View<float**, Kokkos::LayoutRight, memory_space> back("back", 8, 16);
    auto back_columns = Kokkos::subview(back, Kokkos::ALL, std::pair<int, int>(0, 8));
    CHECK_THROWS_AS(stash.restore(exec, handle, back_columns), kompress::invalid_argument);
    stash.restore(exec, handle, Kokkos::subview(back, std::pair<int, int>(5, 7), Kokkos::ALL));
  }
}

TEST_CASE("stash: zero-size Views are handled: an entry of no bytes") {
  const exec_space exec;
  stash_type stash(exec, options(std::size_t(8) << 20));
  Kokkos::View<float**, memory_space> empty("empty", 0, 7);
  const auto before = stash.stats();
  const auto handle = stash.save(exec, empty, kompress::relative(1e-2));
  CHECK(stash.contains(handle));
  const auto info = stash.info(handle);
  CHECK(info.count == 0);
  CHECK(info.stored_bytes == 0);
  CHECK(info.segments == 0);
  CHECK(stash.stats().pool_bytes == before.pool_bytes);
  auto back = stash.restore<Kokkos::View<float**, memory_space>>(exec, handle);
  CHECK(back.extent(0) == 0);
  CHECK(back.extent(1) == 7);
  Kokkos::View<float*, memory_space> none("none", 0);
  stash.restore_and_drop(exec, handle, none);
  CHECK_FALSE(stash.contains(handle));
}

// --- handles ---------------------------------------------------------------------------------------

TEST_CASE("stash: handles used twice, after drop, empty or from another stash are rejected") {
  const exec_space exec;
  stash_type stash(exec, options(std::size_t(8) << 20));
  stash_type other(exec, options(std::size_t(8) << 20));
  const auto values = random_values<float>(10000, 1);
  const auto view = to_view(values);
  Kokkos::View<float*, memory_space> back("back", values.size());

  const auto handle = stash.save(exec, view, kompress::relative(1e-2));
  // restore keeps the entry: twice gives the same values
  stash.restore(exec, handle, back);
  const auto first = to_vector(back);
  stash.restore(exec, handle, back);
  CHECK(bit_identical(first, to_vector(back)));

  CHECK_THROWS_WITH_AS(other.restore(exec, handle, back), doctest::Contains("another stash"),
                       kompress::invalid_handle);
  CHECK_THROWS_AS(other.drop(handle), kompress::invalid_handle);
  CHECK_THROWS_AS(other.info(handle), kompress::invalid_handle);
  CHECK_FALSE(other.contains(handle));
  CHECK_THROWS_WITH_AS(stash.restore(exec, kompress::stash_handle{}, back),
                       doctest::Contains("empty"), kompress::invalid_handle);

  stash.drop(handle);
  CHECK_FALSE(stash.contains(handle));
  CHECK_THROWS_WITH_AS(stash.restore(exec, handle, back), doctest::Contains("was dropped"),
                       kompress::invalid_handle);
  CHECK_THROWS_AS(stash.drop(handle), kompress::invalid_handle);  // dropped twice
  CHECK_THROWS_AS(stash.info(handle), kompress::invalid_handle);

  // The slot is reused by the next save; the old handle stays dead.
  const auto next = stash.save(exec, view, kompress::relative(1e-2));
  CHECK(next.slot == handle.slot);
  CHECK(next.generation != handle.generation);
  CHECK_THROWS_AS(stash.restore(exec, handle, back), kompress::invalid_handle);
  stash.restore_and_drop(exec, next, back);
  CHECK_THROWS_AS(stash.restore_and_drop(exec, next, back), kompress::invalid_handle);
  CHECK(stash.stats().entries == 0);

  // Moving a stash keeps its identity: its handles stay valid.
  const auto kept = stash.save(exec, view, kompress::relative(1e-2));
  stash_type moved = std::move(stash);
  CHECK(moved.contains(kept));
  moved.restore(exec, kept, back);
}

// --- stats, drop order, no allocation once warm -------------------------------------------------------

TEST_CASE("stash: stats follow saves and drops in LIFO and in any order") {
  const exec_space exec;
  stash_type stash(exec, options(std::size_t(32) << 20, std::size_t(1) << 20));
  const auto values = relu_activation();
  const auto view = to_view(values);
  const auto empty_pool = stash.stats().pool_bytes;
  std::vector<kompress::stash_handle> handles;
  for (int i = 0; i < 5; ++i) handles.push_back(stash.save(exec, view, kompress::relative(1e-2)));
  auto stats = stash.stats();
  CHECK(stats.entries == 5);
  CHECK(stats.saves == 5);
  CHECK(stats.raw_bytes == 5 * values.size() * 4);
  CHECK(stats.peak_raw_bytes == stats.raw_bytes);
  CHECK(stats.stored_bytes * 6 < stats.raw_bytes);  // ReLU output at REL 1e-2: > 6x
  CHECK(stats.ratio() > 6.0);
  CHECK(stats.pool_bytes >= empty_pool + stats.stored_bytes);
  CHECK(stats.peak_stored_bytes == stats.stored_bytes);
  // Out of order: middle, first, last, then the rest.
  for (int i : {2, 0, 4, 1, 3}) stash.drop(handles[std::size_t(i)]);
  stats = stash.stats();
  CHECK(stats.entries == 0);
  CHECK(stats.raw_bytes == 0);
  CHECK(stats.stored_bytes == 0);
  CHECK(stats.pool_bytes == empty_pool);
  CHECK(stats.peak_raw_bytes == 5 * values.size() * 4);
  CHECK(stats.drops == 5);
  stash.reset_peaks();
  CHECK(stash.stats().peak_raw_bytes == 0);
  CHECK(stash.stats().peak_pool_bytes == empty_pool);
}

namespace {
std::atomic<long> kokkos_allocations{0};
std::string allocation_labels;  // what was allocated, for the failure's message
void count_allocation(const Kokkos::Tools::SpaceHandle space, const char* label, const void*, std::uint64_t bytes) {
  if (kokkos_allocations++ < 12)
    allocation_labels += std::string(" [") + space.name + " '" + label + "' " + std::to_string(bytes) + " B]";
}
}  // namespace

TEST_CASE("stash: no Kokkos allocation per save or restore once warm") {
  bool async = false;
  SUBCASE("save") { async = false; }
  SUBCASE("save_async") { async = true; }
  CAPTURE(async);
  const exec_space exec;
  stash_type stash(exec, options(std::size_t(24) << 20, std::size_t(1) << 20));
  const auto values = kompress::test::read_array<float>("act_cnn_s3_relu_out", 128 * 64 * 8 * 8);
  const auto view = to_view(values);
  Kokkos::View<float*, memory_space> back("back", values.size());
  auto step = [&] {  // a forward pass saving three activations, a backward pass restoring them
    std::vector<kompress::stash_handle> handles;
    for (int layer = 0; layer < 3; ++layer)
      handles.push_back(async ? stash.save_async(exec, view, kompress::relative(1e-2))
                              : stash.save(exec, view, kompress::relative(1e-2)));
    while (!handles.empty()) {
      stash.restore_and_drop(exec, handles.back(), back);
      handles.pop_back();
    }
  };
  step();  // warm
  Kokkos::Tools::Experimental::set_allocate_data_callback(count_allocation);
  {
    Kokkos::View<float*, memory_space> probe("probe", 1);  // the counter works
  }
  REQUIRE(kokkos_allocations.exchange(0) == 1);
  allocation_labels.clear();
  for (int i = 0; i < 3; ++i) step();
  Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
  CHECK_MESSAGE(kokkos_allocations.load() == 0, "the first allocations:" << allocation_labels);
}

// --- concurrency -------------------------------------------------------------------------------------

TEST_CASE("stash: concurrent saves and restores on two execution space instances") {
  KOMPRESS_TEST_NEEDS_DATA("act_cnn_stem_conv_out_128x16x32x32.f32");
  const exec_space exec;
  const auto instances = Kokkos::Experimental::partition_space(exec, 1, 1);
  stash_type stash(exec, options(std::size_t(64) << 20, std::size_t(512) << 10));
  const auto relu = relu_activation();
  const auto conv = kompress::test::read_raw<float>("act_cnn_stem_conv_out_128x16x32x32.f32");
  const auto relu_view = to_view(relu);
  const auto conv_view = to_view(conv);
  constexpr int rounds = 4;
  std::vector<kompress::stash_handle> handles[2];
  std::vector<std::string> errors[2];
  auto worker = [&](int which) {
    try {
      const auto& values = which ? conv : relu;
      const auto& view = which ? conv_view : relu_view;
      for (int r = 0; r < rounds; ++r)  // one thread saves, the other enqueues
        handles[which].push_back(
            which ? stash.save_async(instances[std::size_t(which)], view, kompress::relative(1e-2))
                  : stash.save(instances[std::size_t(which)], view, kompress::relative(1e-2)));
      Kokkos::View<float*, memory_space> back("back", values.size());
      const double bound = kompress::test::expected_abs_bound<float>(values, kompress::relative(1e-2));
      for (int r = rounds - 1; r >= 1; --r) {
        stash.restore_and_drop(instances[std::size_t(which)], handles[which][std::size_t(r)], back);
        const auto decoded = to_vector(back);
        for (std::size_t i = 0; i < values.size(); ++i)
          if (!(std::fabs(double(values[i]) - double(decoded[i])) <= bound)) {
            errors[which].push_back("value " + std::to_string(i) + " out of bound");
            break;
          }
      }
    } catch (const std::exception& e) {
      errors[which].push_back(e.what());
    }
  };
  std::thread first(worker, 0), second(worker, 1);
  first.join();
  second.join();
  CHECK(errors[0].empty());
  CHECK(errors[1].empty());
  for (const auto& e : errors[0]) MESSAGE(e);
  for (const auto& e : errors[1]) MESSAGE(e);
  const auto stats = stash.stats();
  CHECK(stats.saves == 2 * rounds);
  CHECK(stats.entries == 2);
  CHECK(stats.restores == 2 * (rounds - 1));
  // What was left is intact and restores on the default instance.
  Kokkos::View<float*, memory_space> back("back", relu.size());
  stash.restore_and_drop(exec, handles[0][0], back);
  require_within<float>(relu, to_vector(back),
                        kompress::test::expected_abs_bound<float>(relu, kompress::relative(1e-2)));
  stash.drop(handles[1][0]);
  CHECK(stash.stats().pool_bytes == stash.stats().workspace_bytes);
}

// --- save_async --------------------------------------------------------------------------------------

TEST_CASE("stash: save_async stores what save stores, and settles on fence, restore, info and drop") {
  const exec_space exec;
  const auto values = relu_activation();
  const auto view = to_view(values);
  const auto bound = kompress::relative(1e-2);
  const std::size_t raw = values.size() * sizeof(float);
  // One segment for save, so both write kompress::compress's stream: save keeps it framed
  // (its header cut to a 16-byte frame), save_async whole, 72 bytes more.
  stash_type stash(exec, options(std::size_t(24) << 20, raw));
  const auto reference = stash.save(exec, view, bound);
  const auto expected = stash.info(reference);
  const std::size_t held = stash.stats().pool_bytes;

  const auto handle = stash.save_async(exec, view, bound);
  auto stats = stash.stats();
  CHECK(stats.pending_saves == 1);
  CHECK(stats.saves == 2);
  CHECK(stats.stored_bytes == expected.stored_bytes);  // the pending one counts once settled
  CHECK(stats.pool_bytes >= held + kompress::max_compressed_size<float>(values.size()));
  stash.fence();
  stats = stash.stats();
  CHECK(stats.pending_saves == 0);
  CHECK(stats.stored_bytes == 2 * expected.stored_bytes + 72);
  CHECK(stats.pool_bytes - held < expected.stored_bytes + 72 + 16);
  const auto info = stash.info(handle);
  CHECK(info.stored_bytes == expected.stored_bytes + 72);
  CHECK(info.absolute_bound == expected.absolute_bound);
  CHECK(info.segments == 1);
  Kokkos::View<float*, memory_space> a("a", values.size()), b("b", values.size());
  stash.restore(exec, reference, a);
  stash.restore_and_drop(exec, handle, b);
  CHECK(bit_identical(to_vector(a), to_vector(b)));
  require_within<float>(values, to_vector(b), expected.absolute_bound);

  // Restore, info and drop each settle the entry they are given.
  for (int how = 0; how < 3; ++how) {
    CAPTURE(how);
    const auto pending = stash.save_async(exec, view, bound);
    REQUIRE(stash.stats().pending_saves == 1);
    if (how == 0) {
      stash.restore(exec, pending, b);
      CHECK(bit_identical(to_vector(a), to_vector(b)));
    }
    if (how == 1) CHECK(stash.info(pending).stored_bytes == expected.stored_bytes + 72);
    if (how == 2) stash.drop(pending);
    CHECK(stash.stats().pending_saves == 0);
    if (how != 2) stash.drop(pending);
  }
  stash.drop(reference);
  CHECK(stash.stats().pool_bytes == stash.stats().workspace_bytes);
  // Destroying a stash with a save pending waits for it (ASan would see the write otherwise).
  { stash_type other(exec, options(std::size_t(8) << 20, raw)); other.save_async(exec, view, bound); }
}

TEST_CASE("stash: save_async makes room by settling, and saves synchronously when it cannot") {
  const exec_space exec;
  const auto values = relu_activation();
  const auto view = to_view(values);
  const auto bound = kompress::relative(1e-2);
  const std::size_t worst = kompress::max_compressed_size<float>(values.size());
  const std::size_t segment = std::size_t(256) << 10;
  const std::size_t stream = kompress::compress(exec, view, bound).size() + 64;
  const std::size_t workspace =
      stash_type(exec, options(std::size_t(8) << 20, segment)).stats().workspace_bytes;
  REQUIRE(2 * stream < worst);
  // Room for the workspace, one worst case and one stream: a second save_async fits only once
  // the first is settled, a third not even then.
  stash_type stash(exec, options(workspace + worst + stream + 128, segment));
  const auto first = stash.save_async(exec, view, bound);
  CHECK(stash.stats().pending_saves == 1);
  const auto second = stash.save_async(exec, view, bound);
  CHECK(stash.stats().pending_saves == 1);  // the first was settled to make room
  CHECK(stash.info(first).segments == 1);
  CHECK(stash.info(second).segments == 1);
  // A synchronous save settles pending saves before it turns to the policy.
  const auto third_pending = stash.save_async(exec, view, bound);  // does not fit: saved in segments
  CHECK(stash.stats().pending_saves == 0);
  CHECK(stash.info(third_pending).segments == (values.size() * 4 + segment - 1) / segment);
  Kokkos::View<float*, memory_space> back("back", values.size());
  const double e = stash.info(first).absolute_bound;
  for (const auto& h : {third_pending, second, first}) {
    stash.restore_and_drop(exec, h, back);
    require_within<float>(values, to_vector(back), e);
  }

  stash_type tight(exec, options(workspace + worst + stream / 2, segment));
  const auto pending = tight.save_async(exec, view, bound);
  // Only the settled stream leaves room for this save's segments: it must settle, not throw.
  const auto settled = tight.save(exec, view, bound);
  CHECK(tight.stats().pending_saves == 0);
  tight.restore_and_drop(exec, settled, back);
  require_within<float>(values, to_vector(back), e);
  tight.restore_and_drop(exec, pending, back);
  require_within<float>(values, to_vector(back), e);
}

TEST_CASE("stash: save_async holds at most async_window worst cases; settled streams move down") {
  const exec_space exec;
  const auto bound = kompress::relative(1e-2);
  const std::size_t count = 3000;  // one stream in a 16 KiB segment: save_async stores what save does
  using kompress::detail::first_fit_allocator;
  const std::size_t worst = first_fit_allocator::round_up(kompress::max_compressed_size<float>(count));
  for (const std::size_t window : {std::size_t(1), std::size_t(2), std::size_t(3)}) {
    CAPTURE(window);
    auto o = options(std::size_t(4) << 20, std::size_t(16) << 10);
    o.async_window = window;
    stash_type stash(exec, o), reference(exec, o);
    std::vector<std::vector<float>> saved;
    std::vector<kompress::stash_handle> handles, reference_handles;
    for (unsigned i = 0; i < 8; ++i) {
      saved.push_back(random_values<float>(count, 40 + i));
      const auto view = to_view(saved.back());
      handles.push_back(stash.save_async(exec, view, bound));
      reference_handles.push_back(reference.save(exec, view, bound));
      const auto stats = stash.stats();
      CHECK(stats.pending_saves <= window);
      CHECK(stats.reserved_bytes <= window * worst);
      // Everything the pool holds is accounted for.
      CHECK(stats.pool_bytes ==
            stats.workspace_bytes + stats.reserved_bytes + stats.stored_bytes + stats.padding_bytes);
    }
    const auto stats = stash.stats();
    // The budget this needed: the streams and the window's worst cases, not one per save.
    std::size_t streams = 0;
    for (const auto& h : reference_handles)
      streams += first_fit_allocator::round_up(reference.info(h).stored_bytes);
    CHECK(stats.peak_pool_bytes <= stats.workspace_bytes + streams + window * worst);
    // With one save in flight each settles before the next reserves: the tail it gives back is
    // where the next one goes. With more, a reservation settled while a later one held the
    // range above it leaves a hole, and the next settled stream moves down into it.
    if (window == 1) CHECK(stats.moved_streams == 0);
    else CHECK(stats.moved_streams > 0);
    for (std::size_t i = handles.size(); i-- > 0;) {
      Kokkos::View<float*, memory_space> back("back", count), reference_back("reference", count);
      stash.restore_and_drop(exec, handles[i], back);
      reference.restore_and_drop(exec, reference_handles[i], reference_back);
      CHECK(bit_identical(to_vector(back), to_vector(reference_back)));
    }
    CHECK(stash.stats().pool_bytes == stash.stats().workspace_bytes);
  }
}

TEST_CASE("stash: save_async rejects what save rejects, and leaves the stash unchanged") {
  const exec_space exec;
  stash_type stash(exec, options(std::size_t(8) << 20, std::size_t(1) << 20));
  Kokkos::View<float**, Kokkos::LayoutRight, memory_space> matrix("matrix", 64, 64);
  auto strided = Kokkos::subview(matrix, Kokkos::ALL, 3);
  CHECK_THROWS_WITH_AS(stash.save_async(exec, strided, kompress::relative(1e-2)),
                       doctest::Contains("contiguous"), kompress::invalid_argument);
  CHECK_THROWS_AS(stash.save_async(exec, matrix, kompress::absolute(-1.0)), kompress::invalid_argument);
  const auto stats = stash.stats();
  CHECK(stats.entries == 0);
  CHECK(stats.pending_saves == 0);
  CHECK(stats.pool_bytes == stats.workspace_bytes);
  // A zero-size View is an entry of no bytes, as with save.
  Kokkos::View<double*, memory_space> empty("empty", 0);
  const auto handle = stash.save_async(exec, empty, kompress::relative(1e-2));
  CHECK(stash.info(handle).stored_bytes == 0);
  stash.drop(handle);
}
