// engine/core/env: the environment switches' values, and the warning for any other.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/core/env.h"
#include "engine/core/log.h"

namespace latent {
namespace {

std::vector<std::string>* g_warnings = nullptr;

void capture(LogLevel level, const char*, int, const char* message, void*) {
  if (g_warnings && level == LogLevel::kWarning) g_warnings->push_back(message);
}

class EnvChoice : public ::testing::Test {
 protected:
  void SetUp() override {
    g_warnings = &warnings_;
    set_log_callback(capture, nullptr);
  }
  void TearDown() override {
    unsetenv("LATENT_TEST_SWITCH");
    set_log_callback(nullptr, nullptr);
    g_warnings = nullptr;
  }
  int choose(const char* value) {
    if (value)
      setenv("LATENT_TEST_SWITCH", value, 1);
    else
      unsetenv("LATENT_TEST_SWITCH");
    return env_choice("LATENT_TEST_SWITCH", {{"on", "1"}, {"off", "0"}, {"precompiled"}}, 0);
  }
  std::vector<std::string> warnings_;
};

TEST_F(EnvChoice, EachSpellingSelectsItsChoice) {
  EXPECT_EQ(choose("on"), 0);
  EXPECT_EQ(choose("1"), 0);
  EXPECT_EQ(choose("off"), 1);
  EXPECT_EQ(choose("0"), 1);
  EXPECT_EQ(choose("precompiled"), 2);
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(EnvChoice, UnsetOrEmptyIsTheFallbackWithoutAWord) {
  EXPECT_EQ(choose(nullptr), 0);
  EXPECT_EQ(choose(""), 0);
  EXPECT_TRUE(warnings_.empty());
}

// Any other value (case and spaces count) is the fallback, with a warning naming the variable,
// the value, the choices and what is used.
TEST_F(EnvChoice, AnyOtherValueWarnsAndFallsBack) {
  for (const char* bad : {"On", "off ", "2", "yes", "precompile"}) {
    warnings_.clear();
    EXPECT_EQ(choose(bad), 0) << bad;
    ASSERT_EQ(warnings_.size(), 1u) << bad;
    EXPECT_EQ(warnings_[0], std::string("LATENT_TEST_SWITCH=") + bad +
                                " is not one of on, off, precompiled: using on");
  }
  setenv("LATENT_TEST_SWITCH", "x", 1);
  warnings_.clear();
  EXPECT_EQ(env_choice("LATENT_TEST_SWITCH", {{"heuristic"}, {"timed", "exhaustive"}}, 1), 1);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_EQ(warnings_[0], "LATENT_TEST_SWITCH=x is not one of heuristic, timed: using timed");
}

// A switch read on every call (the attention's) warns once a process for each value, not on
// every call; another wrong value is said again.
TEST_F(EnvChoice, EachWrongValueIsSaidOnce) {
  for (int i = 0; i < 3; ++i) EXPECT_EQ(choose("twice"), 0);
  EXPECT_EQ(warnings_.size(), 1u);
  EXPECT_EQ(choose("thrice"), 0);
  EXPECT_EQ(choose("thrice"), 0);
  ASSERT_EQ(warnings_.size(), 2u);
  EXPECT_EQ(warnings_[1], "LATENT_TEST_SWITCH=thrice is not one of on, off, precompiled: using on");
  EXPECT_EQ(choose("off"), 1);  // a right value after them
}

}  // namespace
}  // namespace latent
