// SafetensorsStreamWriter: frames streamed to <path>.partial, the header written at finish(),
// padding versus moving the data, byte-identical output, and every failure leaving no file.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

std::string tmp_path(const std::string& name) { return test::temp_dir() + "/" + name; }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<float> frame_values(int n, int seed) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = float(seed * 1000 + i) * 0.25f;
  return v;
}

// Writes `frames` frames of [2, 3, 5] fp32 with `meta`; returns the finish() status.
Status write_frames(const std::string& path, int frames,
                    const std::map<std::string, std::string>& meta,
                    SafetensorsStreamWriter::Options opt = {}) {
  auto w = SafetensorsStreamWriter::create(path, "latents", DType::kF32, {2, 3, 5}, opt);
  if (!w.ok()) return w.status();
  for (int f = 0; f < frames; ++f) {
    auto v = frame_values(30, f);
    Status s = (*w)->append(v.data(), v.size() * sizeof(float));
    if (!s.ok()) return s;
    EXPECT_TRUE(exists(path + ".partial"));
    EXPECT_FALSE(exists(path)) << "the file must not appear before finish()";
  }
  Status s = (*w)->finish(meta);
  EXPECT_TRUE(s.ok()) << s.message();
  return s;
}

void expect_content(const std::string& path, int frames,
                    const std::map<std::string, std::string>& meta) {
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  auto t = (*f)->tensor("latents");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->shape(), (Shape{frames, 2, 3, 5}));
  EXPECT_EQ(t->dtype(), DType::kF32);
  const float* p = t->data_as<float>();
  for (int f = 0; f < frames; ++f) {
    auto v = frame_values(30, f);
    ASSERT_EQ(std::memcmp(p + f * 30, v.data(), 30 * sizeof(float)), 0) << "frame " << f;
  }
  EXPECT_EQ((*f)->metadata(), meta);
  EXPECT_EQ((*f)->records().size(), 1u);
}

TEST(SafetensorsStreamWriter, SmallFileGetsTheExactHeader) {
  const std::string path = tmp_path("small.safetensors");
  std::map<std::string, std::string> meta = {{"latent_space", "sd"}, {"pts", "[0,1,2]"}};
  ASSERT_TRUE(write_frames(path, 3, meta).ok());
  EXPECT_FALSE(exists(path + ".partial"));
  expect_content(path, 3, meta);
  // Small data: the header is not padded to the reservation (the data was moved).
  const std::string bytes = slurp(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_LT(n, 256u);
  EXPECT_EQ(bytes.size(), 8 + n + 3 * 30 * 4);
  EXPECT_EQ(bytes[8], '{');
}

TEST(SafetensorsStreamWriter, LargeFileKeepsItsDataInPlaceBehindAPaddedHeader) {
  const std::string path = tmp_path("padded.safetensors");
  SafetensorsStreamWriter::Options opt;
  opt.header_reserve = 512;
  std::map<std::string, std::string> meta = {{"k", "v"}};
  // 600 frames x 120 bytes: padding (under 512) is less than 1/16 of the data.
  ASSERT_TRUE(write_frames(path, 600, meta, opt).ok());
  const std::string bytes = slurp(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  EXPECT_EQ(8 + n, 512u);
  expect_content(path, 600, meta);
}

TEST(SafetensorsStreamWriter, HeaderLargerThanTheReservationMovesTheData) {
  const std::string path = tmp_path("grown.safetensors");
  SafetensorsStreamWriter::Options opt;
  opt.header_reserve = 64;
  std::map<std::string, std::string> meta = {{"pts", std::string(5000, '7')}};
  ASSERT_TRUE(write_frames(path, 40, meta, opt).ok());
  expect_content(path, 40, meta);
}

TEST(SafetensorsStreamWriter, SameInputSameBytes) {
  std::map<std::string, std::string> meta = {{"a", "1"}, {"b", "[0,33366666]"}};
  ASSERT_TRUE(write_frames(tmp_path("same1.safetensors"), 5, meta).ok());
  ASSERT_TRUE(write_frames(tmp_path("same2.safetensors"), 5, meta).ok());
  EXPECT_EQ(slurp(tmp_path("same1.safetensors")), slurp(tmp_path("same2.safetensors")));
}

TEST(SafetensorsStreamWriter, ReplacesAnOldFileOnlyAtFinish) {
  const std::string path = tmp_path("replace.safetensors");
  ASSERT_TRUE(write_frames(path, 2, {{"v", "old"}}).ok());
  {
    auto w = SafetensorsStreamWriter::create(path, "latents", DType::kF32, {2, 3, 5});
    ASSERT_TRUE(w.ok());
    auto v = frame_values(30, 9);
    ASSERT_TRUE((*w)->append(v.data(), v.size() * 4).ok());
    // Destroyed without finish(): an interrupted write.
  }
  EXPECT_FALSE(exists(path + ".partial"));
  expect_content(path, 2, {{"v", "old"}});
}

TEST(SafetensorsStreamWriter, BadInputIsAnError) {
  const std::string path = tmp_path("bad.safetensors");
  auto w = SafetensorsStreamWriter::create(path, "latents", DType::kBF16, {4, 2, 2});
  ASSERT_TRUE(w.ok());
  std::vector<uint16_t> wrong(15);
  Status s = (*w)->append(wrong.data(), wrong.size() * 2);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("expected 32"), std::string::npos) << s.message();
  Status f = (*w)->finish({});
  EXPECT_FALSE(f.ok());
  EXPECT_NE(f.message().find("no frames"), std::string::npos) << f.message();
  EXPECT_FALSE(exists(path));
  EXPECT_FALSE(exists(path + ".partial"));

  EXPECT_FALSE(SafetensorsStreamWriter::create(path, "__metadata__", DType::kF32, {1}).ok());
  EXPECT_FALSE(SafetensorsStreamWriter::create(path, "x", DType::kF32, {0, 3}).ok());
  auto nodir =
      SafetensorsStreamWriter::create(tmp_path("no/such/dir/x.safetensors"), "x", DType::kF32, {1});
  ASSERT_FALSE(nodir.ok());
  EXPECT_NE(nodir.status().message().find("no/such/dir/x.safetensors.partial"), std::string::npos)
      << nodir.status().message();
}

TEST(SafetensorsStreamWriter, FullDiskIsAnErrorAndLeavesNoFile) {
  // RLIMIT_FSIZE in a child process stands in for a full disk: writes past it fail with EFBIG
  // (SIGXFSZ ignored, as a host application would see ENOSPC).
  const std::string done = tmp_path("done_before.safetensors");
  ASSERT_TRUE(write_frames(done, 2, {{"v", "kept"}}).ok());
  const std::string path = tmp_path("full.safetensors");
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {8192, 8192};
    setrlimit(RLIMIT_FSIZE, &rl);
    Status s = write_frames(path, 200, {});
    const bool ok = !s.ok() && s.message().find("File too large") != std::string::npos &&
                    s.message().find("full.safetensors.partial") != std::string::npos &&
                    !exists(path) && !exists(path + ".partial");
    if (!ok) fprintf(stderr, "unexpected: %s\n", s.message().c_str());
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  expect_content(done, 2, {{"v", "kept"}});
}

}  // namespace
}  // namespace latent
