// kompress._kompress: the nanobind extension behind the `kompress` Python package.
//
// Arrays come in through DLPack / the buffer protocol as nb::ndarray (numpy arrays, torch
// tensors) and are wrapped, without a copy, in unmanaged Views of the memory they live in:
// host memory, or CUDA device memory when the extension is built against a CUDA-enabled Kokkos.
// A CUDA array's work runs on a Kokkos::Cuda instance made on the caller's CUDA stream (the
// `stream` argument: torch's current stream), so it orders with the caller's other work on
// that stream and nothing synchronises the whole device. Every call that compresses or
// communicates releases the GIL, but for host compressions of under 16 KiB (microseconds of
// work). Argument checks that need Python objects happen before the GIL is released;
// everything else is kompress's own checking, whose exceptions become the Python classes
// registered at the bottom (kompress.Error and subclasses).
//
// The Python layer (python/kompress/*.py) gives these functions their keyword arguments,
// allocates outputs, converts torch tensors and finds their streams; this file stays a thin
// typed bridge, but for compress's options, converted here (`codec_keywords`).

#include <kompress/kompress.hpp>
#include <kompress/comm.hpp>
#include <kompress/dlrm.hpp>
#include <kompress/stash.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

/// Objects of this module alive now that may hold Kokkos memory (requests, stashes,
/// exchanges): Kokkos is finalised at exit only when none is left, since a View must never
/// be freed after Kokkos::finalize (the process would abort).
std::atomic<long> live_kokkos_holders{0};
struct kokkos_holder {
  kokkos_holder() { ++live_kokkos_holders; }
  kokkos_holder(const kokkos_holder&) = delete;
  ~kokkos_holder() { --live_kokkos_holders; }
};

using exec_space = Kokkos::DefaultHostExecutionSpace;
// Any dtype, shape, strides and device (checked below): inputs may be read-only (bytes, memory
// maps), outputs must be writable.
using in_array = nb::ndarray<nb::ro>;
using array = nb::ndarray<>;

// --- devices ----------------------------------------------------------------------------------
//
// Where an array lives decides the execution space its work runs on. host_device always
// exists; cuda_device only in a build against a CUDA-enabled Kokkos.

struct host_device {
  using execution_space = Kokkos::DefaultHostExecutionSpace;
  using memory_space = Kokkos::HostSpace;
};

#ifdef KOKKOS_ENABLE_CUDA
struct cuda_device {
  using execution_space = Kokkos::Cuda;
  using memory_space = Kokkos::CudaSpace;
};

/// Kokkos::Cuda instances on the callers' streams, one per stream handle, made on first use:
/// making one allocates device scratch and pinned memory, far more than a small call costs.
/// Released before Kokkos is finalised (clear()). The handle is the stream's address (0: the
/// legacy default stream), so a stream destroyed and another made at the same address share
/// an instance, which holds nothing of the stream but its handle.
class cuda_instances {
 public:
  Kokkos::Cuda on(std::uintptr_t stream) {
    std::lock_guard lock(mutex_);
    for (const auto& [handle, instance] : instances_)
      if (handle == stream) return instance;
    if (instances_.size() == max_instances) instances_.erase(instances_.begin());
    instances_.emplace_back(stream, Kokkos::Cuda(reinterpret_cast<cudaStream_t>(stream)));
    return instances_.back().second;
  }
  void clear() {
    std::lock_guard lock(mutex_);
    instances_.clear();
  }

 private:
  static constexpr std::size_t max_instances = 64;  // a program uses a handful of streams
  std::mutex mutex_;
  std::vector<std::pair<std::uintptr_t, Kokkos::Cuda>> instances_;
};
cuda_instances& streams() {
  // Never destroyed at exit: a program that finalises Kokkos itself would otherwise have these
  // instances released after Kokkos::finalize. The package clears it before it finalises.
  static auto* instances = new cuda_instances;
  return *instances;
}
#endif

constexpr bool cuda_enabled() {
#ifdef KOKKOS_ENABLE_CUDA
  return true;
#else
  return false;
#endif
}

enum class device_kind { host, cuda };

/// As torch names the device type.
const char* device_name(device_kind kind) { return kind == device_kind::host ? "cpu" : "cuda"; }

/// The device `a` lives on, checked usable: the host, or (CUDA builds) the GPU Kokkos runs on.
template <class A>
device_kind device_of(const A& a, const char* who, const char* what) {
  const int type = a.device_type();
  if (type == nb::device::cpu::value) return device_kind::host;
  if (type == nb::device::cuda::value) {
#ifdef KOKKOS_ENABLE_CUDA
    const int kokkos_device = Kokkos::Cuda{}.cuda_device();
    if (a.device_id() != kokkos_device)
      throw kompress::invalid_argument(
          std::string(who) + ": " + what + " is on cuda:" + std::to_string(a.device_id()) +
          ", but kompress runs on cuda:" + std::to_string(kokkos_device) +
          " (the device current when kompress was imported, or KOMPRESS_CUDA_DEVICE)");
    return device_kind::cuda;
#else
    throw kompress::invalid_argument(std::string(who) + ": " + what + " is on cuda:" + std::to_string(a.device_id()) +
                                     ", but this kompress extension was built without CUDA (build it against a "
                                     "CUDA-enabled Kokkos: docs/python.md, \"Building for GPUs\")");
#endif
  }
  throw kompress::invalid_argument(std::string(who) + ": " + what + " is on a device kompress does not support " +
                                   "(DLPack device type " + std::to_string(type) + ")");
}

/// The one device of several arrays (the send and receive arrays of a collective, say).
template <class A, class B>
device_kind same_device(const A& a, const char* what_a, const B& b, const char* what_b, const char* who) {
  const device_kind da = device_of(a, who, what_a), db = device_of(b, who, what_b);
  if (da != db)
    throw kompress::invalid_argument(std::string(who) + ": " + what_a + " and " + what_b +
                                     " must be on the same device (got " +
                                     device_name(da) + " and " + device_name(db) + ")");
  return da;
}

/// Calls f(Device{}, exec) with the device of `kind` and its execution space instance: the
/// host's, or a Kokkos::Cuda instance on `stream`.
template <class F>
decltype(auto) on_device(device_kind kind, [[maybe_unused]] std::uintptr_t stream, F&& f) {
#ifdef KOKKOS_ENABLE_CUDA
  if (kind == device_kind::cuda) return f(cuda_device{}, streams().on(stream));
#endif
  (void)kind;
  return f(host_device{}, exec_space{});
}

template <class T, class Device = host_device>
using device_view = Kokkos::View<T*, typename Device::memory_space, Kokkos::MemoryUnmanaged>;
template <class T>
using host_view = device_view<T, host_device>;

// --- arrays -----------------------------------------------------------------------------------

enum class dtype_code { float32, float64 };

template <class A>
bool is_c_contiguous(const A& a) {
  std::int64_t expected = 1;
  for (std::size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expected) return false;
    expected *= std::int64_t(a.shape(d));
  }
  return true;
}

/// The float dtype of `a`, checked contiguous (C order) and on the CPU; throws
/// kompress::invalid_argument naming `who` and `what` otherwise.
/// A DLPack dtype as numpy names it: "int64", "float16", "bfloat16", "bool", ...
std::string dtype_name(nb::dlpack::dtype dt) {
  std::string kind;
  switch (dt.code) {
    case std::uint8_t(nb::dlpack::dtype_code::Int): kind = "int"; break;
    case std::uint8_t(nb::dlpack::dtype_code::UInt): kind = "uint"; break;
    case std::uint8_t(nb::dlpack::dtype_code::Float): kind = "float"; break;
    case std::uint8_t(nb::dlpack::dtype_code::Bfloat): kind = "bfloat"; break;
    case std::uint8_t(nb::dlpack::dtype_code::Complex): kind = "complex"; break;
    case std::uint8_t(nb::dlpack::dtype_code::Bool): return "bool";
    default: kind = "dtype code " + std::to_string(dt.code) + " of ";
  }
  std::string name = kind + std::to_string(dt.bits);
  if (dt.lanes != 1) name += "x" + std::to_string(dt.lanes);
  return name;
}

template <class A>
dtype_code float_array(const A& a, const char* who, const char* what) {
  const auto dt = a.dtype();
  const bool is_float = dt.code == std::uint8_t(nb::dlpack::dtype_code::Float) && dt.lanes == 1;
  if (!is_float || (dt.bits != 32 && dt.bits != 64))
    throw kompress::invalid_argument(std::string(who) + ": " + what + " must be float32 or float64 (got " +
                                     dtype_name(dt) + ")");
  if (a.size() != 0 && !is_c_contiguous(a))
    throw kompress::invalid_argument(std::string(who) + ": " + what +
                                     " must be C-contiguous (got a strided array; pass "
                                     "np.ascontiguousarray(x) or x.contiguous())");
  return dt.bits == 32 ? dtype_code::float32 : dtype_code::float64;
}

/// A rank-1 contiguous uint8 array: a stream, or the buffer a stream is written into; a View
/// of the memory of Device.
template <class Device = host_device, class A>
auto byte_array(const A& a, const char* who, const char* what) {
  using byte = std::conditional_t<std::is_same_v<A, in_array>, const std::byte, std::byte>;
  const auto dt = a.dtype();
  if (dt.code != std::uint8_t(nb::dlpack::dtype_code::UInt) || dt.bits != 8 || dt.lanes != 1)
    throw kompress::invalid_argument(std::string(who) + ": " + what + " must be a uint8 array (got " +
                                     dtype_name(dt) + ")");
  if (a.ndim() != 1 || (a.size() != 0 && a.stride(0) != 1))
    throw kompress::invalid_argument(std::string(who) + ": " + what +
                                     " must be a contiguous one-dimensional uint8 array (got " +
                                     std::to_string(a.ndim()) + " dimensions)");
  return device_view<byte, Device>(static_cast<byte*>(a.data()), a.size());
}

template <class T, class Device = host_device>
device_view<T, Device> view_of(const array& a) {
  return device_view<T, Device>(static_cast<T*>(a.data()), a.size());
}
template <class T, class Device = host_device>
device_view<const T, Device> view_of(const in_array& a) {
  return device_view<const T, Device>(static_cast<const T*>(a.data()), a.size());
}

/// Calls f(T{}) with T the element type of `code`.
template <class F>
decltype(auto) dispatch(dtype_code code, F&& f) {
  if (code == dtype_code::float32) return f(float{});
  return f(double{});
}

kompress::error_bound make_bound(const char* who, std::optional<double> abs, std::optional<double> rel) {
  if (abs && rel)
    throw kompress::invalid_argument(std::string(who) + ": give one of abs= and rel=, not both");
  if (abs) return kompress::absolute(*abs);
  if (rel) return kompress::relative(*rel);
  return kompress::lossless();
}

// --- codec ------------------------------------------------------------------------------------

kompress::codec_mode codec_of(std::string_view codec, const char* who) {
  if (codec == "fast") return kompress::codec_mode::fast;
  if (codec == "ratio") return kompress::codec_mode::ratio;
  throw kompress::invalid_argument(std::string(who) + ": codec must be \"fast\" or \"ratio\" (got \"" +
                                   std::string(codec) + "\")");
}

kompress::rounding_mode rounding_of(std::string_view rounding, const char* who) {
  if (rounding == "nearest") return kompress::rounding_mode::nearest;
  if (rounding == "stochastic") return kompress::rounding_mode::stochastic;
  throw kompress::invalid_argument(std::string(who) + ": rounding must be \"nearest\" or \"stochastic\" (got \"" +
                                   std::string(rounding) + "\")");
}

/// The codec's options as compress and compress_into get them: the keyword values the caller
/// gave, converted here with Python's own float(), int() and str() (and operator.index for the
/// seed), where the Python layer would spend a call on each; a small compression feels every
/// one (docs/performance.md, "Call overhead").
struct codec_keywords {
  nb::handle abs, rel, fill_value, block_size, codec, rounding, rounding_seed;
};

nb::object checked(PyObject* result) {
  if (result == nullptr) throw nb::python_error();
  return nb::steal(result);
}

std::optional<double> optional_float(nb::handle value) {
  if (value.is_none()) return std::nullopt;
  if (PyFloat_CheckExact(value.ptr())) return PyFloat_AS_DOUBLE(value.ptr());
  return PyFloat_AS_DOUBLE(checked(PyNumber_Float(value.ptr())).ptr());
}

int int_keyword(nb::handle value, const char* who, const char* name) {
  const nb::object number = PyLong_CheckExact(value.ptr()) ? nb::borrow(value) : checked(PyNumber_Long(value.ptr()));
  int overflow = 0;
  const long v = PyLong_AsLongAndOverflow(number.ptr(), &overflow);
  if (overflow != 0 || v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    throw kompress::invalid_argument(std::string(who) + ": " + name + " is out of range (got " +
                                     nb::str(number).c_str() + ")");
  return int(v);
}

/// str(value)'s UTF-8 text, valid while `text` lives.
std::string_view text_keyword(nb::handle value, nb::object& text) {
  text = PyUnicode_CheckExact(value.ptr()) ? nb::borrow(value) : checked(PyObject_Str(value.ptr()));
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
  if (data == nullptr) throw nb::python_error();
  return {data, std::size_t(size)};
}

std::uint64_t seed_keyword(nb::handle value, const char* who) {
  PyObject* index = PyNumber_Index(value.ptr());
  if (index == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw nb::python_error();
    PyErr_Clear();
    const nb::object type_name = nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(value.ptr()))).attr("__name__");
    throw nb::type_error((std::string(who) + ": rounding_seed must be an int (got " +
                          nb::str(type_name).c_str() + ")").c_str());
  }
  const nb::object number = nb::steal(index);
  const unsigned long long seed = PyLong_AsUnsignedLongLong(number.ptr());
  if (seed == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    throw kompress::invalid_argument(std::string(who) + ": rounding_seed must be in [0, 2^64) (got " +
                                     nb::str(number).c_str() + ")");
  }
  return seed;
}

kompress::compress_options options_of(const codec_keywords& k, const char* who) {
  const std::optional<double> abs = optional_float(k.abs), rel = optional_float(k.rel);
  const std::optional<double> fill_value = optional_float(k.fill_value);
  const int block_size = int_keyword(k.block_size, who, "block_size");
  nb::object codec_text, rounding_text;
  const kompress::codec_mode codec = codec_of(text_keyword(k.codec, codec_text), who);
  const kompress::rounding_mode rounding = rounding_of(text_keyword(k.rounding, rounding_text), who);
  return {.bound = make_bound(who, abs, rel), .fill_value = fill_value, .block_size = block_size, .codec = codec,
          .rounding = rounding, .rounding_seed = seed_keyword(k.rounding_seed, who)};
}

/// Inputs below this size are compressed without releasing the GIL: their work takes a few
/// microseconds, about what releasing and taking it back costs another thread.
constexpr std::size_t gil_kept_below_bytes = 16 << 10;

std::size_t max_compressed_size(std::size_t count, int element_bytes, int block_size, const std::string& codec) {
  constexpr const char* who = "kompress.max_compressed_size";
  const kompress::compress_options options{.block_size = block_size, .codec = codec_of(codec, who)};
  if (element_bytes == 4) return kompress::max_compressed_size<float>(count, options);
  if (element_bytes == 8) return kompress::max_compressed_size<double>(count, options);
  throw kompress::invalid_argument(std::string(who) + ": element size must be 4 or 8 bytes (got " +
                                   std::to_string(element_bytes) + ")");
}

template <class T, class Device = host_device>
using device_view3 = Kokkos::View<T***, Kokkos::LayoutRight, typename Device::memory_space, Kokkos::MemoryUnmanaged>;

/// The array's values as a rank-3 row-major View: the last two axes as they are, every axis
/// before them folded into the first. The ratio codec predicts across the View's two fastest
/// extents (2-D / 3-D Lorenzo), so a field keeps its shape; the values and their order are
/// those of the flat view, so the fast codec writes the same bytes from either.
template <class T, class Device = host_device>
device_view3<const T, Device> shaped_view_of(const in_array& a) {
  std::size_t extents[3] = {1, 1, 1};
  const int rank = int(a.ndim());
  for (int d = 0; d < rank; ++d) extents[d >= rank - 2 ? 3 - (rank - d) : 0] *= std::size_t(a.shape(d));
  return device_view3<const T, Device>(static_cast<const T*>(a.data()), extents[0], extents[1], extents[2]);
}

/// A new uint8 numpy array of `length` bytes and its memory. Made by numpy.empty, looked up once
/// and kept for the process's life (never released, so nothing is freed after the interpreter
/// is gone): a quarter of the cost of nanobind's ndarray export, which a small compression
/// feels (docs/performance.md, "Call overhead").
std::pair<nb::object, std::uint8_t*> new_numpy_bytes(std::size_t length) {
  static const nb::handle empty = nb::object(nb::module_::import_("numpy").attr("empty")).release();
  static const nb::handle uint8 = nb::object(nb::module_::import_("numpy").attr("uint8")).release();
  nb::object array = empty(length, uint8);
  Py_buffer view;
  if (PyObject_GetBuffer(array.ptr(), &view, PyBUF_SIMPLE | PyBUF_WRITABLE) != 0) throw nb::python_error();
  auto* data = static_cast<std::uint8_t*>(view.buf);
  PyBuffer_Release(&view);  // the array keeps its memory; nothing else holds it
  return {std::move(array), data};
}

/// Compresses `in` into a new uint8 numpy array of exactly the stream's length.
nb::object compress(const in_array& in, nb::handle abs, nb::handle rel, nb::handle fill_value, nb::handle block_size,
                    nb::handle codec, nb::handle rounding, nb::handle rounding_seed) {
  constexpr const char* who = "kompress.compress";
  const dtype_code code = float_array(in, who, "the input");
  if (device_of(in, who, "the input") != device_kind::host)
    throw kompress::invalid_argument(std::string(who) + ": the input must be in host memory here "
                                     "(kompress.compress takes a CUDA tensor through compress_into)");
  const kompress::compress_options options =
      options_of({abs, rel, fill_value, block_size, codec, rounding, rounding_seed}, who);
  // The worst case is allocated and filled, then the stream alone is copied to the result: no
  // slack is kept alive with it.
  std::size_t length = 0;
  std::unique_ptr<std::uint8_t[]> scratch;
  {
    std::optional<nb::gil_scoped_release> release;
    if (in.nbytes() >= gil_kept_below_bytes) release.emplace();
    dispatch(code, [&](auto t) {
      using T = decltype(t);
      const auto values = shaped_view_of<T>(in);
      const std::size_t worst = kompress::max_compressed_size(values, options);
      scratch.reset(new std::uint8_t[worst]);
      length = kompress::compress(exec_space{}, values,
                                  host_view<std::byte>(reinterpret_cast<std::byte*>(scratch.get()), worst), options);
    });
  }
  auto [stream, data] = new_numpy_bytes(length);
  std::memcpy(data, scratch.get(), length);
  return std::move(stream);
}

/// Compresses `in` into the caller's uint8 buffer `out` (on the same device); returns the
/// stream's length. A CUDA array is compressed on `stream`, which is then waited for (the
/// length is known only once the stream is written).
std::size_t compress_into(const in_array& in, const array& out, nb::handle abs, nb::handle rel,
                          nb::handle fill_value, nb::handle block_size, nb::handle codec, nb::handle rounding,
                          nb::handle rounding_seed, std::uintptr_t stream) {
  constexpr const char* who = "kompress.compress_into";
  const dtype_code code = float_array(in, who, "the input");
  const device_kind device = same_device(in, "the input", out, "the output", who);
  const kompress::compress_options options =
      options_of({abs, rel, fill_value, block_size, codec, rounding, rounding_seed}, who);
  std::optional<nb::gil_scoped_release> release;
  if (device != device_kind::host || in.nbytes() >= gil_kept_below_bytes) release.emplace();
  return on_device(device, stream, [&](auto d, const auto& exec) {
    using D = decltype(d);
    const auto bytes = byte_array<D>(out, who, "the output");
    return dispatch(code, [&](auto t) {
      using T = decltype(t);
      return kompress::compress(exec, shaped_view_of<T, D>(in), bytes, options);
    });
  });
}

/// The stream's header, checked; a CUDA stream's header and chunk tables are copied to the
/// host first (after the device's pending work).
kompress::stream_info inspect(const in_array& stream) {
  constexpr const char* who = "kompress.inspect";
  const device_kind device = device_of(stream, who, "the stream");
  nb::gil_scoped_release release;
  return on_device(device, 0, [&](auto d, const auto&) {
    return kompress::inspect(byte_array<decltype(d)>(stream, who, "the stream"));
  });
}

void decompress_into(const in_array& stream, const array& out, std::uintptr_t cuda_stream) {
  constexpr const char* who = "kompress.decompress";
  const dtype_code code = float_array(out, who, "the output");
  const device_kind device = same_device(stream, "the stream", out, "the output", who);
  nb::gil_scoped_release release;
  on_device(device, cuda_stream, [&](auto d, const auto& exec) {
    using D = decltype(d);
    const auto bytes = byte_array<D>(stream, who, "the stream");
    dispatch(code, [&](auto t) {
      using T = decltype(t);
      kompress::decompress(exec, bytes, view_of<T, D>(out));
    });
  });
}

// --- MPI --------------------------------------------------------------------------------------

/// mpi4py's Comm.handle (an integer) as an MPI_Comm: a pointer in Open MPI, an int in MPICH.
template <class Comm = MPI_Comm>
Comm comm_of(std::uintptr_t handle) {
  if constexpr (std::is_pointer_v<Comm>)
    return reinterpret_cast<Comm>(handle);
  else
    return static_cast<Comm>(handle);
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  return std::string(text, std::size_t(length));
}

/// The collective options, built in one place from the Python keywords (when the C++ options
/// change shape, only this function does).
struct collective_settings {
  std::optional<double> abs, rel;
  std::string mode = "compressed";
  std::string reduction_bound = "per_hop";
  std::string reduction = "recompress";
  std::string schedule = "auto";
  int block_size = 32;
  bool measure_error = false;
  std::optional<kompress::cost_model> cost;
  std::size_t exchange_window = 0;
};

kompress::collective_options make_collective_options(const collective_settings& s, const char* who) {
  kompress::collective_options options;
  if (s.abs || s.rel) options.codec.bound = make_bound(who, s.abs, s.rel);
  if (s.mode == "compressed")
    options.mode = kompress::transfer_mode::compressed;
  else if (s.mode == "raw")
    options.mode = kompress::transfer_mode::raw;
  else if (s.mode == "auto" || s.mode == "automatic")
    options.mode = kompress::transfer_mode::automatic;
  else
    throw kompress::invalid_argument(std::string(who) +
                                     ": mode must be 'compressed', 'raw' or 'auto' (got '" + s.mode + "')");
  if (s.reduction_bound == "per_hop")
    options.reduction_bound = kompress::allreduce_bound::per_hop;
  else if (s.reduction_bound == "total")
    options.reduction_bound = kompress::allreduce_bound::total;
  else
    throw kompress::invalid_argument(std::string(who) + ": reduction_bound must be 'per_hop' or 'total' (got '" +
                                     s.reduction_bound + "')");
  if (s.reduction == "recompress")
    options.reduction = kompress::reduction_method::recompress;
  else if (s.reduction == "homomorphic")
    options.reduction = kompress::reduction_method::homomorphic;
  else
    throw kompress::invalid_argument(std::string(who) + ": reduction must be 'recompress' or 'homomorphic' (got '" +
                                     s.reduction + "')");
  if (s.schedule == "auto" || s.schedule == "automatic")
    options.schedule = kompress::collective_schedule::automatic;
  else if (s.schedule == "ring")
    options.schedule = kompress::collective_schedule::ring;
  else if (s.schedule == "halving_doubling")
    options.schedule = kompress::collective_schedule::halving_doubling;
  else
    throw kompress::invalid_argument(std::string(who) +
                                     ": schedule must be 'auto', 'ring' or 'halving_doubling' (got '" + s.schedule +
                                     "')");
  options.codec.block_size = s.block_size;
  options.measure_error = s.measure_error;
  if (s.cost) options.cost = *s.cost;
  options.exchange_window = s.exchange_window;
  return options;
}

/// Send and receive arrays of one float dtype.
template <class S>
dtype_code pair_dtype(const S& send, const array& recv, const char* who) {
  const dtype_code a = float_array(send, who, "the send array");
  const dtype_code b = float_array(recv, who, "the receive array");
  if (a != b)
    throw kompress::invalid_argument(std::string(who) +
                                     ": the send and receive arrays must have the same dtype (got " +
                                     (a == dtype_code::float32 ? "float32" : "float64") + " and " +
                                     (b == dtype_code::float32 ? "float32" : "float64") + ")");
  return a;
}

// --- local failures reach every rank ------------------------------------------------------------
//
// Every kompress collective (and the exchange's constructor and calls) starts with an agreement
// in which each rank says whether its own checks passed (comm/detail/agreement.hpp): a bad
// argument on one rank is an error on every rank, and nothing is left pending. The bindings'
// own checks (dtype, contiguity, option strings, what nanobind must convert) come before the
// C++ call; when one fails, this rank still takes part in that agreement, as a failed rank, so
// the other ranks raise too and the next call matches on every rank.

/// What agree() rethrows on this rank: the real failure is rethrown by the caller, with the GIL.
struct announced_failure {};

/// Takes part in the agreement the other ranks' call of a collective runs on `comm`, as a rank
/// whose checks failed: they raise "rank r rejected its arguments". Returns normally; an MPI
/// failure of the agreement itself is thrown.
void announce_failure(std::uintptr_t comm, const char* who) {
  kompress::detail::agreement a;
  a.local_failure = std::make_exception_ptr(announced_failure{});
  nb::gil_scoped_release release;
  try {
    kompress::detail::agree(a, comm_of(comm), who);
  } catch (const announced_failure&) {
  }
}

/// Runs `checks` (this rank's checks of a collective's arguments); a failure is announced to
/// the other ranks of `comm` (announce_failure), then thrown here.
template <class Checks>
void check_on_every_rank(std::uintptr_t comm, const char* who, Checks&& checks) {
  std::exception_ptr failure;
  try {
    checks();
  } catch (...) {
    failure = std::current_exception();
  }
  if (!failure) return;
  announce_failure(comm, who);
  std::rethrow_exception(failure);
}

/// `obj` as an array nanobind can wrap (DLPack or the buffer protocol), or a TypeError.
template <class A>
A array_argument(nb::handle obj, const char* who, const char* what) {
  A a;
  if (!nb::try_cast(obj, a))
    throw nb::type_error((std::string(who) + ": " + what + " must be a numpy array or a tensor (got " +
                          nb::type_name(obj.type()).c_str() + ")")
                             .c_str());
  return a;
}

/// A collective's send and receive arrays (of one dtype, on one device) and options, checked.
struct buffer_arguments {
  in_array send;
  array recv;
  dtype_code code = dtype_code::float32;
  device_kind device = device_kind::host;
  kompress::collective_options options;

  buffer_arguments(nb::handle send_obj, nb::handle recv_obj, const collective_settings& s, const char* who)
      : send(array_argument<in_array>(send_obj, who, "the send array")),
        recv(array_argument<array>(recv_obj, who, "the receive array")),
        code(pair_dtype(send, recv, who)),
        device(same_device(send, "the send array", recv, "the receive array", who)),
        options(make_collective_options(s, who)) {}
};

/// buffer_arguments, checked on every rank (check_on_every_rank).
std::optional<buffer_arguments> agreed_arguments(nb::handle send_obj, nb::handle recv_obj, std::uintptr_t comm,
                                                 const collective_settings& s, const char* who) {
  std::optional<buffer_arguments> args;
  check_on_every_rank(comm, who, [&] { args.emplace(send_obj, recv_obj, s, who); });
  return args;
}

/// A nonblocking collective in flight: the kompress::request and the arrays it reads and
/// writes, kept alive until it completes.
class py_request {
 public:
  py_request(kompress::request request, std::vector<nb::object> keep_alive)
      : request_(std::move(request)), keep_alive_(std::move(keep_alive)) {}
  py_request(const py_request&) = delete;
  py_request& operator=(const py_request&) = delete;
  ~py_request() {
    // An unfinished request waits in its destructor; other ranks may need this process's
    // Python threads meanwhile.
    if (request_.valid()) {
      nb::gil_scoped_release release;
      request_ = kompress::request{};
    }
  }

  kompress::collective_report wait() {
    kompress::collective_report report;
    {
      nb::gil_scoped_release release;
      report = request_.wait();
    }
    keep_alive_.clear();
    return report;
  }

  bool test() {
    bool done;
    {
      nb::gil_scoped_release release;
      done = request_.test();
    }
    if (done) keep_alive_.clear();
    return done;
  }

  kompress::collective_report report() const { return request_.report(); }

 private:
  kokkos_holder holder_;
  kompress::request request_;
  std::vector<nb::object> keep_alive_;
};

/// Calls f(T{}, Device{}, exec) with the element type of `code`, and the device of `kind` with
/// its execution space instance (on `stream` for CUDA).
template <class F>
decltype(auto) dispatch_on(device_kind kind, std::uintptr_t stream, dtype_code code, F&& f) {
  return on_device(kind, stream, [&](auto d, const auto& exec) {
    return dispatch(code, [&](auto t) { return f(t, d, exec); });
  });
}

/// Runs a collective with the GIL released: `blocking(t, d, exec)` returns its report,
/// `start(t, d, exec)` its request, which keeps the Python arrays alive until it completes.
template <class Blocking, class Start>
nb::object run_collective(const buffer_arguments& args, std::uintptr_t stream, bool nonblocking,
                          nb::handle send_obj, nb::handle recv_obj, Blocking&& blocking, Start&& start) {
  if (!nonblocking) {
    kompress::collective_report report;
    {
      nb::gil_scoped_release release;
      report = dispatch_on(args.device, stream, args.code, blocking);
    }
    return nb::cast(report);
  }
  kompress::request request;
  {
    nb::gil_scoped_release release;
    request = dispatch_on(args.device, stream, args.code, start);
  }
  return nb::cast(new py_request(std::move(request), {nb::borrow(send_obj), nb::borrow(recv_obj)}),
                  nb::rv_policy::take_ownership);
}

/// The collectives of one send and one receive array differ only in the kompress functions
/// they call and the names their errors carry.
template <class Calls>
nb::object buffer_collective(nb::handle send_obj, nb::handle recv_obj, std::uintptr_t comm,
                             const collective_settings& s, bool nonblocking, std::uintptr_t stream) {
  const char* who = nonblocking ? Calls::nonblocking_name : Calls::blocking_name;
  const auto args = agreed_arguments(send_obj, recv_obj, comm, s, who);
  const auto& [send, recv, code, device, options] = *args;
  return run_collective(
      *args, stream, nonblocking, send_obj, recv_obj,
      [&](auto t, auto d, const auto& exec) {
        using T = decltype(t);
        using D = decltype(d);
        return Calls::blocking(exec, view_of<T, D>(send), view_of<T, D>(recv), comm_of(comm), options);
      },
      [&](auto t, auto d, const auto& exec) {
        using T = decltype(t);
        using D = decltype(d);
        return Calls::nonblocking(exec, view_of<T, D>(send), view_of<T, D>(recv), comm_of(comm), options);
      });
}

struct alltoall_calls {
  static constexpr const char* blocking_name = "kompress.alltoall";
  static constexpr const char* nonblocking_name = "kompress.ialltoall";
  static auto blocking(const auto&... args) { return kompress::alltoall(args...); }
  static auto nonblocking(const auto&... args) { return kompress::ialltoall(args...); }
  static constexpr const char* init_name = "kompress.alltoall_init";
  static auto init(const auto&... args) { return kompress::alltoall_init(args...); }
};
struct allreduce_calls {
  static constexpr const char* blocking_name = "kompress.allreduce";
  static constexpr const char* nonblocking_name = "kompress.iallreduce";
  static auto blocking(const auto&... args) { return kompress::allreduce(args...); }
  static auto nonblocking(const auto&... args) { return kompress::iallreduce(args...); }
  static constexpr const char* init_name = "kompress.allreduce_init";
  static auto init(const auto&... args) { return kompress::allreduce_init(args...); }
};
struct allgather_calls {
  static constexpr const char* blocking_name = "kompress.allgather";
  static constexpr const char* nonblocking_name = "kompress.iallgather";
  static auto blocking(const auto&... args) { return kompress::allgather(args...); }
  static auto nonblocking(const auto&... args) { return kompress::iallgather(args...); }
  static constexpr const char* init_name = "kompress.allgather_init";
  static auto init(const auto&... args) { return kompress::allgather_init(args...); }
};
struct reduce_scatter_calls {
  static constexpr const char* blocking_name = "kompress.reduce_scatter";
  static constexpr const char* nonblocking_name = "kompress.ireduce_scatter";
  static auto blocking(const auto&... args) { return kompress::reduce_scatter(args...); }
  static auto nonblocking(const auto&... args) { return kompress::ireduce_scatter(args...); }
  static constexpr const char* init_name = "kompress.reduce_scatter_init";
  static auto init(const auto&... args) { return kompress::reduce_scatter_init(args...); }
};

/// A hierarchical collective over node groups (blocking only): raw within each node, compressed
/// across nodes (kompress/comm/hierarchical_*.hpp). `comm` is the groups' communicator's handle,
/// on which the arguments are checked.
template <class Calls>
nb::object hierarchical_collective(nb::handle send_obj, nb::handle recv_obj, std::uintptr_t comm,
                                   const kompress::node_groups& groups, kompress::hierarchical_workspace& workspace,
                                   const collective_settings& s, std::uintptr_t stream) {
  const std::string who = std::string(Calls::blocking_name) + " (hierarchical)";
  const auto args = agreed_arguments(send_obj, recv_obj, comm, s, who.c_str());
  const auto& [send, recv, code, device, options] = *args;
  kompress::collective_report report;
  {
    nb::gil_scoped_release release;
    report = dispatch_on(device, stream, code, [&](auto t, auto d, const auto& exec) {
      using T = decltype(t);
      using D = decltype(d);
      return Calls::blocking(exec, view_of<T, D>(send), view_of<T, D>(recv), groups, options, &workspace);
    });
  }
  return nb::cast(report);
}

nb::object alltoallv(nb::handle send_obj, const std::vector<std::int64_t>& send_counts,
                     const std::vector<std::int64_t>& send_displs, nb::handle recv_obj,
                     const std::vector<std::int64_t>& recv_counts, const std::vector<std::int64_t>& recv_displs,
                     std::uintptr_t comm, const collective_settings& s, bool nonblocking,
                     std::uintptr_t stream) {
  const char* who = nonblocking ? "kompress.ialltoallv" : "kompress.alltoallv";
  const auto args = agreed_arguments(send_obj, recv_obj, comm, s, who);
  const auto& [send, recv, code, device, options] = *args;
  return run_collective(
      *args, stream, nonblocking, send_obj, recv_obj,
      [&](auto t, auto d, const auto& exec) {
        using T = decltype(t);
        using D = decltype(d);
        return kompress::alltoallv(exec, view_of<T, D>(send), send_counts, send_displs, view_of<T, D>(recv),
                                  recv_counts, recv_displs, comm_of(comm), options);
      },
      [&](auto t, auto d, const auto& exec) {
        using T = decltype(t);
        using D = decltype(d);
        return kompress::ialltoallv(exec, view_of<T, D>(send), send_counts, send_displs, view_of<T, D>(recv),
                                  recv_counts, recv_displs, comm_of(comm), options);
      });
}

/// A persistent collective (kompress::*_init): the request and the arrays every round reads
/// and writes, kept alive as long as it is. Closable: the package closes every one before it
/// finalises Kokkos (the request may own Views and a duplicated communicator).
class py_persistent_request {
 public:
  py_persistent_request(kompress::persistent_request request, std::vector<nb::object> keep_alive)
      : request_(std::in_place, std::move(request)), keep_alive_(std::move(keep_alive)) {}
  py_persistent_request(const py_persistent_request&) = delete;
  py_persistent_request& operator=(const py_persistent_request&) = delete;
  ~py_persistent_request() { close(); }

  void start() {
    auto& r = get("start");
    nb::gil_scoped_release release;
    r.start();
  }
  kompress::collective_report wait() {
    auto& r = get("wait");
    nb::gil_scoped_release release;
    return r.wait();
  }
  bool test() {
    auto& r = get("test");
    nb::gil_scoped_release release;
    return r.test();
  }
  kompress::collective_report run() {
    auto& r = get("run");
    nb::gil_scoped_release release;
    return r.run();
  }
  kompress::collective_report report() { return get("report").report(); }
  bool active() const { return request_ && request_->active(); }
  bool closed() const { return !request_; }
  /// Frees the request; an active round is completed first (GIL released: the other ranks
  /// may need this process's Python threads meanwhile).
  void close() {
    if (request_) {
      nb::gil_scoped_release release;
      request_.reset();
    }
    keep_alive_.clear();
  }

 private:
  kompress::persistent_request& get(const char* what) {
    if (!request_)
      throw kompress::invalid_argument(std::string("kompress.PersistentRequest.") + what + ": the request is closed");
    return *request_;
  }
  kokkos_holder holder_;
  std::optional<kompress::persistent_request> request_;
  std::vector<nb::object> keep_alive_;
};

/// Sets up a persistent collective with the GIL released (the init agrees across ranks).
/// Every round runs on the execution space instance given here (a CUDA array: on `stream`).
template <class Init>
py_persistent_request* init_collective(const buffer_arguments& args, std::uintptr_t stream, nb::handle send_obj,
                                       nb::handle recv_obj, Init&& init) {
  kompress::persistent_request request;
  {
    nb::gil_scoped_release release;
    request = dispatch_on(args.device, stream, args.code, init);
  }
  return new py_persistent_request(std::move(request), {nb::borrow(send_obj), nb::borrow(recv_obj)});
}

template <class Calls>
py_persistent_request* buffer_collective_init(nb::handle send_obj, nb::handle recv_obj, std::uintptr_t comm,
                                              const collective_settings& s, std::uintptr_t stream) {
  const auto args = agreed_arguments(send_obj, recv_obj, comm, s, Calls::init_name);
  const auto& [send, recv, code, device, options] = *args;
  return init_collective(*args, stream, send_obj, recv_obj, [&](auto t, auto d, const auto& exec) {
    using T = decltype(t);
    using D = decltype(d);
    return Calls::init(exec, view_of<T, D>(send), view_of<T, D>(recv), comm_of(comm), options);
  });
}

py_persistent_request* alltoallv_init(nb::handle send_obj, const std::vector<std::int64_t>& send_counts,
                                      const std::vector<std::int64_t>& send_displs, nb::handle recv_obj,
                                      const std::vector<std::int64_t>& recv_counts,
                                      const std::vector<std::int64_t>& recv_displs, std::uintptr_t comm,
                                      const collective_settings& s, std::uintptr_t stream) {
  constexpr const char* who = "kompress.alltoallv_init";
  const auto args = agreed_arguments(send_obj, recv_obj, comm, s, who);
  const auto& [send, recv, code, device, options] = *args;
  return init_collective(*args, stream, send_obj, recv_obj, [&](auto t, auto d, const auto& exec) {
    using T = decltype(t);
    using D = decltype(d);
    return kompress::alltoallv_init(exec, view_of<T, D>(send), send_counts, send_displs, view_of<T, D>(recv),
                                    recv_counts, recv_displs, comm_of(comm), options);
  });
}

kompress::cost_model measure_cost_model(std::uintptr_t comm, std::size_t probe_bytes) {
  nb::gil_scoped_release release;
  return kompress::measure_cost_model(exec_space{}, comm_of(comm), probe_bytes);
}

// --- the activation stash ---------------------------------------------------------------------

/// A save's codec: nothing (the stash's), "fast", "ratio" or "auto" (stash_codec::automatic).
std::optional<kompress::stash_codec> stash_codec_of(const std::optional<std::string>& codec, const char* who) {
  if (!codec) return std::nullopt;
  if (*codec == "fast") return kompress::stash_codec::fast;
  if (*codec == "ratio") return kompress::stash_codec::ratio;
  if (*codec == "auto") return kompress::stash_codec::automatic;
  throw kompress::invalid_argument(std::string(who) + ": codec must be None, 'fast', 'ratio' or 'auto' (got '" +
                                   *codec + "')");
}

/// A save's rounding: nothing (the stash's), "nearest" or "stochastic".
std::optional<kompress::rounding_mode> stash_rounding_of(const std::optional<std::string>& rounding,
                                                         const char* who) {
  if (!rounding) return std::nullopt;
  if (*rounding == "nearest") return kompress::rounding_mode::nearest;
  if (*rounding == "stochastic") return kompress::rounding_mode::stochastic;
  throw kompress::invalid_argument(std::string(who) + ": rounding must be None, 'nearest' or 'stochastic' (got '" +
                                   *rounding + "')");
}

/// A save's layer: nothing, or a number in [0, 2^32).
std::optional<std::uint32_t> stash_layer_of(std::optional<std::int64_t> layer, const char* who) {
  if (!layer) return std::nullopt;
  if (*layer < 0 || *layer > std::numeric_limits<std::uint32_t>::max())
    throw kompress::invalid_argument(std::string(who) + ": layer must be in [0, 2^32) (got " +
                                     std::to_string(*layer) + ")");
  return std::uint32_t(*layer);
}

/// kompress::stash on one device (its pool in that device's memory), closable: the Python
/// package closes every stash before it finalises Kokkos, so that no View outlives Kokkos
/// whatever Python keeps alive at exit. A CUDA stash saves and restores on the caller's stream.
class py_stash {
 private:
  /// Calls f(stash, Device{}, exec) on the open stash; exec is the host's or the CUDA stream's.
  template <class F>
  decltype(auto) with_stash(const char* who, [[maybe_unused]] std::uintptr_t stream, F&& f) {
#ifdef KOKKOS_ENABLE_CUDA
    if (cuda_) return f(*cuda_, cuda_device{}, streams().on(stream));
#endif
    if (!host_) throw kompress::invalid_argument(std::string(who) + ": the stash is closed");
    return f(*host_, host_device{}, exec_space{});
  }

 public:
  py_stash(const kompress::stash_options& options, const std::string& device, std::uintptr_t stream) {
    if (device == "cpu") {
      host_.emplace(exec_space{}, options);
      return;
    }
#ifdef KOKKOS_ENABLE_CUDA
    if (device == "cuda") {
      nb::gil_scoped_release release;
      cuda_.emplace(streams().on(stream), options);
      return;
    }
#endif
    (void)stream;
    throw kompress::invalid_argument(
        "kompress.Stash: device must be 'cpu'" + std::string(cuda_enabled() ? " or 'cuda'" : "") + " (got '" +
        device + "'" + (device == "cuda" ? "; this kompress extension was built without CUDA" : "") + ")");
  }

  kompress::stash_handle save(const in_array& in, std::optional<double> abs, std::optional<double> rel,
                              const std::optional<std::string>& codec, std::optional<std::int64_t> layer,
                              bool keep_sign, const std::optional<std::string>& rounding, bool group_relative,
                              std::uintptr_t stream) {
    constexpr const char* who = "kompress.Stash.save";
    const dtype_code code = float_array(in, who, "the array");
    check_device(in, who, "the array");
    const auto bound = make_bound(who, abs, rel);
    const kompress::stash_save_options how{.codec = stash_codec_of(codec, who), .layer = stash_layer_of(layer, who),
                                           .keep_sign = keep_sign, .rounding = stash_rounding_of(rounding, who),
                                           .group_relative = group_relative};
    nb::gil_scoped_release release;
    return with_stash(who, stream, [&](auto& s, auto d, const auto& exec) {
      using D = decltype(d);
      return dispatch(code, [&](auto t) { return s.save(exec, view_of<decltype(t), D>(in), bound, how); });
    });
  }

  void restore(const kompress::stash_handle& handle, const array& out, bool drop, std::uintptr_t stream) {
    constexpr const char* who = "kompress.Stash.restore";
    const dtype_code code = float_array(out, who, "the output");
    check_device(out, who, "the output");
    nb::gil_scoped_release release;
    with_stash(who, stream, [&](auto& s, auto d, const auto& exec) {
      using D = decltype(d);
      dispatch(code, [&](auto t) {
        const auto view = view_of<decltype(t), D>(out);
        if (drop)
          s.restore_and_drop(exec, handle, view);
        else
          s.restore(exec, handle, view);
      });
    });
  }

  void drop(const kompress::stash_handle& handle) {
    with_stash("kompress.Stash.drop", 0, [&](auto& s, auto, const auto&) { s.drop(handle); });
  }
  bool contains(const kompress::stash_handle& handle) {
    return !closed() && with_stash("", 0, [&](auto& s, auto, const auto&) { return s.contains(handle); });
  }
  kompress::stash_entry_info info(const kompress::stash_handle& handle) {
    return with_stash("kompress.Stash.info", 0, [&](auto& s, auto, const auto&) { return s.info(handle); });
  }
  kompress::stash_stats stats() {
    return with_stash("kompress.Stash.stats", 0, [&](auto& s, auto, const auto&) { return s.stats(); });
  }
  void reset_peaks() {
    with_stash("kompress.Stash.reset_peaks", 0, [&](auto& s, auto, const auto&) { s.reset_peaks(); });
  }
  void close() {
    host_.reset();
#ifdef KOKKOS_ENABLE_CUDA
    cuda_.reset();
#endif
  }
  bool closed() const {
#ifdef KOKKOS_ENABLE_CUDA
    if (cuda_) return false;
#endif
    return !host_;
  }
  std::string device() const { return device_name(device_kind_of()); }

 private:
  device_kind device_kind_of() const {
#ifdef KOKKOS_ENABLE_CUDA
    if (cuda_) return device_kind::cuda;
#endif
    return device_kind::host;
  }

  /// An array must live where the pool does: a device stash never copies across devices.
  template <class A>
  void check_device(const A& a, const char* who, const char* what) const {
    const device_kind kind = device_of(a, who, what);
    if (!closed() && kind != device_kind_of())
      throw kompress::invalid_argument(std::string(who) + ": " + what + " is on " +
                                       device_name(kind) + ", the stash on " + device() +
                                       " (a stash keeps arrays of its own device)");
  }

  kokkos_holder holder_;
  std::optional<kompress::stash<exec_space>> host_;
#ifdef KOKKOS_ENABLE_CUDA
  std::optional<kompress::stash<Kokkos::Cuda>> cuda_;
#endif
};

kompress::stash_options make_stash_options(std::size_t budget_bytes, const std::string& policy,
                                           const std::string& directory, std::optional<double> ceiling_abs,
                                           std::optional<double> ceiling_rel, double growth,
                                           std::size_t segment_bytes, int block_size, double ratio_codec_min_saving,
                                           std::int64_t codec_remeasure_saves, std::int64_t async_window,
                                           const std::string& rounding, std::uint64_t rounding_seed) {
  constexpr const char* who = "kompress.Stash";
  if (codec_remeasure_saves < 1 || codec_remeasure_saves > std::numeric_limits<std::uint32_t>::max())
    throw kompress::invalid_argument(std::string(who) + ": codec_remeasure_saves must be in [1, 2^32) (got " +
                                     std::to_string(codec_remeasure_saves) + ")");
  if (async_window < 1)
    throw kompress::invalid_argument(std::string(who) + ": async_window must be at least 1 (got " +
                                     std::to_string(async_window) + ")");
  kompress::stash_options options{.budget_bytes = budget_bytes, .segment_bytes = segment_bytes,
                                  .codec = {.block_size = block_size,
                                            .rounding = rounding_of(rounding, who),
                                            .rounding_seed = rounding_seed},
                                  .ratio_codec_min_saving = ratio_codec_min_saving,
                                  .codec_remeasure_saves = std::uint32_t(codec_remeasure_saves),
                                  .async_window = std::size_t(async_window)};
  if (policy == "throw")
    options.policy = kompress::budget_policy::throw_error();
  else if (policy == "spill_host")
    options.policy = kompress::budget_policy::spill_to_host();
  else if (policy == "spill_file") {
    if (directory.empty())
      throw kompress::invalid_argument(std::string(who) + ": policy 'spill_file' needs directory=");
    options.policy = kompress::budget_policy::spill_to_file(directory);
  } else if (policy == "loosen_bound") {
    if (!ceiling_abs && !ceiling_rel)
      throw kompress::invalid_argument(std::string(who) +
                                       ": policy 'loosen_bound' needs ceiling_abs= or ceiling_rel=");
    options.policy = kompress::budget_policy::loosen_bound(make_bound(who, ceiling_abs, ceiling_rel), growth);
  } else
    throw kompress::invalid_argument(std::string(who) +
                                     ": policy must be 'throw', 'spill_host', 'spill_file' or "
                                     "'loosen_bound' (got '" + policy + "')");
  return options;
}

// --- the DLRM embedding exchange --------------------------------------------------------------

class py_exchange {
 public:
  /// `tables`: (owner, dim) pairs. Every check before the exchange's own (which it agrees on
  /// with the other ranks in its constructor) is made on every rank (check_on_every_rank).
  py_exchange(std::uintptr_t comm, const std::vector<std::pair<std::int64_t, std::int64_t>>& tables,
              std::int64_t local_batch, kompress::dlrm::exchange_options options)
      : comm_(comm) {
    constexpr const char* who = "kompress.EmbeddingExchange";
    std::vector<kompress::dlrm::table> t;
    check_on_every_rank(comm, who, [&] {
      for (const auto& [owner, dim] : tables) {
        if (owner < 0 || owner > std::numeric_limits<int>::max() || dim < 0)
          throw kompress::invalid_argument(std::string(who) + ": table (" + std::to_string(owner) + ", " +
                                           std::to_string(dim) + ") must be (owner rank, dimension >= 0)");
        t.push_back({.owner = int(owner), .dim = std::size_t(dim)});
      }
      if (local_batch < 0)
        throw kompress::invalid_argument(std::string(who) + ": local_batch must be >= 0 (got " +
                                         std::to_string(local_batch) + ")");
    });
    nb::gil_scoped_release release;  // the constructor agrees on the model with the other ranks
    exchange_.emplace(comm_of(comm), std::move(t), std::size_t(local_batch), std::move(options));
  }

  nb::object run(bool forward, nb::handle in_obj, nb::handle out_obj, bool nonblocking, std::uintptr_t stream) {
    const char* who = forward ? "kompress.EmbeddingExchange.forward" : "kompress.EmbeddingExchange.backward";
    in_array in;
    array out;
    dtype_code code = dtype_code::float32;
    device_kind device = device_kind::host;
    kompress::dlrm::embedding_exchange* exchange = nullptr;
    check_on_every_rank(comm_, who, [&] {
      exchange = &get(who);
      in = array_argument<in_array>(in_obj, who, "the input");
      out = array_argument<array>(out_obj, who, "the output");
      code = pair_dtype(in, out, who);
      device = same_device(in, "the input", out, "the output", who);
      if (in.ndim() != 2 || out.ndim() != 2)
        throw kompress::invalid_argument(std::string(who) +
                                         ": the arrays must be two-dimensional [rows x width] (got " +
                                         std::to_string(in.ndim()) + " and " + std::to_string(out.ndim()) +
                                         " dimensions)");
    });
    auto& ex = *exchange;
    kompress::request request;
    kompress::collective_report report;
    {
      nb::gil_scoped_release release;
      dispatch_on(device, stream, code, [&](auto t, auto d, const auto& exec) {
        using T = decltype(t);
        using memory = typename decltype(d)::memory_space;
        using view2 = Kokkos::View<T**, Kokkos::LayoutRight, memory, Kokkos::MemoryUnmanaged>;
        using const_view2 = Kokkos::View<const T**, Kokkos::LayoutRight, memory, Kokkos::MemoryUnmanaged>;
        const_view2 vin(static_cast<const T*>(in.data()), in.shape(0), in.shape(1));
        view2 vout(static_cast<T*>(out.data()), out.shape(0), out.shape(1));
        // The one place that names the exchange's calls (blocking and nonblocking).
        if (forward) {
          if (nonblocking)
            request = ex.iforward(exec, vin, vout);
          else
            report = ex.forward(exec, vin, vout);
        } else {
          if (nonblocking)
            request = ex.ibackward(exec, vin, vout);
          else
            report = ex.backward(exec, vin, vout);
        }
      });
    }
    if (!nonblocking) return nb::cast(report);
    return nb::cast(new py_request(std::move(request), {nb::borrow(in_obj), nb::borrow(out_obj)}),
                    nb::rv_policy::take_ownership);
  }

  kompress::dlrm::embedding_exchange& get(const char* who) {
    if (!exchange_) throw kompress::invalid_argument(std::string(who) + ": the exchange is closed");
    return *exchange_;
  }
  void close() { exchange_.reset(); }

 private:
  kokkos_holder holder_;
  std::uintptr_t comm_;  ///< where a failed check is announced, also once closed
  std::optional<kompress::dlrm::embedding_exchange> exchange_;
};

// --- Kokkos -----------------------------------------------------------------------------------

/// Initialises Kokkos unless the host program did; true if this call did. Kokkos's OpenMP
/// backend takes omp_get_max_threads(), i.e. OMP_NUM_THREADS when set.
/// `device_id` (>= 0): the GPU of a CUDA build (the device torch has current, or
/// KOMPRESS_CUDA_DEVICE: the Python layer decides); -1 leaves it to Kokkos.
bool initialize_kokkos(int num_threads, int device_id) {
  if (Kokkos::is_initialized() || Kokkos::is_finalized()) return false;
  Kokkos::InitializationSettings settings;
  settings.set_disable_warnings(true);
  if (num_threads > 0) settings.set_num_threads(num_threads);
  if (cuda_enabled() && device_id >= 0) settings.set_device_id(device_id);
  Kokkos::initialize(settings);
  return true;
}

}  // namespace

NB_MODULE(_kompress, m) {
  m.doc() = "kompress's C++ bindings; use the kompress package, not this module.";

  // Exceptions: kompress::error's hierarchy, mirrored. Most derived first in the translator.
  static nb::object error_type = nb::steal(PyErr_NewException("kompress.Error", PyExc_RuntimeError, nullptr));
  static nb::object invalid_argument_type = nb::steal(PyErr_NewException(
      "kompress.InvalidArgument", nb::make_tuple(error_type, nb::handle(PyExc_ValueError)).ptr(), nullptr));
  static nb::object format_error_type =
      nb::steal(PyErr_NewException("kompress.FormatError", error_type.ptr(), nullptr));
  static nb::object budget_exceeded_type =
      nb::steal(PyErr_NewException("kompress.BudgetExceeded", error_type.ptr(), nullptr));
  static nb::object invalid_handle_type =
      nb::steal(PyErr_NewException("kompress.InvalidHandle", invalid_argument_type.ptr(), nullptr));
  static nb::object resource_error_type =
      nb::steal(PyErr_NewException("kompress.ResourceError", error_type.ptr(), nullptr));
  static nb::object mpi_error_type = nb::steal(PyErr_NewException("kompress.MPIError", error_type.ptr(), nullptr));
  static nb::object peer_error_type = nb::steal(PyErr_NewException("kompress.PeerError", error_type.ptr(), nullptr));
  m.attr("Error") = error_type;
  m.attr("InvalidArgument") = invalid_argument_type;
  m.attr("FormatError") = format_error_type;
  m.attr("BudgetExceeded") = budget_exceeded_type;
  m.attr("InvalidHandle") = invalid_handle_type;
  m.attr("ResourceError") = resource_error_type;
  m.attr("MPIError") = mpi_error_type;
  m.attr("PeerError") = peer_error_type;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const kompress::invalid_handle& e) {
      PyErr_SetString(invalid_handle_type.ptr(), e.what());
    } catch (const kompress::budget_exceeded& e) {
      nb::object exc = budget_exceeded_type(e.what());
      exc.attr("needed_bytes") = e.needed_bytes();
      exc.attr("budget_bytes") = e.budget_bytes();
      exc.attr("in_use_bytes") = e.in_use_bytes();
      exc.attr("largest_free_bytes") = e.largest_free_bytes();
      PyErr_SetObject(budget_exceeded_type.ptr(), exc.ptr());
    } catch (const kompress::invalid_argument& e) {
      PyErr_SetString(invalid_argument_type.ptr(), e.what());
    } catch (const kompress::format_error& e) {
      PyErr_SetString(format_error_type.ptr(), e.what());
    } catch (const kompress::resource_error& e) {
      nb::object exc = resource_error_type(e.what());
      exc.attr("requested_bytes") = e.requested_bytes();
      PyErr_SetObject(resource_error_type.ptr(), exc.ptr());
    } catch (const kompress::mpi_error& e) {
      nb::object exc = mpi_error_type(e.what());
      exc.attr("code") = e.code();
      PyErr_SetObject(mpi_error_type.ptr(), exc.ptr());
    } catch (const kompress::peer_error& e) {
      nb::object exc = peer_error_type(e.what());
      exc.attr("failed_rank") = e.failed_rank();
      PyErr_SetObject(peer_error_type.ptr(), exc.ptr());
    } catch (const kompress::error& e) {
      PyErr_SetString(error_type.ptr(), e.what());
    }
  });

  m.attr("cuda_enabled") = cuda_enabled();
  m.def("_initialize_kokkos", &initialize_kokkos, "num_threads"_a, "device_id"_a);
  m.def("_cuda_device", []() -> std::optional<int> {
#ifdef KOKKOS_ENABLE_CUDA
    return Kokkos::Cuda{}.cuda_device();
#else
    return std::nullopt;
#endif
  });
  m.def("_finalize_kokkos", [] {
    if (!Kokkos::is_initialized() || live_kokkos_holders.load() != 0) return false;
#ifdef KOKKOS_ENABLE_CUDA
    streams().clear();
#endif
    Kokkos::finalize();
    return true;
  });
  m.def("_kokkos_concurrency", [] { return exec_space{}.concurrency(); });
  m.def("_mpi_library_version", &mpi_library_version);

  nb::class_<kompress::stream_info>(m, "StreamInfo", "What a stream's header says (kompress.inspect).")
      .def_ro("format_major", &kompress::stream_info::format_major)
      .def_ro("format_minor", &kompress::stream_info::format_minor)
      .def_prop_ro("dtype", [](const kompress::stream_info& i) {
        return i.type == kompress::element_type::float32 ? "float32" : "float64";
      })
      .def_ro("count", &kompress::stream_info::count)
      .def_prop_ro("mode", [](const kompress::stream_info& i) {
        return i.requested_bound.mode == kompress::bound_mode::relative ? "rel" : "abs";
      })
      .def_prop_ro("requested_bound", [](const kompress::stream_info& i) { return i.requested_bound.value; })
      .def_ro("absolute_bound", &kompress::stream_info::absolute_bound)
      .def_ro("quantization_step", &kompress::stream_info::quantization_step)
      .def_prop_ro("fill_value", [](const kompress::stream_info& i) -> std::optional<double> {
        if (!i.has_fill_value) return std::nullopt;
        return i.fill_value;
      })
      .def_prop_ro("codec", [](const kompress::stream_info& i) {
        return i.codec == kompress::codec_mode::ratio ? "ratio" : "fast";
      })
      .def_ro("block_size", &kompress::stream_info::block_size)
      .def_ro("blocks_per_chunk", &kompress::stream_info::blocks_per_chunk)
      .def_ro("chunk_count", &kompress::stream_info::chunk_count)
      .def_ro("compressed_bytes", &kompress::stream_info::compressed_bytes)
      .def_prop_ro("uncompressed_bytes", &kompress::stream_info::uncompressed_bytes)
      .def_ro("value_min", &kompress::stream_info::value_min)
      .def_ro("value_max", &kompress::stream_info::value_max)
      .def_prop_ro("ratio", &kompress::stream_info::ratio)
      .def("__repr__", [](const kompress::stream_info& i) {
        return "StreamInfo(dtype=" + std::string(i.type == kompress::element_type::float32 ? "float32" : "float64") +
               ", count=" + std::to_string(i.count) + ", compressed_bytes=" + std::to_string(i.compressed_bytes) +
               ", absolute_bound=" + kompress::detail::number_text(i.absolute_bound) + ")";
      });

  m.def("max_compressed_size", &max_compressed_size, "count"_a, "element_bytes"_a, "block_size"_a = 32,
        "codec"_a = "fast");
  m.def("compress", &compress, "x"_a, "abs"_a.none(), "rel"_a.none(), "fill_value"_a.none(), "block_size"_a,
        "codec"_a, "rounding"_a, "rounding_seed"_a);
  m.def("compress_into", &compress_into, "x"_a, "out"_a, "abs"_a.none(), "rel"_a.none(), "fill_value"_a.none(),
        "block_size"_a, "codec"_a, "rounding"_a, "rounding_seed"_a, "cuda_stream"_a);
  m.def("inspect", &inspect, "stream"_a);
  m.def("decompress_into", &decompress_into, "stream"_a, "out"_a, "cuda_stream"_a);

  // Collectives.
  nb::class_<kompress::cost_model>(m, "CostModel", "The cost model of automatic mode (docs/collectives.md).")
      .def(nb::init<>())
      .def_rw("link_bytes_per_second", &kompress::cost_model::link_bytes_per_second)
      .def_rw("compress_bytes_per_second", &kompress::cost_model::compress_bytes_per_second)
      .def_rw("decompress_bytes_per_second", &kompress::cost_model::decompress_bytes_per_second)
      .def_rw("min_message_bytes", &kompress::cost_model::min_message_bytes)
      .def_rw("expected_ratio", &kompress::cost_model::expected_ratio)
      .def_rw("latency_seconds", &kompress::cost_model::latency_seconds)
      .def_rw("compress_call_seconds", &kompress::cost_model::compress_call_seconds)
      .def_rw("decompress_call_seconds", &kompress::cost_model::decompress_call_seconds)
      .def("worth_compressing", &kompress::cost_model::worth_compressing, "bytes"_a)
      .def("worth_compressing_forwarded", &kompress::cost_model::worth_compressing_forwarded, "bytes"_a, "sends"_a,
           "decode_share"_a = 1.0);

  nb::class_<collective_settings>(m, "_CollectiveSettings")
      .def(nb::init<>())
      // Every field in one call: a setattr each costs more than a small collective's checks.
      .def(
          "__init__",
          [](collective_settings* s, std::optional<double> abs, std::optional<double> rel, std::string mode,
             std::string reduction_bound, std::string reduction, std::string schedule, int block_size,
             bool measure_error, std::optional<kompress::cost_model> cost, std::size_t exchange_window) {
            new (s) collective_settings{abs,
                                        rel,
                                        std::move(mode),
                                        std::move(reduction_bound),
                                        std::move(reduction),
                                        std::move(schedule),
                                        block_size,
                                        measure_error,
                                        cost,
                                        exchange_window};
          },
          "abs"_a.none(), "rel"_a.none(), "mode"_a, "reduction_bound"_a, "reduction"_a, "schedule"_a,
          "block_size"_a, "measure_error"_a, "cost"_a.none(), "exchange_window"_a)
      .def_rw("abs", &collective_settings::abs, nb::arg().none())
      .def_rw("rel", &collective_settings::rel, nb::arg().none())
      .def_rw("mode", &collective_settings::mode)
      .def_rw("reduction_bound", &collective_settings::reduction_bound)
      .def_rw("reduction", &collective_settings::reduction)
      .def_rw("schedule", &collective_settings::schedule)
      .def_rw("block_size", &collective_settings::block_size)
      .def_rw("measure_error", &collective_settings::measure_error)
      .def_rw("cost", &collective_settings::cost, nb::arg().none())
      .def_rw("exchange_window", &collective_settings::exchange_window);

  nb::class_<kompress::collective_report>(m, "Report", "What one collective did on the calling rank.")
      .def_ro("payload_bytes", &kompress::collective_report::payload_bytes)
      .def_ro("wire_bytes", &kompress::collective_report::wire_bytes)
      .def_ro("messages", &kompress::collective_report::messages)
      .def_ro("compressed_messages", &kompress::collective_report::compressed_messages)
      .def_ro("absolute_bound", &kompress::collective_report::absolute_bound)
      .def_ro("max_error", &kompress::collective_report::max_error)
      .def_prop_ro("ratio", &kompress::collective_report::ratio)
      .def_prop_ro("sent_raw", &kompress::collective_report::sent_raw)
      .def("__repr__", [](const kompress::collective_report& r) {
        return "Report(payload_bytes=" + std::to_string(r.payload_bytes) +
               ", wire_bytes=" + std::to_string(r.wire_bytes) + ", messages=" + std::to_string(r.messages) +
               ", compressed_messages=" + std::to_string(r.compressed_messages) +
               ", absolute_bound=" + kompress::detail::number_text(r.absolute_bound) + ")";
      });

  nb::class_<py_request>(m, "Request", "A nonblocking collective in flight; wait() completes it.")
      .def("wait", &py_request::wait, "Completes the collective (blocks, GIL released); returns its Report.")
      .def("test", &py_request::test, "Advances without blocking; True once the result is in place.")
      .def_prop_ro("report", &py_request::report);

  m.def("_alltoall", &buffer_collective<alltoall_calls>);
  m.def("_alltoallv", &alltoallv);
  m.def("_allreduce", &buffer_collective<allreduce_calls>);
  m.def("_allgather", &buffer_collective<allgather_calls>);
  m.def("_reduce_scatter", &buffer_collective<reduce_scatter_calls>);
  m.def("_measure_cost_model", &measure_cost_model);
  nb::class_<kompress::node_groups>(m, "_NodeGroups")
      .def("__init__",
           [](kompress::node_groups* self, std::uintptr_t comm, bool by_memory, int ranks_per_node) {
             nb::gil_scoped_release release;  // collective: other ranks' Python threads may need this one's
             if (by_memory)
               new (self) kompress::node_groups(comm_of(comm));
             else
               new (self) kompress::node_groups(comm_of(comm), ranks_per_node);
           })
      .def_prop_ro("nodes", &kompress::node_groups::nodes)
      .def_prop_ro("ranks_per_node", &kompress::node_groups::ranks_per_node)
      .def_prop_ro("uniform", &kompress::node_groups::uniform);
  nb::class_<kompress::hierarchical_workspace>(m, "_HierarchicalWorkspace")
      .def("__init__",
           [](kompress::hierarchical_workspace* self, const kompress::node_groups& groups) {
             nb::gil_scoped_release release;  // collective, as above
             new (self) kompress::hierarchical_workspace(groups);
           })
      .def_prop_ro("bytes", &kompress::hierarchical_workspace::bytes);
  m.def("_hierarchical_allreduce", &hierarchical_collective<allreduce_calls>);
  m.def("_hierarchical_allgather", &hierarchical_collective<allgather_calls>);
  m.def("_hierarchical_reduce_scatter", &hierarchical_collective<reduce_scatter_calls>);
  m.def("_announce_failure", &announce_failure, "comm"_a, "who"_a);

  nb::class_<py_persistent_request>(m, "_PersistentRequest")
      .def("start", &py_persistent_request::start)
      .def("wait", &py_persistent_request::wait)
      .def("test", &py_persistent_request::test)
      .def("run", &py_persistent_request::run)
      .def("report", &py_persistent_request::report)
      .def_prop_ro("active", &py_persistent_request::active)
      .def_prop_ro("closed", &py_persistent_request::closed)
      .def("close", &py_persistent_request::close);
  const auto owned = nb::rv_policy::take_ownership;
  m.def("_alltoall_init", &buffer_collective_init<alltoall_calls>, owned);
  m.def("_alltoallv_init", &alltoallv_init, owned);
  m.def("_allreduce_init", &buffer_collective_init<allreduce_calls>, owned);
  m.def("_allgather_init", &buffer_collective_init<allgather_calls>, owned);
  m.def("_reduce_scatter_init", &buffer_collective_init<reduce_scatter_calls>, owned);

  // Stash.
  nb::class_<kompress::stash_handle>(m, "StashHandle", "Names one entry of one stash.")
      .def_ro("stash_id", &kompress::stash_handle::stash_id)
      .def_ro("slot", &kompress::stash_handle::slot)
      .def_ro("generation", &kompress::stash_handle::generation)
      .def("__eq__", [](const kompress::stash_handle& a, const kompress::stash_handle& b) { return a == b; });
  nb::class_<kompress::stash_entry_info>(m, "StashEntryInfo")
      .def_prop_ro("dtype", [](const kompress::stash_entry_info& i) {
        return i.type == kompress::element_type::float32 ? "float32" : "float64";
      })
      .def_ro("count", &kompress::stash_entry_info::count)
      .def_ro("raw_bytes", &kompress::stash_entry_info::raw_bytes)
      .def_ro("stored_bytes", &kompress::stash_entry_info::stored_bytes)
      .def_ro("sign_bytes", &kompress::stash_entry_info::sign_bytes)
      .def_ro("zeros_in_signs", &kompress::stash_entry_info::zeros_in_signs)
      .def_prop_ro("codec", [](const kompress::stash_entry_info& i) {
        return i.codec == kompress::codec_mode::ratio ? "ratio" : "fast";
      })
      .def_ro("keeps_sign", &kompress::stash_entry_info::keeps_sign)
      .def_ro("group_relative", &kompress::stash_entry_info::group_relative)
      .def_prop_ro("rounding", [](const kompress::stash_entry_info& i) {
        return i.rounding == kompress::rounding_mode::stochastic ? "stochastic" : "nearest";
      })
      .def_ro("absolute_bound", &kompress::stash_entry_info::absolute_bound)
      .def_ro("segments", &kompress::stash_entry_info::segments)
      .def_prop_ro("used_bound", [](const kompress::stash_entry_info& i) { return i.used_bound.value; })
      .def_prop_ro("loosened", [](const kompress::stash_entry_info& i) {
        return i.used_bound.value != i.requested_bound.value;
      })
      .def_prop_ro("spilled_segments", [](const kompress::stash_entry_info& i) {
        return i.placement.host_segments + i.placement.file_segments;
      })
      .def_prop_ro("ratio", &kompress::stash_entry_info::ratio);
  nb::class_<kompress::stash_stats>(m, "StashStats")
      .def_ro("budget_bytes", &kompress::stash_stats::budget_bytes)
      .def_ro("workspace_bytes", &kompress::stash_stats::workspace_bytes)
      .def_ro("entries", &kompress::stash_stats::entries)
      .def_ro("raw_bytes", &kompress::stash_stats::raw_bytes)
      .def_ro("stored_bytes", &kompress::stash_stats::stored_bytes)
      .def_ro("sign_bytes", &kompress::stash_stats::sign_bytes)
      .def_ro("pool_bytes", &kompress::stash_stats::pool_bytes)
      .def_ro("reserved_bytes", &kompress::stash_stats::reserved_bytes)
      .def_ro("padding_bytes", &kompress::stash_stats::padding_bytes)
      .def_ro("host_spilled_bytes", &kompress::stash_stats::host_spilled_bytes)
      .def_ro("file_spilled_bytes", &kompress::stash_stats::file_spilled_bytes)
      .def_ro("peak_raw_bytes", &kompress::stash_stats::peak_raw_bytes)
      .def_ro("peak_stored_bytes", &kompress::stash_stats::peak_stored_bytes)
      .def_ro("peak_pool_bytes", &kompress::stash_stats::peak_pool_bytes)
      .def_ro("saves", &kompress::stash_stats::saves)
      .def_ro("restores", &kompress::stash_stats::restores)
      .def_ro("drops", &kompress::stash_stats::drops)
      .def_ro("spilled_segments", &kompress::stash_stats::spilled_segments)
      .def_ro("loosened_saves", &kompress::stash_stats::loosened_saves)
      .def_ro("ratio_codec_saves", &kompress::stash_stats::ratio_codec_saves)
      .def_ro("codec_measurements", &kompress::stash_stats::codec_measurements)
      .def_ro("moved_streams", &kompress::stash_stats::moved_streams)
      .def_ro("total_raw_bytes", &kompress::stash_stats::total_raw_bytes)
      .def_ro("total_stored_bytes", &kompress::stash_stats::total_stored_bytes)
      .def_prop_ro("ratio", &kompress::stash_stats::ratio);
  nb::class_<kompress::stash_options>(m, "_StashOptions");
  m.def("_stash_options", &make_stash_options);
  nb::class_<py_stash>(m, "_Stash")
      .def(nb::init<const kompress::stash_options&, const std::string&, std::uintptr_t>())
      .def("save", &py_stash::save, "x"_a, "abs"_a.none(), "rel"_a.none(), "codec"_a.none(), "layer"_a.none(),
           "keep_sign"_a, "rounding"_a.none(), "group_relative"_a, "stream"_a)
      .def("restore", &py_stash::restore, "handle"_a, "out"_a, "drop"_a, "stream"_a)
      .def("drop", &py_stash::drop)
      .def("contains", &py_stash::contains)
      .def("info", &py_stash::info)
      .def("stats", &py_stash::stats)
      .def("reset_peaks", &py_stash::reset_peaks)
      .def("close", &py_stash::close)
      .def_prop_ro("device", &py_stash::device)
      .def_prop_ro("closed", &py_stash::closed);

  // Per-layer bounds (the Python side, kompress.torch.LayerBounds, names the layers).
  nb::class_<kompress::layer_bounds>(m, "_LayerBounds")
      .def("__init__",
           [](kompress::layer_bounds* self, std::optional<double> abs, std::optional<double> rel, double ceiling,
              std::optional<double> floor, double growth, double tolerance, std::uint64_t check_every) {
             const auto initial = make_bound("kompress.torch.LayerBounds", abs, rel);
             const auto same_mode = [&](double value) { return kompress::error_bound{initial.mode, value}; };
             new (self) kompress::layer_bounds({.initial = initial,
                                                .ceiling = same_mode(ceiling),
                                                .floor = floor ? std::optional(same_mode(*floor)) : std::nullopt,
                                                .growth = growth,
                                                .tolerance = tolerance,
                                                .check_every = check_every});
           },
           "abs"_a.none(), "rel"_a.none(), "ceiling"_a, "floor"_a.none(), "growth"_a, "tolerance"_a,
           "check_every"_a)
      .def("bound", [](const kompress::layer_bounds& b, std::uint32_t layer) { return b.bound(layer).value; })
      .def("settled", &kompress::layer_bounds::settled)
      .def("check_due", &kompress::layer_bounds::check_due)
      .def("report", &kompress::layer_bounds::report)
      .def("log", [](const kompress::layer_bounds& b) {
        std::vector<std::tuple<std::uint64_t, std::uint32_t, double, double, double>> changes;
        for (const auto& c : b.log()) changes.emplace_back(c.step, c.layer, c.from.value, c.to.value, c.deviation);
        return changes;
      });

  // DLRM.
  nb::class_<kompress::dlrm::exchange_options>(m, "_ExchangeOptions")
      .def(nb::init<>())
      .def("set_bounds",
           [](kompress::dlrm::exchange_options& o, std::optional<double> fabs, std::optional<double> frel,
              std::optional<double> babs, std::optional<double> brel) {
             constexpr const char* who = "kompress.EmbeddingExchange";
             if (fabs || frel) o.forward.bound = make_bound(who, fabs, frel);
             if (babs || brel) o.backward.bound = make_bound(who, babs, brel);
           },
           nb::arg().none(), nb::arg().none(), nb::arg().none(), nb::arg().none())
      .def_rw("compress_forward", &kompress::dlrm::exchange_options::compress_forward)
      .def_rw("compress_backward", &kompress::dlrm::exchange_options::compress_backward)
      .def_rw("table_weights", &kompress::dlrm::exchange_options::table_weights)
      .def_rw("window", &kompress::dlrm::exchange_options::window)
      .def_prop_rw(
          "block_size", [](const kompress::dlrm::exchange_options& o) { return o.forward.block_size; },
          [](kompress::dlrm::exchange_options& o, int block_size) {
            o.forward.block_size = block_size;
            o.backward.block_size = block_size;
          })
      .def("set_schedule", [](kompress::dlrm::exchange_options& o, nb::callable schedule) {
        // Called from C++ with the GIL released: take it for the Python call. The callable
        // gets (iteration, table, "forward" | "backward").
        auto shared = std::make_shared<nb::object>(schedule);
        o.bound_schedule = [shared](std::uint64_t iteration, int table, kompress::dlrm::direction d) {
          nb::gil_scoped_acquire acquire;
          return nb::cast<double>((*shared)(iteration, table,
                                            d == kompress::dlrm::direction::forward ? "forward" : "backward"));
        };
      });
  nb::class_<py_exchange>(m, "_EmbeddingExchange")
      .def(nb::init<std::uintptr_t, const std::vector<std::pair<std::int64_t, std::int64_t>>&, std::int64_t,
                    kompress::dlrm::exchange_options>())
      .def("run", &py_exchange::run)
      .def_prop_ro("local_batch", [](py_exchange& e) { return e.get("kompress.EmbeddingExchange").local_batch(); })
      .def_prop_ro("global_batch", [](py_exchange& e) { return e.get("kompress.EmbeddingExchange").global_batch(); })
      .def_prop_ro("local_width", [](py_exchange& e) { return e.get("kompress.EmbeddingExchange").local_width(); })
      .def_prop_ro("total_width", [](py_exchange& e) { return e.get("kompress.EmbeddingExchange").total_width(); })
      .def_prop_ro("iteration", [](py_exchange& e) { return e.get("kompress.EmbeddingExchange").iteration(); })
      .def("close", &py_exchange::close);
}
