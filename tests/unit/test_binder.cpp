// WeightBinder on the real CPU backend: uploads, shape checks, and the one report of every
// missing, misshaped and unexpected tensor.
#include <gtest/gtest.h>

#include <fstream>

#include "engine/backends/registry.h"
#include "engine/weights/binder.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

::testing::AssertionResult has_substr(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t p = text.find(part); p != std::string::npos; p = text.find(part, p + 1)) ++n;
  return n;
}

class BinderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = get_backend({"cpu", ""});
    ASSERT_TRUE(b.ok()) << b.status().message();
    backend_ = *b;
  }

  // Writes `tensors` to a fresh file and opens it as a store.
  WeightStore store_of(const std::string& name, const std::map<std::string, Tensor>& tensors) {
    path_ = test::temp_dir() + "/" + name + ".safetensors";
    Status s = write_safetensors(path_, tensors);
    EXPECT_TRUE(s.ok()) << s.message();
    auto store = WeightStore::open(path_);
    EXPECT_TRUE(store.ok()) << store.status().message();
    return std::move(store).value();
  }

  std::shared_ptr<Backend> backend_;
  std::string path_;
};

TEST_F(BinderTest, TakesUploadsAndCounts) {
  Tensor w = test::random_tensor({4, 3, 3, 3}, 1);
  Tensor b = test::random_tensor({4}, 2).to_dtype(DType::kBF16);
  Tensor g = test::random_tensor({4}, 3).to_dtype(DType::kF16);
  WeightStore store = store_of(
      "full",
      {{"encoder.conv_in.weight", w}, {"encoder.conv_in.bias", b}, {"encoder.norm.weight", g}});
  WeightBinder binder(store, *backend_);
  EXPECT_TRUE(binder.has("encoder.conv_in.weight"));
  EXPECT_FALSE(binder.has("decoder.conv_in.weight"));

  Tensor tw = binder.take("encoder.conv_in.weight", {4, 3, 3, 3});
  Tensor tb = binder.take("encoder.conv_in.bias", {4});
  Tensor tg = binder.take_host("encoder.norm.weight", {4});
  ASSERT_TRUE(tw.defined());
  ASSERT_TRUE(tb.defined());
  ASSERT_TRUE(tg.defined());
  EXPECT_EQ(tw.device(), backend_->device());
  EXPECT_EQ(tw.dtype(), backend_->compute_dtype());
  EXPECT_EQ(tw.shape(), w.shape());

  auto dw = backend_->download(tw);
  ASSERT_TRUE(dw.ok()) << dw.status().message();
  EXPECT_EQ(dw->to_floats(), w.to_floats());
  auto db = backend_->download(tb);
  ASSERT_TRUE(db.ok());
  EXPECT_EQ(db->to_floats(), b.to_floats());  // bf16 -> fp32 is exact
  EXPECT_EQ(tg.dtype(), DType::kF32);
  EXPECT_TRUE(tg.device().is_cpu());
  EXPECT_EQ(tg.to_floats(), g.to_floats());

  Status s = binder.finish();
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(binder.parameters_taken(), 108 + 4 + 4);
  EXPECT_EQ(binder.storage_dtypes().at("fp32"), 108);
  EXPECT_EQ(binder.storage_dtypes().at("bf16"), 4);
  EXPECT_EQ(binder.storage_dtypes().at("fp16"), 4);

  // Taking a tensor twice does not count it twice.
  binder.take("encoder.conv_in.bias", {4});
  EXPECT_EQ(binder.parameters_taken(), 116);
}

TEST_F(BinderTest, EmptyShapeSkipsCheck) {
  WeightStore store = store_of("noshape", {{"w", test::random_tensor({2, 5}, 1)}});
  WeightBinder binder(store, *backend_);
  Tensor t = binder.take("w", {});
  ASSERT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{2, 5}));
  EXPECT_TRUE(binder.finish().ok());
}

TEST_F(BinderTest, MisshapedTensorNamesFileAndShapes) {
  WeightStore store =
      store_of("misshaped", {{"encoder.conv_in.weight", test::random_tensor({4, 3, 3, 3}, 1)}});
  WeightBinder binder(store, *backend_);
  Tensor t = binder.take("encoder.conv_in.weight", {8, 3, 3, 3});
  EXPECT_FALSE(t.defined());
  Status s = binder.finish();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(has_substr(s.message(), "tensor 'encoder.conv_in.weight' in " + path_ +
                                          " has shape [4, 3, 3, 3], expected [8, 3, 3, 3]"));
  EXPECT_FALSE(has_substr(s.message(), "unexpected"));  // asked for, so not unexpected
}

TEST_F(BinderTest, MissingAndUnexpectedInOneReport) {
  WeightStore store = store_of("mixed", {{"encoder.conv_in.weight", test::random_tensor({2}, 1)},
                                         {"encoder.extra.weight", test::random_tensor({2}, 1)},
                                         {"decoder.conv_out.bias", test::random_tensor({3}, 1)}});
  WeightBinder binder(store, *backend_);
  binder.take("encoder.conv_in.weight", {2});
  EXPECT_FALSE(binder.take("encoder.down_blocks.0.resnets.0.conv1.weight", {2}).defined());
  EXPECT_FALSE(binder.take("decoder.conv_out.bias", {4}).defined());
  Status s = binder.finish();
  ASSERT_FALSE(s.ok());
  const std::string& m = s.message();
  EXPECT_TRUE(has_substr(m, path_));
  EXPECT_TRUE(has_substr(m, "1 missing tensor: encoder.down_blocks.0.resnets.0.conv1.weight"));
  EXPECT_TRUE(
      has_substr(m, "'decoder.conv_out.bias' in " + path_ + " has shape [3], expected [4]"));
  EXPECT_TRUE(has_substr(m, "1 unexpected tensor: encoder.extra.weight"));
}

TEST_F(BinderTest, IgnoredPrefixIsNotUnexpected) {
  WeightStore store = store_of("ignored", {{"encoder.a", test::random_tensor({2}, 1)},
                                           {"decoder.a", test::random_tensor({2}, 1)},
                                           {"decoder.b", test::random_tensor({2}, 1)}});
  {
    WeightBinder binder(store, *backend_);
    binder.take("encoder.a", {2});
    Status s = binder.finish();
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(has_substr(s.message(), "2 unexpected tensors: decoder.a, decoder.b"));
  }
  WeightBinder binder(store, *backend_);
  binder.ignore_prefix("decoder.");
  binder.take("encoder.a", {2});
  EXPECT_TRUE(binder.finish().ok()) << binder.finish().message();
}

TEST_F(BinderTest, OptionalTensors) {
  WeightStore store =
      store_of("optional", {{"quant_conv.weight", test::random_tensor({8, 8, 1, 1}, 1)}});
  WeightBinder binder(store, *backend_);
  EXPECT_FALSE(binder.take_optional("post_quant_conv.weight", {8, 8, 1, 1}).defined());
  EXPECT_TRUE(binder.take_optional("quant_conv.weight", {8, 8, 1, 1}).defined());
  EXPECT_TRUE(binder.finish().ok()) << binder.finish().message();

  WeightBinder strict(store, *backend_);
  EXPECT_FALSE(strict.take_optional("quant_conv.weight", {4, 8, 1, 1}).defined());
  Status s = strict.finish();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(has_substr(s.message(), "'quant_conv.weight' in " + path_ +
                                          " has shape [8, 8, 1, 1], expected [4, 8, 1, 1]"));
}

TEST_F(BinderTest, RenameMapsModelNamesToStoreNames) {
  WeightStore store = store_of(
      "renamed", {{"first_stage_model.encoder.conv_in.weight", test::random_tensor({2}, 1)},
                  {"cond_stage_model.x", test::random_tensor({1}, 1)}});
  auto rename = [](const std::string& n) { return "first_stage_model." + n; };
  WeightBinder binder(store, *backend_, rename);
  binder.ignore_prefix("cond_stage_model.");
  EXPECT_TRUE(binder.has("encoder.conv_in.weight"));
  EXPECT_TRUE(binder.take("encoder.conv_in.weight", {2}).defined());
  EXPECT_FALSE(binder.take("encoder.conv_out.weight", {2}).defined());
  EXPECT_FALSE(binder.take("encoder.conv_in.weight", {3}).defined());
  Status s = binder.finish();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(has_substr(s.message(),
                         "encoder.conv_out.weight (as first_stage_model.encoder.conv_out.weight)"));
  EXPECT_TRUE(has_substr(s.message(),
                         "'encoder.conv_in.weight' (stored as "
                         "'first_stage_model.encoder.conv_in.weight') in " +
                             path_));
  EXPECT_FALSE(has_substr(s.message(), "unexpected"));
}

TEST_F(BinderTest, LongListsAreCapped) {
  std::map<std::string, Tensor> tensors;
  for (int i = 0; i < 15; ++i) tensors["extra." + std::to_string(i)] = test::random_tensor({1}, i);
  WeightStore store = store_of("capped", tensors);
  WeightBinder binder(store, *backend_);
  for (int i = 0; i < 25; ++i)
    binder.take("decoder.up_blocks." + std::to_string(i) + ".weight", {1});
  Status s = binder.finish();
  ASSERT_FALSE(s.ok());
  const std::string& m = s.message();
  EXPECT_TRUE(has_substr(m, "25 missing tensors: decoder.up_blocks.0.weight"));
  EXPECT_TRUE(has_substr(m, "15 unexpected tensors: extra.0, extra.1, "));
  EXPECT_TRUE(has_substr(m, "decoder.up_blocks.9.weight and 15 more."));
  EXPECT_TRUE(has_substr(m, "extra.4 and 5 more."));
  // The 20 listed names are shared between the two kinds.
  EXPECT_EQ(count_of(m, "decoder.up_blocks."), 10u);
  EXPECT_EQ(count_of(m, "extra."), 10u);
}

TEST_F(BinderTest, UnsupportedDtypeIsNamed) {
  // A hand-written file with an int64 tensor next to a float one.
  const std::string path = test::temp_dir() + "/binder_i64.safetensors";
  {
    const std::string header = R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                               R"("w":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})";
    std::ofstream out(path, std::ios::binary);
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header << std::string(20, '\0');
  }
  auto store = WeightStore::open(path);
  ASSERT_TRUE(store.ok()) << store.status().message();
  WeightBinder binder(*store, *backend_);
  EXPECT_TRUE(binder.take("w", {1}).defined());
  EXPECT_FALSE(binder.take("ids", {2}).defined());
  Status s = binder.finish();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(has_substr(s.message(), "unsupported dtype I64 for tensor 'ids' in " + path));
}

}  // namespace
}  // namespace latent
