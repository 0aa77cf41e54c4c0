#pragma once
// Declarations of kompress's public types, for headers that name them without needing their
// definitions. Needs neither Kokkos nor MPI.

#include <cstdint>

namespace kompress::inline v0 {

// bound.hpp: error bounds and the codec's options
enum class bound_mode : std::uint8_t;
struct error_bound;
struct compress_options;
struct decompress_options;
enum class codec_mode : std::uint8_t;
enum class rounding_mode : std::uint8_t;

// format.hpp: what a stream's header says
enum class element_type : std::uint8_t;
struct stream_info;

// error.hpp: every exception
class error;
class invalid_argument;
class format_error;
class resource_error;
class mpi_error;
class peer_error;
class budget_exceeded;
class invalid_handle;

// comm/: the collectives (kompress/comm.hpp)
enum class transfer_mode;
enum class allreduce_bound;
enum class reduction_method;
enum class transport_mode;
enum class collective_schedule;
struct cost_model;
struct collective_options;
struct collective_report;
class request;
class persistent_request;
class comm_workspace;
class node_groups;
class hierarchical_workspace;

// stash/: the activation stash (kompress/stash.hpp)
struct budget_policy;
struct stash_options;
enum class stash_codec : std::uint8_t;
struct stash_save_options;
struct layer_bounds_options;
struct layer_bound_change;
class layer_bounds;
struct stash_handle;
struct stash_placement;
struct stash_stats;
struct stash_entry_info;
template <class ExecutionSpace>
class stash;

// dlrm/: the DLRM embedding exchange (kompress/dlrm.hpp)
namespace dlrm {
struct table;
enum class direction;
struct exchange_options;
class embedding_exchange;
}  // namespace dlrm

struct version_info;

}  // namespace kompress::inline v0
