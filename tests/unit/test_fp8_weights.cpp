// FP8 weights (engine/weights/fp8.h, safetensors.h's Fp8Companion): the decoding of every byte
// against PyTorch (scripts/make_dit_fp8_fixtures.py: tests/fixtures/dit_fp8/decode.safetensors),
// ComfyUI's scaled FP8 (per-tensor and per-row scale_weight, scale_input, the scaled_fp8 marker)
// through WeightStore and WeightBinder, and every bad scale named by its key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <vector>
#include <nlohmann/json.hpp>

#include "engine/weights/binder.h"
#include "engine/weights/fp8.h"
#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

::testing::AssertionResult has_substr(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// One tensor of a hand-made safetensors file: any dtype string, raw little-endian bytes.
struct Raw {
  std::string name, dtype;
  Shape shape;
  std::string bytes;
};

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
std::string u8_bytes(const std::vector<uint8_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

std::string write_raw(const std::string& file, const std::vector<Raw>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const Raw& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8) text.push_back(' ');
  const std::string path = test::temp_dir() + "/" + file;
  std::ofstream out(path, std::ios::binary);
  uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << text << data;
  return path;
}

std::string fixture(const std::string& name) { return test::fixtures_dir() + "/dit_fp8/" + name; }

// --- decoding ---------------------------------------------------------------------------------

TEST(Fp8Decode, EveryByteMatchesPyTorch) {
  auto f = SafetensorsFile::open(fixture("decode.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  for (const char* fmt : {"e4m3", "e5m2"}) {
    SCOPED_TRACE(fmt);
    const bool e4m3 = std::string(fmt) == "e4m3";
    const std::vector<float> ref = (*f)->tensor(fmt)->to_floats();  // torch's float32 values
    ASSERT_EQ(ref.size(), 256u);
    // The FP8 tensor as torch wrote it, read through the file path.
    const TensorRecord* rec = (*f)->find(std::string(fmt) + "_bytes");
    ASSERT_NE(rec, nullptr);
    EXPECT_EQ(rec->fp8, e4m3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2);
    EXPECT_EQ(rec->dtype, DType::kF32);
    EXPECT_EQ(rec->shape, Shape({256}));
    auto t = (*f)->tensor(std::string(fmt) + "_bytes");
    ASSERT_TRUE(t.ok()) << t.status().message();
    ASSERT_EQ(t->dtype(), DType::kF32);
    const std::vector<float> got = t->to_floats();
    int nans = 0, infs = 0, subnormals = 0;
    for (int i = 0; i < 256; ++i) {
      const float direct = e4m3 ? fp8_e4m3_to_f32(static_cast<uint8_t>(i))
                                : fp8_e5m2_to_f32(static_cast<uint8_t>(i));
      if (std::isnan(ref[i])) {
        ++nans;
        EXPECT_TRUE(std::isnan(direct)) << "byte " << i;
        EXPECT_TRUE(std::isnan(got[i])) << "byte " << i;
        continue;
      }
      infs += std::isinf(ref[i]);
      subnormals += ref[i] != 0 && std::fpclassify(ref[i]) == FP_NORMAL &&
                    std::fabs(ref[i]) < (e4m3 ? std::ldexp(1.f, -6) : std::ldexp(1.f, -14));
      // Bit for bit: -0 stays -0, subnormals exact.
      EXPECT_EQ(bits_of(direct), bits_of(ref[i]))
          << "byte " << i << ": " << direct << " vs " << ref[i];
      EXPECT_EQ(bits_of(got[i]), bits_of(ref[i])) << "byte " << i;
    }
    // e4m3fn: S.1111.111 only, no infinity; e5m2: IEEE-like.
    EXPECT_EQ(nans, e4m3 ? 2 : 6);
    EXPECT_EQ(infs, e4m3 ? 0 : 2);
    EXPECT_EQ(subnormals, e4m3 ? 14 : 6);  // 7 (or 3) positive mantissas, both signs
  }
  // Landmarks.
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xfe), -448.f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.f, -9));
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x7b), 57344.f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x01), std::ldexp(1.f, -16));
  EXPECT_EQ(fp8_e5m2_to_f32(0x3c), 1.f);
  EXPECT_TRUE(std::isinf(fp8_e5m2_to_f32(0xfc)) && fp8_e5m2_to_f32(0xfc) < 0);
}

// --- encoding (dtype=fp8 quantises weights and activations) ---------------------------------

TEST(Fp8Encode, E4m3RoundsToNearestEvenAndSaturates) {
  // Every finite code comes back to itself (both zeros keep their sign).
  std::vector<std::pair<float, int>> finite;  // value, code, ascending over the positive codes
  for (int i = 0; i < 256; ++i) {
    const float v = fp8_e4m3_to_f32(static_cast<uint8_t>(i));
    if (std::isnan(v)) continue;
    EXPECT_EQ(fp8_e4m3_from_f32(v), i) << "code " << i << " = " << v;
    if (i < 0x80) finite.push_back({v, i});
  }
  ASSERT_EQ(finite.size(), 127u);  // 0x00 .. 0x7e
  // Between two neighbours: below the midpoint -> the lower, above -> the upper, at it -> the
  // even code (the one whose last mantissa bit is 0); the same with the sign flipped.
  for (size_t j = 0; j + 1 < finite.size(); ++j) {
    const auto [lo, lo_code] = finite[j];
    const auto [hi, hi_code] = finite[j + 1];
    const float mid = 0.5f * (lo + hi);  // exact in fp32
    SCOPED_TRACE(testing::Message() << lo << " .. " << hi);
    EXPECT_EQ(fp8_e4m3_from_f32(std::nextafter(mid, 0.f)), lo_code);
    EXPECT_EQ(fp8_e4m3_from_f32(std::nextafter(mid, 1e9f)), hi_code);
    EXPECT_EQ(fp8_e4m3_from_f32(mid), (lo_code % 2 == 0) ? lo_code : hi_code);
    EXPECT_EQ(fp8_e4m3_from_f32(-mid), 0x80 | ((lo_code % 2 == 0) ? lo_code : hi_code));
  }
  // Saturation (CUDA's __NV_SATFINITE): past 448, infinities; NaN stays NaN.
  for (float v : {448.f, 449.f, 464.f, 480.f, 1e6f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(fp8_e4m3_from_f32(v), 0x7e) << v;
    EXPECT_EQ(fp8_e4m3_from_f32(-v), 0xfe) << v;
  }
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(fp8_e4m3_from_f32(std::nanf("")))));
  // Below half the smallest subnormal: zero; just above it: the smallest subnormal.
  EXPECT_EQ(fp8_e4m3_from_f32(std::ldexp(1.f, -10)), 0x00);  // a tie, to the even 0
  EXPECT_EQ(fp8_e4m3_from_f32(std::ldexp(1.1f, -10)), 0x01);
}

TEST(Fp8Encode, RowsGetTheirOwnScale) {
  const std::vector<float> row = {0.5f, -2.f, 1e-3f, 0.f, 1.75f};
  std::vector<uint8_t> q(row.size());
  const float scale = fp8_e4m3_quantize_row(row.data(), row.size(), q.data());
  EXPECT_FLOAT_EQ(scale, 2.f / 448.f);
  EXPECT_EQ(q[1], 0xfe);  // the largest magnitude lands on -448
  for (size_t i = 0; i < row.size(); ++i)  // within half an e4m3 step (2^-4 relative) or a subnormal step
    EXPECT_NEAR(fp8_e4m3_to_f32(q[i]) * scale, row[i],
                std::max(std::fabs(row[i]) / 16.f, std::ldexp(1.f, -10) * scale))
        << i;
  const std::vector<float> zeros(4, 0.f);
  EXPECT_EQ(fp8_e4m3_quantize_row(zeros.data(), zeros.size(), q.data()), 1.f);
  EXPECT_EQ(q[0], 0);
  const std::vector<float> bad = {1.f, std::numeric_limits<float>::infinity()};
  EXPECT_TRUE(std::isnan(fp8_e4m3_quantize_row(bad.data(), bad.size(), q.data())));
}

TEST(Fp8Decode, OtherNarrowDtypesStayUnsupported) {
  const std::string path = write_raw("e8m0.safetensors", {{"w", "F8_E8M0", {2}, u8_bytes({1, 2})},
                                                          {"v", "F8_E4M3", {2}, u8_bytes({1, 2})}});
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE(f.value()->tensor("v").ok());
  auto t = f.value()->tensor("w");
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(has_substr(t.status().message(), "unsupported dtype F8_E8M0"));
  // The byte count of an FP8 tensor is checked like any other.
  const std::string bad = write_raw("short.safetensors", {{"w", "F8_E4M3", {3}, u8_bytes({1, 2})}});
  auto g = SafetensorsFile::open(bad);
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(has_substr(g.status().message(), "F8_E4M3[3] needs 3"));
}

// --- scaled FP8 through the store and the binder ---------------------------------------------

// e4m3 bytes: 0x38 = 1, 0x40 = 2, 0xb8 = -1, 0x01 = 2^-9 (subnormal), 0x7e = 448, 0x00 = 0.
const std::vector<uint8_t> kA = {0x38, 0x40, 0xb8, 0x01, 0x7e, 0x00};

class Fp8StoreTest : public ::testing::Test {
 protected:
  void SetUp() override { backend_ = test::cpu_backend(); }

  // A ComfyUI-style file: prefixed names, per-tensor, per-row ([R] and [R, 1]) and no scale,
  // scale_input, the marker; plus `extra` tensors.
  WeightStore open(const std::string& file, const std::vector<Raw>& extra = {}) {
    std::vector<Raw> t = {
        {"m.a.weight", "F8_E4M3", {2, 3}, u8_bytes(kA)},
        {"m.a.scale_weight", "F32", {}, f32_bytes({0.5f})},
        {"m.a.scale_input", "F32", {}, f32_bytes({1.f})},
        {"m.a.bias", "BF16", {2}, std::string("\x80\x3f\x00\x40", 4)},  // 1, 2
        {"m.b.weight", "F8_E4M3", {2, 2}, u8_bytes({0x38, 0x40, 0xb8, 0x01})},
        {"m.b.scale_weight", "F32", {2}, f32_bytes({2.f, -3.f})},
        {"m.c.weight", "F8_E5M2", {3}, u8_bytes({0x3c, 0x40, 0x01})},
        {"m.d.weight", "F8_E4M3", {2, 2}, u8_bytes({0x38, 0x38, 0x40, 0x40})},
        {"m.d.weight_scale", "F32", {2, 1}, f32_bytes({0.25f, 4.f})},
        {"m.d.input_scale", "F32", {1}, f32_bytes({3.f})},
        {"m.scaled_fp8", "F8_E4M3", {0}, ""},
    };
    t.insert(t.end(), extra.begin(), extra.end());
    path_ = write_raw(file, t);
    auto store = WeightStore::open(path_);
    EXPECT_TRUE(store.ok()) << store.status().message();
    return std::move(store).value();
  }

  // Takes every weight and bias of the base file; finish()'s status.
  Status bind_all(const WeightStore& store, WeightBinder* binder = nullptr) {
    WeightBinder local(store, *backend_);
    WeightBinder& b = binder ? *binder : local;
    for (const char* n : {"m.a.weight", "m.a.bias", "m.b.weight", "m.c.weight", "m.d.weight"})
      b.take(n, {});
    return b.finish();
  }

  std::shared_ptr<Backend> backend_;
  std::string path_;
};

TEST_F(Fp8StoreTest, WeightsDequantiseWithTheirScales) {
  WeightStore s = open("scaled.safetensors");
  auto a = s.get("m.a.weight");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->dtype(), DType::kF32);
  EXPECT_EQ(a->shape(), Shape({2, 3}));
  EXPECT_EQ(a->to_floats(),
            std::vector<float>({0.5f, 1.f, -0.5f, std::ldexp(1.f, -10), 224.f, 0.f}));
  // Per row, [R] and [R, 1].
  EXPECT_EQ(s.get("m.b.weight")->to_floats(),
            std::vector<float>({2.f, 4.f, 3.f, -std::ldexp(3.f, -9)}));
  EXPECT_EQ(s.get("m.d.weight")->to_floats(), std::vector<float>({0.25f, 0.25f, 8.f, 8.f}));
  // Unscaled e5m2: 0x3c = 1, 0x40 = 2, 0x01 = 2^-16.
  EXPECT_EQ(s.get("m.c.weight")->to_floats(), std::vector<float>({1.f, 2.f, std::ldexp(1.f, -16)}));
  // The scale itself reads as a plain tensor.
  EXPECT_EQ(s.get("m.a.scale_weight")->to_floats(), std::vector<float>({0.5f}));
  EXPECT_NE(s.fp8_scale_of("m.a.weight"), nullptr);
  EXPECT_EQ(s.fp8_scale_of("m.c.weight"), nullptr);
  EXPECT_EQ(s.fp8_scale_of("m.a.bias"), nullptr);
}

TEST_F(Fp8StoreTest, BinderConsumesScalesIgnoresInputScalesAndMarker) {
  WeightStore s = open("bind.safetensors");
  WeightBinder b(s, *backend_);
  Status st = bind_all(s, &b);
  EXPECT_TRUE(st.ok()) << st.message();
  const auto& dt = b.storage_dtypes();
  EXPECT_EQ(dt.at("fp8_e4m3 scaled"), 6 + 4 + 4);
  EXPECT_EQ(dt.at("fp8_e5m2"), 3);
  EXPECT_EQ(dt.at("bf16"), 2);
  // The uploaded weight holds the dequantised values.
  Tensor w = b.take_host("m.a.weight", {2, 3});
  EXPECT_EQ(w.to_floats()[4], 224.f);
}

TEST_F(Fp8StoreTest, UnknownKeysAreStillUnexpected) {
  WeightStore s = open("extra.safetensors", {{"m.a.weight_extra", "F32", {1}, f32_bytes({1.f})},
                                             {"m.scale", "F32", {1}, f32_bytes({1.f})}});
  Status st = bind_all(s);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(has_substr(st.message(), "2 unexpected tensors: m.a.weight_extra, m.scale."));
}

TEST_F(Fp8StoreTest, BadScalesAreErrorsNamingTheKey) {
  struct Case {
    const char* what;
    std::vector<Raw> extra;
    std::vector<const char*> take;  // besides the base file's tensors
    std::string message;
  };
  const std::vector<Case> cases = {
      {"a scale beside a BF16 weight, taken",
       {{"m.e.weight", "BF16", {1}, std::string("\x80\x3f", 2)},
        {"m.e.scale_weight", "F32", {}, f32_bytes({2.f})}},
       {"m.e.weight"},
       "tensor 'm.e.scale_weight' in " + test::temp_dir() +
           "/bad.safetensors scales 'm.e.weight', which is stored as BF16, not FP8"},
      {"a scale beside an F32 weight never taken",
       {{"m.e.weight", "F32", {1}, f32_bytes({1.f})},
        {"m.e.scale_weight", "F32", {}, f32_bytes({2.f})}},
       {},
       "'m.e.scale_weight' in " + test::temp_dir() +
           "/bad.safetensors scales 'm.e.weight', which is stored as F32, not FP8"},
      {"an input scale beside a BF16 weight",
       {{"m.e.weight", "BF16", {1}, std::string("\x80\x3f", 2)},
        {"m.e.scale_input", "F32", {}, f32_bytes({2.f})}},
       {"m.e.weight"},
       "'m.e.scale_input' in " + test::temp_dir() +
           "/bad.safetensors scales 'm.e.weight', which is stored as BF16, not FP8"},
      {"a scale of neither one value nor one per row",
       {{"m.e.weight", "F8_E4M3", {2, 3}, u8_bytes(kA)},
        {"m.e.scale_weight", "F32", {3}, f32_bytes({1.f, 2.f, 3.f})}},
       {"m.e.weight"},
       "'m.e.scale_weight' in " + test::temp_dir() +
           "/bad.safetensors has shape [3]: a scale of 'm.e.weight' [2, 3] holds one value or "
           "one per row"},
      {"a per-row scale of the wrong layout",
       {{"m.e.weight", "F8_E4M3", {2, 3}, u8_bytes(kA)},
        {"m.e.scale_weight", "F32", {1, 2}, f32_bytes({1.f, 2.f})}},
       {"m.e.weight"},
       "'m.e.scale_weight' in " + test::temp_dir() + "/bad.safetensors has shape [1, 2]"},
      {"an input scale of two values",
       {{"m.e.weight", "F8_E4M3", {2, 3}, u8_bytes(kA)},
        {"m.e.scale_input", "F32", {2}, f32_bytes({1.f, 2.f})}},
       {"m.e.weight"},
       "'m.e.scale_input' in " + test::temp_dir() +
           "/bad.safetensors has shape [2]: an input scale holds one value"},
      {"a scale without its weight",
       {{"m.z.scale_weight", "F32", {}, f32_bytes({1.f})}},
       {},
       "'m.z.scale_weight' in " + test::temp_dir() +
           "/bad.safetensors is an FP8 scale, but there is no 'm.z.weight' beside it"},
      {"a scale stored in FP8",
       {{"m.e.weight", "F8_E4M3", {2, 3}, u8_bytes(kA)},
        {"m.e.scale_weight", "F8_E4M3", {}, u8_bytes({0x38})}},
       {"m.e.weight"},
       "'m.e.scale_weight' in " + test::temp_dir() +
           "/bad.safetensors is an FP8 scale stored as F8_E4M3"},
      {"a scale that is not finite",
       {{"m.e.weight", "F8_E4M3", {2, 3}, u8_bytes(kA)},
        {"m.e.scale_weight", "F32", {}, f32_bytes({INFINITY})}},
       {"m.e.weight"},
       "tensor 'm.e.scale_weight' in " + test::temp_dir() +
           "/bad.safetensors holds inf: a weight scale must be finite"},
      {"a marker of more than two values",
       {{"model.scaled_fp8", "F32", {3}, f32_bytes({1.f, 2.f, 3.f})}},
       {},
       "tensor 'model.scaled_fp8' in " + test::temp_dir() +
           "/bad.safetensors has 3 values: not ComfyUI's scaled_fp8 marker"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    WeightStore s = open("bad.safetensors", c.extra);
    WeightBinder b(s, *backend_);
    for (const char* n : c.take) b.take(n, {});
    Status st = bind_all(s, &b);
    ASSERT_FALSE(st.ok());
    EXPECT_TRUE(has_substr(st.message(), c.message));
    // Named once, not again as unexpected.
    const std::string key = c.message.substr(c.message.find('\'') + 1);
    const std::string name = key.substr(0, key.find('\''));
    size_t n = 0;
    for (size_t p = st.message().find("'" + name + "'"); p != std::string::npos;
         p = st.message().find("'" + name + "'", p + 1))
      ++n;
    EXPECT_EQ(n, 1u) << st.message();
    EXPECT_FALSE(has_substr(st.message(), "unexpected tensor: " + name));
  }
}

TEST(Fp8Companion, NamesByForm) {
  EXPECT_EQ(fp8_companion("a.b.scale_weight").kind, Fp8Companion::kWeightScale);
  EXPECT_EQ(fp8_companion("a.b.scale_weight").weight, "a.b.weight");
  EXPECT_EQ(fp8_companion("a.b.weight_scale").weight, "a.b.weight");
  EXPECT_EQ(fp8_companion("a.b.scale_input").kind, Fp8Companion::kInputScale);
  EXPECT_EQ(fp8_companion("a.b.input_scale").weight, "a.b.weight");
  EXPECT_EQ(fp8_companion("scaled_fp8").kind, Fp8Companion::kMarker);
  EXPECT_EQ(fp8_companion("model.diffusion_model.scaled_fp8").kind, Fp8Companion::kMarker);
  EXPECT_EQ(fp8_companion("a.b.weight").kind, Fp8Companion::kNone);
  EXPECT_EQ(fp8_companion("a.not_scaled_fp8").kind, Fp8Companion::kNone);
  EXPECT_EQ(fp8_companion(".scale_weight").kind, Fp8Companion::kNone);  // no module
}

}  // namespace
}  // namespace latent
