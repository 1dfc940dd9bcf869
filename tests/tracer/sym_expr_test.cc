#include "tracer/sym_expr.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace warden::tracer {
namespace {

const SymExpr s0 = SymExpr::Symbol(0), s1 = SymExpr::Symbol(1), s2 = SymExpr::Symbol(2);

TEST(SymExprTest, CanonicalFormMakesAlgebraicEqualityStructural) {
  EXPECT_EQ(s0 + s1, s1 + s0);
  EXPECT_EQ(s0 * s1, s1 * s0);
  EXPECT_EQ((s0 + 1) * (s0 + 1), s0 * s0 + 2 * s0 + 1);
  EXPECT_EQ(s0 - s0, SymExpr(0));
  EXPECT_NE(s0, s1);
  EXPECT_TRUE((s0 * 2 - s0 - s0).is_constant());
  EXPECT_EQ((s0 * 2 - s0 - s0).constant(), 0);
}

TEST(SymExprTest, ConstantsFold) {
  SymExpr e = SymExpr(3) * 4 + 2;
  EXPECT_TRUE(e.is_constant());
  EXPECT_EQ(e.constant(), 14);
  EXPECT_EQ(e.ToString(), "14");
  EXPECT_EQ(SymExpr().ToString(), "0");
}

TEST(SymExprTest, AsSymbolOnlyForBareSymbols) {
  EXPECT_EQ(s1.as_symbol(), 1);
  EXPECT_FALSE((s1 * 2).as_symbol().has_value());
  EXPECT_FALSE((s1 + 1).as_symbol().has_value());
  EXPECT_FALSE(SymExpr(5).as_symbol().has_value());
}

TEST(SymExprTest, ExactDivision) {
  EXPECT_EQ(SymExpr::ExactDiv(s0 * s1 * 4, s1 * 2), s0 * 2);
  EXPECT_EQ(SymExpr::ExactDiv(s0 * 6 + 3, SymExpr(3)), s0 * 2 + 1);
  EXPECT_EQ(SymExpr::ExactDiv(s0 + s1, s0 + s1), SymExpr(1));
  EXPECT_FALSE(SymExpr::ExactDiv(s0 * 3, SymExpr(2)).has_value());
  EXPECT_FALSE(SymExpr::ExactDiv(s0 * s1, s2).has_value());
  EXPECT_FALSE(SymExpr::ExactDiv(s0 + 1, s0).has_value());
}

TEST(SymExprTest, SubstituteAndEvaluate) {
  SymExpr e = s0 * s1 + s2 * 3 - 1;
  EXPECT_EQ(e.Substitute(1, SymExpr(4)), s0 * 4 + s2 * 3 - 1);
  EXPECT_EQ(e.Substitute(2, s0), s0 * s1 + s0 * 3 - 1);
  const int64_t values[] = {5, 7, 2};
  EXPECT_EQ(e.Evaluate(values), 5 * 7 + 2 * 3 - 1);
  EXPECT_EQ(e.symbols(), (std::vector<int>{0, 1, 2}));
}

// Map replaces every symbol at once: swapping s0 and s1 is not two substitutions that clash
// (size leaves map to size symbols this way, Note [Symbolic sizes]).
TEST(SymExprTest, MapReplacesAllSymbolsAtOnce) {
  SymExpr e = s0 * s0 * 2 + s1 * 3 + 5;
  EXPECT_EQ(e.Map([](int k) { return SymExpr::Symbol(1 - k); }), s1 * s1 * 2 + s0 * 3 + 5);
  EXPECT_EQ(e.Map([](int k) { return k == 0 ? s2 * 4 : SymExpr(7); }), s2 * s2 * 32 + 26);
  EXPECT_EQ(SymExpr(9).Map([](int) { return s0; }), SymExpr(9));
}

TEST(SymExprTest, PrintsHighestDegreeFirstWithNames) {
  EXPECT_EQ((s0 * s1 + s0 * 2 + 1).ToString(), "s0*s1 + 2*s0 + 1");
  EXPECT_EQ((s1 - s0 * 3).ToString(), "-3*s0 + s1");
  auto name = [](int id) { return std::string(id == 0 ? "arg0.size(0)" : "arg1.size(1)"); };
  EXPECT_EQ((s0 * s1).ToString(name), "arg0.size(0)*arg1.size(1)");
  EXPECT_EQ(SymShapeString({s0, SymExpr(4), s0 + s1}), "[s0, 4, s0 + s1]");
}

// More cases: canonical form, exact division edge cases, lower bounds, printing.

TEST(SymExprMore, ConstantsAndSymbols) {
  EXPECT_TRUE(SymExpr().is_constant());
  EXPECT_EQ(SymExpr().constant(), 0);
  EXPECT_TRUE(SymExpr(7).is_constant());
  EXPECT_EQ(SymExpr(7).constant(), 7);
  EXPECT_EQ(SymExpr(0), SymExpr());
  EXPECT_FALSE(s0.is_constant());
  EXPECT_EQ(s0.as_symbol(), 0);
  EXPECT_EQ(s1.as_symbol(), 1);
  EXPECT_EQ((s0 * 2).as_symbol(), std::nullopt);
  EXPECT_EQ((s0 + 1).as_symbol(), std::nullopt);
  EXPECT_EQ(SymExpr(1).as_symbol(), std::nullopt);
  EXPECT_EQ((s0 + 3).constant(), 3) << "the constant term";
}

TEST(SymExprMore, CanonicalFormMakesAlgebraicEqualityStructural) {
  EXPECT_EQ(s0 + s1, s1 + s0);
  EXPECT_EQ(s0 * s1, s1 * s0);
  EXPECT_EQ((s0 + 1) * (s0 + 1), s0 * s0 + s0 * 2 + 1);
  EXPECT_EQ((s0 + s1) - s1, s0);
  EXPECT_EQ(s0 - s0, SymExpr(0));
  EXPECT_TRUE((s0 * s1 - s1 * s0).is_constant());
  EXPECT_EQ(-(s0 - 2), SymExpr(2) - s0);
  EXPECT_NE(s0, s1);
  EXPECT_NE(s0 * s0, s0 * 2);
  SymExpr acc = s0;
  acc += 4;
  acc *= s1;
  EXPECT_EQ(acc, s0 * s1 + s1 * 4);
}

TEST(SymExprMore, SymbolsAreSortedAndUnique) {
  EXPECT_THAT((s2 * s2 + s0 * s2 + 5).symbols(), ::testing::ElementsAre(0, 2));
  EXPECT_TRUE(SymExpr(3).symbols().empty());
  EXPECT_TRUE((s1 - s1).symbols().empty());
}

TEST(SymExprMore, ExactDivision) {
  EXPECT_EQ(SymExpr::ExactDiv(s0 * 6 + 4, 2), s0 * 3 + 2);
  EXPECT_EQ(SymExpr::ExactDiv(s0 * s1 + s0 * 3, s0), s1 + 3);
  EXPECT_EQ(SymExpr::ExactDiv(s0 * s1 * 4, s1 * 2), s0 * 2);
  EXPECT_EQ(SymExpr::ExactDiv(s0 * s0, s0), s0);
  EXPECT_EQ(SymExpr::ExactDiv(s0 + 1, s0 + 1), SymExpr(1)) << "a polynomial divides itself";
  EXPECT_EQ(SymExpr::ExactDiv(SymExpr(0), s0), SymExpr(0));
  EXPECT_EQ(SymExpr::ExactDiv(SymExpr(-6), -3), SymExpr(2));
  EXPECT_EQ(SymExpr::ExactDiv(s0 * 3 + 1, 3), std::nullopt) << "not exact for every s0";
  EXPECT_EQ(SymExpr::ExactDiv(s0 + 1, s0), std::nullopt);
  EXPECT_EQ(SymExpr::ExactDiv(s0, s1), std::nullopt);
  EXPECT_EQ(SymExpr::ExactDiv(SymExpr(7), 2), std::nullopt);
  EXPECT_EQ(SymExpr::ExactDiv(s0 * 2 + 2, s0 + 1), std::nullopt) << "only monomial divisors";
  EXPECT_EQ(SymExpr::ExactDiv(s0, SymExpr(0)), std::nullopt) << "division by zero";
}

TEST(SymExprMore, SubstituteAndEvaluate) {
  const SymExpr e = s0 * s1 + s0 * 2 - 3;
  EXPECT_EQ(e.Substitute(1, SymExpr(4)), s0 * 6 - 3);
  EXPECT_EQ(e.Substitute(0, s1 + 1), s1 * s1 + s1 * 3 - 1);
  EXPECT_EQ(e.Substitute(2, SymExpr(100)), e) << "absent symbol";
  EXPECT_EQ(s0.Substitute(0, s2), s2);
  const int64_t values[] = {5, 7, 11};
  EXPECT_EQ(e.Evaluate(values), 5 * 7 + 10 - 3);
  EXPECT_EQ(SymExpr(-4).Evaluate(values), -4);
  EXPECT_EQ(SymExpr().Evaluate(values), 0);
  EXPECT_EQ((s2 * s2 - s0).Evaluate(values), 121 - 5);
  // Evaluate agrees with substituting every symbol.
  SymExpr folded = e;
  for (int k = 0; k < 3; ++k) folded = folded.Substitute(k, SymExpr(values[k]));
  ASSERT_TRUE(folded.is_constant());
  EXPECT_EQ(folded.constant(), e.Evaluate(values));
}

TEST(SymExprMore, LowerBound) {
  EXPECT_EQ((s0 * s1 + 2).LowerBound(2), 6);
  EXPECT_EQ((s0 * 3).LowerBound(2), 6);
  EXPECT_EQ((s0 + s1 - 1).LowerBound(2), 3) << "a negative constant is fine";
  EXPECT_EQ(SymExpr(-5).LowerBound(2), -5);
  EXPECT_EQ((s0 * s0).LowerBound(0), 0);
  EXPECT_EQ((s0 - s1).LowerBound(2), std::nullopt) << "not monotone";
  EXPECT_EQ((SymExpr(10) - s0).LowerBound(2), std::nullopt);
}

TEST(SymExprMore, ToString) {
  EXPECT_EQ(SymExpr().ToString(), "0");
  EXPECT_EQ(SymExpr(-3).ToString(), "-3");
  EXPECT_EQ(s0.ToString(), "s0");
  EXPECT_EQ((s0 * s1 + s0 * 2 + 1).ToString(), "s0*s1 + 2*s0 + 1");
  EXPECT_EQ((s0 - 1).ToString(), "s0 - 1");
  EXPECT_EQ((SymExpr(2) - s0).ToString(), "-s0 + 2");
  EXPECT_EQ((s0 * -2 - s1 * 3).ToString(), "-2*s0 - 3*s1");
  EXPECT_EQ((s1 * s1).ToString(), "s1*s1");
  auto name = [](int k) { return "arg" + std::to_string(k) + ".size(0)"; };
  EXPECT_EQ((s0 + s1).ToString(name), "arg0.size(0) + arg1.size(0)");
  EXPECT_EQ(SymShapeString({s0, SymExpr(4), s1 * 2}), "[s0, 4, 2*s1]");
  EXPECT_EQ(SymShapeString({}), "[]");
  EXPECT_EQ(SymShapeString({s1}, name), "[arg1.size(0)]");
}

}  // namespace
}  // namespace warden::tracer
