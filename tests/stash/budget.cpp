// The stash's budget: exceeded under each policy (throw, spill to host, spill to a file, a
// looser bound within a ceiling); spilled entries restore bit-identically to unspilled ones;
// nothing is ever dropped silently; in-place and workspace placement give the same streams.
#include <kompress/stash.hpp>

#include "support/codec_checks.hpp"
#include "support/data_checks.hpp"
#include "support/stash_views.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using exec_space = Kokkos::DefaultExecutionSpace;
using memory_space = exec_space::memory_space;
using stash_type = kompress::stash<exec_space>;
using kompress::test::to_vector;
using kompress::test::to_view;

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

// The budgets below are sized for these two arrays: the MLP's second ReLU output (1024 x 1024;
// the sample's 128 rows repeated) and a convolution's output, which only the full set has.
constexpr const char* conv_file = "act_cnn_stem_conv_out_128x16x32x32.f32";
std::vector<float> relu() { return kompress::test::read_array<float>("act_mlp_relu2_out", 1024 * 1024); }
std::vector<float> conv() { return kompress::test::read_raw<float>(conv_file); }

std::vector<float> restore_vector(stash_type& stash, const kompress::stash_handle& handle) {
  return to_vector(stash.restore<Kokkos::View<float*, memory_space>>(exec_space{}, handle));
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void require_within(const std::vector<float>& original, const std::vector<float>& decoded, double bound) {
  const auto check = kompress::test::check_bound<float>(original, decoded, bound);
  CHECK(check.violations == 0);
}

/// A fresh directory under the system's temporary folder, removed at scope exit.
struct temporary_directory {
  std::filesystem::path path;
  temporary_directory() {
    std::random_device random;
    path = std::filesystem::temp_directory_path() /
           ("kompress-stash-test-" + std::to_string(random()) + std::to_string(random()));
    std::filesystem::create_directories(path);
  }
  ~temporary_directory() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::size_t files() const {
    return std::size_t(std::distance(std::filesystem::directory_iterator(path),
                                     std::filesystem::directory_iterator{}));
  }
};

// 256 KiB segments: the 4 MiB ReLU output is 16 segments of about 42 KB each at REL 1e-2,
// and the workspace about 260 KiB.
kompress::stash_options small(std::size_t budget, kompress::budget_policy policy = {}) {
  return {.budget_bytes = budget, .policy = policy, .segment_bytes = 256 * KiB};
}

}  // namespace

TEST_CASE("stash budget: options are checked when the stash is made") {
  const exec_space exec;
  CHECK_THROWS_WITH_AS(stash_type(exec, {.budget_bytes = 1 * MiB}),
                       doctest::Contains("too small: the workspace alone takes"),
                       kompress::invalid_argument);
  CHECK_THROWS_AS(stash_type(exec, {.budget_bytes = 8 * MiB, .codec = {.block_size = 48}}),
                  kompress::invalid_argument);
  CHECK_THROWS_WITH_AS(
      stash_type(exec, small(4 * MiB, kompress::budget_policy::spill_to_file("/nonexistent/kompress"))),
      doctest::Contains("not an existing directory"), kompress::invalid_argument);
  CHECK_THROWS_WITH_AS(stash_type(exec, small(4 * MiB, kompress::budget_policy::loosen_bound(
                                                           kompress::relative(1e-1), 1.0))),
                       doctest::Contains("growth must be finite and > 1 (got 1)"), kompress::invalid_argument);
  CHECK_THROWS_AS(stash_type(exec, small(4 * MiB, kompress::budget_policy::loosen_bound(
                                                      kompress::relative(-1.0)))),
                  kompress::invalid_argument);
}

TEST_CASE("stash budget: the default policy throws budget_exceeded with the numbers, keeping nothing") {
  KOMPRESS_TEST_NEEDS_DATA(conv_file);
  const exec_space exec;
  const auto values = relu();
  const auto view = to_view(values);
  stash_type stash(exec, small(600 * KiB));
  // 16 segments of ~42 KB = ~680 KB, more than the ~350 KB the workspace leaves free.
  const auto before = stash.stats();
  try {
    stash.save(exec, view, kompress::relative(1e-2));
    FAIL("no budget_exceeded");
  } catch (const kompress::budget_exceeded& e) {
    const std::string message = e.what();
    MESSAGE(message);
    CHECK(message.find("kompress::stash::save: budget exceeded") != std::string::npos);
    CHECK(message.find("policy throw_error") != std::string::npos);
    CHECK(message.find(std::to_string(e.needed_bytes())) != std::string::npos);
    CHECK(message.find(std::to_string(e.largest_free_bytes())) != std::string::npos);
    CHECK(e.needed_bytes() > e.largest_free_bytes());
    CHECK(e.budget_bytes() == 600 * KiB);
    CHECK(e.in_use_bytes() >= before.workspace_bytes);
  }
  const auto after = stash.stats();
  CHECK(after.entries == 0);
  CHECK(after.pool_bytes == before.pool_bytes);  // the segments placed before the failure are freed
  CHECK(after.saves == 0);
  static_assert(std::is_base_of_v<kompress::error, kompress::budget_exceeded>);

  // What fits still fits afterwards, and a save that would overflow leaves the others intact.
  const auto small_values = conv();
  std::vector<float> part(small_values.begin(), small_values.begin() + 40000);
  const auto handle = stash.save(exec, to_view(part), kompress::relative(1e-2));
  CHECK_THROWS_AS(stash.save(exec, view, kompress::relative(1e-2)), kompress::budget_exceeded);
  require_within(part, restore_vector(stash, handle),
                 kompress::test::expected_abs_bound<float>(part, kompress::relative(1e-2)));
}

TEST_CASE("stash budget: spill to host keeps every byte and restores bit-identically") {
  KOMPRESS_TEST_NEEDS_DATA(conv_file);
  const exec_space exec;
  const auto a = relu(), b = conv();
  const auto view_a = to_view(a), view_b = to_view(b);
  stash_type roomy(exec, small(64 * MiB));
  stash_type tight(exec, small(1 * MiB, kompress::budget_policy::spill_to_host()));
  std::vector<kompress::stash_handle> roomy_handles, tight_handles;
  for (int i = 0; i < 3; ++i) {
    for (const auto* view : {&view_a, &view_b}) {
      roomy_handles.push_back(roomy.save(exec, *view, kompress::relative(1e-2)));
      tight_handles.push_back(tight.save(exec, *view, kompress::relative(1e-2)));
    }
  }
  const auto stats = tight.stats();
  CHECK(stats.spilled_segments > 0);
  CHECK(stats.host_spilled_bytes > 0);
  CHECK(stats.pool_bytes <= stats.budget_bytes);
  std::size_t host_segments = 0, pool_segments = 0;
  for (std::size_t i = 0; i < tight_handles.size(); ++i) {
    const auto info = tight.info(tight_handles[i]);
    host_segments += info.placement.host_segments;
    pool_segments += info.placement.pool_segments;
    CHECK(info.used_bound.value == 1e-2);
    CHECK(bit_identical(restore_vector(tight, tight_handles[i]), restore_vector(roomy, roomy_handles[i])));
  }
  CHECK(host_segments > 0);
  CHECK(pool_segments > 0);
  // The same streams; those in the pool framed (their headers cut to 16-byte frames), the
  // spilled ones whole.
  CHECK(stats.stored_bytes == roomy.stats().stored_bytes + 72 * host_segments);
  // Dropping frees the host bytes too; the pool ends as it began.
  for (auto it = tight_handles.rbegin(); it != tight_handles.rend(); ++it) tight.drop(*it);
  CHECK(tight.stats().host_spilled_bytes == 0);
  CHECK(tight.stats().pool_bytes == tight.stats().workspace_bytes);
}

TEST_CASE("stash budget: spill to a file keeps every byte, restores bit-identically, cleans up") {
  const exec_space exec;
  const auto a = relu();
  const auto view = to_view(a);
  temporary_directory directory;
  stash_type roomy(exec, small(64 * MiB));
  const auto reference = roomy.save(exec, view, kompress::relative(1e-2));
  const auto expected = restore_vector(roomy, reference);
  {
    stash_type tight(exec, small(700 * KiB, kompress::budget_policy::spill_to_file(directory.path)));
    CHECK(directory.files() == 0);  // created on the first spill only
    std::vector<kompress::stash_handle> handles;
    for (int i = 0; i < 3; ++i) handles.push_back(tight.save(exec, view, kompress::relative(1e-2)));
    CHECK(directory.files() == 1);
    const auto stats = tight.stats();
    CHECK(stats.file_spilled_bytes > 0);
    CHECK(stats.pool_bytes <= stats.budget_bytes);
    CHECK(tight.info(handles[2]).placement.file_segments > 0);
    for (const auto& handle : handles) CHECK(bit_identical(restore_vector(tight, handle), expected));
    // Out-of-order drop and reuse of the file's freed ranges.
    tight.drop(handles[1]);
    handles[1] = tight.save(exec, view, kompress::relative(1e-2));
    for (const auto& handle : handles) CHECK(bit_identical(restore_vector(tight, handle), expected));
    tight.drop(handles[0]);
  }
  CHECK(directory.files() == 0);  // the stash removed its file
}

TEST_CASE("stash budget: a looser bound within the ceiling, recorded per entry") {
  const exec_space exec;
  const auto values = relu();
  const auto view = to_view(values);
  // At REL 1e-2 the ReLU output is ~680 KB; ~480 KiB of room needs a looser bound.
  stash_type stash(exec, small(740 * KiB, kompress::budget_policy::loosen_bound(kompress::relative(1e-1))));
  const auto handle = stash.save(exec, view, kompress::relative(1e-2));
  const auto info = stash.info(handle);
  MESSAGE("stored with REL " << info.used_bound.value << ", " << info.stored_bytes << " bytes");
  CHECK(info.requested_bound.value == 1e-2);
  CHECK(info.used_bound.value > 1e-2);
  CHECK(info.used_bound.value <= 1e-1);
  CHECK(info.used_bound.mode == kompress::bound_mode::relative);
  const double used = kompress::test::expected_abs_bound<float>(values, info.used_bound);
  CHECK(info.absolute_bound == used);
  require_within(values, restore_vector(stash, handle), used);
  CHECK(stash.stats().loosened_saves == 1);

  // Under a ceiling that is still too tight: budget_exceeded naming the bounds tried.
  stash_type strict(exec, small(500 * KiB, kompress::budget_policy::loosen_bound(kompress::relative(2e-2))));
  CHECK_THROWS_WITH_AS(strict.save(exec, view, kompress::relative(1e-2)),
                       doctest::Contains("tried the bounds REL 0.01, REL 0.02 up to the ceiling REL 0.02"),
                       kompress::budget_exceeded);
  CHECK(strict.stats().entries == 0);
  CHECK(strict.stats().pool_bytes == strict.stats().workspace_bytes);
  // A ceiling in another mode than the save's bound is a mistake.
  CHECK_THROWS_AS(strict.save(exec, view, kompress::absolute(1e-2)), kompress::invalid_argument);
}

TEST_CASE("stash budget: in place or through the workspace, the streams are the same") {
  KOMPRESS_TEST_NEEDS_DATA(conv_file);
  const exec_space exec;
  const auto values = conv();
  const auto view = to_view(values);
  // Whole streams (framing, which takes every stream through the workspace, off).
  auto in_place =
      kompress::detail::tuned_stash(exec, small(16 * MiB), {.compress_in_place = true, .frame_streams = false});
  auto staged =
      kompress::detail::tuned_stash(exec, small(16 * MiB), {.compress_in_place = false, .frame_streams = false});
  const auto a = in_place.save(exec, view, kompress::relative(1e-3));
  const auto b = staged.save(exec, view, kompress::relative(1e-3));
  CHECK(in_place.info(a).stored_bytes == staged.info(b).stored_bytes);
  CHECK(bit_identical(restore_vector(in_place, a), restore_vector(staged, b)));
  // The worst-case range an in-place save borrows is not counted as held.
  CHECK(staged.stats().peak_pool_bytes == staged.stats().pool_bytes);
  CHECK(in_place.stats().peak_pool_bytes == in_place.stats().pool_bytes);
  CHECK(in_place.stats().pool_bytes == staged.stats().pool_bytes);
}

TEST_CASE("stash options: the codec's options apply to every segment; the bound stays per save") {
  const exec_space exec;
  CHECK_THROWS_WITH_AS(stash_type(exec, {.budget_bytes = 8 * MiB, .codec = {.bound = kompress::relative(1e-2)}}),
                       doctest::Contains("options.codec.bound must be lossless()"),
                       kompress::invalid_argument);
  // Padding marked by a fill value: bit-exact, and outside the relative bound's range even
  // when the View is saved in several segments (the range is the whole View's).
  const float fill = -999.0f;
  std::vector<float> values = relu();
  for (std::size_t i = 0; i < values.size(); i += 7) values[i] = fill;
  const auto view = to_view(values);
  for (const int block_size : {32, 128}) {
    CAPTURE(block_size);
    stash_type stash(exec, {.budget_bytes = 16 * MiB, .segment_bytes = 256 * KiB,
                            .codec = {.fill_value = double(fill), .block_size = block_size}});
    const auto handle = stash.save(exec, view, kompress::relative(1e-2));
    const auto info = stash.info(handle);
    REQUIRE(info.segments > 1);
    const double expected = kompress::absolute_bound(
        exec, view, {.bound = kompress::relative(1e-2), .fill_value = double(fill)});
    CHECK(info.absolute_bound == expected);
    CHECK(expected < 1e-2 * 999.0);  // the fill value is not in the range
    const auto back = restore_vector(stash, handle);
    require_within(values, back, expected);
    for (std::size_t i = 0; i < values.size(); i += 7) REQUIRE(back[i] == fill);
  }
}
