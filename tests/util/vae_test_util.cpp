#include "tests/util/vae_test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/backends/registry.h"
#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"

namespace latent::test {

std::shared_ptr<Backend> cpu() {
  auto b = get_backend(BackendOptions{"cpu", ""});
  EXPECT_TRUE(b.ok()) << b.status().message();
  return b.ok() ? *b : nullptr;
}

std::string fixture(const std::string& name) { return fixtures_dir() + "/" + name; }

Io load_io(const std::string& dir) {
  Io io;
  auto f = SafetensorsFile::open(dir + "/io.safetensors");
  EXPECT_TRUE(f.ok()) << f.status().message()
                      << " (generate the fixtures with scripts/make_fixtures.py)";
  if (!f.ok()) return io;
  auto get = [&](const char* n) {
    auto t = (*f)->tensor(n);
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? t->to_dtype(DType::kF32) : Tensor();
  };
  io.sample = get("sample");
  io.latent_mean = get("latent_mean");
  io.latent = get("latent");
  io.decoded = get("decoded");
  return io;
}

void expect_matches(VaeModel& model, const Io& io, bool encoder, bool decoder, double tolerance) {
  Backend& b = model.backend();
  if (encoder) {
    auto x = b.upload(io.sample);
    ASSERT_TRUE(x.ok()) << x.status().message();
    auto z = model.encode(*x);
    ASSERT_TRUE(z.ok()) << z.status().message();
    auto host = b.download(*z);
    ASSERT_TRUE(host.ok()) << host.status().message();
    ASSERT_EQ(host->shape(), io.latent_mean.shape());
    EXPECT_LT(relative_l2(*host, io.latent_mean), tolerance) << "encoder";
  }
  if (decoder) {
    auto z = b.upload(io.latent);
    ASSERT_TRUE(z.ok()) << z.status().message();
    auto y = model.decode(*z);
    ASSERT_TRUE(y.ok()) << y.status().message();
    auto host = b.download(*y);
    ASSERT_TRUE(host.ok()) << host.status().message();
    ASSERT_EQ(host->shape(), io.decoded.shape());
    EXPECT_LT(relative_l2(*host, io.decoded), tolerance) << "decoder";
  }
}

std::unique_ptr<VaeModel> load_ok(const std::string& path, const VaeLoadOptions& opts) {
  auto m = load_vae(path, cpu(), opts);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::string load_error(const std::string& path, const VaeLoadOptions& opts) {
  auto m = load_vae(path, cpu(), opts);
  EXPECT_FALSE(m.ok()) << path << " loaded but should not have";
  return m.ok() ? "" : m.status().message();
}

std::map<std::string, Tensor> read_all(const std::string& path) {
  std::map<std::string, Tensor> out;
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return out;
  for (const auto& r : (*f)->records()) out[r.name] = (*f)->tensor(r.name)->to_dtype(r.dtype);
  return out;
}

void write_all(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  Status s = write_safetensors(path, tensors);
  ASSERT_TRUE(s.ok()) << s.message();
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::string new_dir(const std::string& name) {
  std::string d = temp_dir() + "/" + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

std::string folder_with(const std::string& name, const std::map<std::string, Tensor>& tensors,
                        const nlohmann::json& config) {
  std::string d = new_dir(name);
  write_all(d + "/diffusion_pytorch_model.safetensors", tensors);
  write_text(d + "/config.json", config.dump(2));
  return d;
}

std::string config_error(const std::string& fixture_name, const std::string& dir,
                         const std::string& key, const nlohmann::json& value) {
  auto sd = read_all(fixture(fixture_name) + "/diffusion_pytorch_model.safetensors");
  auto cfg = read_json(fixture(fixture_name) + "/config.json");
  cfg[key] = value;
  return load_error(folder_with(dir, sd, cfg));
}

std::string input_error(VaeModel& model, bool encode, const Shape& shape, uint64_t seed) {
  auto x = model.backend().upload(random_tensor(shape, seed));
  EXPECT_TRUE(x.ok()) << x.status().message();
  if (!x.ok()) return "";
  auto r = encode ? model.encode(*x) : model.decode(*x);
  EXPECT_FALSE(r.ok()) << (encode ? "encode" : "decode") << " of " << shape_str(shape)
                       << " succeeded";
  return r.ok() ? "" : r.status().message();
}

void expect_input_error(VaeModel& model, bool encode, const Shape& shape, uint64_t seed,
                        const std::string& needle) {
  const std::string msg = input_error(model, encode, shape, seed);
  EXPECT_NE(msg.find(needle), std::string::npos) << msg;
}

}  // namespace latent::test
