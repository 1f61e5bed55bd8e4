// Replays the conformance vectors (tests/vectors/*.json, written by
// generate.py and reviewed in the diff) through the native C ABI
// (hosts/common/chstate.h) and requires every output document byte for byte.
// The WebAssembly build replays the same files (tests/wasi) in wasmtime and
// Node; together they show that both builds of the core answer identically.
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "hosts/common/chstate.h"

namespace {

using json = nlohmann::json;

constexpr const char* kFiles[] = {"config", "sql", "lock", "policy"};

struct Case {
  std::string file;
  json body;
  std::string random;  // bytes passed to every start/feed
  std::string label;   // file_name, for gtest
};

// gtest prints a failing parameter with this (not as raw bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// How every runner serialises an input document: compact, UTF-8.
std::string Compact(const json& doc) { return doc.dump(-1, ' ', false, json::error_handler_t::strict); }

std::vector<Case> LoadCases() {
  std::vector<Case> cases;
  for (const char* file : kFiles) {
    std::string text = ReadFile(std::string("tests/vectors/") + file + ".json");
    json doc = json::parse(text, nullptr, false);
    if (doc.is_discarded()) {
      cases.push_back({file, json(), "", std::string(file) + "_unreadable"});
      continue;
    }
    std::string random = Unhex(doc.value("random_hex", ""));
    for (const json& c : doc["cases"]) {
      cases.push_back({file, c, random, std::string(file) + "_" + c["name"].get<std::string>()});
    }
  }
  return cases;
}

class VectorsTest : public testing::TestWithParam<Case> {};

TEST_P(VectorsTest, NativeOutputIsByteIdentical) {
  const Case& c = GetParam();
  ASSERT_FALSE(c.body.is_null()) << "tests/vectors/" << c.file << ".json is missing or not JSON";
  ASSERT_TRUE(c.body.contains("steps") && !c.body["steps"].empty());
  chstate_store* store = nullptr;
  if (c.body.contains("store")) {
    char* err = nullptr;
    store = chstate_store_new(Compact(c.body["store"]).c_str(), &err);
    ASSERT_NE(store, nullptr) << (err ? err : "");
  }
  const auto* random = reinterpret_cast<const unsigned char*>(c.random.data());
  int index = 0;
  for (const json& step : c.body["steps"]) {
    std::string call = step["call"];
    std::string input = Compact(step["doc"]);
    char* out = nullptr;
    if (call == "resolve_settings") {
      out = chstate_resolve_settings(input.c_str());
    } else if (call == "start") {
      out = chstate_op_start(store, input.c_str(), step["now_ms"].get<int64_t>(), random, c.random.size());
    } else if (call == "feed") {
      out = chstate_op_feed(store, input.c_str(), step["now_ms"].get<int64_t>(), random, c.random.size());
    }
    ASSERT_NE(out, nullptr) << "step " << index << ": unknown call " << call;
    std::string got(out);
    chstate_string_free(out);
    EXPECT_EQ(got, step["expect"].get<std::string>())
        << "step " << index << " (" << call << " " << input << "). If the core's output changed on purpose, run "
        << "`python3 tests/vectors/generate.py` and review the diff of tests/vectors/*.json";
    ++index;
  }
  chstate_store_free(store);
}

INSTANTIATE_TEST_SUITE_P(Vectors, VectorsTest, testing::ValuesIn(LoadCases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.label; });

// The files are the contract: a runner that silently found no cases would pass.
TEST(VectorFilesTest, EveryFileHasCases) {
  for (const char* file : kFiles) {
    json doc = json::parse(ReadFile(std::string("tests/vectors/") + file + ".json"), nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << file;
    EXPECT_GE(doc["cases"].size(), 8u) << file;
  }
}

}  // namespace
