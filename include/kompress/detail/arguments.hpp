#pragma once
// The argument checks every public entry point shares: one message per mistake, naming the
// function that was called.

#include <kompress/bound.hpp>
#include <kompress/error.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>

namespace kompress::inline v0::detail {

/// A double as error messages show it: %g style, the shortest text that reads back as the same
/// value ("-1e-300", "0.001", "inf"; std::to_string's six fixed decimals would say "-0.000000").
inline std::string number_text(double value) {
  char text[32];  // the longest shortest form, "-2.2250738585072014e-308", is 24 characters
  const auto written = std::to_chars(text, text + sizeof text, value, std::chars_format::general);
  return std::string(text, written.ptr);
}

constexpr bool supported_block_size(int block_size) {
  return block_size == 32 || block_size == 64 || block_size == 128;
}

inline void validate_block_size(int block_size, const char* who) {
  if (!supported_block_size(block_size))
    throw invalid_argument(std::string(who) + ": block size must be 32, 64 or 128 (got " +
                           std::to_string(block_size) + ")");
}

inline void validate_bound(const error_bound& bound, const char* who) {
  if (!std::isfinite(bound.value) || bound.value < 0.0)
    throw invalid_argument(std::string(who) + ": the error bound must be finite and >= 0 (got " +
                           number_text(bound.value) + ")");
  if (bound.mode != bound_mode::absolute && bound.mode != bound_mode::relative)
    throw invalid_argument(std::string(who) + ": unknown bound mode");
}

/// The codec options every layer embeds (collectives, DLRM exchange, stash), checked once.
inline void validate_options(const compress_options& options, const char* who) {
  validate_bound(options.bound, who);
  validate_block_size(options.block_size, who);
  if (options.codec != codec_mode::fast && options.codec != codec_mode::ratio)
    throw invalid_argument(std::string(who) + ": unknown codec mode " +
                           std::to_string(int(options.codec)));
  if (options.rounding != rounding_mode::nearest && options.rounding != rounding_mode::stochastic)
    throw invalid_argument(std::string(who) + ": unknown rounding mode " +
                           std::to_string(int(options.rounding)));
}

/// Codecs read and write Views as flat arrays in memory order.
template <class V>
void require_contiguous(const V& view, const char* who, const char* what) {
  if (view.size() != 0 && (!view.span_is_contiguous() || view.span() != view.size()))
    throw invalid_argument(std::string(who) + ": " + what +
                           " must be contiguous (a LayoutLeft or LayoutRight View, or a "
                           "contiguous subview); got a strided View");
}

/// Throws invalid_argument when the memory of two Views overlaps (`what` names them): the
/// kernels read one while writing the other, so overlap loses data or crashes. Views of no
/// elements overlap nothing. Contiguity is checked first, so [data, data + size) is the span.
template <class A, class B>
void require_disjoint(const A& a, const B& b, const char* who, const char* what) {
  const auto begin_a = reinterpret_cast<std::uintptr_t>(a.data());
  const auto begin_b = reinterpret_cast<std::uintptr_t>(b.data());
  const std::uintptr_t end_a = begin_a + a.size() * sizeof(typename A::value_type);
  const std::uintptr_t end_b = begin_b + b.size() * sizeof(typename B::value_type);
  if (a.size() != 0 && b.size() != 0 && begin_a < end_b && begin_b < end_a)
    throw invalid_argument(std::string(who) + ": " + what +
                           " overlap; they must be disjoint (got " +
                           std::to_string(end_a - begin_a) + " and " +
                           std::to_string(end_b - begin_b) + " bytes sharing " +
                           std::to_string((end_a < end_b ? end_a : end_b) -
                                          (begin_a > begin_b ? begin_a : begin_b)) +
                           ")");
}

}  // namespace kompress::inline v0::detail
