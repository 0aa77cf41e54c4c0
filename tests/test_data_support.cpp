// support/real_data.hpp: the data folder is found, every array is listed with the right
// shape, type, family and fill value, and a missing file is a clear error.
#include <doctest/doctest.h>

#include "real_data.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

namespace kt = kompress::test;

namespace {

// Sets an environment variable for one scope and restores it after.
class scoped_env {
 public:
  scoped_env(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~scoped_env() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string message_of(auto&& call) {
  try {
    call();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  FAIL("expected a std::runtime_error");
  return {};
}

const kt::data_file_info* find(const std::vector<kt::data_file_info>& files,
                               const std::string& name) {
  auto it = std::find_if(files.begin(), files.end(), [&](const auto& f) { return f.name == name; });
  return it == files.end() ? nullptr : &*it;
}

// The fill-like values of an array (|x| >= 1e19, manifest.json's criterion), counted by value.
template <class T>
std::map<double, std::size_t> fill_like_values(const std::vector<T>& values) {
  std::map<double, std::size_t> found;
  for (T value : values) {
    if (std::abs(value) >= T(1e19)) ++found[static_cast<double>(value)];
  }
  return found;
}

}  // namespace

TEST_CASE("data_dir is an existing folder") {
  const auto dir = kt::data_dir();
  CHECK(std::filesystem::is_directory(dir));
  CHECK(std::filesystem::is_regular_file(dir / "README.md"));
}

TEST_CASE("float_data_files lists every array, sorted, with shape, dtype and family") {
  const auto files = kt::float_data_files();
  CHECK(std::is_sorted(files.begin(), files.end(),
                       [](const auto& a, const auto& b) { return a.name < b.name; }));

  std::map<std::string, int> per_family;
  for (const auto& f : files) {
    ++per_family[f.family];
    CHECK((f.dtype == "f32" || f.dtype == "f64"));
    CHECK(f.name.ends_with("." + f.dtype));
    CHECK(std::filesystem::file_size(kt::data_file(f.name)) ==
          f.elements() * (f.dtype == "f32" ? 4u : 8u));
  }
  // The data README: 22 scientific fields here (24 are described; two are held out), the
  // word2vec and three DLRM embedding files, 7 activations and 3 gradients.
  CHECK(per_family["science"] >= 22);
  CHECK(per_family["embedding"] >= 4);
  CHECK(per_family["activation"] >= 10);
  CHECK(per_family.size() == 3);

  const auto* erai = find(files, "erai_z_2x3x241x480.f32");
  REQUIRE(erai != nullptr);
  CHECK(erai->shape == std::vector<std::size_t>{2, 3, 241, 480});
  CHECK(erai->family == "science");
  CHECK_FALSE(erai->fill_value.has_value());

  const auto* mpas = find(files, "mpas_surface_pressure_163842.f64");
  REQUIRE(mpas != nullptr);
  CHECK(mpas->dtype == "f64");
  CHECK(mpas->shape == std::vector<std::size_t>{163842});

  const auto* dlrm = find(files, "dlrm_flights_lookup_grad_1024x10x128.f32");
  REQUIRE(dlrm != nullptr);
  CHECK(dlrm->family == "embedding");
  const auto* grad = find(files, "grad_mlp_fc1_out_1024x1024.f32");
  REQUIRE(grad != nullptr);
  CHECK(grad->family == "activation");

  // Only the arrays are listed, not the word list, the JSON files or the uint8 MNIST files.
  CHECK(find(files, "emb_word2vec_googlenews_8000x300.words.txt") == nullptr);
  CHECK(std::none_of(files.begin(), files.end(),
                     [](const auto& f) { return f.name.ends_with(".u8"); }));
}

TEST_CASE("fill values match the arrays: present where listed, nothing fill-like elsewhere") {
  const std::map<std::string, float> expected_fill = {
      {"pop_temp_384x320.f32", 9.96921e36f},
      {"foam_ocean_v_24x128x128.f32", 1e35f},
      {"nemo_orca2_sst_5x149x182.f32", 1e20f},
  };
  int with_fill = 0;
  for (const auto& f : kt::float_data_files()) {
    CAPTURE(f.name);
    const auto found = f.dtype == "f32" ? fill_like_values(kt::read_raw<float>(f.name))
                                        : fill_like_values(kt::read_raw<double>(f.name));
    if (const auto it = expected_fill.find(f.name); it != expected_fill.end()) {
      ++with_fill;
      REQUIRE(f.fill_value.has_value());
      CHECK(*f.fill_value == static_cast<double>(it->second));
      // The fill is the only fill-like value, stored exactly as this float.
      REQUIRE(found.size() == 1);
      CHECK(found.begin()->first == *f.fill_value);
      CHECK(found.begin()->second > 0);
    } else {
      CHECK_FALSE(f.fill_value.has_value());
      CHECK(found.empty());
    }
  }
  CHECK(with_fill == 3);
}

TEST_CASE("read_raw reads little-endian arrays and checks the element size") {
  const auto values = kt::read_raw<float>("sz_testfloat_8x8x128.f32");
  REQUIRE(values.size() == 8u * 8u * 128u);
  // The README's min / max of this array.
  const auto [min, max] = std::minmax_element(values.begin(), values.end());
  CHECK(*min == doctest::Approx(0.213285).epsilon(1e-6));
  CHECK(*max == doctest::Approx(5.05322).epsilon(1e-6));

  const auto labels = kt::read_raw<unsigned char>("mnist_t10k_labels_10000.u8");
  CHECK(labels.size() == 10000u);
  CHECK(*std::max_element(labels.begin(), labels.end()) == 9);

  // 64,286 bytes: not a whole number of floats.
  const std::string message =
      message_of([] { kt::read_raw<float>("emb_word2vec_googlenews_8000x300.words.txt"); });
  CHECK(message.find("not a multiple") != std::string::npos);
}

TEST_CASE("a missing data file is an error naming the file, the folder and KOMPRESS_DATA_DIR") {
  const std::string message = message_of([] { kt::data_file("no_such_array_8x8.f32"); });
  CHECK(message.find("no_such_array_8x8.f32") != std::string::npos);
  CHECK(message.find(kt::data_dir().string()) != std::string::npos);
  CHECK(message.find("KOMPRESS_DATA_DIR") != std::string::npos);

  CHECK_THROWS_AS(kt::read_raw<float>("no_such_array_8x8.f32"), std::runtime_error);
}

TEST_CASE("KOMPRESS_DATA_DIR selects the folder; an empty or missing folder is an error") {
  const auto empty_dir = std::filesystem::temp_directory_path() /
                         ("kompress_test_empty_data_dir." + std::to_string(::getpid()));
  std::filesystem::create_directories(empty_dir);
  {
    scoped_env env("KOMPRESS_DATA_DIR", empty_dir.string());
    CHECK(kt::data_dir() == empty_dir);
    const std::string message = message_of([] { kt::float_data_files(); });
    CHECK(message.find(empty_dir.string()) != std::string::npos);
    CHECK(message.find("no .f32 or .f64 files") != std::string::npos);
  }
  std::filesystem::remove(empty_dir);
  {
    scoped_env env("KOMPRESS_DATA_DIR", (empty_dir / "absent").string());
    const std::string message = message_of([] { kt::data_file("sz_testfloat_8x8x128.f32"); });
    CHECK(message.find("absent") != std::string::npos);
    CHECK(message.find("KOMPRESS_DATA_DIR") != std::string::npos);
  }
}
