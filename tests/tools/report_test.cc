// tools/report_lib (`warden report`, `warden explain`): the text report of a fixed trace
// (testdata/report_trace.jsonl: a static function whose float and batch size change until the
// cache limit, and an untraceable one) against a golden file; suggestions; the HTML page's
// sections and escaping; Graphviz source of a graph; explain of a saved explain_json() document
// prints what explain() prints. To update the golden after an intended change:
//   bazel run //tools:warden -- report --text tests/tools/testdata/report_trace.jsonl \
//     > tests/tools/testdata/report_expected.txt
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/warden.h"
#include "tools/report_lib.h"

namespace warden::report {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kDir = "tests/tools/testdata/";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Trace Fixture() {
  auto trace = LoadTrace(std::string(kDir) + "report_trace.jsonl");
  EXPECT_TRUE(trace.ok()) << trace.status();
  return trace.ok() ? *trace : Trace{};
}

TEST(Report, TextMatchesTheGolden) {
  EXPECT_EQ(TextReport(Fixture()), ReadFile(std::string(kDir) + "report_expected.txt"));
}

TEST(Report, SuggestionsFollowFromTheReasons) {
  const Trace trace = Fixture();
  ASSERT_EQ(trace.functions.size(), 2u);
  const std::vector<std::string> s = Suggestions(trace.functions[0]);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_THAT(s[0], HasSubstr("arg1 is a float that changed 2 times"));
  EXPECT_THAT(s[0], HasSubstr("pass it as a 0-dim tensor, or mark_dynamic(1, 0)"));
  EXPECT_THAT(s[1], HasSubstr("arg0.size(0) changed 2 times (4, 5): mark_dynamic(0, 0)"));
  EXPECT_THAT(s[2], HasSubstr("cache_size_limit (3) hit at call 4"));
  EXPECT_THAT(Suggestions(trace.functions[1])[0], HasSubstr("runs eagerly from call 0"));
}

TEST(Report, TimelineCountsTheCallsBetweenMisses) {
  const std::vector<TimelineRow> rows = Timeline(Fixture().functions[0]);
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0].kind, "compile");
  EXPECT_EQ(rows[1].kind, "hits");
  EXPECT_EQ(rows[1].first_call, 1);
  EXPECT_EQ(rows[2].kind, "recompile");
  EXPECT_EQ(rows[2].entry, "0/1");
  EXPECT_EQ(rows[4].kind, "cache limit");
}

TEST(Report, MissingDirectoryAndBadLinesAreReported) {
  EXPECT_FALSE(LoadTrace("/nonexistent/warden-trace").ok());
  const Trace t = ParseTrace({{"x.jsonl", "{\"event\":\"trace_start\"}\nnot json\n"}});
  EXPECT_EQ(t.num_events, 1);
  ASSERT_EQ(t.notes.size(), 1u);
  EXPECT_THAT(t.notes[0], HasSubstr("x.jsonl:2: not a JSON object"));
}

TEST(Report, HtmlHasTheSectionsAndEscapes) {
  const std::string html = HtmlReport(Fixture(), /*dot=*/"");
  for (const char* heading : {"<h1>Warden report</h1>", "<h3>Suggestions</h3>", "<h3>Timeline</h3>",
                              "<h3>Recompiles</h3>", "<h3>Cache entries</h3>", "<svg class=\"timeline\""}) {
    EXPECT_THAT(html, HasSubstr(heading));
  }
  EXPECT_THAT(html, HasSubstr("function 'scaled' (id 0, pid 4242)"));
  EXPECT_THAT(html, HasSubstr("arg1 is a float that changed 2 times"));
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("src=\"http")));  // self-contained
  const Trace odd = ParseTrace({{"t.jsonl", R"({"event":"function","fn":"<b>&","fn_id":0,"pid":1})"}});
  EXPECT_THAT(HtmlReport(odd, ""), HasSubstr("function '&lt;b&gt;&amp;' (id 0, pid 1)"));
}

TEST(Report, GraphDotHasANodePerValueAndTheEdges) {
  const std::string dot = GraphDot(
      "graph(%x: f32[3, 4], %y: f32[3, 4]):\n"
      "  %0 = aten::add.Tensor(%x, %y, 1) : f32[3, 4]\n"
      "  %1 = aten::relu(%0) : f32[3, 4]\n"
      "  return (%1)\n");
  EXPECT_THAT(dot, HasSubstr("n0 [label=\"%x: f32[3, 4]\""));
  EXPECT_THAT(dot, HasSubstr("n2 [label=\"%0 = aten::add.Tensor\nf32[3, 4]\"]"));
  EXPECT_THAT(dot, HasSubstr("n0 -> n2;"));
  EXPECT_THAT(dot, HasSubstr("n1 -> n2;"));
  EXPECT_THAT(dot, HasSubstr("n2 -> n3;"));
  EXPECT_THAT(dot, HasSubstr("n3 -> n4;"));  // %1 -> return
}

TEST(Explain, SavedJsonPrintsWhatExplainPrints) {
  Options o;
  o.name = "scaled_add";
  o.backend = "aten";
  o.dynamic = Dynamic::kStatic;
  CompiledFunction f = compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        return {torch::relu(a[0].toTensor() + a[1].toTensor()) * 3};
      },
      o);
  f({torch::ones({3, 4}), torch::ones({3, 4})});
  f({torch::ones({3, 4}), torch::ones({3, 4})});
  f({torch::ones({5, 4}), torch::ones({5, 4})});
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/explain.json";
  std::ofstream(path) << f.explain_json();
  auto text = ExplainText(ReadFile(path));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, f.explain());
}

TEST(Explain, RejectsWhatIsNotAnExplainDocument) {
  auto text = ExplainText("[1, 2]");
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(std::string(text.status().message()), HasSubstr("not an explain_json() document"));
  EXPECT_FALSE(ExplainText("{").ok());
}

}  // namespace
}  // namespace warden::report
