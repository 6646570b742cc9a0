// Frame <-> tensor conversion and the size policies (engine/core/pixels.h).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/core/pixels.h"

namespace latent {
namespace {

constexpr PixelFormat kAllFormats[] = {
    PixelFormat::kRGB,  PixelFormat::kBGR,  PixelFormat::kRGBA, PixelFormat::kBGRA,
    PixelFormat::kRGBx, PixelFormat::kBGRx, PixelFormat::kxRGB, PixelFormat::kxBGR,
    PixelFormat::kARGB, PixelFormat::kABGR,
};

struct Frame {
  int width = 0, height = 0;
  size_t stride = 0;
  PixelFormat format = PixelFormat::kRGB;
  std::vector<uint8_t> bytes;

  Frame(int w, int h, PixelFormat f, size_t extra_stride = 0, uint8_t fill = 0)
      : width(w), height(h), format(f) {
    stride = static_cast<size_t>(w) * pixel_layout(f).bytes_per_pixel + extra_stride;
    bytes.assign(stride * h, fill);
  }
  uint8_t* px(int x, int y) {
    return bytes.data() + y * stride + x * pixel_layout(format).bytes_per_pixel;
  }
  int comp(int x, int y, int c) {  // c: 0 = r, 1 = g, 2 = b
    const PixelLayout L = pixel_layout(format);
    return px(x, y)[c == 0 ? L.r : (c == 1 ? L.g : L.b)];
  }
};

void fill_random(Frame& f, uint64_t seed) {
  std::mt19937_64 gen(seed);
  for (auto& b : f.bytes) b = static_cast<uint8_t>(gen());
}

float at(const Tensor& t, int c, int y, int x) {
  return t.data_as<float>()[(static_cast<size_t>(c) * t.dim(2) + y) * t.dim(3) + x];
}

float byte_value(int b) { return static_cast<float>(b) / 127.5f - 1.f; }

FrameGeometry plan(int w, int h, int f, SizePolicy p) {
  auto g = plan_frame_geometry(w, h, f, p);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return *g;
}

TEST(Pixels, FormatNamesRoundTrip) {
  for (PixelFormat f : kAllFormats) {
    auto parsed = parse_pixel_format(pixel_format_name(f));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, f);
  }
  auto bad = parse_pixel_format("NV12");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("NV12"), std::string::npos);
  for (SizePolicy p : {SizePolicy::kPad, SizePolicy::kCrop, SizePolicy::kScale})
    EXPECT_EQ(*parse_size_policy(size_policy_name(p)), p);
  EXPECT_FALSE(parse_size_policy("stretch").ok());
}

// Each format: channel order, value mapping, alpha written as 255, stride padding untouched.
TEST(Pixels, EveryFormatConvertsAndRestores) {
  for (PixelFormat f : kAllFormats) {
    SCOPED_TRACE(pixel_format_name(f));
    Frame in(16, 8, f, /*extra_stride=*/5);
    fill_random(in, 7 + static_cast<int>(f));
    const FrameGeometry g = plan(16, 8, 8, SizePolicy::kPad);
    auto t = frame_to_tensor(in.bytes.data(), in.stride, f, g);
    ASSERT_TRUE(t.ok()) << t.status().message();
    ASSERT_EQ(t->shape(), (Shape{1, 3, 8, 16}));
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 16; ++x)
        for (int c = 0; c < 3; ++c) ASSERT_EQ(at(*t, c, y, x), byte_value(in.comp(x, y, c)));

    Frame out(16, 8, f, 5, /*fill=*/0xAB);
    Status s = tensor_to_frame(*t, g, f, out.bytes.data(), out.stride);
    ASSERT_TRUE(s.ok()) << s.message();
    const PixelLayout L = pixel_layout(f);
    for (int y = 0; y < 8; ++y) {
      for (int x = 0; x < 16; ++x) {
        for (int c = 0; c < 3; ++c) ASSERT_EQ(out.comp(x, y, c), in.comp(x, y, c));
        if (L.a >= 0) {
          ASSERT_EQ(out.px(x, y)[L.a], 255);
        }
      }
      for (size_t i = 16 * L.bytes_per_pixel; i < out.stride; ++i)
        ASSERT_EQ(out.bytes[y * out.stride + i], 0xAB) << "stride padding was overwritten";
    }
  }
}

TEST(Pixels, PadReplicatesEdgesAndCropsBack) {
  Frame in(100, 70, PixelFormat::kBGRx);
  fill_random(in, 11);
  const FrameGeometry g = plan(100, 70, 8, SizePolicy::kPad);
  EXPECT_EQ(g.model_width(), 104);
  EXPECT_EQ(g.model_height(), 72);
  EXPECT_EQ(g.latent_width(), 13);
  EXPECT_EQ(g.latent_height(), 9);
  auto t = frame_to_tensor(in.bytes.data(), in.stride, in.format, g);
  ASSERT_TRUE(t.ok()) << t.status().message();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(at(*t, c, 10, 103), byte_value(in.comp(99, 10, c)));
    EXPECT_EQ(at(*t, c, 71, 20), byte_value(in.comp(20, 69, c)));
    EXPECT_EQ(at(*t, c, 71, 103), byte_value(in.comp(99, 69, c)));
    EXPECT_EQ(at(*t, c, 0, 0), byte_value(in.comp(0, 0, c)));
  }
  Frame out(100, 70, in.format);
  ASSERT_TRUE(tensor_to_frame(*t, g, out.format, out.bytes.data(), out.stride).ok());
  for (int y = 0; y < 70; ++y)
    for (int x = 0; x < 100; ++x)
      for (int c = 0; c < 3; ++c) ASSERT_EQ(out.comp(x, y, c), in.comp(x, y, c));
}

TEST(Pixels, CropTakesTheCentreAndReplicatesTheBorderBack) {
  Frame in(100, 70, PixelFormat::kRGB);
  fill_random(in, 12);
  const FrameGeometry g = plan(100, 70, 8, SizePolicy::kCrop);
  EXPECT_EQ(g.model_width(), 96);
  EXPECT_EQ(g.model_height(), 64);
  EXPECT_EQ(g.x.offset, 2);
  EXPECT_EQ(g.y.offset, 3);
  auto t = frame_to_tensor(in.bytes.data(), in.stride, in.format, g);
  ASSERT_TRUE(t.ok()) << t.status().message();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(at(*t, c, 0, 0), byte_value(in.comp(2, 3, c)));
    EXPECT_EQ(at(*t, c, 63, 95), byte_value(in.comp(97, 66, c)));
  }
  Frame out(100, 70, in.format);
  ASSERT_TRUE(tensor_to_frame(*t, g, out.format, out.bytes.data(), out.stride).ok());
  for (int y = 0; y < 70; ++y) {
    for (int x = 0; x < 100; ++x) {
      const int sx = std::min(std::max(x, 2), 97), sy = std::min(std::max(y, 3), 66);
      for (int c = 0; c < 3; ++c) ASSERT_EQ(out.comp(x, y, c), in.comp(sx, sy, c)) << x << "," << y;
    }
  }
}

TEST(Pixels, ScaleResizesToTheNearestMultipleAndBack) {
  const FrameGeometry g = plan(100, 70, 8, SizePolicy::kScale);
  EXPECT_EQ(g.model_width(), 104);  // 12.5 -> 13 blocks
  EXPECT_EQ(g.model_height(), 72);  // 8.75 -> 9 blocks
  EXPECT_EQ(plan(99, 67, 8, SizePolicy::kScale).model_width(), 96);
  EXPECT_EQ(plan(99, 67, 8, SizePolicy::kScale).model_height(), 64);
  EXPECT_EQ(plan(3, 3, 8, SizePolicy::kScale).model_width(), 8);  // never below one block

  // A smooth image survives the resize there and back within a couple of levels.
  Frame in(100, 70, PixelFormat::kRGBA);
  for (int y = 0; y < 70; ++y)
    for (int x = 0; x < 100; ++x) {
      uint8_t* p = in.px(x, y);
      p[0] = static_cast<uint8_t>(2 * x + 20);
      p[1] = static_cast<uint8_t>(3 * y);
      p[2] = static_cast<uint8_t>(x + y);
      p[3] = 17;
    }
  auto t = frame_to_tensor(in.bytes.data(), in.stride, in.format, g);
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_EQ(t->shape(), (Shape{1, 3, 72, 104}));
  Frame out(100, 70, in.format);
  ASSERT_TRUE(tensor_to_frame(*t, g, out.format, out.bytes.data(), out.stride).ok());
  int worst = 0;
  for (int y = 0; y < 70; ++y)
    for (int x = 0; x < 100; ++x)
      for (int c = 0; c < 3; ++c)
        worst = std::max(worst, std::abs(out.comp(x, y, c) - in.comp(x, y, c)));
  EXPECT_LE(worst, 2);
  EXPECT_EQ(out.px(5, 5)[3], 255);

  // A constant image stays exactly constant.
  Frame flat(37, 29, PixelFormat::kRGB);
  for (auto& b : flat.bytes) b = 200;
  const FrameGeometry gf = plan(37, 29, 8, SizePolicy::kScale);
  auto tf = frame_to_tensor(flat.bytes.data(), flat.stride, flat.format, gf);
  ASSERT_TRUE(tf.ok());
  for (float v : tf->to_floats()) ASSERT_FLOAT_EQ(v, byte_value(200));
}

TEST(Pixels, BilinearMatchesPyTorchAlignCornersFalse) {
  // torch.nn.functional.interpolate(x, size=(4, 4), mode="bilinear", align_corners=False)
  const float src[4] = {0, 1, 2, 3};
  float up[16];
  resize_bilinear(src, 1, 2, 2, up, 4, 4);
  const float want[16] = {0.0f, 0.25f, 0.75f, 1.0f, 0.5f, 0.75f, 1.25f, 1.5f,
                          1.5f, 1.75f, 2.25f, 2.5f, 2.0f, 2.25f, 2.75f, 3.0f};
  for (int i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(up[i], want[i]) << i;
  // Down by two averages neighbours: [0 1 2 3] -> [0.5 2.5].
  const float row[4] = {0, 1, 2, 3};
  float down[2];
  resize_bilinear(row, 1, 1, 4, down, 1, 2);
  EXPECT_FLOAT_EQ(down[0], 0.5f);
  EXPECT_FLOAT_EQ(down[1], 2.5f);
}

TEST(Pixels, RoundsAndClampsOnTheWayOut) {
  const FrameGeometry g = plan(8, 8, 8, SizePolicy::kPad);
  Tensor t = Tensor::zeros({1, 3, 8, 8}, DType::kF32);
  float* p = t.data_as<float>();
  p[0] = 2.f;                                      // above range -> 255
  p[1] = -3.f;                                     // below range -> 0
  p[2] = std::numeric_limits<float>::quiet_NaN();  // NaN -> 0
  p[3] = 0.f;                                      // 127.5 rounds to 128
  p[4] = byte_value(77) + 0.3f / 127.5f;           // nearest is 77
  p[5] = byte_value(77) + 0.7f / 127.5f;           // nearest is 78
  Frame out(8, 8, PixelFormat::kRGB);
  ASSERT_TRUE(tensor_to_frame(t, g, out.format, out.bytes.data(), out.stride).ok());
  EXPECT_EQ(out.comp(0, 0, 0), 255);
  EXPECT_EQ(out.comp(1, 0, 0), 0);
  EXPECT_EQ(out.comp(2, 0, 0), 0);
  EXPECT_EQ(out.comp(3, 0, 0), 128);
  EXPECT_EQ(out.comp(4, 0, 0), 77);
  EXPECT_EQ(out.comp(5, 0, 0), 78);
}

TEST(Pixels, PlanningRejectsImpossibleSizes) {
  EXPECT_FALSE(plan_frame_geometry(0, 10, 8, SizePolicy::kPad).ok());
  EXPECT_FALSE(plan_frame_geometry(10, -1, 8, SizePolicy::kPad).ok());
  EXPECT_FALSE(plan_frame_geometry(100000, 100000, 8, SizePolicy::kPad).ok());
  EXPECT_FALSE(plan_frame_geometry(64, 64, 0, SizePolicy::kPad).ok());
  auto crop = plan_frame_geometry(5, 40, 8, SizePolicy::kCrop);
  ASSERT_FALSE(crop.ok());
  EXPECT_NE(crop.status().message().find("frame width 5"), std::string::npos)
      << crop.status().message();
  auto small_pad = plan_frame_geometry(8, 8, 16, SizePolicy::kPad);
  ASSERT_TRUE(small_pad.ok());
  EXPECT_EQ(small_pad->model_width(), 16);
  EXPECT_EQ(small_pad->latent_width(), 1);
}

TEST(Pixels, BadArgumentsAreErrors) {
  const FrameGeometry g = plan(16, 16, 8, SizePolicy::kPad);
  Frame f(16, 16, PixelFormat::kRGBA);
  auto short_stride = frame_to_tensor(f.bytes.data(), 10, f.format, g);
  ASSERT_FALSE(short_stride.ok());
  EXPECT_NE(short_stride.status().message().find("stride"), std::string::npos);
  EXPECT_FALSE(frame_to_tensor(nullptr, f.stride, f.format, g).ok());

  Tensor wrong = Tensor::zeros({1, 3, 8, 16}, DType::kF32);
  Status s = tensor_to_frame(wrong, g, f.format, f.bytes.data(), f.stride);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("[1, 3, 16, 16]"), std::string::npos) << s.message();
  Tensor half = Tensor::zeros({1, 3, 16, 16}, DType::kF16);
  EXPECT_FALSE(tensor_to_frame(half, g, f.format, f.bytes.data(), f.stride).ok());
  EXPECT_FALSE(tensor_to_frame(Tensor(), g, f.format, f.bytes.data(), f.stride).ok());
}

}  // namespace
}  // namespace latent
