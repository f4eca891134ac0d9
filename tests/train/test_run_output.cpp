// Run output besides checkpoints: the JSON builders and parser, the metrics JSON-lines file, the
// run manifest, the progress display and the git revision.
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <sstream>

#include "plexus/error.hpp"
#include "plexus/json.hpp"
#include "plexus/progress.hpp"
#include "plexus/run_output.hpp"
#include "plexus/version.hpp"
#include "support/catch.hpp"
#include "support/harness.hpp"

using namespace plexus;
namespace fs = std::filesystem;
using plexus::test::TempDir;

namespace {


std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

size_t count(const std::string& s, std::string_view what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

}  // namespace

// ---- JSON ----

TEST_CASE("JSON strings escape quotes, backslashes and control characters", "[cpu][train]") {
  CHECK(json_quote("plain") == "\"plain\"");
  CHECK(json_quote("a\"b\\c") == "\"a\\\"b\\\\c\"");
  CHECK(json_quote("l1\nl2\tx\r\b\f") == "\"l1\\nl2\\tx\\r\\b\\f\"");
  CHECK(json_quote(std::string("\x01\x1f\x00", 3)) == "\"\\u0001\\u001f\\u0000\"");
  // UTF-8 passes through untouched; invalid bytes become U+FFFD so the line stays valid.
  CHECK(json_quote("caf\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x98\x80") ==
        "\"caf\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x98\x80\"");
  CHECK(json_quote("a\xff"
                   "b") ==
        "\"a\xef\xbf\xbd"
        "b\"");
  CHECK(json_quote("\xc3") == "\"\xef\xbf\xbd\"");                                  // cut sequence
  CHECK(json_quote("\xed\xa0\x80") == "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"");  // surrogate
}

TEST_CASE("a JSON object holds every kind of value in the order added", "[cpu][train]") {
  JsonObject inner;
  inner.add("k", 1);
  JsonArray arr;
  arr.push(1).push("two").push(3.5).push(false).push_null().push(JsonObject{});
  JsonObject o;
  o.add("s", "x")
      .add("str", std::string("y"))
      .add("i", -3)
      .add("i64", std::numeric_limits<int64_t>::min())
      .add("u64", std::numeric_limits<uint64_t>::max())
      .add("b", true)
      .add("d", 0.1)
      .add("f", 0.5f)
      .add("nan", std::nan(""))
      .add("inf", -HUGE_VAL)
      .add_null("n")
      .add("obj", inner)
      .add("arr", arr)
      .add_raw("raw", " {\"a\": [1, 2]} ");
  CHECK(o.str() ==
        "{\"s\":\"x\",\"str\":\"y\",\"i\":-3,\"i64\":-9223372036854775808,"
        "\"u64\":18446744073709551615,\"b\":true,\"d\":0.1,\"f\":0.5,\"nan\":null,\"inf\":null,"
        "\"n\":null,\"obj\":{\"k\":1},\"arr\":[1,\"two\",3.5,false,null,{}],"
        "\"raw\": {\"a\": [1, 2]} }");
  CHECK(o.contains("raw"));
  CHECK_FALSE(o.contains("missing"));
  CHECK(JsonObject{}.str() == "{}");
  CHECK(JsonArray{}.str() == "[]");
  CHECK(parse_json(o.str()).at("u64").string == "18446744073709551615");
}

TEST_CASE("a JSON object refuses a repeated key and invalid raw JSON", "[cpu][train]") {
  JsonObject o;
  o.add("loss", 1.0);
  REQUIRE_THROWS_AS(o.add("loss", 2.0), Error);
  REQUIRE_THROWS_WITH(o.add("loss", 2.0), PLX_CONTAINS("key \"loss\" added twice"));
  REQUIRE_THROWS_WITH(o.add_raw("config", "{\"a\": }"),
                      PLX_CONTAINS("raw JSON for key \"config\"") && PLX_CONTAINS("byte 6"));
  REQUIRE_THROWS_WITH(o.add_raw("two", "1 2"), PLX_CONTAINS("unexpected text after the value"));
  JsonArray a;
  REQUIRE_THROWS_WITH(a.push_raw("[1,"), PLX_CONTAINS("array element 0"));
  CHECK(o.str() == "{\"loss\":1}");  // the refused members left nothing behind
}

TEST_CASE("doubles written to JSON read back bit for bit", "[cpu][train]") {
  std::vector<double> values = {
      0.0,     -0.0,    0.1,      1.0 / 3.0,           2.0 / 3.0, 1e-300, 5e-324,
      DBL_MIN, DBL_MAX, -DBL_MAX, 123456789.123456789, 1e21,      1e22,   0.30000000000000004,
      2.5e-8,  100.0};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const uint64_t bits = rng();
    const double d = std::bit_cast<double>(bits);
    if (std::isfinite(d)) values.push_back(d);
  }
  for (double v : values) {
    const std::string text = json_number(v);
    INFO(text);
    const JsonValue p = parse_json(text);
    REQUIRE(p.kind == JsonValue::Kind::Number);
    CHECK(std::bit_cast<uint64_t>(p.number) == std::bit_cast<uint64_t>(v));
  }
  CHECK(json_number(std::nan("")) == "null");
  CHECK(json_number(HUGE_VAL) == "null");
  CHECK(json_number(0.1) == "0.1");
}

TEST_CASE("the JSON parser reads escapes, nesting and numbers", "[cpu][train]") {
  const JsonValue v = parse_json(
      " {\"a\": [1, -2.5e3, true, false, null], \"s\": \"q\\\"\\\\\\/\\n\\u00e9\\ud83d\\ude00\","
      " \"o\": {\"x\": {}}, \"big\": 12345678901234567890, \"z\": -0} ");
  REQUIRE(v.kind == JsonValue::Kind::Object);
  const JsonValue& a = v.at("a");
  REQUIRE(a.items.size() == 5);
  CHECK(a.items[0].is_integer);
  CHECK(a.items[0].integer == 1);
  CHECK(a.items[1].number == -2500.0);
  CHECK_FALSE(a.items[1].is_integer);
  CHECK(a.items[2].boolean);
  CHECK(a.items[3].kind == JsonValue::Kind::Bool);
  CHECK(a.items[4].is_null());
  CHECK(v.at("s").string == "q\"\\/\n\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(v.at("o").at("x").kind == JsonValue::Kind::Object);
  CHECK_FALSE(v.at("big").is_integer);  // past int64: a double, and its text kept
  CHECK(v.at("big").number == 12345678901234567890.0);
  CHECK(v.find("missing") == nullptr);
  REQUIRE_THROWS_WITH(v.at("missing"), PLX_CONTAINS("no key \"missing\""));
  CHECK(parse_json("\"\\ud800x\"").string == "\xef\xbf\xbdx");  // lone surrogate
  // dump() writes back what was read, compact or indented.
  CHECK(parse_json(v.dump()).dump() == v.dump());
  CHECK(v.dump().find("12345678901234567890") != std::string::npos);
  CHECK(parse_json("{\"a\":[1,{\"b\":2}]}").dump(2) ==
        "{\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ]\n}");
}

TEST_CASE("malformed JSON is an error naming the source and byte", "[cpu][train]") {
  const auto bad = [](std::string_view text, const std::string& message) {
    INFO(text);
    REQUIRE_THROWS_AS(parse_json(text, "m.jsonl:3"), Error);
    REQUIRE_THROWS_WITH(parse_json(text, "m.jsonl:3"),
                        PLX_CONTAINS("m.jsonl:3: invalid JSON at byte") && PLX_CONTAINS(message));
  };
  bad("", "unexpected end of text");
  bad("{\"a\" 1}", "expected ':'");
  bad("{\"a\":1,}", "expected a string key");
  bad("[1 2]", "expected ',' or ']'");
  bad("\"abc", "unterminated string");
  bad("\"a\nb\"", "raw control character");
  bad("\"\\x\"", "unknown escape");
  bad("\"\\u12g4\"", "bad hex digit");
  bad("01", "unexpected text after the value");
  bad("1.", "digits expected after '.'");
  bad("-", "bad number");
  bad("nul", "expected a value");
  bad("NaN", "expected a value");
  bad("\"\xff\"", "invalid UTF-8");
  bad(std::string(300, '['), "nested deeper than");
}

// ---- metrics ----

TEST_CASE("metrics lines parse back with their strings and doubles intact", "[cpu][train]") {
  TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  const std::string tricky = "q\"uote back\\slash\nnew\ttab\x01 caf\xc3\xa9 \xf0\x9f\x98\x80";
  {
    MetricsWriter w(path);
    CHECK(w.path() == path);
    for (int step = 1; step <= 3; ++step) {
      JsonObject rec;
      rec.add("step", step).add("loss", 1.0 / step).add("note", tricky).add("ok", step != 2);
      w.write(rec);
    }
  }
  const std::string text = slurp(path);
  CHECK(count(text, "\n") == 3);
  CHECK(text.back() == '\n');
  std::vector<JsonValue> lines = read_json_lines(path);
  REQUIRE(lines.size() == 3);
  for (int step = 1; step <= 3; ++step) {
    const JsonValue& l = lines[static_cast<size_t>(step - 1)];
    CHECK(l.at("step").integer == step);
    CHECK(l.at("loss").number == 1.0 / step);
    CHECK(l.at("note").string == tricky);
    CHECK(l.at("ok").boolean == (step != 2));
  }

  // A second writer appends, as a resumed run does.
  {
    MetricsWriter w(path);
    MetricsWriter moved = std::move(w);
    moved.write(JsonObject().add("step", 4).add("loss", std::nan("")));
  }
  lines = read_json_lines(path);
  REQUIRE(lines.size() == 4);
  CHECK(lines[3].at("loss").is_null());

  // A run killed mid-line leaves a last line without its newline: skipped, not an error.
  std::ofstream(path, std::ios::app) << "{\"step\":5,\"lo";
  CHECK(read_json_lines(path).size() == 4);
}

TEST_CASE("a bad metrics line or path is an error naming the file", "[cpu][train]") {
  TempDir dir;
  const std::string path = dir / "m.jsonl";
  std::ofstream(path) << "{\"a\":1}\n\n{\"a\":}\n";
  REQUIRE_THROWS_WITH(read_json_lines(path), PLX_CONTAINS(path + ":3: invalid JSON"));
  REQUIRE_THROWS_WITH(read_json_lines(dir / "none.jsonl"),
                      PLX_CONTAINS("none.jsonl") && PLX_CONTAINS("No such file"));
  const std::string missing = dir / "no/dir/m.jsonl";
  REQUIRE_THROWS_WITH(MetricsWriter(missing),
                      PLX_CONTAINS(missing) && PLX_CONTAINS("No such file or directory"));
}

// ---- manifest ----

TEST_CASE("the manifest is written whole, indented, and replaces the old one", "[cpu][train]") {
  TempDir dir;
  const std::string path = dir / "manifest.json";
  JsonArray plugins;
  plugins.push(JsonObject().add("name", "cpu").add("version", "0.1.0"));
  JsonObject m;
  m.add("seed", std::numeric_limits<uint64_t>::max())
      .add("git_revision", git_revision())
      .add("plugins", plugins)
      .add_raw("config", "{\"model\": {\"name\": \"simple_cnn\"}}")
      .add("lr", 0.01);
  write_manifest(path, m);
  write_manifest(path, m.add("finished", true));
  const std::string text = slurp(path);
  CHECK(text.back() == '\n');
  CHECK(text.find("\n  \"seed\": 18446744073709551615,") != std::string::npos);
  const JsonValue v = parse_json(text, path);
  CHECK(v.at("seed").string == "18446744073709551615");
  CHECK(v.at("plugins").items.at(0).at("name").string == "cpu");
  CHECK(v.at("config").at("model").at("name").string == "simple_cnn");
  CHECK(v.at("lr").number == 0.01);
  CHECK(v.at("finished").boolean);
  CHECK(dir.entries() == std::set<std::string>{"manifest.json"});

  const std::string missing = dir / "gone/manifest.json";
  REQUIRE_THROWS_WITH(write_manifest(missing, m), PLX_CONTAINS("manifest '" + missing + "'") &&
                                                      PLX_CONTAINS("No such file or directory"));
  write_file_atomic(dir / "config.toml", "[model]\n", "resolved config");
  CHECK(slurp(dir / "config.toml") == "[model]\n");
  CHECK(dir.entries() == std::set<std::string>{"manifest.json", "config.toml"});
}

// ---- progress ----

namespace {
// Runs one epoch of `steps` steps of `dt` fake seconds and 32 images each, with loss going
// from 1 down and accuracy up.
void run_epoch(Progress& p, double& clock, int64_t steps, double dt) {
  p.start_epoch(2, 5, steps);
  for (int64_t s = 1; s <= steps; ++s) {
    clock += dt;
    p.update(s, 32 * s, 1.0 / static_cast<double>(s),
             0.5 + 0.4 * static_cast<double>(s) / static_cast<double>(steps));
  }
}
}  // namespace

TEST_CASE("format_duration and format_rate", "[cpu][train]") {
  CHECK(format_duration(0) == "0:00");
  CHECK(format_duration(5) == "0:05");
  CHECK(format_duration(59.6) == "1:00");
  CHECK(format_duration(65) == "1:05");
  CHECK(format_duration(3599) == "59:59");
  CHECK(format_duration(3723) == "1:02:03");
  CHECK(format_duration(100 * 3600 + 1) == "100:00:01");
  CHECK(format_duration(-1) == "--:--");
  CHECK(format_duration(std::nan("")) == "--:--");
  CHECK(format_duration(HUGE_VAL) == "--:--");
  CHECK(format_rate(4.254) == "4.25");
  CHECK(format_rate(42.54) == "42.5");
  CHECK(format_rate(2345.4) == "2345");
  CHECK(format_rate(12345) == "12.3k");
  CHECK(format_rate(1234567) == "1.23M");
  CHECK(format_rate(-1) == "-");
  CHECK(format_rate(std::nan("")) == "-");
}

TEST_CASE("plain progress prints whole lines at every tenth of the epoch", "[cpu][train]") {
  std::ostringstream os;
  double clock = 0;
  Progress p(os, ProgressMode::Plain, [&] { return clock; });
  CHECK(p.mode() == ProgressMode::Plain);
  run_epoch(p, clock, 100, 0.1);  // 320 img/s; 10 s per epoch
  p.end_epoch(
      {.train_loss = 0.25, .train_accuracy = 0.9, .test_loss = 0.3, .test_accuracy = 0.875});
  p.finish({.epochs = 5,
            .seconds = 3723,
            .images_per_s = 320.0,
            .test_loss = 0.3,
            .test_accuracy = 0.875});
  const std::string out = os.str();
  INFO(out);
  CHECK(out.find('\r') == std::string::npos);
  CHECK(count(out, "\n") == 10 + 2);  // 10%, 20%, ... 100%, the epoch line, the summary
  // Halfway: 50 steps of 0.1 s done, 50 to go: ETA 5 s.
  CHECK(out.find("epoch 2/5  50% 50/100 loss 0.0200 acc 70.00% 320 img/s ETA 0:05\n") !=
        std::string::npos);
  CHECK(out.find("epoch 2/5  10% 10/100 loss 0.1000 acc 54.00% 320 img/s ETA 0:09\n") !=
        std::string::npos);
  CHECK(out.find("epoch 2/5 100% 100/100 loss 0.0100 acc 90.00% 320 img/s ETA 0:00\n") !=
        std::string::npos);
  CHECK(out.find("epoch 2/5: train loss 0.2500 acc 90.00%, test loss 0.3000 acc 87.50%, 0:10, "
                 "320 img/s\n") != std::string::npos);
  CHECK(out.find("done: 5 epochs in 1:02:03 (320 img/s): test loss 0.3000 acc 87.50%\n") !=
        std::string::npos);
}

TEST_CASE("plain progress of a short epoch prints each boundary once", "[cpu][train]") {
  std::ostringstream os;
  double clock = 0;
  Progress p(os, ProgressMode::Plain, [&] { return clock; });
  run_epoch(p, clock, 3, 1.0);
  CHECK(count(os.str(), "\n") == 3);
  CHECK(os.str().find("100% 3/3") != std::string::npos);
  std::ostringstream os2;
  Progress p2(os2, ProgressMode::Plain, [&] { return clock; });
  run_epoch(p2, clock, 1000, 0.001);
  CHECK(count(os2.str(), "\n") == 10);
}

TEST_CASE("bar progress redraws one line with carriage returns, about ten times a second",
          "[cpu][train]") {
  std::ostringstream os;
  double clock = 0;
  Progress p(os, ProgressMode::Bar, [&] { return clock; });
  run_epoch(p, clock, 1000, 0.002);  // 2 fake seconds: ~20 redraws, not 1000
  const std::string bar = os.str();
  INFO(bar);
  const size_t draws = count(bar, "\r");
  CHECK(draws >= 15);
  CHECK(draws <= 25);
  CHECK(bar.find('\n') == std::string::npos);
  CHECK(bar.find("epoch 2/5 [========================] 100% 1000/1000") != std::string::npos);
  CHECK(bar.find("ETA 0:00") != std::string::npos);
  p.note("saved checkpoint last.ckpt");
  p.end_epoch({.train_loss = 0.1, .train_accuracy = 0.99, .seconds = 2.4, .images_per_s = 12800});
  const std::string out = os.str();
  CHECK(out.find("\rsaved checkpoint last.ckpt") != std::string::npos);
  CHECK(out.find("\repoch 2/5: train loss 0.1000 acc 99.00%, 0:02, 12.8k img/s") !=
        std::string::npos);
  CHECK(out.back() == '\n');
}

TEST_CASE("no progress prints nothing", "[cpu][train]") {
  std::ostringstream os;
  double clock = 0;
  Progress p(os, ProgressMode::None, [&] { return clock; });
  run_epoch(p, clock, 100, 0.1);
  p.note("x");
  p.end_epoch({.train_loss = 1, .train_accuracy = 0.5});
  p.finish({.epochs = 1, .seconds = 1});
  CHECK(os.str().empty());
}

TEST_CASE("auto progress is a bar only on a terminal", "[cpu][train]") {
  const char* term = std::getenv("TERM");
  const bool tty = ::isatty(::fileno(stdout)) && !(term && std::string(term) == "dumb");
  CHECK(resolve_progress_mode(ProgressMode::Auto) ==
        (tty ? ProgressMode::Bar : ProgressMode::Plain));
  std::ostringstream os;
  CHECK(Progress(os, ProgressMode::Auto).mode() != ProgressMode::Auto);
  CHECK(resolve_progress_mode(ProgressMode::None) == ProgressMode::None);
}

// ---- git revision ----

namespace {
// The trimmed output of a shell command, or nullopt when it fails.
std::optional<std::string> run(const std::string& cmd) {
  FILE* f = ::popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!f) return std::nullopt;
  std::string out;
  char buf[256];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  if (::pclose(f) != 0) return std::nullopt;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}
}  // namespace

TEST_CASE("git_revision is the source tree's commit or unknown", "[cpu][train]") {
  const std::string rev = git_revision();
  INFO(rev);
  REQUIRE_FALSE(rev.empty());
  const std::string src = PLEXUS_SOURCE_DIR;
  const auto top = run("git -C '" + src + "' rev-parse --show-toplevel");
  const auto head = run("git -C '" + src + "' rev-parse HEAD");
  if (!top || !head || fs::weakly_canonical(*top) != fs::weakly_canonical(src)) {
    CHECK(rev == "unknown");
    return;
  }
  // The build's short hash is a prefix of HEAD's full hash, optionally followed by -dirty.
  std::string hash = rev;
  if (hash.size() > 6 && hash.ends_with("-dirty")) hash.resize(hash.size() - 6);
  CHECK(hash.size() >= 7);
  CHECK(head->starts_with(hash));
}
