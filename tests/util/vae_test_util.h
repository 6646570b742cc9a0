// Helpers shared by the VAE model tests (tests/model/test_autoencoder_kl.cpp, test_tiny.cpp):
// the fixtures of scripts/make_fixtures.py and checks against them on the CPU backend.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/backends/backend.h"
#include "engine/models/vae/vae.h"

namespace latent::test {

// The shared fp32 CPU backend.
std::shared_ptr<Backend> cpu();
// tests/fixtures/<name>.
std::string fixture(const std::string& name);

// A fixture's io.safetensors: diffusers' inputs and outputs (fp32).
struct Io {
  Tensor sample, latent_mean, latent, decoded;
};
Io load_io(const std::string& dir);

// Runs the model on the fixture's inputs and compares with diffusers' outputs (relative L2).
void expect_matches(VaeModel& model, const Io& io, bool encoder = true, bool decoder = true,
                    double tolerance = 1e-3);

std::unique_ptr<VaeModel> load_ok(const std::string& path, const VaeLoadOptions& opts = {});
// The load must fail; returns its message.
std::string load_error(const std::string& path, const VaeLoadOptions& opts = {});

// Every tensor of a safetensors file, in its stored dtype.
std::map<std::string, Tensor> read_all(const std::string& path);
void write_all(const std::string& path, const std::map<std::string, Tensor>& tensors);
void write_text(const std::string& path, const std::string& text);
nlohmann::json read_json(const std::string& path);
// A fresh (emptied) folder under the test's temp dir.
std::string new_dir(const std::string& name);
// A diffusers folder whose weights are `tensors` and config `config`.
std::string folder_with(const std::string& name, const std::map<std::string, Tensor>& tensors,
                        const nlohmann::json& config);

// The load error of fixture `fixture_name`'s diffusers folder with config.json's `key` set to
// `value`, written as folder `dir`.
std::string config_error(const std::string& fixture_name, const std::string& dir,
                         const std::string& key, const nlohmann::json& value);

// The message of model.encode (or, with encode false, decode) of the seeded random tensor of
// `shape` on the model's backend; the call must fail.
std::string input_error(VaeModel& model, bool encode, const Shape& shape, uint64_t seed);
// The same, and the message must contain `needle`.
void expect_input_error(VaeModel& model, bool encode, const Shape& shape, uint64_t seed,
                        const std::string& needle);

}  // namespace latent::test
