#pragma once
// An MPI collective as a kompress operation: raw mode's one-shot calls are MPI's own
// collective on the caller's Views, blocking or nonblocking, after the agreement -- or, on two
// ranks, no call at all: the data moved with the agreement and the operation is complete.

#include <kompress/comm/options.hpp>
#include <kompress/comm/request.hpp>
#include <kompress/detail/mpi.hpp>

#include <mpi.h>

#include <utility>

namespace kompress::inline v0::detail {

/// A plain MPI nonblocking call, for raw mode: the request keeps the Views alive. Its handle
/// stays MPI_REQUEST_NULL (complete) where nothing is left to do.
template <class SendView, class RecvView>
class mpi_request_operation final : public operation {
 public:
  mpi_request_operation(SendView send, RecvView recv, const char* who)
      : send_(std::move(send)), recv_(std::move(recv)), who_(who) {}
  ~mpi_request_operation() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  MPI_Request* handle() { return &request_; }
  collective_report& mutable_report() { return report_; }
  bool progress(bool block) override {
    if (block) {
      check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), who_, "MPI_Wait");
      return true;
    }
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), who_, "MPI_Test");
    return done != 0;
  }
  const collective_report& report() const override { return report_; }

 private:
  SendView send_;
  RecvView recv_;
  const char* who_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  collective_report report_;
};

}  // namespace kompress::inline v0::detail
