// Small text helpers shared by the core's parsers (private to the core).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace plexus::text {

// The parts of `s` between separators, empty parts dropped: "a,,b" -> {"a", "b"}; "" -> {}.
inline std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(sep, start), s.size());
    if (end > start) out.emplace_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace plexus::text
