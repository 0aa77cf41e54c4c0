#pragma once
// kompress::request: a nonblocking collective in flight. It owns the operation's buffers and
// duplicated communicator; wait() finishes the work (decompression included) and test()
// advances it without blocking. Move-only.

#include <kompress/comm/options.hpp>
#include <kompress/error.hpp>

#include <memory>
#include <utility>

namespace kompress {
inline namespace v0 {

namespace detail {
/// A collective as a state machine: progress(true) runs it to completion.
class operation {
 public:
  virtual ~operation() = default;
  /// Advances as far as possible; blocks until done if `block`. True when done.
  virtual bool progress(bool block) = 0;
  virtual const collective_report& report() const = 0;
};

/// A blocking call: runs the operation to completion and returns its report.
inline collective_report complete(std::unique_ptr<operation> op) {
  op->progress(true);
  return op->report();
}
}  // namespace detail


class request {
 public:
  request() = default;
  explicit request(std::unique_ptr<detail::operation> op) : op_(std::move(op)) {}
  request(request&&) noexcept = default;
  request& operator=(request&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      op_ = std::move(other.op_);
      done_ = other.done_;
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  /// Destroying an unfinished request waits for it: its buffers must outlive the messages.
  ~request() { finish_quietly(); }

  /// Completes the collective: the receive View holds the result when it returns.
  const collective_report& wait() {
    if (!op_) throw invalid_argument("kompress::request::wait: empty request");
    if (!done_) done_ = op_->progress(true);
    return op_->report();
  }

  /// Advances without blocking; true once the result is in place.
  bool test() {
    if (!op_) throw invalid_argument("kompress::request::test: empty request");
    if (!done_) done_ = op_->progress(false);
    return done_;
  }

  bool valid() const { return op_ != nullptr; }

  /// The report; complete once wait() returned or test() returned true.
  const collective_report& report() const {
    if (!op_) throw invalid_argument("kompress::request::report: empty request");
    return op_->report();
  }

 private:
  void finish_quietly() noexcept {
    if (op_ && !done_) {
      try {
        done_ = op_->progress(true);
      } catch (...) {
        // A destructor must not throw; callers who care call wait().
      }
    }
  }

  std::unique_ptr<detail::operation> op_;
  bool done_ = false;
};

}  // namespace v0
}  // namespace kompress
