#pragma once
// Little-endian byte access, zigzag coding and bit widths: the integer plumbing of the codec.
// Streams are little-endian on every platform; we support little-endian hosts only and say so
// at compile time rather than write wrong bytes on a big-endian one.

#include <Kokkos_Core.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kompress::detail {

static_assert(std::endian::native == std::endian::little,
              "kompress: the stream format is little-endian and only little-endian hosts are "
              "supported");

template <class U>
KOKKOS_INLINE_FUNCTION U load(const std::byte* p) {
  U value;
  std::memcpy(&value, p, sizeof(U));
  return value;
}

template <class U>
KOKKOS_INLINE_FUNCTION void store(std::byte* p, U value) {
  std::memcpy(p, &value, sizeof(U));
}

/// Low `nbytes` bytes of `value` (0 <= nbytes <= 8), least significant first.
KOKKOS_INLINE_FUNCTION void store_bytes(std::byte* p, std::uint64_t value, int nbytes) {
  for (int i = 0; i < nbytes; ++i) p[i] = static_cast<std::byte>(value >> (8 * i));
}

KOKKOS_INLINE_FUNCTION std::uint64_t load_bytes(const std::byte* p, int nbytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < nbytes; ++i) value |= std::uint64_t(p[i]) << (8 * i);
  return value;
}

/// Zigzag: small magnitudes of either sign become small unsigned numbers.
KOKKOS_INLINE_FUNCTION std::uint64_t zigzag(std::int64_t v) {
  return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63);
}

KOKKOS_INLINE_FUNCTION std::int64_t unzigzag(std::uint64_t u) {
  return static_cast<std::int64_t>(u >> 1) ^ -static_cast<std::int64_t>(u & 1);
}

KOKKOS_INLINE_FUNCTION int bit_width(std::uint64_t v) {
  return Kokkos::Experimental::bit_width_builtin(v);
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
KOKKOS_INLINE_FUNCTION bits_t<T> to_bits(T x) {
  bits_t<T> b;
  std::memcpy(&b, &x, sizeof(T));
  return b;
}

template <class T>
KOKKOS_INLINE_FUNCTION T from_bits(bits_t<T> b) {
  T x;
  std::memcpy(&x, &b, sizeof(T));
  return x;
}

}  // namespace kompress::detail
