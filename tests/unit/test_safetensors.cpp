// Safetensors reading/writing, sharded stores, and every malformed input we know of.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

::testing::AssertionResult has_substr(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

std::string tmp_path(const std::string& name) { return test::temp_dir() + "/" + name; }

// Writes an 8-byte length, `header` verbatim and `data_bytes` bytes of a counting pattern.
std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes) {
  const std::string path = tmp_path(name);
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header;
  for (size_t i = 0; i < data_bytes; ++i) out.put(static_cast<char>(i & 0xff));
  return path;
}

std::string write_bytes(const std::string& name, const std::string& bytes) {
  const std::string path = tmp_path(name);
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  return path;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The open error for a file; fails the test if it opened.
std::string open_error(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  EXPECT_FALSE(f.ok()) << path << " opened";
  return f.ok() ? std::string() : f.status().message();
}

class RoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(RoundTrip, WriteThenReadIsBitExact) {
  const DType dt = GetParam();
  std::map<std::string, Tensor> tensors = {
      {"encoder.conv_in.weight", test::random_tensor({8, 3, 3, 3}, 1).to_dtype(dt)},
      {"encoder.conv_in.bias", test::random_tensor({8}, 2).to_dtype(dt)},
      {"scalar", test::random_tensor({}, 3).to_dtype(dt)},
      {"empty", Tensor::empty({0, 4}, dt)},
  };
  const std::string path = tmp_path(std::string("rt_") + dtype_name(dt) + ".safetensors");
  ASSERT_TRUE(write_safetensors(path, tensors, {{"format", "pt"}, {"note", "x"}}).ok());

  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->records().size(), tensors.size());
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->metadata().at("note"), "x");
  for (const auto& [name, want] : tensors) {
    const TensorRecord* rec = (*file)->find(name);
    ASSERT_NE(rec, nullptr) << name;
    EXPECT_EQ(rec->dtype, dt);
    EXPECT_EQ(rec->shape, want.shape());
    auto got = (*file)->tensor(name);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ(got->dtype(), dt);
    EXPECT_EQ(got->shape(), want.shape());
    ASSERT_EQ(got->nbytes(), want.nbytes());
    EXPECT_EQ(std::memcmp(got->data(), want.data(), want.nbytes()), 0) << name;
  }
  // Views share the one mapping rather than copying.
  auto a = (*file)->tensor("encoder.conv_in.weight");
  auto b = (*file)->tensor("encoder.conv_in.bias");
  EXPECT_EQ(a->storage().get(), b->storage().get());
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, RoundTrip,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Safetensors, WriterIsDeterministicAndPadsHeader) {
  std::map<std::string, Tensor> tensors = {
      {"b", test::random_tensor({5}, 7)},
      {"a", test::random_tensor({3}, 8).to_dtype(DType::kBF16)}};
  const std::string p1 = tmp_path("det1.safetensors"), p2 = tmp_path("det2.safetensors");
  ASSERT_TRUE(write_safetensors(p1, tensors).ok());
  ASSERT_TRUE(write_safetensors(p2, tensors).ok());
  const std::string bytes = read_all(p1);
  EXPECT_EQ(bytes, read_all(p2));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 5 * 4 + 3 * 2);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find("\"a\""), header.find_first_of('"'));  // sorted: "a" first
  EXPECT_EQ(header.find_last_not_of(' ') + 1 <= header.size(), true);
  EXPECT_NE(header.find("\"BF16\""), std::string::npos);
}

TEST(Safetensors, TensorOutlivesFileObject) {
  const std::string path = tmp_path("outlive.safetensors");
  Tensor want = test::random_tensor({4, 4}, 9);
  ASSERT_TRUE(write_safetensors(path, {{"w", want}}).ok());
  Tensor t;
  {
    auto file = SafetensorsFile::open(path);
    ASSERT_TRUE(file.ok());
    t = (*file)->tensor("w").value();
  }
  EXPECT_EQ(t.to_floats(), want.to_floats());
}

TEST(Safetensors, MisalignedDataIsCopiedCorrectly) {
  // Header of 61 bytes: the data block starts at byte 69, not a multiple of 4.
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.resize(61, ' ');
  const std::string path = write_raw("misaligned.safetensors", header, 8);
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto t = (*file)->tensor("w");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % 4, 0u);
  const uint8_t want[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(std::memcmp(t->data(), want, 8), 0);
}

TEST(Safetensors, AbsentTensorNamesTensorAndFile) {
  const std::string path = tmp_path("absent.safetensors");
  ASSERT_TRUE(write_safetensors(path, {{"w", test::random_tensor({2}, 1)}}).ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  auto t = (*file)->tensor("nope");
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(has_substr(t.status().message(), "'nope'"));
  EXPECT_TRUE(has_substr(t.status().message(), path));
}

TEST(Safetensors, WriteIntoMissingFolderFails) {
  const std::string path = tmp_path("no/such/dir/x.safetensors");
  Status s = write_safetensors(path, {{"w", test::random_tensor({2}, 1)}});
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(has_substr(s.message(), path));
}

// --- malformed files ----------------------------------------------------------------------

TEST(SafetensorsBad, MissingFile) {
  const std::string path = tmp_path("does_not_exist.safetensors");
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "No such file"));
}

TEST(SafetensorsBad, EmptyFile) {
  const std::string path = write_bytes("empty.safetensors", "");
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "0 bytes"));
}

TEST(SafetensorsBad, ShorterThanLength) {
  const std::string path = write_bytes("short.safetensors", std::string("\x05\0\0\0\0", 5));
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "shorter than the 8-byte header length"));
}

TEST(SafetensorsBad, HeaderLengthLargerThanFile) {
  std::string bytes("\x00\x10\0\0\0\0\0\0{}", 10);  // claims 4096 header bytes
  const std::string path = write_bytes("longheader.safetensors", bytes);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "header length 4096 is larger than the 2 bytes"));
}

TEST(SafetensorsBad, HeaderLengthOverLimit) {
  // A sparse file large enough that the length fits, but over the 100 MB cap.
  const std::string path = tmp_path("huge.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    uint64_t n = 100ull * 1000 * 1000 + 8;
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  }
  ASSERT_EQ(::truncate(path.c_str(), 101ll * 1000 * 1000), 0);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "100 MB"));
  std::remove(path.c_str());
}

TEST(SafetensorsBad, NotJson) {
  const std::string path = write_raw("notjson.safetensors", "{\"w\": {dtype: F32}}     ", 0);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "not valid JSON"));
}

TEST(SafetensorsBad, HeaderNotAnObject) {
  const std::string path = write_raw("array.safetensors", "[1, 2, 3]", 0);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "must be a JSON object, found array"));
}

TEST(SafetensorsBad, DeeplyNestedHeader) {
  const std::string path = write_raw(
      "deep.safetensors", "{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}", 0);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "nests deeper"));
}

// A header length field larger than the JSON header: the "header" runs into the tensor data.
// Whatever the data bytes are, the message names the length, not nesting or JSON syntax.
std::string header_into_data(const std::string& name, const std::string& data) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  const std::string path = tmp_path(name);
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size() + data.size() / 2;  // half the data counted as header
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
  return path;
}

TEST(SafetensorsBad, HeaderLengthRunsIntoBinaryData) {
  // Data full of '[' and control bytes: the old depth check said "nests deeper than 16 levels".
  std::string data;
  for (int i = 0; i < 64; ++i) data += (i % 2 ? '[' : '\x01');
  const std::string path = header_into_data("into_binary.safetensors", data);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "header length runs into the tensor data")) << e;
  EXPECT_FALSE(has_substr(e, "nests deeper")) << e;
}

TEST(SafetensorsBad, HeaderLengthRunsIntoPrintableData) {
  const std::string path = header_into_data("into_text.safetensors", std::string(64, '['));
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, "goes on after its JSON value ends")) << e;
  EXPECT_TRUE(has_substr(e, "header length runs into the tensor data")) << e;
}

TEST(Safetensors, HeaderPaddedWithSpacesOpens) {
  const std::string path = write_raw(
      "padded.safetensors",
      std::string(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})") + "       ", 16);
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_NE((*f)->find("w"), nullptr);
}

TEST(SafetensorsBad, OffsetsPastEnd) {
  const std::string path = write_raw(
      "pastend.safetensors", R"({"enc.w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "'enc.w'"));
  EXPECT_TRUE(has_substr(e, "past the end of the 12-byte data block"));
}

TEST(SafetensorsBad, OffsetsReversed) {
  const std::string path = write_raw(
      "reversed.safetensors", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 12);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "'w'"));
}

TEST(SafetensorsBad, OffsetsOverlap) {
  const std::string path = write_raw("overlap.safetensors",
                                     R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                     12);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "'a'"));
  EXPECT_TRUE(has_substr(e, "'b'"));
  EXPECT_TRUE(has_substr(e, "overlap"));
}

TEST(SafetensorsBad, SizeDoesNotMatchShape) {
  const std::string path = write_raw(
      "size.safetensors", R"({"dec.b":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", 8);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "'dec.b'"));
  EXPECT_TRUE(has_substr(e, "needs 6"));
}

TEST(SafetensorsBad, NegativeShape) {
  const std::string path =
      write_raw("neg.safetensors", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "'w'"));
  EXPECT_TRUE(has_substr(e, "non-negative int, found -1"));
}

TEST(SafetensorsBad, NonIntShape) {
  for (const char* dim : {"2.5", "\"3\"", "null", "true", "[1]"}) {
    const std::string path = write_raw(
        "nonint.safetensors",
        std::string(R"({"w":{"dtype":"F32","shape":[)") + dim + R"(],"data_offsets":[0,0]}})", 0);
    std::string e = open_error(path);
    EXPECT_TRUE(has_substr(e, path)) << dim;
    EXPECT_TRUE(has_substr(e, "'w'")) << dim;
    EXPECT_TRUE(has_substr(e, "non-negative int")) << dim;
  }
}

TEST(SafetensorsBad, ShapeOverflow) {
  const std::string path =
      write_raw("overflow.safetensors",
                R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "too many elements"));
}

TEST(SafetensorsBad, MissingFields) {
  const std::string path =
      write_raw("fields.safetensors", R"({"w":{"dtype":"F32","data_offsets":[0,0]}})", 0);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "'shape'"));
}

TEST(SafetensorsBad, DuplicateTensorName) {
  const std::string path = write_raw("dup.safetensors",
                                     R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                     R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                     8);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "'w' more than once"));
}

TEST(SafetensorsBad, MetadataNotStrings) {
  const std::string path = write_raw("meta.safetensors", R"({"__metadata__":{"step":5}})", 0);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "'step'"));
}

TEST(SafetensorsBad, UnknownDtypeRejectedAtOpen) {
  const std::string path = write_raw(
      "q7.safetensors", R"({"vae.w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1);
  std::string e = open_error(path);
  EXPECT_TRUE(has_substr(e, path));
  EXPECT_TRUE(has_substr(e, "'vae.w'"));
  EXPECT_TRUE(has_substr(e, "unknown dtype 'Q7'"));
}

TEST(SafetensorsBad, UnsupportedDtypeNamedWhenUsed) {
  // Full single-file checkpoints carry int64 position ids next to the VAE: the file opens,
  // the int64 tensor is not a record, and asking for it names the dtype.
  const std::string path =
      write_raw("i64.safetensors",
                R"({"pos_ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                R"("w":{"dtype":"F16","shape":[2],"data_offsets":[16,20]}})",
                20);
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->records().size(), 1u);
  EXPECT_EQ((*file)->find("pos_ids"), nullptr);
  EXPECT_TRUE((*file)->tensor("w").ok());
  auto t = (*file)->tensor("pos_ids");
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(has_substr(t.status().message(), "unsupported dtype I64"));
  EXPECT_TRUE(has_substr(t.status().message(), "'pos_ids'"));
  EXPECT_TRUE(has_substr(t.status().message(), path));

  // Its bytes still count: an overlap with it is caught.
  const std::string bad =
      write_raw("i64_overlap.safetensors",
                R"({"pos_ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                R"("w":{"dtype":"F16","shape":[2],"data_offsets":[12,16]}})",
                16);
  EXPECT_TRUE(has_substr(open_error(bad), "overlap"));
}

TEST(SafetensorsBad, ParseHeaderInMemory) {
  std::vector<TensorRecord> recs;
  std::map<std::string, std::string> meta;
  uint64_t start = 0;
  const std::string header = R"({"w":{"dtype":"BF16","shape":[2,1],"data_offsets":[0,4]}})";
  std::string buf(8, '\0');
  buf[0] = static_cast<char>(header.size());
  buf += header + "abcd";
  ASSERT_TRUE(parse_safetensors_header(reinterpret_cast<const uint8_t*>(buf.data()), buf.size(),
                                       "mem", &recs, &meta, &start)
                  .ok());
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].shape, (Shape{2, 1}));
  EXPECT_EQ(start, 8 + header.size());
  Status s = parse_safetensors_header(reinterpret_cast<const uint8_t*>(buf.data()), buf.size() - 1,
                                      "mem-image", &recs, &meta, &start);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(has_substr(s.message(), "mem-image"));
}

// --- WeightStore ----------------------------------------------------------------------------

std::string write_index(const std::string& name, const std::string& body) {
  return write_bytes(name, body);
}

TEST(WeightStore, SingleFile) {
  const std::string path = tmp_path("store_single.safetensors");
  ASSERT_TRUE(write_safetensors(
                  path, {{"b", test::random_tensor({2}, 1)}, {"a", test::random_tensor({3}, 2)}})
                  .ok());
  auto store = WeightStore::open(path);
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_EQ(store->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(store->contains("a"));
  EXPECT_FALSE(store->contains("c"));
  ASSERT_NE(store->find("b"), nullptr);
  EXPECT_EQ(store->find("b")->shape, (Shape{2}));
  auto missing = store->get("c");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(has_substr(missing.status().message(), path));
}

TEST(WeightStore, ShardedIndex) {
  const std::string dir = test::temp_dir() + "/sharded";
  ASSERT_EQ(::system(("mkdir -p " + dir).c_str()), 0);
  Tensor a = test::random_tensor({4}, 1), b = test::random_tensor({2, 2}, 2).to_dtype(DType::kF16);
  Tensor c = test::random_tensor({3}, 3).to_dtype(DType::kBF16);
  ASSERT_TRUE(
      write_safetensors(dir + "/model-00001-of-00002.safetensors", {{"enc.a", a}, {"enc.b", b}})
          .ok());
  ASSERT_TRUE(write_safetensors(dir + "/model-00002-of-00002.safetensors", {{"dec.c", c}}).ok());
  const std::string index = write_index(
      "sharded/model.safetensors.index.json",
      R"({"metadata":{"total_size":30},"weight_map":{"enc.a":"model-00001-of-00002.safetensors",)"
      R"("enc.b":"model-00001-of-00002.safetensors","dec.c":"model-00002-of-00002.safetensors"}})");
  auto store = WeightStore::open(index);
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_EQ(store->names(), (std::vector<std::string>{"dec.c", "enc.a", "enc.b"}));
  EXPECT_EQ(store->path(), index);
  auto gc = store->get("dec.c");
  ASSERT_TRUE(gc.ok());
  EXPECT_EQ(gc->dtype(), DType::kBF16);
  EXPECT_EQ(std::memcmp(gc->data(), c.data(), c.nbytes()), 0);
  auto gb = store->get("enc.b");
  ASSERT_TRUE(gb.ok());
  EXPECT_EQ(std::memcmp(gb->data(), b.data(), b.nbytes()), 0);
}

TEST(WeightStore, IndexPointsAtMissingShard) {
  const std::string dir = test::temp_dir() + "/missing_shard";
  ASSERT_EQ(::system(("mkdir -p " + dir).c_str()), 0);
  const std::string index = write_index("missing_shard/model.safetensors.index.json",
                                        R"({"weight_map":{"enc.a":"gone.safetensors"}})");
  auto store = WeightStore::open(index);
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(has_substr(store.status().message(), index));
  EXPECT_TRUE(has_substr(store.status().message(), dir + "/gone.safetensors"));
  EXPECT_TRUE(has_substr(store.status().message(), "'enc.a'"));
}

TEST(WeightStore, IndexListsTensorAbsentFromShard) {
  const std::string dir = test::temp_dir() + "/absent_in_shard";
  ASSERT_EQ(::system(("mkdir -p " + dir).c_str()), 0);
  ASSERT_TRUE(
      write_safetensors(dir + "/s1.safetensors", {{"enc.a", test::random_tensor({1}, 1)}}).ok());
  const std::string index =
      write_index("absent_in_shard/model.safetensors.index.json",
                  R"({"weight_map":{"enc.a":"s1.safetensors","enc.z":"s1.safetensors"}})");
  auto store = WeightStore::open(index);
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(has_substr(store.status().message(), index));
  EXPECT_TRUE(has_substr(store.status().message(), dir + "/s1.safetensors"));
  EXPECT_TRUE(has_substr(store.status().message(), "'enc.z'"));
}

TEST(WeightStore, TensorInTwoShards) {
  const std::string dir = test::temp_dir() + "/dup_shards";
  ASSERT_EQ(::system(("mkdir -p " + dir).c_str()), 0);
  ASSERT_TRUE(
      write_safetensors(dir + "/s1.safetensors", {{"enc.a", test::random_tensor({1}, 1)}}).ok());
  ASSERT_TRUE(write_safetensors(dir + "/s2.safetensors", {{"enc.a", test::random_tensor({1}, 1)},
                                                          {"enc.b", test::random_tensor({1}, 1)}})
                  .ok());
  const std::string index =
      write_index("dup_shards/model.safetensors.index.json",
                  R"({"weight_map":{"enc.a":"s1.safetensors","enc.b":"s2.safetensors"}})");
  auto store = WeightStore::open(index);
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(has_substr(store.status().message(), "'enc.a'"));
  EXPECT_TRUE(has_substr(store.status().message(), dir + "/s1.safetensors"));
  EXPECT_TRUE(has_substr(store.status().message(), dir + "/s2.safetensors"));
}

TEST(WeightStore, BadShardIsNamedWithIndex) {
  const std::string dir = test::temp_dir() + "/bad_shard";
  ASSERT_EQ(::system(("mkdir -p " + dir).c_str()), 0);
  write_bytes("bad_shard/s1.safetensors", "xyz");
  const std::string index = write_index("bad_shard/model.safetensors.index.json",
                                        R"({"weight_map":{"enc.a":"s1.safetensors"}})");
  auto store = WeightStore::open(index);
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(has_substr(store.status().message(), index));
  EXPECT_TRUE(has_substr(store.status().message(), dir + "/s1.safetensors"));
}

TEST(WeightStore, MalformedIndex) {
  const std::string dir = test::temp_dir() + "/bad_index";
  ASSERT_EQ(::system(("mkdir -p " + dir).c_str()), 0);
  struct Case {
    const char* body;
    const char* expect;
  } cases[] = {
      {R"({"weight_map": [1]})", "\"weight_map\" object"},
      {R"({"metadata": {}})", "\"weight_map\" object"},
      {R"({"weight_map": {"a": 3}})", "'a' must name a shard file"},
      {R"({"weight_map": {}})", "empty"},
      {R"({"weight_map": {"a": "s.safetensors",})", "not valid JSON"},
      {R"([])", "must be a JSON object"},
  };
  for (const auto& c : cases) {
    const std::string index = write_index("bad_index/model.safetensors.index.json", c.body);
    auto store = WeightStore::open(index);
    ASSERT_FALSE(store.ok()) << c.body;
    EXPECT_TRUE(has_substr(store.status().message(), index)) << c.body;
    EXPECT_TRUE(has_substr(store.status().message(), c.expect)) << c.body;
  }
  auto none = WeightStore::open(dir + "/absent.safetensors.index.json");
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(has_substr(none.status().message(), dir + "/absent.safetensors.index.json"));
}

}  // namespace
}  // namespace latent
