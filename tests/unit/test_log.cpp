// engine/core/log: LATENT_LOG's values.
#include <gtest/gtest.h>

#include "engine/core/log.h"

namespace latent {
namespace {

TEST(Log, ParsesNumbersAndNames) {
  EXPECT_EQ(parse_log_level("0"), 0);
  EXPECT_EQ(parse_log_level("4"), 4);
  EXPECT_EQ(parse_log_level("9"), 9);
  EXPECT_EQ(parse_log_level("none"), 0);
  EXPECT_EQ(parse_log_level("error"), 1);
  EXPECT_EQ(parse_log_level("warn"), 2);
  EXPECT_EQ(parse_log_level("WARNING"), 2);
  EXPECT_EQ(parse_log_level("info"), 4);
  EXPECT_EQ(parse_log_level("Debug"), 5);
  EXPECT_EQ(parse_log_level("trace"), 6);
}

// Anything else is refused (the caller keeps warnings and errors and says so): `info` once
// parsed as 0 and silenced every error.
TEST(Log, RefusesOtherValues) {
  for (const char* bad : {"", "verbose", "4x", "-1", "10", " 4", "inf", "0x4"})
    EXPECT_FALSE(parse_log_level(bad).has_value()) << "'" << bad << "'";
  EXPECT_FALSE(parse_log_level(nullptr).has_value());
}

}  // namespace
}  // namespace latent
