// latent-tool's command line (CLI11, tools/latent_tool.cpp): unknown options and stray arguments
// are refused, values are typed and range-checked and never swallow the next option, each
// command has its own --help; OpenCV's own warnings stay out of the output; compare of identical
// images says inf dB; a config with a huge size fails with a message, not an abort, under a
// memory limit.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/util/test_util.h"

namespace latent {
namespace {

struct ToolRun {
  int status;  // exit status; -1: killed by a signal (an abort)
  std::string output;
};

// `args` through the shell (so a test may set a ulimit first with `prefix`).
ToolRun run_tool(const std::string& args, const std::string& prefix = "") {
  const char* tool = std::getenv("LATENT_TOOL");
  const std::string cmd =
      prefix + "'" + std::string(tool ? tool : "latent-tool") + "' " + args + " 2>&1";
  ToolRun r{-1, ""};
  FILE* p = popen(("bash -c \"" + cmd + "\"").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int st = pclose(p);
  // bash reports a child killed by signal N as exit status 128 + N.
  r.status = WIFEXITED(st) && WEXITSTATUS(st) < 128 ? WEXITSTATUS(st) : -1;
  return r;
}

bool has(const ToolRun& r, const std::string& s) { return r.output.find(s) != std::string::npos; }

class LatentToolCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::getenv("LATENT_TOOL")) GTEST_SKIP() << "LATENT_TOOL is not set (run through ctest)";
  }
  const std::string kl = test::fixtures_dir() + "/kl_tiny";
  const std::string photo = test::fixtures_dir() + "/photos/astronaut.png";
  std::string out(const std::string& name) const { return test::temp_dir() + "/" + name; }
};

TEST_F(LatentToolCli, UnknownOptionsAreRefused) {
  ToolRun r = run_tool("inspect --model " + kl + " --frobnicate 3");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r, "--frobnicate")) << r.output;
  // --lora is not an option (yet): refused, never silently dropped.
  r = run_tool("encode --model " + kl + " --lora style.safetensors --input " + photo +
               " --output " + out("lora.safetensors"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r, "--lora")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(out("lora.safetensors")));
}

TEST_F(LatentToolCli, NumbersAreTypedAndRangeChecked) {
  const std::string io = test::fixtures_dir() + "/kl_tiny/io.safetensors";
  for (const char* bad : {"abc", "-5", "0", "1.5"}) {
    ToolRun r = run_tool("run --device cpu --model " + kl + " --part encoder --inputs " + io +
                         " --outputs " + out("rep.safetensors") + " --repeat " + bad);
    EXPECT_EQ(r.status, 2) << "--repeat " << bad << ": " << r.output;
    EXPECT_TRUE(has(r, "--repeat")) << r.output;
  }
  ToolRun r = run_tool("run --device cpu --model " + kl + " --part middle --inputs " + io +
                       " --outputs " + out("part.safetensors"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r, "--part")) << r.output;
  // An option of the other kind of part would be ignored: refused.
  r = run_tool("run --device cpu --model " + kl + " --part encoder --case x --inputs " + io +
               " --outputs " + out("case.safetensors"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_TRUE(has(r, "--case applies to --part transformer")) << r.output;
}

// An option's value never swallows the next option: `--dtype --input x` is a missing value.
// An empty --lora is refused by name, not run as if no LoRA had been asked for.
TEST_F(LatentToolCli, AnEmptyLoraIsRefused) {
  const std::string dit = test::fixtures_dir() + "/dit_qwen_image_tiny";
  for (const char* cmd :
       {"run --part transformer --case multi_image --inputs ", "denoise --inputs "}) {
    const bool run = std::string(cmd).rfind("run", 0) == 0;
    const std::string io = dit + (run ? "/io_transformer.safetensors" : "/io_denoise.safetensors");
    const std::string target =
        out(run ? "lora_empty_run.safetensors" : "lora_empty_dn.safetensors");
    const std::string tail =
        run ? " --outputs " + target : " --case img2img --steps 1 --output-latents " + target;
    ToolRun r =
        run_tool(std::string(cmd) + io + " --device cpu --model " + dit + tail + " --lora ''");
    EXPECT_EQ(r.status, 1) << cmd << r.output;
    EXPECT_TRUE(has(r, "LoRA '': no file named")) << cmd << r.output;
    EXPECT_FALSE(std::filesystem::exists(target)) << cmd;
  }
}

// An output that cannot be written is refused before the model loads and runs, naming it.
TEST_F(LatentToolCli, UnwritableOutputsAreRefusedBeforeRunning) {
  const std::string dir = out("an-output-folder");
  std::filesystem::create_directories(dir);
  const std::string dit = test::fixtures_dir() + "/dit_qwen_image_tiny";
  const std::string denoise = "denoise --device cpu --model " + dit + " --inputs " + dit +
                              "/io_denoise.safetensors --case img2img --steps 1 ";
  const struct {
    std::string args, message;
  } cases[] = {
      {"encode --model " + kl + " --input " + photo + " --output " + dir,
       "--output " + dir + " is a folder; give a file name"},
      {"encode --model " + kl + " --input " + photo + " --output /nonexistent/x.safetensors",
       "--output /nonexistent/x.safetensors: folder '/nonexistent' does not exist"},
      {"run --model " + kl + " --part encoder --inputs " + kl + "/io.safetensors --outputs " + dir,
       "--outputs " + dir + " is a folder"},
      {denoise + "--output-latents /nonexistent/l.safetensors", "folder '/nonexistent' does not"},
      {denoise + "--output " + out("image.xyz"),
       "--output " + out("image.xyz") + ": no image writer for that name"},
  };
  for (const auto& c : cases) {
    ToolRun r = run_tool(c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.output;
    EXPECT_TRUE(has(r, c.message)) << c.args << "\n" << r.output;
    EXPECT_FALSE(has(r, "encoded ") || has(r, "denoised ") || has(r, " ms")) << r.output;
  }
}

TEST_F(LatentToolCli, MissingValueDoesNotSwallowTheNextOption) {
  ToolRun r = run_tool("encode --model " + kl + " --dtype --input " + photo + " --output " +
                       out("dtype.safetensors"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r, "--dtype: needs a value")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(out("dtype.safetensors")));
  r = run_tool("encode --model --input " + photo + " --output " + out("model.safetensors"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r, "--model: needs a value")) << r.output;
  r = run_tool("encode --model " + kl + " --dtype fp64 --input " + photo + " --output " +
               out("dtype.safetensors"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r, "fp64")) << r.output;
}

// Stray arguments are refused, never taken as the model.
TEST_F(LatentToolCli, ExtraPositionalsAreRefused) {
  ToolRun r =
      run_tool("encode " + kl + " --input " + photo + " --output " + out("pos.safetensors"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r, kl)) << r.output;
  EXPECT_FALSE(std::filesystem::exists(out("pos.safetensors")));
  r = run_tool("inspect " + kl + " " + kl);
  EXPECT_EQ(r.status, 2) << r.output;
  r = run_tool("inspect --model " + kl + " " + kl);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_TRUE(has(r, "give the model once")) << r.output;
  r = run_tool("compare " + photo);
  EXPECT_EQ(r.status, 2) << r.output;
  // The one positional inspect takes still works.
  r = run_tool("inspect --device cpu " + kl);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r, "AutoencoderKL")) << r.output;
}

TEST_F(LatentToolCli, EachCommandHasItsOwnHelp) {
  ToolRun r = run_tool("run --help");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r, "--part")) << r.output;
  EXPECT_TRUE(has(r, "--repeat")) << r.output;
  EXPECT_FALSE(has(r, "--embeds")) << r.output;  // denoise's, not run's
  r = run_tool("denoise --help");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r, "--embeds")) << r.output;
  EXPECT_FALSE(has(r, "--part")) << r.output;
  r = run_tool("help");  // bench/bench_pipelines.py looks for the stream command here
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r, "stream")) << r.output;
  r = run_tool("");
  EXPECT_EQ(r.status, 2) << r.output;
  r = run_tool("frobnicate");
  EXPECT_EQ(r.status, 2) << r.output;
}

TEST_F(LatentToolCli, OpenCvWarningsStayOut) {
  ToolRun r = run_tool("encode --device cpu --model " + kl +
                       " --input /nonexistent/x.png --output " + out("ocv.safetensors"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(has(r, "cannot read image '/nonexistent/x.png'")) << r.output;
  EXPECT_FALSE(has(r, "WARN")) << r.output;
  EXPECT_FALSE(has(r, "imread_")) << r.output;
}

TEST_F(LatentToolCli, CompareOfIdenticalImagesIsInfinite) {
  ToolRun r = run_tool("compare " + photo + " " + photo);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r, "PSNR inf dB  SSIM 1.0000")) << r.output;
  // astronaut.png carries an sRGB profile libpng warns about on stderr: not our output.
  EXPECT_FALSE(has(r, "warning")) << r.output;
  const std::string other = test::fixtures_dir() + "/photos/eveningglow.png";
  r = run_tool("compare " + photo + " " + other);
  EXPECT_FALSE(has(r, "inf")) << r.output;
  // compare runs no model: a --device would be ignored, so it is refused.
  r = run_tool("compare --device cuda " + photo + " " + photo);
  EXPECT_EQ(r.status, 2) << r.output;
}

// `"latent_channels": 1000000000` in config.json: inspect fails with a message naming the key
// under a 4 GiB address-space limit (it allocated ~16 GB, or aborted with std::bad_alloc).
TEST_F(LatentToolCli, HugeConfigSizeIsAMessageNotAnAbort) {
  const std::string dir = out("kl_huge_cli");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kl + "/diffusion_pytorch_model.safetensors",
                             dir + "/diffusion_pytorch_model.safetensors");
  std::ifstream in(kl + "/config.json");
  std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = cfg.find("\"latent_channels\"");
  ASSERT_NE(at, std::string::npos);
  const size_t end = cfg.find_first_of(",}", at);
  cfg.replace(at, end - at, "\"latent_channels\": 1000000000");
  std::ofstream(dir + "/config.json") << cfg;
#if defined(__SANITIZE_ADDRESS__)
  const char* limit = "";  // an AddressSanitizer build cannot start under an address-space limit
#else
  const char* limit = "ulimit -v 4194304; ";
#endif
  ToolRun r = run_tool("inspect --device cpu --model " + dir, limit);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(has(r, "latent_channels")) << r.output;
  EXPECT_FALSE(has(r, "bad_alloc")) << r.output;
}

}  // namespace
}  // namespace latent
