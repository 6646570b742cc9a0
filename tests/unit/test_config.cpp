// config.json access: values, defaults, and messages naming file, key and position.
#include <gtest/gtest.h>

#include <fstream>

#include "engine/weights/config.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

::testing::AssertionResult has_substr(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = test::temp_dir() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

const char* kVaeConfig = R"({
  "_class_name": "AutoencoderKL",
  "_diffusers_version": "0.30.0",
  "act_fn": "silu",
  "block_out_channels": [128, 256, 512, 512],
  "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
  "force_upcast": true,
  "in_channels": 3,
  "latent_channels": 16,
  "latents_mean": null,
  "layers_per_block": 2.0,
  "sample_size": 1024,
  "scaling_factor": 0.3611,
  "shift_factor": 0.1159,
  "use_quant_conv": false,
  "big": 9223372036854775807,
  "means": [0.5, -1, 2e-3]
})";

TEST(Config, LoadsAndReadsEveryType) {
  const std::string path = write_file("vae_config.json", kVaeConfig);
  auto cfg = Config::load(path);
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  EXPECT_EQ(cfg->path(), path);
  EXPECT_EQ(cfg->class_name(), "AutoencoderKL");
  EXPECT_TRUE(cfg->has("latent_channels"));
  EXPECT_FALSE(cfg->has("nope"));
  EXPECT_FALSE(cfg->has("latents_mean"));  // null reads as absent

  EXPECT_EQ(cfg->get_int("latent_channels", 4).value(), 16);
  EXPECT_EQ(cfg->get_int("absent", 4).value(), 4);
  EXPECT_EQ(cfg->get_int("layers_per_block", 1).value(), 2);  // 2.0 is integral
  EXPECT_EQ(cfg->get_int("big", 0).value(), INT64_MAX);
  EXPECT_EQ(cfg->require_int("in_channels").value(), 3);
  EXPECT_DOUBLE_EQ(cfg->get_float("scaling_factor", 1.0).value(), 0.3611);
  EXPECT_DOUBLE_EQ(cfg->get_float("in_channels", 1.0).value(), 3.0);  // ints are numbers
  EXPECT_DOUBLE_EQ(cfg->get_float("latents_mean", 7.5).value(), 7.5);
  EXPECT_TRUE(cfg->get_bool("force_upcast", false).value());
  EXPECT_FALSE(cfg->get_bool("use_quant_conv", true).value());
  EXPECT_EQ(cfg->get_string("act_fn", "relu").value(), "silu");
  EXPECT_EQ(cfg->get_string("absent", "relu").value(), "relu");
  EXPECT_EQ(cfg->get_int_list("block_out_channels", {}).value(),
            (std::vector<int64_t>{128, 256, 512, 512}));
  EXPECT_EQ(cfg->get_int_list("absent", {1, 2}).value(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(cfg->get_float_list("means", {}).value(), (std::vector<double>{0.5, -1, 2e-3}));
  EXPECT_EQ(cfg->get_string_list("down_block_types", {}).value(),
            (std::vector<std::string>{"DownEncoderBlock2D", "DownEncoderBlock2D"}));
}

TEST(Config, DefaultConstructedIsEmpty) {
  Config cfg;
  EXPECT_EQ(cfg.class_name(), "");
  EXPECT_EQ(cfg.get_int("x", 5).value(), 5);
  auto r = cfg.require_int("x");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has_substr(r.status().message(), "'x'"));
}

TEST(ConfigBad, MissingFile) {
  const std::string path = test::temp_dir() + "/no_config.json";
  auto cfg = Config::load(path);
  ASSERT_FALSE(cfg.ok());
  EXPECT_TRUE(has_substr(cfg.status().message(), path));
  EXPECT_TRUE(has_substr(cfg.status().message(), "No such file"));
}

TEST(ConfigBad, FolderInsteadOfFile) {
  auto cfg = Config::load(test::temp_dir());
  ASSERT_FALSE(cfg.ok());
  EXPECT_TRUE(has_substr(cfg.status().message(), test::temp_dir() + ": it is a folder"));
}

TEST(ConfigBad, SyntaxErrorGivesLineAndColumn) {
  const std::string path = write_file("syntax.json", "{\n  \"a\": 1,\n  \"b\": [1, 2,, 3]\n}\n");
  auto cfg = Config::load(path);
  ASSERT_FALSE(cfg.ok());
  // Line 3, column 14 is the second comma.
  EXPECT_TRUE(has_substr(cfg.status().message(), path + ":3:14: invalid JSON"));
  EXPECT_TRUE(has_substr(cfg.status().message(), "unexpected ','"));
}

TEST(ConfigBad, TruncatedAndEmpty) {
  for (const char* text : {"", "{\"a\": ", "{\"a\": 1", "   "}) {
    auto cfg = Config::parse(text, "cfg.json");
    ASSERT_FALSE(cfg.ok()) << text;
    EXPECT_TRUE(has_substr(cfg.status().message(), "cfg.json:1:")) << text;
    EXPECT_TRUE(has_substr(cfg.status().message(), "invalid JSON")) << text;
  }
}

TEST(ConfigBad, NotAnObject) {
  for (const char* text : {"[1, 2]", "3", "\"vae\"", "null"}) {
    auto cfg = Config::parse(text, "cfg.json");
    ASSERT_FALSE(cfg.ok()) << text;
    EXPECT_TRUE(has_substr(cfg.status().message(), "cfg.json: a config must be a JSON object"));
  }
}

TEST(ConfigBad, WrongTypesNameFileKeyAndType) {
  auto cfg = Config::parse(R"({
    "i_str": "4", "i_frac": 4.5, "i_huge": 1e30, "i_u64": 18446744073709551615, "i_bool": true,
    "f_str": "0.5", "b_int": 1, "s_num": 3,
    "l_not_list": 5, "l_mixed": [1, 2, "three"], "l_frac": [1, 2.5],
    "fl_mixed": [1.0, null], "sl_mixed": ["a", 1]
  })",
                           "/models/vae/config.json");
  ASSERT_TRUE(cfg.ok());
  struct Case {
    Status status;
    const char* key;
    const char* expect;
  } cases[] = {
      {cfg->get_int("i_str", 0).status(), "'i_str'", "must be an int, found string \"4\""},
      {cfg->get_int("i_frac", 0).status(), "'i_frac'", "must be an int, found number 4.5"},
      {cfg->get_int("i_huge", 0).status(), "'i_huge'", "must be an int"},
      {cfg->get_int("i_u64", 0).status(), "'i_u64'", "must be an int"},
      {cfg->get_int("i_bool", 0).status(), "'i_bool'", "must be an int, found boolean"},
      {cfg->require_int("i_str").status(), "'i_str'", "must be an int"},
      {cfg->require_int("absent").status(), "'absent'", "missing required key"},
      {cfg->get_float("f_str", 0).status(), "'f_str'", "must be a number, found string"},
      {cfg->get_bool("b_int", false).status(), "'b_int'", "must be true or false, found number"},
      {cfg->get_string("s_num", "").status(), "'s_num'", "must be a string, found number"},
      {cfg->get_int_list("l_not_list", {}).status(), "'l_not_list'", "must be a list of ints"},
      {cfg->get_int_list("l_mixed", {}).status(), "'l_mixed'", "element 2 is string \"three\""},
      {cfg->get_int_list("l_frac", {}).status(), "'l_frac'", "element 1 is number 2.5"},
      {cfg->get_float_list("fl_mixed", {}).status(), "'fl_mixed'", "element 1 is null"},
      {cfg->get_float_list("s_num", {}).status(), "'s_num'", "must be a list of numbers"},
      {cfg->get_string_list("sl_mixed", {}).status(), "'sl_mixed'", "element 1 is number 1"},
      {cfg->get_string_list("s_num", {}).status(), "'s_num'", "must be a list of strings"},
  };
  for (const auto& c : cases) {
    ASSERT_FALSE(c.status.ok()) << c.key;
    EXPECT_TRUE(has_substr(c.status.message(), "/models/vae/config.json: ")) << c.key;
    EXPECT_TRUE(has_substr(c.status.message(), c.key));
    EXPECT_TRUE(has_substr(c.status.message(), c.expect));
  }
}

TEST(ConfigBad, InvalidUtf8) {
  auto cfg = Config::parse("{\"a\": \"\xff\xfe\"}", "bin.json");
  ASSERT_FALSE(cfg.ok());
  EXPECT_TRUE(has_substr(cfg.status().message(), "bin.json:1:"));
}

}  // namespace
}  // namespace latent
