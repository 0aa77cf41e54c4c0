#pragma once
// The stash's spill file: one private file per stash, created exclusively, read and written
// through its descriptor only (docs/stash.md, "The spill file").
//
// Why each step:
//   - O_CREAT | O_EXCL | O_NOFOLLOW: a name planted in a shared directory (a symlink to a
//     victim's file, or a file of another user) makes the open fail instead of truncating or
//     writing through it; the stash then tries the next name and never touches what it found.
//   - mode 0600: spilled activations are the user's data; nobody else may read them.
//   - pread/pwrite on the descriptor, never the path again: renaming or unlinking the name
//     behind the stash's back cannot redirect its reads or writes.
//   - The name encodes the host and the pid, so a later stash can recognise (and remove) the
//     files of a process that died without running destructors (SIGKILL, SIGXFSZ), and only
//     those: see remove_stale_spill_files.
// POSIX only (Linux, macOS), like the HPC systems the stash targets.

#include <kompress/error.hpp>

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

namespace kompress::inline v0::detail {

inline constexpr std::string_view spill_file_prefix = "kompress-stash-";
inline constexpr std::string_view spill_file_suffix = ".spill";

/// This host's name as it goes into a spill file's name: [A-Za-z0-9.] kept, anything else '_',
/// at most 64 characters.
inline std::string spill_host_name() {
  char buffer[256] = {};
  if (::gethostname(buffer, sizeof buffer - 1) != 0) return "unknown";
  std::string host;
  for (const char* c = buffer; *c && host.size() < 64; ++c) {
    const bool keep = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                      (*c >= '0' && *c <= '9') || *c == '.';
    host += keep ? *c : '_';
  }
  return host.empty() ? "unknown" : host;
}

/// kompress-stash-<pid>-<stash id, 16 hex digits>-<attempt>-<host>.spill
inline std::string spill_file_name(long pid, std::uint64_t stash_id, unsigned attempt,
                                   const std::string& host) {
  char middle[64];
  std::snprintf(middle, sizeof middle, "%ld-%016llx-%u-", pid,
                static_cast<unsigned long long>(stash_id), attempt);
  return std::string(spill_file_prefix) + middle + host + std::string(spill_file_suffix);
}

/// The pid and host a spill file's name encodes, if it has the stash's pattern.
struct spill_file_owner {
  long pid = 0;
  std::string host;
};

inline bool parse_spill_file_name(std::string_view name, spill_file_owner& owner) {
  if (!name.starts_with(spill_file_prefix) || !name.ends_with(spill_file_suffix)) return false;
  name.remove_prefix(spill_file_prefix.size());
  name.remove_suffix(spill_file_suffix.size());
  auto number = [&name](int base, std::size_t exact_digits, auto& value) {
    const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), value, base);
    const std::size_t digits = std::size_t(end - name.data());
    if (ec != std::errc{} || digits == 0 || (exact_digits && digits != exact_digits) ||
        digits >= name.size() || *end != '-')
      return false;
    name.remove_prefix(digits + 1);
    return true;
  };
  unsigned long long id = 0;
  unsigned attempt = 0;
  // A pid that pid_t cannot hold could alias another process (or, negative, a process group).
  if (!number(10, 0, owner.pid) || owner.pid <= 0 || owner.pid > 0x7fffffffL ||
      !number(16, 16, id) || !number(10, 0, attempt))
    return false;
  owner.host = std::string(name);
  return !owner.host.empty();
}

/// Removes the spill files in `directory` that a dead process of this user on this host left
/// behind (killed before the stash's destructor ran). A file is removed only if all hold:
///   - its name has the stash's pattern and encodes this host's name;
///   - the pid it encodes is not this process's (this process's files are live stashes') and
///     no process has it now (kill(pid, 0) fails with ESRCH; a pid reused by a live process,
///     of any user, keeps the file: a leak, never a loss);
///   - it is a regular file (lstat: a symlink is not followed nor removed) owned by this
///     effective user.
/// What could still go wrong: a process in another pid namespace sharing this directory and
/// this host name (containers on one host) looks dead from here. Its file would lose its name
/// only: the stash holds the descriptor and never reopens by name, so it reads and writes on.
/// Never throws (best effort: an unreadable directory is left alone).
inline void remove_stale_spill_files(const std::filesystem::path& directory) noexcept {
  try {
    const std::string host = spill_host_name();
    const long self = long(::getpid());
    std::error_code ec;
    for (std::filesystem::directory_iterator it(directory, ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      spill_file_owner owner;
      if (!parse_spill_file_name(name, owner) || owner.host != host || owner.pid == self) continue;
      if (::kill(pid_t(owner.pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to ask
      struct stat status{};
      if (::lstat(it->path().c_str(), &status) != 0 || !S_ISREG(status.st_mode) ||
          status.st_uid != ::geteuid())
        continue;
      ::unlink(it->path().c_str());
    }
  } catch (...) {
  }
}

/// One spill file: created on demand, removed (closed and unlinked) when destroyed.
class spill_file {
 public:
  /// How many names create() tries before giving up (each one exists already).
  static constexpr unsigned max_attempts = 16;

  spill_file() = default;
  spill_file(spill_file&& other) noexcept
      : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}
  spill_file& operator=(spill_file&& other) noexcept {
    if (this != &other) {
      close_and_remove();
      path_ = std::move(other.path_);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  spill_file(const spill_file&) = delete;
  spill_file& operator=(const spill_file&) = delete;
  ~spill_file() { close_and_remove(); }

  bool is_open() const noexcept { return fd_ >= 0; }
  const std::filesystem::path& path() const noexcept { return path_; }

  /// Creates the file in `directory` under the first free name for this stash (mode 0600,
  /// never through a symlink, never over an existing file); removes stale files first.
  void create(const std::filesystem::path& directory, std::uint64_t stash_id, const char* who) {
    remove_stale_spill_files(directory);
    const std::string host = spill_host_name();
    int last_errno = 0;
    for (unsigned attempt = 0; attempt < max_attempts; ++attempt) {
      std::filesystem::path candidate =
          directory / spill_file_name(long(::getpid()), stash_id, attempt, host);
      int fd;
      do {
        fd = ::open(candidate.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                    S_IRUSR | S_IWUSR);
      } while (fd < 0 && errno == EINTR);
      if (fd >= 0) {
        fd_ = fd;
        path_ = std::move(candidate);
        return;
      }
      last_errno = errno;
      if (last_errno != EEXIST) break;  // another name would not help
    }
    throw error(std::string(who) + ": cannot create a spill file in '" + directory.string() +
                "' (" + std::strerror(last_errno) +
                (last_errno == EEXIST ? "; " + std::to_string(max_attempts) +
                                            " names of this stash exist already, not ours to replace"
                                      : std::string()) +
                ")");
  }

  void write(std::size_t offset, const std::byte* bytes, std::size_t length, const char* who) {
    std::size_t done = 0;
    while (done < length) {
      const ssize_t n = ::pwrite(fd_, bytes + done, length - done, off_t(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw error(std::string(who) + ": writing " + std::to_string(length) +
                    " bytes to the spill file '" + path_.string() + "' failed (" +
                    (n < 0 ? std::strerror(errno) : "no progress") + ")");
      done += std::size_t(n);
    }
  }

  void read(std::size_t offset, std::byte* bytes, std::size_t length, const char* who) const {
    std::size_t done = 0;
    while (done < length) {
      const ssize_t n = ::pread(fd_, bytes + done, length - done, off_t(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw error(std::string(who) + ": reading " + std::to_string(length) +
                    " bytes from the spill file '" + path_.string() + "' failed (" +
                    (n < 0 ? std::strerror(errno) : "the file is shorter than expected") + ")");
      done += std::size_t(n);
    }
  }

 private:
  void close_and_remove() noexcept {
    if (fd_ < 0) return;
    // Only the file we created: if the name was replaced meanwhile (possible in a directory
    // without the sticky bit), what is there now is not ours to remove.
    struct stat ours{}, named{};
    const bool same = ::fstat(fd_, &ours) == 0 && ::lstat(path_.c_str(), &named) == 0 &&
                      ours.st_dev == named.st_dev && ours.st_ino == named.st_ino;
    if (same) ::unlink(path_.c_str());
    ::close(fd_);
    fd_ = -1;
    path_.clear();
  }

  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace kompress::inline v0::detail
