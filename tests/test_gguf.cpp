// GGUF reader and writer: real files, round trips, and a corruption suite (run under ASan+UBSan
// by scripts/test.sh). Every corrupted input must give gguf::Error, never a crash or a hang.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include "atomic_file.h"
#include "gguf.h"
#include "test_support.h"

using namespace gguf;
using vkllm::test::read_file;
using vkllm::test::shared_files;
using vkllm::test::shared_path;

namespace {

// A file holding every value type, nested arrays and a few tensors of different types.
Writer sample_writer() {
  Writer w;
  w.set("general.architecture", Value::str("llama"));
  w.set("t.u8", {ValueType::U8, uint64_t{200}});
  w.set("t.i8", {ValueType::I8, int64_t{-100}});
  w.set("t.u16", {ValueType::U16, uint64_t{60000}});
  w.set("t.i16", {ValueType::I16, int64_t{-30000}});
  w.set("t.u32", Value::u32(4000000000u));
  w.set("t.i32", Value::i32(-2000000000));
  w.set("t.f32", Value::f32(1.5f));
  w.set("t.bool", Value::boolean(true));
  w.set("t.string", Value::str("héllo ▁world"));
  w.set("t.u64", Value::u64(0xFFFFFFFFFFFFFFFFull));
  w.set("t.i64", {ValueType::I64, int64_t{INT64_MIN}});
  w.set("t.f64", {ValueType::F64, 3.141592653589793});
  w.set("t.strings", Value::strings({"a", "", "ccc", "<0x0A>"}));
  const float fl[] = {1.0f, -2.5f, 1e-8f};
  w.set("t.f32s", Value::f32s(fl));
  const int32_t il[] = {1, -2, 3};
  w.set("t.i32s", Value::i32s(il));
  Array nested;
  nested.elem_type = ValueType::ARRAY;
  nested.count = 2;
  nested.arrays = {Value::strings({"x", "y"}), Value::i32s(il)};
  w.set("t.nested", {ValueType::ARRAY, nested});
  Array bools;
  bools.elem_type = ValueType::BOOL;
  bools.count = 3;
  bools.raw = {1, 0, 1};
  w.set("t.bools", {ValueType::ARRAY, bools});

  std::vector<uint8_t> f32(4 * 8 * 4, 0x11), q8(34 * 2 * 3, 0x22), q4k(144 * 2, 0x33);
  w.add_tensor("a.weight", TensorType::F32, {8, 4}, f32);
  w.add_tensor("b.weight", TensorType::Q8_0, {64, 3}, q8);
  w.add_tensor("c.weight", TensorType::Q4_K, {256, 1, 2}, q4k);
  return w;
}

void expect_error(std::span<const uint8_t> bytes, const std::string& needle) {
  try {
    File::parse(bytes, "hostile.gguf");
    ADD_FAILURE() << "parsed without error; expected: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hostile.gguf"), std::string::npos) << e.what();
  }
}

// A header: magic, version, n_tensors, n_kv.
std::vector<uint8_t> header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
  std::vector<uint8_t> b(24);
  const uint32_t magic = 0x46554747u;
  std::memcpy(&b[0], &magic, 4);
  std::memcpy(&b[4], &version, 4);
  std::memcpy(&b[8], &n_tensors, 8);
  std::memcpy(&b[16], &n_kv, 8);
  return b;
}
template <typename T>
void put(std::vector<uint8_t>& b, T v) {
  const size_t n = b.size();
  b.resize(n + sizeof v);
  std::memcpy(&b[n], &v, sizeof v);
}
void put_str(std::vector<uint8_t>& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
// One tensor info with the given dims/type/offset, padded with enough zero data.
std::vector<uint8_t> one_tensor(std::vector<uint64_t> ne, uint32_t type, uint64_t offset, size_t data_bytes = 64) {
  auto b = header(1, 0);
  put_str(b, "t");
  put<uint32_t>(b, static_cast<uint32_t>(ne.size()));
  for (uint64_t d : ne) put<uint64_t>(b, d);
  put<uint32_t>(b, type);
  put<uint64_t>(b, offset);
  b.resize((b.size() + 31) / 32 * 32 + data_bytes, 0);
  return b;
}

}  // namespace

TEST(Gguf, ParsesEveryShippedFile) {
  std::vector<std::string> files = shared_files("models", ".gguf");
  for (const std::string& v : shared_files("vocab", ".gguf")) files.push_back(v);
  if (files.empty()) GTEST_SKIP() << vkllm::test::missing_message("models/");
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    const File f = File::open(path);
    EXPECT_GE(f.version(), 2u);
    EXPECT_FALSE(f.get_string("general.architecture").empty());
    EXPECT_GT(f.get_array("tokenizer.ggml.tokens").count, 0u);
    for (const TensorInfo& t : f.tensors()) {
      EXPECT_GE(t.data, reinterpret_cast<const uint8_t*>(0) + 1);
      EXPECT_LE(f.data_offset() + t.offset + t.n_bytes, f.file_size());
    }
  }
}

TEST(Gguf, Stories260KHeader) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const File f = File::open(shared_path("models/stories260K.gguf"));
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u32("llama.block_count"), 5u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count"), 8u);
  EXPECT_EQ(f.get_array("tokenizer.ggml.tokens").count, 512u);
  const TensorInfo* emb = f.find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->ne[0], 64u);
  EXPECT_EQ(emb->ne[1], 512u);
  EXPECT_EQ(emb->type, TensorType::F32);
  try {
    f.get_u32("general.architecture");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key 'general.architecture' is a string, expected u32"), std::string::npos) << e.what();
  }
}

TEST(Gguf, WriterRoundTripsEveryValueType) {
  const Writer w = sample_writer();
  const std::vector<uint8_t> bytes = w.to_bytes();
  const File f = File::parse(bytes);
  EXPECT_EQ(f.version(), 3u);
  ASSERT_EQ(f.metadata().size(), 18u);
  EXPECT_EQ(std::get<uint64_t>(f.find("t.u8")->data), 200u);
  EXPECT_EQ(std::get<int64_t>(f.find("t.i8")->data), -100);
  EXPECT_EQ(f.get_u32("t.u32"), 4000000000u);
  EXPECT_EQ(f.get_i64("t.i32"), -2000000000);
  EXPECT_EQ(f.get_f32("t.f32"), 1.5f);
  EXPECT_TRUE(f.get_bool("t.bool"));
  EXPECT_EQ(f.get_string("t.string"), "héllo ▁world");
  EXPECT_EQ(f.get_u64("t.u64"), 0xFFFFFFFFFFFFFFFFull);
  EXPECT_EQ(f.get_i64("t.i64"), INT64_MIN);
  EXPECT_EQ(std::get<double>(f.find("t.f64")->data), 3.141592653589793);
  EXPECT_EQ(f.get_array("t.strings").strings[3], "<0x0A>");
  EXPECT_EQ(f.get_array("t.f32s").float_at(1), -2.5);
  EXPECT_EQ(f.get_array("t.i32s").int_at(1), -2);
  EXPECT_EQ(f.get_array("t.nested").arrays[0], Value::strings({"x", "y"}));
  // read(write(x)) == x for every value, and writing again gives the same bytes.
  Writer again;
  for (const auto& [k, v] : f.metadata()) {
    again.set(k, v);
  }
  for (const TensorInfo& t : f.tensors()) {
    again.add_tensor(t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims), {t.data, t.n_bytes});
  }
  EXPECT_EQ(again.to_bytes(), bytes);
  const File orig = File::parse(w.to_bytes());
  for (size_t i = 0; i < orig.metadata().size(); ++i) EXPECT_EQ(orig.metadata()[i], f.metadata()[i]) << orig.metadata()[i].first;
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[2].type, TensorType::Q4_K);
  EXPECT_EQ(f.tensors()[2].n_bytes, 288u);
  EXPECT_EQ(f.tensors()[1].data[0], 0x22);
}

TEST(Gguf, WriterWritesAtomicallyToDisk) {
  const std::string dir = testing::TempDir(), path = dir + "/vkllm_writer_test.gguf";
  // The temporary file of a writer killed mid-write (a PID no process has: above Linux's largest
  // pid_max) is removed by the next write once it is an hour old; a fresh one stays (its writer may
  // live in another PID namespace), as does a live writer's (this process's).
  const std::string orphan = dir + "/.vkllm_writer_test.gguf.999999999.a1B2c3";
  const std::string fresh = dir + "/.vkllm_writer_test.gguf.999999998.a1B2c3";
  const std::string live = dir + "/.vkllm_writer_test.gguf." + std::to_string(getpid()) + ".a1B2c3";
  std::ofstream(orphan) << "partial";
  std::ofstream(fresh) << "partial";
  std::ofstream(live) << "partial";
  std::filesystem::last_write_time(orphan, std::filesystem::file_time_type::clock::now() - std::chrono::minutes(61));
  sample_writer().write(path);
  const File f = File::open(path);
  EXPECT_EQ(f.tensors().size(), 3u);
  EXPECT_FALSE(std::filesystem::exists(orphan));
  EXPECT_TRUE(std::filesystem::exists(fresh));
  EXPECT_TRUE(std::filesystem::exists(live));
  std::filesystem::remove(fresh);
  for (const auto& e : std::filesystem::directory_iterator(dir))  // and its own temporary is gone
    EXPECT_FALSE(e.path().filename().string().starts_with(".vkllm_writer_test.gguf.") && e.path() != live) << e.path();
  std::filesystem::remove(live);
  std::filesystem::remove(path);
}

// Only a regular file is replaced: a link to a FIFO (or a device: the pipeline cache once replaced
// what its link named) is refused and left as it is.
TEST(Gguf, WriterReplacesOnlyRegularFiles) {
  const std::string dir = testing::TempDir(), fifo = dir + "/vkllm_writer_fifo", link = dir + "/vkllm_writer_link";
  std::filesystem::remove(fifo);
  std::filesystem::remove(link);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::filesystem::create_symlink(fifo, link);
  const uint8_t byte = 1;
  EXPECT_THROW(write_file_atomic(link, std::span(&byte, 1)), Error);
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  std::filesystem::remove(link);
  std::filesystem::remove(fifo);
}

// A name whose temporary would be too long for the directory is refused by check_writable (before
// a run's generation), not by the write after it; one 16 bytes under the limit is written.
TEST(Gguf, WriterRefusesNamesItsTemporaryCannotHave) {
  const std::string dir = testing::TempDir();
  const long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  ASSERT_GT(name_max, 20);
  const std::string too_long = dir + "/" + std::string(size_t(name_max) - 10, 'n'), fits = dir + "/" + std::string(size_t(name_max) - 16, 'f');
  try {
    check_writable(too_long);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the file name is too long to be written safely"), std::string::npos) << e.what();
  }
  const uint8_t byte = 1;
  EXPECT_THROW(write_file_atomic(too_long, std::span(&byte, 1)), Error);
  EXPECT_FALSE(std::filesystem::exists(too_long));
  check_writable(fits);
  write_file_atomic(fits, std::span(&byte, 1));
  EXPECT_EQ(std::filesystem::file_size(fits), 1u);
  std::filesystem::remove(fits);
}

// A replaced file keeps its permission bits (a private session stays private); a new one gets
// 0666 less the umask; a symbolic link is followed, so the file it names is replaced and the
// link stays; a file this process may not write is refused (root may write any).
TEST(Gguf, WriterKeepsModesAndFollowsLinks) {
  namespace fs = std::filesystem;
  const std::string dir = testing::TempDir(), path = dir + "/vkllm_modes_test.gguf", link = dir + "/vkllm_modes_link.gguf";
  fs::remove(path);
  fs::remove(link);
  const mode_t old_mask = ::umask(077);
  sample_writer().write(path);
  ::umask(old_mask);
  EXPECT_EQ(fs::status(path).permissions(), fs::perms::owner_read | fs::perms::owner_write);
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  sample_writer().write(path);
  EXPECT_EQ(fs::status(path).permissions(), fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  fs::create_symlink("vkllm_modes_test.gguf", link);
  std::ofstream(path, std::ios::trunc) << "old";
  sample_writer().write(link);
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(link)));
  EXPECT_EQ(File::open(path).tensors().size(), 3u);
  if (::geteuid() != 0) {
    fs::permissions(path, fs::perms::owner_read);
    EXPECT_THROW(sample_writer().write(path), Error);
    fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  }
  fs::remove(link);
  fs::remove(path);
}

TEST(Gguf, TruncationAtEveryHeaderOffsetIsAnError) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::vector<uint8_t> full = read_file(shared_path("models/stories260K.gguf"));
  const uint64_t header_end = File::parse(full).data_offset();
  for (uint64_t n = 0; n < header_end; ++n) {
    EXPECT_THROW(File::parse(std::span(full.data(), n), "trunc.gguf"), Error) << "truncated at " << n;
  }
  // Truncated inside the tensor data: the header parses but a tensor runs past the end.
  EXPECT_THROW(File::parse(std::span(full.data(), full.size() - 1)), Error);
  const std::vector<uint8_t> sample = sample_writer().to_bytes();
  for (uint64_t n = 0; n < sample.size(); ++n) {
    if (n >= File::parse(sample).data_offset() + File::parse(sample).tensors().back().offset + 288) break;
    EXPECT_THROW(File::parse(std::span(sample.data(), n)), Error) << "sample truncated at " << n;
  }
}

TEST(Gguf, SeededRandomMutationsNeverCrash) {
  std::vector<uint8_t> bytes = sample_writer().to_bytes();
  std::vector<uint8_t> real;
  if (vkllm::test::shared_exists("models/stories260K.gguf")) {
    real = read_file(shared_path("models/stories260K.gguf"));
    real.resize(File::parse(real).data_offset() + 4096);  // header and the start of the data
  }
  std::mt19937_64 rng(1234);
  int errors = 0, parsed = 0;
  for (int iter = 0; iter < 10000; ++iter) {
    std::vector<uint8_t>& target = (iter % 2 == 1 && !real.empty()) ? real : bytes;
    const size_t limit = (&target == &real) ? real.size() - 4096 : target.size();
    std::vector<std::pair<size_t, uint8_t>> saved;
    const int n_mut = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n_mut; ++m) {
      const size_t at = rng() % limit;
      saved.emplace_back(at, target[at]);
      switch (rng() % 3) {
        case 0: target[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: target[at] = static_cast<uint8_t>(rng()); break;
        default: target[at] = (rng() % 2) ? 0xFF : 0x00; break;
      }
    }
    try {
      File::parse(target);
      ++parsed;
    } catch (const Error&) {
      ++errors;
    }
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) target[it->first] = it->second;
  }
  EXPECT_EQ(errors + parsed, 10000);
  EXPECT_GT(errors, 1000);  // most mutations of a header are detected
}

TEST(Gguf, HostileFiles) {
  {  // magic, versions, big-endian
    auto b = header(0, 0);
    b[0] = 'X';
    expect_error(b, "not a GGUF file");
    expect_error(header(0, 0, 1), "version 1 is not supported");
    expect_error(header(0, 0, 4), "version 4 is not supported");
    expect_error(header(0, 0, 0x03000000u), "big-endian");
  }
  expect_error(header(1ull << 62, 0), "tensor count 4611686018427387904 cannot fit");
  expect_error(header(0, 1ull << 62), "metadata count 4611686018427387904 cannot fit");
  {  // string length 2^63
    auto b = header(0, 1);
    put<uint64_t>(b, 1ull << 63);
    expect_error(b, "has length 9223372036854775808");
  }
  {  // a bad value type
    auto b = header(0, 1);
    put_str(b, "k");
    put<uint32_t>(b, 13);
    expect_error(b, "value type 13 is not a GGUF value type");
  }
  {  // array with 2^62 elements
    auto b = header(0, 1);
    put_str(b, "k");
    put<uint32_t>(b, 9);
    put<uint32_t>(b, 4);
    put<uint64_t>(b, 1ull << 62);
    expect_error(b, "cannot fit");
  }
  {  // deeply nested arrays
    auto b = header(0, 1);
    put_str(b, "k");
    put<uint32_t>(b, 9);
    for (int i = 0; i < 20; ++i) {
      put<uint32_t>(b, 9);
      put<uint64_t>(b, 1);
    }
    b.resize(b.size() + 64, 0);
    expect_error(b, "nested deeper");
  }
  {  // duplicate keys
    auto b = header(0, 2);
    for (int i = 0; i < 2; ++i) {
      put_str(b, "dup");
      put<uint32_t>(b, 4);
      put<uint32_t>(b, 7);
    }
    expect_error(b, "duplicate metadata key 'dup'");
  }
  {  // bool that is not 0/1
    auto b = header(0, 1);
    put_str(b, "flag");
    put<uint32_t>(b, 7);
    put<uint8_t>(b, 2);
    expect_error(b, "expected 0 or 1");
  }
  expect_error(one_tensor({1ull << 32, 1ull << 32}, 0, 0), "overflow 63 bits");
  expect_error(one_tensor({4}, 9999, 0), "type 9999 is not a known ggml type");
  expect_error(one_tensor({4}, 4, 0), "Q4_2 was retired");
  expect_error(one_tensor({4}, 0, 1ull << 40), "runs past the end");
  expect_error(one_tensor({4}, 0, 8), "not a multiple of the alignment 32");
  expect_error(one_tensor({33}, 8, 0), "not a multiple of the Q8_0 block size 32");
  expect_error(one_tensor({4}, 0, 0, 8), "runs past the end");
  expect_error(one_tensor({4, 0, 0, 0, 0}, 0, 0), "5 dimensions");
  {  // overlapping tensors and duplicate tensor names
    for (const std::string second : {"u", "t"}) {
      auto b = header(2, 0);
      for (const std::string& name : {std::string("t"), second}) {
        put_str(b, name);
        put<uint32_t>(b, 1);
        put<uint64_t>(b, 16);
        put<uint32_t>(b, 0);
        put<uint64_t>(b, name == "t" ? 0 : 32);
      }
      b.resize((b.size() + 31) / 32 * 32 + 128, 0);
      expect_error(b, second == "t" ? "duplicate tensor name 't'" : "overlaps tensor 't'");
    }
  }
  {  // alignment that is not a power of two
    auto b = header(0, 1);
    put_str(b, "general.alignment");
    put<uint32_t>(b, 4);
    put<uint32_t>(b, 24);
    expect_error(b, "expected a power of two");
  }
}

TEST(Gguf, TypeTableNamesEveryType) {
  EXPECT_EQ(type_name(9999), "type 9999");
  EXPECT_EQ(type_name(TensorType::IQ2_XS), "IQ2_XS");
  EXPECT_EQ(type_info(static_cast<uint32_t>(TensorType::Q6_K))->block_bytes, 210u);
  EXPECT_EQ(type_info(static_cast<uint32_t>(TensorType::Q4_K))->block_bytes, 144u);
  EXPECT_EQ(type_info(static_cast<uint32_t>(TensorType::Q3_K))->block_bytes, 110u);
  EXPECT_EQ(type_info(static_cast<uint32_t>(TensorType::Q2_K))->block_bytes, 84u);
  EXPECT_EQ(type_info(static_cast<uint32_t>(TensorType::Q5_K))->block_bytes, 176u);
  EXPECT_EQ(type_info(static_cast<uint32_t>(TensorType::TQ1_0))->block_bytes, 54u);
  EXPECT_EQ(type_from_name("q8_0"), TensorType::Q8_0);
}
