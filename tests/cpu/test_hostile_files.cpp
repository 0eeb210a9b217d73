// Issue 29, files: every reader refuses a FIFO, a directory or a device (a FIFO blocked open()
// forever), file-system failures are ariadne::Error naming the path (they reached the user as
// "internal error"), writers replace their output atomically (a full disk left a truncated file and
// a failed overwrite destroyed the good one), 16-bit mask PNGs keep their labels (only the high
// byte was kept: 15 became 0, 1000 became 3), and a duplicate COCO file stem is an error.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <png.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ariadne/error.hpp"
#include "ariadne/file.hpp"
#include "ariadne/gguf.hpp"
#include "ariadne/image.hpp"
#include "ariadne/mask.hpp"
#include "ariadne/npy.hpp"
#include "ariadne/safetensors.hpp"
#include "common.hpp"

namespace {

using namespace ariadne;
namespace fs = std::filesystem;

using ariadne::testing::error_of;

using ariadne::testing::TempDir;  // a fresh folder per test, removed afterwards

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Every reader of a file path, by name.
const std::vector<std::pair<const char*, std::function<void(const std::string&)>>>& readers() {
  static const std::vector<std::pair<const char*, std::function<void(const std::string&)>>> r = {
      {"safetensors", [](const std::string& p) { SafetensorsFile f(p); }},
      {"gguf", [](const std::string& p) { (void)GgufFile::open(p); }},
      {"image", [](const std::string& p) { (void)read_image(p); }},
      {"png_indexed", [](const std::string& p) { (void)read_png_indexed(p); }},
      {"png_values", [](const std::string& p) { (void)read_png_values(p); }},
      {"mask", [](const std::string& p) { (void)read_label_map(p); }},
      {"coco", [](const std::string& p) { (void)read_coco(p); }},
      {"npy", [](const std::string& p) { (void)read_npy(p); }},
  };
  return r;
}

// A FIFO given as any input: refused at once. Should a reader still block in open(), a watchdog
// opens the FIFO as a writer after 5 s and closes it, so the test fails instead of hanging.
TEST(HostileFiles, FifoIsRefusedWithoutBlocking) {
  TempDir t;
  const std::string fifo = t / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const auto& entry : readers()) {
    // (not a structured binding: clang 14 cannot capture one in a lambda)
    const char* name = entry.first;
    const std::function<void(const std::string&)>& read = entry.second;
    std::atomic<bool> done{false}, rescued{false};
    std::thread watchdog([&] {
      for (int i = 0; i < 500 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (done) return;
      rescued = true;
      const int fd = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);  // a writer unblocks the reader's open()
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (fd >= 0) ::close(fd);  // and closing it gives the reader end of file
    });
    const std::string msg = error_of([&] { read(fifo); });
    done = true;
    watchdog.join();
    EXPECT_FALSE(rescued) << name << " blocked on a FIFO";
    EXPECT_MSG(msg, fifo + ": not a regular file (a FIFO)") << " (" << name << ")";
  }
}

TEST(HostileFiles, DirectoriesDevicesLoopsAndMissingFilesAreNamedErrors) {
  TempDir t;
  const std::string loop = t / "loop";
  ASSERT_EQ(::symlink(loop.c_str(), loop.c_str()), 0);  // a symlink to itself
  const std::string dir = t.path().string();
  for (const auto& entry : readers()) {
    // (not a structured binding: clang 14 cannot capture one in a lambda)
    const char* name = entry.first;
    const std::function<void(const std::string&)>& read = entry.second;
    EXPECT_MSG(error_of([&] { read(dir); }), dir + ": not a regular file (a directory)") << " (" << name << ")";
    EXPECT_MSG(error_of([&] { read("/dev/null"); }), "/dev/null: not a regular file (a character device)")
        << " (" << name << ")";
    EXPECT_MSG(error_of([&] { read(loop); }), loop + ": cannot open (Too many levels of symbolic links)")
        << " (" << name << ")";
    EXPECT_MSG(error_of([&] { read(t / "missing"); }), "missing: cannot open (No such file or directory)")
        << " (" << name << ")";
    EXPECT_MSG(error_of([&] { read(t / "missing/sub"); }), "cannot open (No such file or directory)")
        << " (" << name << ")";
  }
  // A regular file still reads (through a symlink too).
  const std::vector<float> v = {1, 2, 3};
  write_npy(t / "a.npy", v.data(), {3});
  ASSERT_EQ(::symlink((t / "a.npy").c_str(), (t / "link.npy").c_str()), 0);
  EXPECT_EQ(read_npy(t / "link.npy").to_float(), v);
}

// std::filesystem errors and bad_alloc become ariadne::Error naming the path.
TEST(HostileFiles, WithPathErrorsNamesThePath) {
  TempDir t;
  const std::string missing = t / "nope";
  const std::string msg = error_of([&] {
    with_path_errors(missing, "list the folder", [&] {
      for (const auto& e : fs::directory_iterator(missing)) (void)e;
    });
  });
  EXPECT_MSG(msg, missing + ": cannot list the folder (No such file or directory)");
  EXPECT_MSG(error_of([&] { with_path_errors("big.npy", "read", [] { throw std::bad_alloc(); }); }),
             "big.npy: cannot read (out of memory)");
  EXPECT_EQ(error_of([&] { with_path_errors("x", "read", [] { throw Error("x: its own message"); }); }),
            "x: its own message");
  EXPECT_EQ(with_path_errors("x", "read", [] { return 5; }), 5);
}

// Writers replace their output atomically; a failure names the path and the errno text and leaves
// the old file untouched, with no temporary file behind. (The tests run as root, which ignores
// permissions: failures are forced by a parent that is a regular file, a destination that is a
// directory, and RLIMIT_FSIZE for a write that fails midway, as on a full disk.)
TEST(HostileFiles, WritersAreAtomic) {
  TempDir t;
  const std::string good = t / "out.npy";
  const std::vector<float> small = {1, 2, 3, 4};
  write_npy(good, small.data(), {2, 2});
  const std::string before = slurp(good);
  ASSERT_FALSE(before.empty());

  // A write that fails midway: EFBIG past a 4 KiB file-size limit.
  const std::vector<float> big(1 << 16, 5.f);
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old_limit;
  lim.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  const std::string e1 = error_of([&] { write_npy(good, big.data(), {int64_t(big.size())}); });
  std::vector<SafetensorsTensor> ts = {{"w", DType::f32, {int64_t(big.size())}, big.data()}};
  const std::string good_st = t / "w.safetensors";
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  write_safetensors(good_st, {{"w", DType::f32, {2, 2}, small.data()}});
  const std::string before_st = slurp(good_st);
  ::setrlimit(RLIMIT_FSIZE, &lim);
  const std::string e2 = error_of([&] { write_safetensors(good_st, ts); });
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_MSG(e1, good + ": cannot write (File too large)");
  EXPECT_MSG(e2, good_st + ": cannot write (File too large)");
  EXPECT_EQ(slurp(good), before);
  EXPECT_EQ(slurp(good_st), before_st);
  EXPECT_EQ(read_npy(good).to_float(), small);

  // The parent is a regular file; the destination is a directory.
  const std::string under_file = good + "/x.npy";
  EXPECT_MSG(error_of([&] { write_npy(under_file, small.data(), {4}); }), under_file + ": cannot create a file in");
  EXPECT_MSG(error_of([&] { write_npy(under_file, small.data(), {4}); }), "(Not a directory)");
  fs::create_directory(t / "adir");
  EXPECT_MSG(error_of([&] { write_png(t / "adir", Image{1, 1, 1, {0}}); }),
             t / "adir" + ": cannot write: the path is a directory");
  EXPECT_MSG(error_of([&] { write_safetensors(t / "missing/w.safetensors", {}); }), "(No such file or directory)");
  // Nothing but the outputs is left in the folder.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(t.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"adir", "out.npy", "w.safetensors"}));

  // A successful overwrite replaces the content and keeps the file's permission bits.
  ::chmod(good.c_str(), 0640);
  write_npy(good, big.data(), {int64_t(big.size())});
  EXPECT_EQ(read_npy(good).numel(), int64_t(big.size()));
  struct stat st {};
  ASSERT_EQ(::stat(good.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  write_png(t / "p.png", Image{2, 1, 3, {1, 2, 3, 4, 5, 6}});
  EXPECT_EQ(read_image(t / "p.png").pixels, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
}

TEST(HostileFiles, OutputFolderChecks) {
  TempDir t;
  prepare_output_dir(t / "a/b/c");
  EXPECT_TRUE(fs::is_directory(t / "a/b/c"));
  EXPECT_TRUE(fs::is_empty(t / "a/b/c"));  // the write probe is gone
  std::ofstream(t / "file") << "x";
  EXPECT_MSG(error_of([&] { prepare_output_dir(t / "file"); }), t / "file" + ": not a directory (a regular file)");
  EXPECT_MSG(error_of([&] { prepare_output_dir(t / "file/sub"); }), t / "file/sub" + ": cannot");
  EXPECT_MSG(error_of([&] { prepare_output_dir(t / "nope", false); }), "(No such file or directory)");
  EXPECT_MSG(error_of([&] { prepare_output_dir("/proc/self"); }), "/proc/self: cannot write in the output folder");
  check_output_file(t / "a/new.png");
  EXPECT_MSG(error_of([&] { check_output_file(t / "a/b"); }), t / "a/b" + ": cannot write: the path is a directory");
  EXPECT_MSG(error_of([&] { check_output_file(t / "zz/new.png"); }), t / "zz" + ": cannot use as the output folder");
  EXPECT_MSG(error_of([&] { check_output_file(t / "a/"); }), "names a folder, expected a file name");
}

// A 16-bit gray PNG written with libpng's low-level API (big-endian samples).
void write_png16(const std::string& path, int w, int h, const std::vector<uint16_t>& v) {
  FILE* fp = std::fopen(path.c_str(), "wb");
  ASSERT_NE(fp, nullptr);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_init_io(png, fp);
  png_set_IHDR(png, info, png_uint_32(w), png_uint_32(h), 16, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  std::vector<uint8_t> row(size_t(w) * 2);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const uint16_t s = v[size_t(y * w + x)];
      row[size_t(2 * x)] = uint8_t(s >> 8);
      row[size_t(2 * x + 1)] = uint8_t(s & 0xff);
    }
    png_write_row(png, row.data());
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(fp);
}

TEST(HostileFiles, SixteenBitMaskPngKeepsItsLabels) {
  TempDir t;
  const std::vector<uint16_t> labels = {0, 15, 255, 256, 1000, 65535};
  write_png16(t / "m16.png", 3, 2, labels);
  const LabelMap m = read_label_map(t / "m16.png");
  ASSERT_EQ(m.height, 2);
  ASSERT_EQ(m.width, 3);
  EXPECT_EQ(m.ids, (std::vector<int32_t>{0, 15, 255, 256, 1000, 65535}));
  const PngValues v = read_png_values(t / "m16.png");
  EXPECT_EQ(v.bit_depth, 16);
  EXPECT_EQ(v.values, labels);
  // 8-bit gray masks are unchanged.
  write_png(t / "m8.png", Image{3, 1, 1, {0, 15, 200}});
  EXPECT_EQ(read_label_map(t / "m8.png").ids, (std::vector<int32_t>{0, 15, 200}));
}

TEST(HostileFiles, CocoDuplicateStemIsAnErrorNamingBothEntries) {
  const std::string doc = R"({"images": [
      {"id": 1, "file_name": "a/x.jpg", "width": 4, "height": 4},
      {"id": 2, "file_name": "b/x.png", "width": 4, "height": 4},
      {"id": 3, "file_name": "y.jpg", "width": 4, "height": 4}],
    "annotations": []})";
  const CocoDataset ds = parse_coco(doc, "dup.json");
  const std::string msg = error_of([&] { (void)ds.find_by_stem("x"); });
  EXPECT_MSG(msg, "dup.json: images[0] (id 1, 'a/x.jpg') and images[1] (id 2, 'b/x.png') both have the file stem 'x'");
  EXPECT_EQ(ds.find_by_stem("y"), &ds.images[2]);
  EXPECT_EQ(ds.find_by_stem("z"), nullptr);
  // By file: the full name, then the base name, then the stem.
  EXPECT_EQ(ds.find_image("b/x.png"), &ds.images[1]);
  EXPECT_EQ(ds.find_image("/data/photos/x.jpg"), &ds.images[0]);
  EXPECT_EQ(ds.find_image("/data/y.png"), &ds.images[2]);
  EXPECT_MSG(error_of([&] { (void)ds.find_image("x.bmp"); }), "both have the file stem 'x'");
}

}  // namespace
