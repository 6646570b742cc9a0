// Resolving a model path in each form the user may give it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine/weights/model_source.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

namespace fs = std::filesystem;

::testing::AssertionResult has_substr(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

// A fresh folder under the test's temp dir; files are created empty (resolution does not read
// weights, only finds them).
std::string make_dir(const std::string& name, const std::vector<std::string>& files = {}) {
  const std::string dir = test::temp_dir() + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& f : files) {
    fs::create_directories(fs::path(dir + "/" + f).parent_path());
    std::ofstream(dir + "/" + f) << "{}";
  }
  return dir;
}

TEST(ModelSource, DiffusersFolder) {
  const std::string dir =
      make_dir("diffusers", {"config.json", "diffusion_pytorch_model.safetensors"});
  auto src = resolve_model_source(dir);
  ASSERT_TRUE(src.ok()) << src.status().message();
  EXPECT_EQ(src->given, dir);
  EXPECT_EQ(src->root, dir);
  EXPECT_EQ(src->config_path, dir + "/config.json");
  EXPECT_EQ(src->weights_path, dir + "/diffusion_pytorch_model.safetensors");
  EXPECT_FALSE(src->single_file);
  EXPECT_EQ(src->form, "diffusers folder");
}

TEST(ModelSource, WeightNamesInPreferenceOrder) {
  struct Case {
    std::vector<std::string> weights;
    std::string chosen;
  } cases[] = {
      {{"model.safetensors", "diffusion_pytorch_model.safetensors"},
       "diffusion_pytorch_model.safetensors"},
      {{"model.safetensors", "diffusion_pytorch_model.safetensors.index.json"},
       "diffusion_pytorch_model.safetensors.index.json"},
      {{"model.safetensors.index.json", "model.safetensors"}, "model.safetensors"},
      {{"model.safetensors.index.json"}, "model.safetensors.index.json"},
      {{"diffusion_pytorch_model.fp16.safetensors", "diffusion_pytorch_model.bin"},
       "diffusion_pytorch_model.fp16.safetensors"},
      {{"diffusion_pytorch_model.fp16.safetensors", "model.safetensors"}, "model.safetensors"},
  };
  int n = 0;
  for (const auto& c : cases) {
    std::vector<std::string> files = c.weights;
    files.push_back("config.json");
    const std::string dir = make_dir("order" + std::to_string(n++), files);
    auto src = resolve_model_source(dir);
    ASSERT_TRUE(src.ok()) << src.status().message();
    EXPECT_EQ(src->weights_path, dir + "/" + c.chosen);
  }
}

TEST(ModelSource, PipelineRoot) {
  const std::string dir =
      make_dir("pipeline", {"model_index.json", "vae/config.json",
                            "vae/diffusion_pytorch_model.safetensors", "transformer/config.json",
                            "transformer/diffusion_pytorch_model.safetensors.index.json"});
  auto src = resolve_model_source(dir);
  ASSERT_TRUE(src.ok()) << src.status().message();
  EXPECT_EQ(src->root, dir + "/vae");
  EXPECT_EQ(src->config_path, dir + "/vae/config.json");
  EXPECT_EQ(src->weights_path, dir + "/vae/diffusion_pytorch_model.safetensors");
  EXPECT_EQ(src->form, "diffusers pipeline (vae/)");

  auto dit = resolve_model_source(dir, "transformer");
  ASSERT_TRUE(dit.ok()) << dit.status().message();
  EXPECT_EQ(dit->weights_path, dir + "/transformer/diffusion_pytorch_model.safetensors.index.json");
  EXPECT_EQ(dit->form, "diffusers pipeline (transformer/)");
}

// A partial download of a pipeline: vae/, transformer/ and scheduler/ without model_index.json.
TEST(ModelSource, PartialPipelineRootWithoutModelIndex) {
  const std::string dir =
      make_dir("partial", {"vae/config.json", "vae/diffusion_pytorch_model.safetensors",
                           "transformer/config.json",
                           "transformer/diffusion_pytorch_model.safetensors",
                           "scheduler/scheduler_config.json"});
  auto src = resolve_model_source(dir);
  ASSERT_TRUE(src.ok()) << src.status().message();
  EXPECT_EQ(src->root, dir + "/vae");
  EXPECT_EQ(src->weights_path, dir + "/vae/diffusion_pytorch_model.safetensors");
  EXPECT_EQ(src->form, "diffusers pipeline (vae/)");
  auto dit = resolve_model_source(dir, "transformer");
  ASSERT_TRUE(dit.ok()) << dit.status().message();
  EXPECT_EQ(dit->config_path, dir + "/transformer/config.json");
  EXPECT_EQ(dit->form, "diffusers pipeline (transformer/)");
}

// Only transformer/ was fetched: asking for the VAE names what is missing.
TEST(ModelSource, PartialPipelineRootWithoutVae) {
  const std::string dir =
      make_dir("partial_novae", {"transformer/config.json",
                                 "transformer/diffusion_pytorch_model.safetensors",
                                 "scheduler/scheduler_config.json"});
  auto src = resolve_model_source(dir);
  ASSERT_FALSE(src.ok());
  EXPECT_TRUE(has_substr(src.status().message(), "without a 'vae' subfolder"))
      << src.status().message();
  EXPECT_TRUE(has_substr(src.status().message(), "transformer/")) << src.status().message();
}

TEST(ModelSource, PipelineRootWithoutSubfolder) {
  const std::string dir = make_dir("pipeline_novae", {"model_index.json", "unet/config.json"});
  auto src = resolve_model_source(dir);
  ASSERT_FALSE(src.ok());
  EXPECT_TRUE(has_substr(src.status().message(), dir));
  EXPECT_TRUE(has_substr(src.status().message(), "without a 'vae' subfolder"));
}

TEST(ModelSource, PipelineSubfolderWithoutConfig) {
  const std::string dir = make_dir("pipeline_noconfig",
                                   {"model_index.json", "vae/diffusion_pytorch_model.safetensors"});
  auto src = resolve_model_source(dir);
  ASSERT_FALSE(src.ok());
  EXPECT_TRUE(has_substr(src.status().message(), dir + "/vae has no config.json"));
}

TEST(ModelSource, SingleFile) {
  const std::string dir = make_dir("single", {"ae.safetensors", "config.json"});
  auto src = resolve_model_source(dir + "/ae.safetensors");
  ASSERT_TRUE(src.ok()) << src.status().message();
  EXPECT_TRUE(src->single_file);
  EXPECT_EQ(src->form, "single file");
  EXPECT_EQ(src->root, dir);
  EXPECT_EQ(src->weights_path, dir + "/ae.safetensors");
  EXPECT_EQ(src->config_path, "");  // config.json beside it is not assumed to belong to it
}

TEST(ModelSource, SingleFileWithSameStemConfig) {
  const std::string dir = make_dir("single_cfg", {"taesd.safetensors", "taesd.json"});
  auto src = resolve_model_source(dir + "/taesd.safetensors");
  ASSERT_TRUE(src.ok()) << src.status().message();
  EXPECT_TRUE(src->single_file);
  EXPECT_EQ(src->config_path, dir + "/taesd.json");
}

TEST(ModelSource, Missing) {
  const std::string path = test::temp_dir() + "/no/such/model";
  auto src = resolve_model_source(path);
  ASSERT_FALSE(src.ok());
  EXPECT_TRUE(has_substr(src.status().message(), path));
  EXPECT_TRUE(has_substr(src.status().message(), "does not exist"));
}

TEST(ModelSource, BinOnlyFolder) {
  const std::string dir = make_dir("binonly", {"config.json", "diffusion_pytorch_model.bin"});
  auto src = resolve_model_source(dir);
  ASSERT_FALSE(src.ok());
  EXPECT_TRUE(has_substr(src.status().message(), dir));
  EXPECT_TRUE(has_substr(src.status().message(), "diffusion_pytorch_model.bin"));
  EXPECT_TRUE(has_substr(src.status().message(), "only safetensors is supported"));
}

TEST(ModelSource, PickleFileGiven) {
  const std::string dir = make_dir("ckpt", {"sd-v1-5.ckpt"});
  auto src = resolve_model_source(dir + "/sd-v1-5.ckpt");
  ASSERT_FALSE(src.ok());
  EXPECT_TRUE(has_substr(src.status().message(), dir + "/sd-v1-5.ckpt"));
  EXPECT_TRUE(has_substr(src.status().message(), "only safetensors is supported"));
}

TEST(ModelSource, FolderWithConfigButNoWeights) {
  const std::string dir = make_dir("noweights", {"config.json"});
  auto src = resolve_model_source(dir);
  ASSERT_FALSE(src.ok());
  EXPECT_TRUE(has_substr(src.status().message(), "no weights in " + dir));
  EXPECT_TRUE(has_substr(src.status().message(), "diffusion_pytorch_model.safetensors"));
}

TEST(ModelSource, FolderWithoutConfig) {
  const std::string empty = make_dir("nothing");
  auto a = resolve_model_source(empty);
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(has_substr(a.status().message(), empty));
  EXPECT_TRUE(has_substr(a.status().message(), "config.json"));
  EXPECT_TRUE(has_substr(a.status().message(), "model_index.json"));

  const std::string loose = make_dir("loose", {"vae.safetensors"});
  auto b = resolve_model_source(loose);
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(has_substr(b.status().message(), loose + "/vae.safetensors"));
}

TEST(ModelSource, OtherFileType) {
  const std::string dir = make_dir("otherfile", {"notes.txt"});
  auto src = resolve_model_source(dir + "/notes.txt");
  ASSERT_FALSE(src.ok());
  EXPECT_TRUE(has_substr(src.status().message(), dir + "/notes.txt"));
}

TEST(ModelSource, UnreadablePath) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads everything";
  const std::string dir =
      make_dir("locked", {"config.json", "diffusion_pytorch_model.safetensors"});
  ::chmod((dir + "/diffusion_pytorch_model.safetensors").c_str(), 0);
  auto src = resolve_model_source(dir);
  ASSERT_FALSE(src.ok());
  EXPECT_TRUE(has_substr(src.status().message(), dir + "/diffusion_pytorch_model.safetensors"));
  ::chmod(dir.c_str(), 0);
  auto locked = resolve_model_source(dir);
  ::chmod(dir.c_str(), 0755);
  ASSERT_FALSE(locked.ok());
  EXPECT_TRUE(has_substr(locked.status().message(), dir));
}

// setenv for one test, restored afterwards.
struct ScopedEnv {
  std::string name, old;
  bool had;
  ScopedEnv(const char* n, const std::string& value) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    ::setenv(n, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had)
      ::setenv(name.c_str(), old.c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

TEST(ModelSource, DefaultModelFromEnvironment) {
  const std::string dir =
      make_dir("builtin", {"config.json", "diffusion_pytorch_model.safetensors"});
  ScopedEnv env("LATENT_DEFAULT_MODEL", dir);
  EXPECT_EQ(default_model_dir(), dir);
  for (const char* given : {"", "default"}) {
    auto src = resolve_model_source(given);
    ASSERT_TRUE(src.ok()) << src.status().message();
    EXPECT_EQ(src->given, given);
    EXPECT_EQ(src->form, "built-in");
    EXPECT_EQ(src->weights_path, dir + "/diffusion_pytorch_model.safetensors");
  }
}

TEST(ModelSource, DefaultModelMissing) {
  const std::string dir = test::temp_dir() + "/no_builtin";
  ScopedEnv env("LATENT_DEFAULT_MODEL", dir);
  auto src = resolve_model_source("default");
  ASSERT_FALSE(src.ok());
  EXPECT_TRUE(has_substr(src.status().message(), "built-in default model"));
  EXPECT_TRUE(has_substr(src.status().message(), dir));
}

TEST(ModelSource, DefaultModelDirWithoutEnvironment) {
  ScopedEnv env("LATENT_DEFAULT_MODEL", "");
  const std::string d = default_model_dir();
  EXPECT_FALSE(d.empty());
  EXPECT_TRUE(has_substr(d, "default"));
}

}  // namespace
}  // namespace latent
