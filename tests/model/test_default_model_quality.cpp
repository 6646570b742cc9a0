// The built-in default autoencoder (models/default, trained by scripts/default_model/) through
// the engine's CPU backend: every held-out photograph in tests/fixtures/photos (never trained on)
// is cut to its centred square at 512x512, encoded, decoded and rounded to 8 bits. The mean
// round-trip PSNR must reach 28 dB; SSIM (OpenCV, 11x11 Gaussian window, sigma 1.5) is reported
// and guarded too. The same numbers come from scripts/default_model/evaluate.py (diffusers), and
// are on the model card.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/backends/registry.h"
#include "engine/models/vae/vae.h"
#include "tests/util/test_util.h"

// OpenCV comes with the test's link to opencv_core/imgproc/imgcodecs (tests/CMakeLists.txt).
// A build without it still compiles this file, and the test fails saying what is missing.
#if __has_include(<opencv2/core.hpp>)
#define LATENT_TEST_HAVE_OPENCV 1
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace latent {
namespace {

#ifdef LATENT_TEST_HAVE_OPENCV

namespace fs = std::filesystem;

constexpr int kSize = 512;
constexpr double kMinMeanPsnr = 28.0;  // the requirement (model card: 30.28 dB)
// Regression guards below the measured values (model card): the hardest photo, eveningglow's
// gravel, scores 25.25 dB; mean SSIM 0.8436.
constexpr double kMinPhotoPsnr = 24.0;
constexpr double kMinMeanSsim = 0.80;

std::string default_model_dir() {
  if (const char* env = std::getenv("LATENT_DEFAULT_MODEL"); env && *env) return env;
  if (const char* src = std::getenv("LATENT_SOURCE_DIR"); src && *src)
    return std::string(src) + "/models/default";
  return test::fixtures_dir() + "/../../models/default";
}

std::vector<std::string> held_out_photos() {
  std::vector<std::string> files;
  const fs::path dir = fs::path(test::fixtures_dir()) / "photos";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string ext = e.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
    if (e.is_regular_file() && (ext == ".png" || ext == ".jpg" || ext == ".jpeg"))
      files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// BGR 8-bit, the largest centred square, resized to kSize x kSize (INTER_AREA) if needed.
cv::Mat load_square(const std::string& path) {
  cv::Mat bgr = cv::imread(path, cv::IMREAD_COLOR);
  if (bgr.empty()) return bgr;
  const int s = std::min(bgr.rows, bgr.cols);
  cv::Mat square = bgr(cv::Rect((bgr.cols - s) / 2, (bgr.rows - s) / 2, s, s));
  cv::Mat out;
  if (s != kSize)
    cv::resize(square, out, cv::Size(kSize, kSize), 0, 0, cv::INTER_AREA);
  else
    out = square.clone();
  return out;
}

// BGR 8-bit [H, W] -> fp32 [1, 3, H, W] RGB in [-1, 1] (v / 127.5 - 1).
Tensor to_tensor(const cv::Mat& bgr) {
  const int h = bgr.rows, w = bgr.cols;
  Tensor t = Tensor::empty({1, 3, h, w}, DType::kF32);
  float* p = t.data_as<float>();
  for (int y = 0; y < h; ++y) {
    const uint8_t* row = bgr.ptr<uint8_t>(y);
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        p[(static_cast<int64_t>(c) * h + y) * w + x] = row[x * 3 + (2 - c)] / 127.5f - 1.f;
  }
  return t;
}

// fp32 [1, 3, H, W] RGB in [-1, 1] -> BGR 8-bit, rounded to nearest (ties to even), clamped.
cv::Mat to_image(const Tensor& t) {
  const int h = static_cast<int>(t.dim(2)), w = static_cast<int>(t.dim(3));
  cv::Mat bgr(h, w, CV_8UC3);
  const float* p = t.data_as<float>();
  for (int y = 0; y < h; ++y) {
    uint8_t* row = bgr.ptr<uint8_t>(y);
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        float v = std::clamp(p[(static_cast<int64_t>(c) * h + y) * w + x], -1.f, 1.f);
        v = std::nearbyint((v + 1.f) * 127.5f);
        row[x * 3 + (2 - c)] = static_cast<uint8_t>(std::isfinite(v) ? v : 0.f);
      }
  }
  return bgr;
}

// SSIM (Wang et al. 2004) of one channel: 11x11 Gaussian window, sigma 1.5, K1 = 0.01,
// K2 = 0.03, L = 255 -- OpenCV's reference getMSSIM, in double precision.
double ssim_channel(const cv::Mat& a8, const cv::Mat& b8) {
  const double c1 = (0.01 * 255) * (0.01 * 255), c2 = (0.03 * 255) * (0.03 * 255);
  cv::Mat a, b;
  a8.convertTo(a, CV_64F);
  b8.convertTo(b, CV_64F);
  auto blur = [](const cv::Mat& m) {
    cv::Mat out;
    cv::GaussianBlur(m, out, cv::Size(11, 11), 1.5);
    return out;
  };
  cv::Mat mu_a = blur(a), mu_b = blur(b);
  cv::Mat mu_a2 = mu_a.mul(mu_a), mu_b2 = mu_b.mul(mu_b), mu_ab = mu_a.mul(mu_b);
  cv::Mat s_a2 = blur(a.mul(a)) - mu_a2;
  cv::Mat s_b2 = blur(b.mul(b)) - mu_b2;
  cv::Mat s_ab = blur(a.mul(b)) - mu_ab;
  cv::Mat num = (2 * mu_ab + c1).mul(2 * s_ab + c2);
  cv::Mat den = (mu_a2 + mu_b2 + c1).mul(s_a2 + s_b2 + c2);
  cv::Mat map;
  cv::divide(num, den, map);
  return cv::mean(map)[0];
}

// Mean SSIM over the three channels.
double ssim(const cv::Mat& a, const cv::Mat& b) {
  std::vector<cv::Mat> ca, cb;
  cv::split(a, ca);
  cv::split(b, cb);
  double sum = 0;
  for (int c = 0; c < 3; ++c) sum += ssim_channel(ca[c], cb[c]);
  return sum / 3.0;
}

TEST(DefaultModelQuality, HeldOutPhotosRoundTripAt512) {
  const std::string dir = default_model_dir();
  auto backend = get_backend(BackendOptions{"cpu", ""});
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  auto loaded = load_vae(dir, *backend);
  ASSERT_TRUE(loaded.ok()) << "loading the default model " << dir << ": "
                           << loaded.status().message();
  VaeModel& model = **loaded;
  const LatentSpace& space = model.latent_space();
  EXPECT_EQ(model.info().architecture, "AutoencoderTiny");
  EXPECT_EQ(space.name, "latent-default");
  EXPECT_TRUE(is_known_latent_space(space.name));
  EXPECT_EQ(space.downsample, 8);
  ASSERT_TRUE(model.has_encoder() && model.has_decoder());

  const std::vector<std::string> photos = held_out_photos();
  ASSERT_GE(photos.size(), 3u) << "held-out photos missing in " << test::fixtures_dir()
                               << "/photos";
  Backend& b = model.backend();
  double psnr_sum = 0, ssim_sum = 0;
  std::printf("default model %s (%d latent channels) on %zu held-out photos, %dx%d:\n",
              dir.c_str(), space.channels, photos.size(), kSize, kSize);
  for (const std::string& path : photos) {
    SCOPED_TRACE(path);
    const cv::Mat original = load_square(path);
    ASSERT_FALSE(original.empty()) << "cv::imread could not read " << path;
    ASSERT_EQ(original.rows, kSize);

    auto x = b.upload(to_tensor(original));
    ASSERT_TRUE(x.ok()) << x.status().message();
    auto z = model.encode(*x);
    ASSERT_TRUE(z.ok()) << z.status().message();
    EXPECT_EQ(z->shape(), (Shape{1, space.channels, kSize / 8, kSize / 8}));
    auto y = model.decode(*z);
    ASSERT_TRUE(y.ok()) << y.status().message();
    auto host = b.download(*y);
    ASSERT_TRUE(host.ok()) << host.status().message();
    ASSERT_EQ(host->shape(), (Shape{1, 3, kSize, kSize}));
    const cv::Mat decoded = to_image(*host);

    const double psnr = cv::PSNR(original, decoded, 255.0);
    const double s = ssim(original, decoded);
    std::printf("  %-24s PSNR %6.2f dB  SSIM %.4f\n", fs::path(path).filename().c_str(), psnr, s);
    EXPECT_GE(psnr, kMinPhotoPsnr) << "round trip of " << path;
    psnr_sum += psnr;
    ssim_sum += s;
  }
  const double mean_psnr = psnr_sum / photos.size(), mean_ssim = ssim_sum / photos.size();
  std::printf("  %-24s PSNR %6.2f dB  SSIM %.4f\n", "mean", mean_psnr, mean_ssim);
  RecordProperty("mean_psnr_db", std::to_string(mean_psnr));
  RecordProperty("mean_ssim", std::to_string(mean_ssim));
  EXPECT_GE(mean_psnr, kMinMeanPsnr);
  EXPECT_GE(mean_ssim, kMinMeanSsim);
}

#else

TEST(DefaultModelQuality, HeldOutPhotosRoundTripAt512) {
  FAIL() << "this test was built without OpenCV: link it to opencv_core, opencv_imgproc and "
            "opencv_imgcodecs (find_package(OpenCV) in tests/CMakeLists.txt)";
}

#endif  // LATENT_TEST_HAVE_OPENCV

}  // namespace
}  // namespace latent
