// The engine's one place for device choice, backend run locks and model identity
// (engine/backends/registry.h, engine/weights/model_source.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/backends/registry.h"
#include "engine/weights/model_source.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

namespace fs = std::filesystem;

TEST(Registry, AutoAndEmptyNameTheSameDevice) {
  auto a = resolve_device("auto");
  auto e = resolve_device("");
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(a->to_string(), e->to_string());
  // The rule: the first GPU when one is usable, else the CPU.
  if (cuda_backend_built() && cuda_device_count() > 0)
    EXPECT_EQ(a->to_string(), "cuda:0");
  else
    EXPECT_TRUE(a->is_cpu());
}

TEST(Registry, GetBackendTakesAutoForDtypeAndDevice) {
  BackendOptions plain;
  plain.device = "";
  plain.dtype = "";
  BackendOptions spelled;
  spelled.device = "auto";
  spelled.dtype = "auto";
  auto a = get_backend(plain);
  auto b = get_backend(spelled);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(a->get(), b->get());  // the same shared instance
}

TEST(Registry, DeviceNamesAreCheckedWithoutProbing) {
  EXPECT_TRUE(check_device_name("auto").ok());
  EXPECT_TRUE(check_device_name("").ok());
  EXPECT_TRUE(check_device_name("cpu").ok());
  EXPECT_TRUE(check_device_name("cuda").ok());
  EXPECT_TRUE(check_device_name("cuda:3").ok());  // may not exist; still a device name
  for (const char* bad : {"gpu7", "cuda:", "cuda:x", "cpu:1x", "CUDA 0"}) {
    Status st = check_device_name(bad);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find(bad), std::string::npos) << st.message();
  }
}

TEST(Registry, ABackendHasOneRunLock) {
  BackendOptions cpu;
  cpu.device = "cpu";
  auto backend = get_backend(cpu);
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  auto first = backend_run_lock(**backend);
  auto second = backend_run_lock(**backend);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first.get(), second.get());
  BackendOptions bf16;
  bf16.device = "cpu";
  bf16.dtype = "bf16";
  auto other = get_backend(bf16);
  if (other.ok()) {
    EXPECT_NE(backend->get(), other->get());
    EXPECT_NE(backend_run_lock(**other).get(), first.get());
  }
}

TEST(Registry, PrimaryContextNeedsACudaDevice) {
  if (cuda_backend_built() && cuda_device_count() > 0) {
    auto ctx = retain_cuda_primary_context(0);
    ASSERT_TRUE(ctx.ok()) << ctx.status().message();
    EXPECT_NE(*ctx, nullptr);
    auto again = retain_cuda_primary_context(0);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*ctx, *again);  // retained once
    auto missing = retain_cuda_primary_context(cuda_device_count());
    EXPECT_FALSE(missing.ok());
  } else {
    auto ctx = retain_cuda_primary_context(0);
    ASSERT_FALSE(ctx.ok());
    EXPECT_NE(ctx.status().message().find("cuda:0"), std::string::npos)
        << ctx.status().message();
  }
}

TEST(ModelIdentity, TheSameFilesByAnyPathAreOneModel) {
  const std::string dir = test::temp_dir() + "/identity";
  fs::remove_all(dir);
  fs::create_directories(dir + "/model");
  std::ofstream(dir + "/model/config.json") << "{}";
  std::ofstream(dir + "/model/diffusion_pytorch_model.safetensors") << "{}";
  fs::create_directory_symlink(dir + "/model", dir + "/link");
  auto direct = resolve_model_source(dir + "/model");
  auto linked = resolve_model_source(dir + "/link");
  auto dotted = resolve_model_source(dir + "/model/../model/");
  ASSERT_TRUE(direct.ok()) << direct.status().message();
  ASSERT_TRUE(linked.ok()) << linked.status().message();
  ASSERT_TRUE(dotted.ok()) << dotted.status().message();
  EXPECT_EQ(model_source_identity(*direct), model_source_identity(*linked));
  EXPECT_EQ(model_source_identity(*direct), model_source_identity(*dotted));

  fs::create_directories(dir + "/other");
  std::ofstream(dir + "/other/config.json") << "{}";
  std::ofstream(dir + "/other/diffusion_pytorch_model.safetensors") << "{}";
  auto other = resolve_model_source(dir + "/other");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(model_source_identity(*direct), model_source_identity(*other));
}

}  // namespace
}  // namespace latent
