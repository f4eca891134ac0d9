// Catch2 v2 (Debian 12) and v3 (the GPU machine) behind one include.
#pragma once

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#define PLX_CATCH3 1
using Catch::Approx;
// REQUIRE_THROWS_WITH(expr, PLX_CONTAINS("text"))
#define PLX_CONTAINS(s) Catch::Matchers::ContainsSubstring(s)
// Marks the running test skipped (Catch2 >= 3.3); ctest sees the skip through the exit code.
#define PLX_SKIP(msg) SKIP(msg)
#else
#include <catch2/catch.hpp>
#define PLX_CONTAINS(s) Catch::Matchers::Contains(s)
// Catch2 v2 has no skip: say so and leave the test without assertions; the binary's exit code
// tells ctest (see tests/support/main.cpp).
#define PLX_SKIP(msg)                      \
  do {                                     \
    ::plexus::test::note_skipped(msg);     \
    WARN("SKIPPED: " << msg);              \
    return;                                \
  } while (0)
#endif

namespace plexus::test {
void note_skipped(const char* why);
}
