// The CUDA emulator's cub::DeviceRadixSort::SortPairs: a stable sort of (key, value) pairs by the
// key bits [begin_bit, end_bit), on the stream (recorded when it is captured), with cub's
// two-phase protocol (a null temp_storage asks for the scratch size).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "../../cuda_runtime.h"

namespace cub {

struct DeviceRadixSort {
  template <class K, class V>
  static cudaError_t SortPairs(void* temp_storage, size_t& temp_bytes, const K* keys_in,
                               K* keys_out, const V* values_in, V* values_out, int n,
                               int begin_bit = 0, int end_bit = sizeof(K) * 8,
                               cudaStream_t stream = nullptr) {
    if (!temp_storage) {
      temp_bytes = 256 + static_cast<size_t>(n) * (sizeof(K) + sizeof(V));  // cub needs about this
      return cudaSuccess;
    }
    if (n < 0 || begin_bit < 0 || end_bit > static_cast<int>(sizeof(K) * 8) || begin_bit > end_bit)
      return cudaErrorInvalidValue;
    return plx_emu::submit_work(stream, [=] {
      using U = std::make_unsigned_t<K>;
      const int bits = end_bit - begin_bit;
      const U mask = bits >= static_cast<int>(sizeof(U) * 8) ? ~U(0) : static_cast<U>((U(1) << bits) - 1);
      auto key = [&](K k) { return static_cast<U>(static_cast<U>(k) >> begin_bit) & mask; };
      std::vector<int> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return key(keys_in[a]) < key(keys_in[b]); });
      std::vector<K> k(static_cast<size_t>(n));
      std::vector<V> v(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        k[i] = keys_in[order[i]];
        v[i] = values_in[order[i]];
      }
      std::copy(k.begin(), k.end(), keys_out);
      std::copy(v.begin(), v.end(), values_out);
    }, "cub::DeviceRadixSort::SortPairs");
  }
};

}  // namespace cub
