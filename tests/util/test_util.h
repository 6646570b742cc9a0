// Shared helpers for the tests: fixture paths, random tensors, tolerances.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/backends/backend.h"
#include "engine/core/tensor.h"

namespace latent::test {

// Folder of committed fixtures (tests/fixtures), overridable with $LATENT_FIXTURES.
std::string fixtures_dir();
// A fresh temporary folder for this test process (removed at exit).
std::string temp_dir();
// Uniform [-1, 1) fp32 host tensor from a seeded generator.
Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.f, float hi = 1.f);
// The CPU backend storing `dtype` ("fp32", "bf16", "fp16"); null and a test failure if it
// cannot be had.
std::shared_ptr<Backend> cpu_backend(const std::string& dtype = "fp32");
// Whether a file exists.
bool file_exists(const std::string& path);
// A GPU test's first step: without a CUDA device, says so on stderr and exits with 77, which
// ctest reports as skipped.
void exit_without_gpu(const char* test_name);

}  // namespace latent::test
