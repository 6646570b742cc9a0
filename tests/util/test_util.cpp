#include "tests/util/test_util.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "engine/backends/registry.h"

namespace latent::test {

std::shared_ptr<Backend> cpu_backend(const std::string& dtype) {
  BackendOptions o;
  o.device = "cpu";
  o.dtype = dtype;
  auto b = get_backend(o);
  if (!b.ok()) ADD_FAILURE() << b.status().message();
  return b.ok() ? *b : nullptr;
}

std::string fixtures_dir() {
  const char* env = std::getenv("LATENT_FIXTURES");
  if (env && *env) return env;
  return LATENT_FIXTURES_DIR;
}

namespace {
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/latent-test-XXXXXX";
    const char* p = mkdtemp(tmpl);
    path = p ? p : "/tmp";
  }
  ~TempDir() {
    std::error_code ec;
    if (path != "/tmp") std::filesystem::remove_all(path, ec);
  }
};
}  // namespace

std::string temp_dir() {
  static TempDir dir;
  return dir.path;
}

Tensor random_tensor(const Shape& shape, uint64_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  return t;
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void exit_without_gpu(const char* test_name) {
  if (cuda_device_count() > 0) return;
  std::fprintf(stderr, "%s: no CUDA device, skipping (exit 77)\n", test_name);
  std::exit(77);
}

}  // namespace latent::test
