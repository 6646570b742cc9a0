// The on-disk plan cache (engine/core/plan_cache.h): file naming by context, round trip,
// atomic save, merging with entries saved by another process, and tolerance of corrupt,
// foreign and older files.
#include <dirent.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/log.h"
#include "engine/core/plan_cache.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

using Json = nlohmann::json;

PlanCache::Context context(const std::string& gpu = "NVIDIA H200",
                           const std::string& cudnn = "91000") {
  return {{"gpu", gpu}, {"compute_capability", "9.0"}, {"cudnn", cudnn}, {"cudart", "13000"}};
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

// Counts warnings through the engine's log callback.
int g_warnings = 0;
void count_warnings(LogLevel level, const char*, int, const char*, void*) {
  if (level == LogLevel::kWarning) ++g_warnings;
}

class PlanCacheTest : public testing::Test {
 protected:
  void SetUp() override {
    static int n = 0;
    dir_ = test::temp_dir() + "/plans" + std::to_string(n++) + "/nested";
    g_warnings = 0;
    set_log_callback(count_warnings, nullptr);
  }
  void TearDown() override { set_log_callback(nullptr, nullptr); }
  std::string dir_;
};

TEST_F(PlanCacheTest, FileNameDependsOnContextOnly) {
  const std::string a = PlanCache::file_for(dir_, "cuda-plans", context());
  EXPECT_EQ(a, PlanCache::file_for(dir_, "cuda-plans", context()));
  EXPECT_EQ(a.rfind(dir_ + "/cuda-plans-", 0), 0u) << a;
  EXPECT_EQ(a.size(), dir_.size() + std::string("/cuda-plans-").size() + 16 + 5) << a;
  EXPECT_NE(a, PlanCache::file_for(dir_, "cuda-plans", context("NVIDIA H100 80GB HBM3")));
  EXPECT_NE(a, PlanCache::file_for(dir_, "cuda-plans", context("NVIDIA H200", "90100")));
  EXPECT_EQ(PlanCache::file_for("", "cuda-plans", context()), "");
}

TEST_F(PlanCacheTest, RoundTripCreatesFolderAndWritesOnlyWhenDirty) {
  const std::string path = PlanCache::file_for(dir_, "cuda-plans", context());
  {
    PlanCache c(path, context());
    EXPECT_EQ(c.load(), 0u);  // no file yet, no warning
    EXPECT_FALSE(c.dirty());
    ASSERT_TRUE(c.save().ok());
    EXPECT_FALSE(test::file_exists(path)) << "nothing to save";
    c.put("conv2d bf16 a", Json{{"algo", 1}, {"math", 1}});
    c.put("conv2d bf16 b", Json{{"algo", 6}, {"math", 0}});
    EXPECT_TRUE(c.dirty());
    Status s = c.save();
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_FALSE(c.dirty());
    // Putting an identical value again does not dirty the store.
    c.put("conv2d bf16 a", Json{{"algo", 1}, {"math", 1}});
    EXPECT_FALSE(c.dirty());
  }
  ASSERT_TRUE(test::file_exists(path));
  const Json j = Json::parse(slurp(path));
  EXPECT_EQ(j["format"], "gst-latent-plan-cache");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["context"]["gpu"], "NVIDIA H200");
  EXPECT_EQ(j["entries"].size(), 2u);

  PlanCache again(path, context());
  EXPECT_EQ(again.load(), 2u);
  Json v;
  ASSERT_TRUE(again.lookup("conv2d bf16 b", &v));
  EXPECT_EQ(v["algo"], 6);
  EXPECT_FALSE(again.lookup("conv2d bf16 c", &v));
  EXPECT_EQ(g_warnings, 0);
  // No temporary file left behind: the folder holds the plan file only.
  DIR* d = opendir(dir_.c_str());
  ASSERT_NE(d, nullptr);
  int files = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++files;
  closedir(d);
  EXPECT_EQ(files, 1);
}

TEST_F(PlanCacheTest, CorruptFileIsIgnoredWithWarningAndReplaced) {
  const std::string path = PlanCache::file_for(dir_, "cuda-plans", context());
  PlanCache seed(path, context());
  seed.put("k", Json(1));
  ASSERT_TRUE(seed.save().ok());
  for (const std::string& bad :
       {std::string("{\"format\": \"gst-latent-plan-cache\", \"vers"), std::string("[1, 2, 3]"),
        std::string("{\"format\": \"something else\", \"version\": 1}"),
        std::string("{\"format\": \"gst-latent-plan-cache\", \"version\": 99, \"context\": {}, "
                    "\"entries\": {}}"),
        std::string("{\"format\": \"gst-latent-plan-cache\", \"version\": 1, \"context\": ") +
            Json(context()).dump() + ", \"entries\": 5}",
        std::string("")}) {
    write(path, bad);
    g_warnings = 0;
    PlanCache c(path, context());
    EXPECT_EQ(c.load(), 0u) << bad;
    EXPECT_EQ(g_warnings, 1) << bad;
    EXPECT_EQ(c.size(), 0u);
    c.put("fresh", Json(2));
    ASSERT_TRUE(c.save().ok());
    PlanCache reread(path, context());
    EXPECT_EQ(reread.load(), 1u) << "the bad file was replaced: " << slurp(path);
  }
}

TEST_F(PlanCacheTest, ForeignContextIsIgnored) {
  // A file copied from another machine under this machine's file name.
  const std::string path = PlanCache::file_for(dir_, "cuda-plans", context());
  PlanCache other(path, context("NVIDIA A100-SXM4-80GB"));
  other.put("conv2d bf16 a", Json{{"algo", 0}});
  ASSERT_TRUE(other.save().ok());
  PlanCache mine(path, context());
  EXPECT_EQ(mine.load(), 0u);
  EXPECT_EQ(g_warnings, 1);
  Json v;
  EXPECT_FALSE(mine.lookup("conv2d bf16 a", &v));
}

TEST_F(PlanCacheTest, SaveMergesEntriesOfAnotherProcess) {
  const std::string path = PlanCache::file_for(dir_, "cuda-plans", context());
  PlanCache a(path, context()), b(path, context());
  a.load();
  b.load();
  a.put("from a", Json(1));
  b.put("from b", Json(2));
  b.put("both", Json("b"));
  a.put("both", Json("a"));
  ASSERT_TRUE(b.save().ok());
  ASSERT_TRUE(a.save().ok());  // after b: keeps b's entries, its own value wins for "both"
  PlanCache c(path, context());
  EXPECT_EQ(c.load(), 3u);
  Json v;
  ASSERT_TRUE(c.lookup("from b", &v));
  EXPECT_EQ(v, Json(2));
  ASSERT_TRUE(c.lookup("both", &v));
  EXPECT_EQ(v, Json("a"));
}

TEST_F(PlanCacheTest, InMemoryOnlyWithoutPath) {
  PlanCache c("", context());
  EXPECT_EQ(c.load(), 0u);
  c.put("k", Json(1));
  EXPECT_TRUE(c.save().ok());
  Json v;
  EXPECT_TRUE(c.lookup("k", &v));
}

// Blobs beside the file: a round trip through a second store of the same context, none for
// another key, nothing stored without a path; a truncated, damaged or foreign blob file is not
// served (with a warning), and the next write replaces it.
TEST_F(PlanCacheTest, BlobsRoundTripAndDamagedOnesAreNotServed) {
  const std::string path = PlanCache::file_for(dir_, "cuda", context());
  PlanCache a(path, context());
  std::vector<uint8_t> data(100000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
  data[0] = 0;  // bytes, not text
  const std::string key = "conv fused wan 3x3x3 96->96 | first";
  ASSERT_TRUE(a.write_blob(key, data).ok());
  const std::string file = a.blob_path(key);
  EXPECT_EQ(file.rfind(path.substr(0, path.size() - 5) + ".blobs/", 0), 0u) << file;

  PlanCache b(path, context());
  std::vector<uint8_t> got;
  ASSERT_TRUE(b.read_blob(key, &got));
  EXPECT_EQ(got, data);
  EXPECT_FALSE(b.read_blob("conv fused other", &got));
  EXPECT_TRUE(b.write_blob("empty", {}).ok());
  ASSERT_TRUE(b.read_blob("empty", &got));
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(g_warnings, 0);

  // Another key's file put where this key's belongs (a hash collision, a copied file).
  const std::string other = slurp(b.blob_path("empty"));
  write(file, other);
  EXPECT_FALSE(b.read_blob(key, &got));
  EXPECT_EQ(g_warnings, 1);
  // Truncated, then one byte of the data changed.
  ASSERT_TRUE(a.write_blob(key, data).ok());
  const std::string whole = slurp(file);
  write(file, whole.substr(0, whole.size() - 9));
  EXPECT_FALSE(b.read_blob(key, &got));
  EXPECT_EQ(g_warnings, 2);
  std::string flipped = whole;
  flipped[whole.size() / 2] ^= 0x40;
  write(file, flipped);
  EXPECT_FALSE(b.read_blob(key, &got));
  EXPECT_EQ(g_warnings, 3);
  write(file, "not a blob");
  EXPECT_FALSE(b.read_blob(key, &got));
  EXPECT_EQ(g_warnings, 4);
  ASSERT_TRUE(a.write_blob(key, data).ok());
  ASSERT_TRUE(b.read_blob(key, &got));
  EXPECT_EQ(got, data);

  // In memory only: nothing is written, nothing is found.
  PlanCache memory("", context());
  EXPECT_TRUE(memory.write_blob(key, data).ok());
  EXPECT_FALSE(memory.read_blob(key, &got));
  EXPECT_EQ(memory.blob_path(key), "");
}

TEST_F(PlanCacheTest, DefaultDirectoryFollowsEnvironment) {
  const char* saved_plan = std::getenv("LATENT_PLAN_CACHE");
  const char* saved_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string keep_plan = saved_plan ? saved_plan : "", keep_xdg = saved_xdg ? saved_xdg : "";
  setenv("LATENT_PLAN_CACHE", "/some/where", 1);
  EXPECT_EQ(PlanCache::default_directory(), "/some/where");
  setenv("LATENT_PLAN_CACHE", "off", 1);
  EXPECT_EQ(PlanCache::default_directory(), "");
  unsetenv("LATENT_PLAN_CACHE");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(PlanCache::default_directory(), "/xdg/gst-latent");
  unsetenv("XDG_CACHE_HOME");
  if (const char* home = std::getenv("HOME")) {
    EXPECT_EQ(PlanCache::default_directory(), std::string(home) + "/.cache/gst-latent");
  }
  if (saved_plan) setenv("LATENT_PLAN_CACHE", keep_plan.c_str(), 1);
  if (saved_xdg) setenv("XDG_CACHE_HOME", keep_xdg.c_str(), 1);
}

}  // namespace
}  // namespace latent
