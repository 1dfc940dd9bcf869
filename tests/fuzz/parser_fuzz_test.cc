// Drives LLVMFuzzerTestOneInput (parser_fuzz.cc) without libFuzzer (g++ has none): seeded random
// byte mutations, splices and truncations of a small corpus of valid inputs. The bound keeps CI
// short; WARDEN_PARSER_FUZZ_ITERATIONS=N runs longer.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

const std::vector<std::string>& Corpus() {
  static auto* corpus = new std::vector<std::string>{
      "recompiles", "recompiles,graph", "all", "guards,output_code,,", "-recompiles,+graph",
      R"({"context": {"date": "2026", "host_name": "h", "num_cpus": 2, "library_build_type": "release"},
          "benchmarks": [
            {"name": "pointwise/chain10_16/eager", "run_type": "iteration", "real_time": 14.0,
             "cpu_time": 13.0, "time_unit": "us", "iterations": 100},
            {"name": "pointwise/chain10_16/cpp", "run_type": "iteration", "real_time": 0.7,
             "cpu_time": 0.7, "time_unit": "us", "iterations": 100, "compiles": 1},
            {"name": "mlp/b8/aten/real_time/threads:2", "run_type": "aggregate", "aggregate_name": "median",
             "real_time": 5.0, "cpu_time": 9.0, "time_unit": "ms", "iterations": 3}]})",
      R"({"benchmarks": []})", R"({"benchmarks": [{"name": 3}]})", "[1, 2, {\"a\": null}]"};
  static bool loaded = false;
  if (!loaded) {
    loaded = true;
    // The start of a real WARDEN_TRACE_DIR file (tests/tools/testdata), whole and cut.
    std::ifstream in("tests/fuzz/testdata/trace_seed.jsonl");
    std::stringstream text;
    text << in.rdbuf();
    const std::string trace = text.str();
    EXPECT_FALSE(trace.empty()) << "testdata not found";
    corpus->push_back(trace);
    corpus->push_back(trace.substr(0, trace.size() / 3));
  }
  return *corpus;
}

std::string Mutate(std::string s, std::mt19937_64& rng) {
  const std::vector<std::string>& corpus = Corpus();
  const int n = 1 + static_cast<int>(rng() % 6);
  for (int i = 0; i < n; ++i) {
    const size_t pos = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 7) {
      case 0: if (!s.empty()) s[pos] = static_cast<char>(rng()); break;                 // flip a byte
      case 1: s.insert(pos, 1, "{}[]\",:0123456789.-e\\ntruefalsnul"[rng() % 33]); break;  // insert
      case 2: if (!s.empty()) s.erase(pos, 1 + rng() % 8); break;                          // delete
      case 3: s = s.substr(0, pos); break;                                                 // truncate
      case 4: { const std::string& o = corpus[rng() % corpus.size()];                      // splice
                s.insert(pos, o.substr(rng() % (o.size() + 1))); break; }
      case 5: s.insert(pos, std::string(1 + rng() % 64, static_cast<char>(rng() % 2 ? '[' : '{'))); break;
      case 6: s.insert(pos, "1e999"); break;                                               // overflow
    }
  }
  return s;
}

TEST(ParserFuzz, RandomMutationsNeverCrash) {
  const char* env = std::getenv("WARDEN_PARSER_FUZZ_ITERATIONS");
  const int64_t iterations = env != nullptr ? std::atoll(env) : 5000;
  std::mt19937_64 rng(12345);
  for (const std::string& s : Corpus()) LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  for (int64_t i = 0; i < iterations; ++i) {
    const std::string s = Mutate(Corpus()[rng() % Corpus().size()], rng);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  SUCCEED() << iterations << " inputs";
}

}  // namespace
