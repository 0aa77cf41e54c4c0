// The block codec compiled by nvcc alone (no Kokkos): the device-callable layer must keep
// compiling for CUDA. The host half runs everywhere and checks the bound through the very
// functions nvcc compiled; where a GPU is present, the kernels run too and must produce the
// host's bytes exactly (the format's promise: the same stream on every backend).
//
//   nvcc -std=c++20 -I include tests/codec/nvcc_device.cu -o codec_device && ./codec_device

#include <kompress/codec/chunk.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

using kompress::detail::value_codec;

constexpr int block_size = 32;
constexpr std::uint64_t chunk_values = 64 * block_size;

template <class T>
__global__ void encode_chunks(const T* in, std::uint64_t count, value_codec<T> codec, std::byte* out,
                              std::uint64_t room, std::uint64_t* lengths) {
  const std::uint64_t chunk = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x;
  const std::uint64_t first = chunk * chunk_values;
  if (first >= count) return;
  const std::uint64_t n = count - first < chunk_values ? count - first : chunk_values;
  lengths[chunk] =
      kompress::detail::encode_chunk<T, block_size>(in + first, n, first, codec, out + chunk * room);
}

template <class T>
__global__ void decode_chunks(const std::byte* in, std::uint64_t count, value_codec<T> codec, std::uint64_t room,
                              const std::uint64_t* lengths, T* out, int* failures) {
  const std::uint64_t chunk = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x;
  const std::uint64_t first = chunk * chunk_values;
  if (first >= count) return;
  const std::uint64_t n = count - first < chunk_values ? count - first : chunk_values;
  if (!kompress::detail::decode_chunk<T, block_size>(in + chunk * room, lengths[chunk], n, codec, out + first))
    atomicAdd(failures, 1);
}

template <class T>
struct host_result {
  std::vector<std::byte> bytes;
  std::vector<std::uint64_t> lengths;
};

template <class T>
bool check(const char* name, double bound) {
  const std::uint64_t count = 5 * chunk_values + 77;
  std::vector<T> values(count);
  for (std::uint64_t i = 0; i < count; ++i) values[i] = T(std::sin(0.001 * double(i)) * 50.0 + (i % 29 == 0 ? 1.0 : 0.0));
  values[100] = T(NAN);
  values[200] = T(-0.0);
  double max_abs = 0.0;
  for (T x : values)
    if (std::isfinite(x)) max_abs = std::fmax(max_abs, std::fabs(double(x)));
  const value_codec<T> codec = kompress::detail::make_value_codec<T>(bound, max_abs);
  const std::uint64_t chunks = (count + chunk_values - 1) / chunk_values;
  const std::uint64_t room = chunk_values * sizeof(T) + chunk_values / block_size;

  std::vector<std::byte> bytes(chunks * room);
  std::vector<std::uint64_t> lengths(chunks);
  std::vector<T> decoded(count);
  bool ok = true;
  for (std::uint64_t c = 0; c < chunks; ++c) {
    const std::uint64_t n = std::min<std::uint64_t>(chunk_values, count - c * chunk_values);
    lengths[c] = kompress::detail::encode_chunk<T, block_size>(values.data() + c * chunk_values, n,
                                                              c * chunk_values, codec, bytes.data() + c * room);
    ok &= kompress::detail::decode_chunk<T, block_size>(bytes.data() + c * room, lengths[c], n, codec,
                                                       decoded.data() + c * chunk_values);
  }
  std::uint64_t violations = 0, total = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    const bool exact = !std::isfinite(values[i]) || (values[i] == T(0) && std::signbit(values[i]));
    violations += exact ? std::memcmp(&values[i], &decoded[i], sizeof(T)) != 0
                        : !(std::fabs(double(values[i]) - double(decoded[i])) <= bound);
  }
  for (auto l : lengths) total += l;
  std::printf("%s host: ratio %.2f, %llu violations\n", name, double(count * sizeof(T)) / double(total),
              static_cast<unsigned long long>(violations));
  ok &= violations == 0;

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("%s device: no GPU here; kernels compiled, not run\n", name);
    return ok;
  }
  T* d_values = nullptr;
  T* d_decoded = nullptr;
  std::byte* d_bytes = nullptr;
  std::uint64_t* d_lengths = nullptr;
  int* d_failures = nullptr;
  cudaMalloc(&d_values, count * sizeof(T));
  cudaMalloc(&d_decoded, count * sizeof(T));
  cudaMalloc(&d_bytes, chunks * room);
  cudaMalloc(&d_lengths, chunks * sizeof(std::uint64_t));
  cudaMalloc(&d_failures, sizeof(int));
  cudaMemset(d_failures, 0, sizeof(int));
  cudaMemset(d_bytes, 0, chunks * room);
  cudaMemcpy(d_values, values.data(), count * sizeof(T), cudaMemcpyHostToDevice);
  encode_chunks<T><<<unsigned(chunks + 63) / 64, 64>>>(d_values, count, codec, d_bytes, room, d_lengths);
  decode_chunks<T><<<unsigned(chunks + 63) / 64, 64>>>(d_bytes, count, codec, room, d_lengths, d_decoded, d_failures);
  std::vector<std::byte> device_bytes(chunks * room);
  std::vector<std::uint64_t> device_lengths(chunks);
  std::vector<T> device_decoded(count);
  int failures = 0;
  cudaMemcpy(device_bytes.data(), d_bytes, chunks * room, cudaMemcpyDeviceToHost);
  cudaMemcpy(device_lengths.data(), d_lengths, chunks * sizeof(std::uint64_t), cudaMemcpyDeviceToHost);
  cudaMemcpy(device_decoded.data(), d_decoded, count * sizeof(T), cudaMemcpyDeviceToHost);
  cudaMemcpy(&failures, d_failures, sizeof(int), cudaMemcpyDeviceToHost);
  const cudaError_t status = cudaDeviceSynchronize();
  bool same = status == cudaSuccess && failures == 0 && device_lengths == lengths;
  for (std::uint64_t c = 0; same && c < chunks; ++c)
    same = std::memcmp(device_bytes.data() + c * room, bytes.data() + c * room, lengths[c]) == 0;
  same = same && std::memcmp(device_decoded.data(), decoded.data(), count * sizeof(T)) == 0;
  std::printf("%s device: %s\n", name, same ? "same bytes and values as the host" : "MISMATCH with the host");
  cudaFree(d_values);
  cudaFree(d_decoded);
  cudaFree(d_bytes);
  cudaFree(d_lengths);
  cudaFree(d_failures);
  return ok && same;
}

}  // namespace

int main() {
  const bool ok = check<float>("float", 1e-2) & check<double>("double", 1e-6);
  std::printf("%s\n", ok ? "1 passed, 0 failed" : "0 passed, 1 failed");
  return ok ? 0 : 1;
}
