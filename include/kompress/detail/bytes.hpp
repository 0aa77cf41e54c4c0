#pragma once
// Little-endian byte access, zigzag coding and bit widths: the integer plumbing of the codec.
// Streams are little-endian on every platform; we support little-endian hosts only and say so
// at compile time rather than write wrong bytes on a big-endian one.

#include <kompress/detail/config.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kompress::inline v0::detail {

static_assert(std::endian::native == std::endian::little,
              "kompress: the stream format is little-endian and only little-endian hosts are "
              "supported");

template <class U>
KOMPRESS_FUNCTION U load(const std::byte* p) {
  U value;
  std::memcpy(&value, p, sizeof(U));
  return value;
}

template <class U>
KOMPRESS_FUNCTION void store(std::byte* p, U value) {
  std::memcpy(p, &value, sizeof(U));
}

/// Low `nbytes` bytes of `value` (0 <= nbytes <= 8), least significant first.
KOMPRESS_FUNCTION void store_bytes(std::byte* p, std::uint64_t value, int nbytes) {
  for (int i = 0; i < nbytes; ++i) p[i] = static_cast<std::byte>(value >> (8 * i));
}

KOMPRESS_FUNCTION std::uint64_t load_bytes(const std::byte* p, int nbytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < nbytes; ++i) value |= std::uint64_t(p[i]) << (8 * i);
  return value;
}

/// Zigzag: small magnitudes of either sign become small unsigned numbers.
KOMPRESS_FUNCTION std::uint64_t zigzag(std::int64_t v) {
  return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63);
}

KOMPRESS_FUNCTION std::int64_t unzigzag(std::uint64_t u) {
  return static_cast<std::int64_t>(u >> 1) ^ -static_cast<std::int64_t>(u & 1);
}

KOMPRESS_FUNCTION int bit_width(std::uint64_t v) {
#if defined(__CUDA_ARCH__)
  return 64 - __clzll(static_cast<long long>(v));
#else
  return std::bit_width(v);
#endif
}

/// The unsigned integer with the bit pattern of a float or double.
template <class T>
struct bits_of;
template <>
struct bits_of<float> {
  using type = std::uint32_t;
};
template <>
struct bits_of<double> {
  using type = std::uint64_t;
};
template <class T>
using bits_t = typename bits_of<T>::type;

template <class T>
KOMPRESS_FUNCTION bits_t<T> to_bits(T x) {
  bits_t<T> b;
  std::memcpy(&b, &x, sizeof(T));
  return b;
}

template <class T>
KOMPRESS_FUNCTION T from_bits(bits_t<T> b) {
  T x;
  std::memcpy(&x, &b, sizeof(T));
  return x;
}

/// |x| by clearing the sign bit: an integer operation, so loops using it still vectorize.
KOMPRESS_FUNCTION double magnitude(double x) {
  return from_bits<double>(to_bits(x) & 0x7FFFFFFFFFFFFFFFull);
}

}  // namespace kompress::inline v0::detail
