// The stash's spill file: created exclusively and privately (mode 0600, never
// through a symlink or over an existing file), removed when the stash goes, and stale files of
// dead processes cleaned only when they are certainly theirs. Small synthetic data: quick
// enough for the sanitizer pass.
#include <kompress/stash.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using exec_space = Kokkos::DefaultExecutionSpace;
using memory_space = exec_space::memory_space;
using stash_type = kompress::stash<exec_space>;

constexpr std::size_t KiB = 1024;

struct temporary_directory {
  fs::path path;
  temporary_directory() {
    std::random_device random;
    path = fs::temp_directory_path() /
           ("kompress-spill-test-" + std::to_string(random()) + std::to_string(random()));
    fs::create_directories(path);
  }
  ~temporary_directory() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::vector<fs::path> spill_files() const {
    std::vector<fs::path> found;
    for (const auto& entry : fs::directory_iterator(path))
      if (entry.path().extension() == ".spill") found.push_back(entry.path());
    return found;
  }
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

/// Incompressible values (uniform noise, saved lossless): they never fit a small pool.
Kokkos::View<float*, memory_space> noise(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Kokkos::View<float*, memory_space> view("noise", count);
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < count; ++i) host(i) = uniform(rng);
  Kokkos::deep_copy(view, host);
  return view;
}

bool restores_exactly(stash_type& stash, const kompress::stash_handle& handle,
                      const Kokkos::View<float*, memory_space>& original) {
  auto back = stash.restore<Kokkos::View<float*, memory_space>>(exec_space{}, handle);
  auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, original);
  auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, back);
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// 64 KiB segments: a ~66 KB workspace; 160 KiB of budget leaves ~90 KB for streams.
kompress::stash_options spilling(const fs::path& directory) {
  return {.budget_bytes = 160 * KiB,
          .policy = kompress::budget_policy::spill_to_file(directory),
          .segment_bytes = 64 * KiB};
}

/// The name the stash tries first for its spill file.
fs::path first_name(const fs::path& directory, const kompress::stash_handle& any_handle,
                    unsigned attempt = 0) {
  return directory / kompress::detail::spill_file_name(long(::getpid()), any_handle.stash_id,
                                                       attempt, kompress::detail::spill_host_name());
}

/// A pid no process has now: a child that has exited and been reaped.
long dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return long(child);
}

}  // namespace

TEST_CASE("spill file: private (0600), a regular file of ours, removed when the stash goes") {
  temporary_directory directory;
  const mode_t previous_umask = ::umask(022);  // the usual umask: 0666 & ~022 would be 0644
  const auto values = noise(64 * 1024, 1);
  {
    stash_type stash(spilling(directory.path));
    CHECK(directory.spill_files().empty());  // created on the first spill only
    const auto handle = stash.save(values, kompress::lossless());
    CHECK(stash.info(handle).placement.file_segments > 0);
    const auto files = directory.spill_files();
    REQUIRE(files.size() == 1);
    struct stat status{};
    REQUIRE(::lstat(files[0].c_str(), &status) == 0);
    CHECK(S_ISREG(status.st_mode));
    CHECK((status.st_mode & 07777) == 0600);
    CHECK(status.st_uid == ::geteuid());
    CHECK(files[0] == first_name(directory.path, handle));
    CHECK(restores_exactly(stash, handle, values));
  }
  ::umask(previous_umask);
  CHECK(directory.spill_files().empty());
}

TEST_CASE("spill file: a symlink or a file planted at the stash's names is left untouched") {
  temporary_directory directory;
  const fs::path victim = directory.path / "victim.txt";
  const std::string precious = "precious data that must survive";
  write_text(victim, precious);

  const auto small = noise(16, 2);
  const auto values = noise(64 * 1024, 3);
  fs::path planted_link, planted_file;
  {
    stash_type stash(spilling(directory.path));
    const auto first = stash.save(small, kompress::lossless());  // fits: no file yet
    REQUIRE(directory.spill_files().empty());
    // An attacker who guessed the names: a symlink at the first, a file at the second.
    planted_link = first_name(directory.path, first, 0);
    planted_file = first_name(directory.path, first, 1);
    fs::create_symlink(victim, planted_link);
    write_text(planted_file, precious);

    const auto handle = stash.save(values, kompress::lossless());
    CHECK(stash.info(handle).placement.file_segments > 0);
    CHECK(read_text(victim) == precious);  // not truncated, not written through the link
    CHECK(fs::is_symlink(planted_link));
    CHECK(read_text(planted_file) == precious);
    const fs::path ours = first_name(directory.path, first, 2);
    CHECK(fs::is_regular_file(fs::symlink_status(ours)));
    CHECK(restores_exactly(stash, handle, values));
    CHECK(restores_exactly(stash, first, small));
  }
  // Destruction removes its own file only.
  CHECK(!fs::exists(fs::symlink_status(first_name(directory.path, {}, 2))));
  CHECK(fs::is_symlink(planted_link));
  CHECK(read_text(victim) == precious);
  CHECK(read_text(planted_file) == precious);
  CHECK(directory.spill_files().size() == 2);
}

TEST_CASE("spill file: when every name is taken, the save throws and keeps what it had") {
  temporary_directory directory;
  const auto small = noise(16, 4);
  const auto values = noise(64 * 1024, 5);
  stash_type stash(spilling(directory.path));
  const auto first = stash.save(small, kompress::lossless());
  for (unsigned attempt = 0; attempt < kompress::detail::spill_file::max_attempts; ++attempt)
    write_text(first_name(directory.path, first, attempt), "taken");
  const auto before = stash.stats();
  CHECK_THROWS_WITH_AS(stash.save(values, kompress::lossless()),
                       doctest::Contains("cannot create a spill file"), kompress::error);
  CHECK(stash.stats().entries == before.entries);
  CHECK(stash.stats().pool_bytes == before.pool_bytes);
  CHECK(restores_exactly(stash, first, small));
  for (unsigned attempt = 0; attempt < kompress::detail::spill_file::max_attempts; ++attempt)
    CHECK(read_text(first_name(directory.path, first, attempt)) == "taken");
}

TEST_CASE("spill file: names encode pid and host, and parse back") {
  const std::string host = kompress::detail::spill_host_name();
  const std::string name = kompress::detail::spill_file_name(4242, 0x0123456789abcdefull, 3, host);
  kompress::detail::spill_file_owner owner;
  REQUIRE(kompress::detail::parse_spill_file_name(name, owner));
  CHECK(owner.pid == 4242);
  CHECK(owner.host == host);
  CHECK(!kompress::detail::parse_spill_file_name("kompress-stash-12-abc-0-host.spill", owner));
  CHECK(!kompress::detail::parse_spill_file_name("kompress-stash-x-0123456789abcdef-0-h.spill", owner));
  CHECK(!kompress::detail::parse_spill_file_name("kompress-stash-12-0123456789abcdef-0-.spill", owner));
  CHECK(!kompress::detail::parse_spill_file_name("notes.txt", owner));
  CHECK(!kompress::detail::parse_spill_file_name("kompress-stash-4294967297-0123456789abcdef-0-h.spill", owner));
}

TEST_CASE("spill file: stale files of dead processes on this host are removed, nothing else") {
  using kompress::detail::spill_file_name;
  temporary_directory directory;
  const std::string host = kompress::detail::spill_host_name();
  const long dead = dead_pid();
  const fs::path stale = directory.path / spill_file_name(dead, 0xaaaa, 0, host);
  const fs::path stale_link = directory.path / spill_file_name(dead, 0xbbbb, 0, host);
  const fs::path other_host = directory.path / spill_file_name(dead, 0xcccc, 0, host + "x");
  const fs::path live_self = directory.path / spill_file_name(long(::getpid()), 0xdddd, 0, host);
  const fs::path live_other = directory.path / spill_file_name(long(::getppid()), 0xeeee, 0, host);
  const fs::path unrelated = directory.path / "kompress-stash-notes.spill";
  const fs::path victim = directory.path / "victim.txt";
  for (const fs::path& path : {stale, other_host, live_self, live_other, unrelated, victim})
    write_text(path, "x");
  fs::create_symlink(victim, stale_link);

  // The cleaning runs when a stash creates its spill file.
  stash_type stash(spilling(directory.path));
  const auto values = noise(64 * 1024, 6);
  const auto handle = stash.save(values, kompress::lossless());
  CHECK(stash.info(handle).placement.file_segments > 0);

  CHECK(!fs::exists(fs::symlink_status(stale)));  // dead pid, this host, our regular file
  CHECK(fs::is_symlink(stale_link));              // not a regular file: left alone
  CHECK(read_text(victim) == "x");
  CHECK(fs::exists(other_host));  // another host's pid says nothing here
  CHECK(fs::exists(live_self));   // this process: a live stash's file
  CHECK(fs::exists(live_other));  // a live process
  CHECK(fs::exists(unrelated));   // not the pattern
}
