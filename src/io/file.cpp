// Input files that must be regular files, atomic output files, output folder checks (file.hpp).
#include "ariadne/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>
#include <system_error>

#include "ariadne/error.hpp"

namespace ariadne {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

// Folder and base name of an output path ("a/b.png" -> "a", "b.png"; "b.png" -> ".", "b.png").
void split_output_path(const std::string& path, std::string* dir, std::string* base) {
  ARIADNE_CHECK(!path.empty(), "output file: the path is empty");
  const std::filesystem::path p(path);
  *base = p.filename().string();
  ARIADNE_CHECK(!base->empty() && *base != "." && *base != "..", path,
                ": names a folder, expected a file name");
  *dir = p.parent_path().string();
  if (dir->empty()) dir->assign(1, '.');  // (not = ".": a GCC 12 -Wrestrict false positive)
}

std::atomic<uint64_t> g_temp_counter{0};

void write_all(int fd, const std::string& path, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      detail::fail(path, ": cannot write (", errno_text(errno), ")");
    }
    ARIADNE_CHECK(w > 0, path, ": cannot write (the write returned 0 bytes)");
    p += w;
    n -= size_t(w);
  }
}

}  // namespace

const char* file_type_name(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "an unknown file type";
}

int open_input_file(const std::string& path, uint64_t* size) {
  ARIADNE_CHECK(!path.empty(), "input file: the path is empty");
  struct stat st {};
  // stat() first: open() of a FIFO for reading blocks until a writer appears, even before fstat.
  if (::stat(path.c_str(), &st) != 0) detail::fail(path, ": cannot open (", errno_text(errno), ")");
  ARIADNE_CHECK(S_ISREG(st.st_mode), path, ": not a regular file (", file_type_name(st.st_mode), ")");
  // O_NONBLOCK: should the path have been replaced by a FIFO since, open() still returns at once.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) detail::fail(path, ": cannot open (", errno_text(errno), ")");
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int e = errno;
    const unsigned mode = st.st_mode;
    ::close(fd);
    if (S_ISREG(mode) || mode == 0) detail::fail(path, ": cannot stat (", errno_text(e), ")");
    detail::fail(path, ": not a regular file (", file_type_name(mode), ")");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  if (size) *size = uint64_t(st.st_size);
  return fd;
}

std::vector<uint8_t> read_input_file(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  const int fd = open_input_file(path, &size);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  ARIADNE_CHECK(size <= max_bytes, path, ": ", size, " bytes, more than the ", max_bytes,
                "-byte limit of this reader (wrong file?)");
  std::vector<uint8_t> buf;
  try {
    buf.resize(size_t(size));
  } catch (const std::bad_alloc&) {
    detail::fail(path, ": cannot allocate ", size, " bytes to read it");
  }
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t r = ::read(fd, buf.data() + got, buf.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      detail::fail(path, ": read failed (", errno_text(errno), ")");
    }
    ARIADNE_CHECK(r > 0, path, ": file shrank while being read (", got, " of ", size, " bytes)");
    got += size_t(r);
  }
  return buf;
}

void write_file_atomic(const std::string& path, const std::function<void(const WriteFn& write)>& emit) {
  std::string dir, base;
  split_output_path(path, &dir, &base);
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  ARIADNE_CHECK(!exists || S_ISREG(st.st_mode), path, ": cannot write: the path is ", file_type_name(st.st_mode),
                ", expected a regular file or a new name");
  // A temporary name in the same folder (rename is atomic only within one file system).
  std::string temp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    temp = dir + "/." + base + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(g_temp_counter++);
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) detail::fail(path, ": cannot create a file in '", dir, "' (", errno_text(errno), ")");
  bool renamed = false;
  try {
    if (exists) (void)::fchmod(fd, st.st_mode & 07777);
    // Small writes are gathered so that a header written field by field is one system call.
    std::vector<uint8_t> pending;
    pending.reserve(size_t(1) << 16);
    const WriteFn write = [&](const void* data, size_t n) {
      const auto* p = static_cast<const uint8_t*>(data);
      if (pending.size() + n <= pending.capacity()) {
        pending.insert(pending.end(), p, p + n);
        return;
      }
      write_all(fd, path, pending.data(), pending.size());
      pending.clear();
      if (n < pending.capacity()) pending.insert(pending.end(), p, p + n);
      else write_all(fd, path, p, n);
    };
    emit(write);
    write_all(fd, path, pending.data(), pending.size());
    if (::fsync(fd) != 0) detail::fail(path, ": cannot write (fsync: ", errno_text(errno), ")");
    const int c = ::close(fd);
    fd = -1;
    if (c != 0) detail::fail(path, ": cannot write (close: ", errno_text(errno), ")");
    if (::rename(temp.c_str(), path.c_str()) != 0) detail::fail(path, ": cannot replace (", errno_text(errno), ")");
    renamed = true;
    // Make the rename itself durable (best effort: some file systems refuse fsync on a folder).
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
  } catch (...) {
    if (fd >= 0) ::close(fd);
    if (!renamed) ::unlink(temp.c_str());
    throw;
  }
}

void write_file_atomic(const std::string& path, const void* data, size_t n) {
  write_file_atomic(path, [&](const WriteFn& write) { write(data, n); });
}

void prepare_output_dir(const std::string& dir_in, bool create) {
  const std::string dir = dir_in.empty() ? "." : dir_in;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int e = errno;
    ARIADNE_CHECK(create && e == ENOENT, dir, ": cannot use as the output folder (", errno_text(e), ")");
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) detail::fail(dir, ": cannot create the output folder (", ec.message(), ")");
    ARIADNE_CHECK(::stat(dir.c_str(), &st) == 0, dir, ": cannot create the output folder (", errno_text(errno), ")");
  }
  ARIADNE_CHECK(S_ISDIR(st.st_mode), dir, ": not a directory (", file_type_name(st.st_mode),
                "), expected the output folder");
  // access(W_OK) says yes to root on a read-only mount: create a file to know.
  const std::string probe = dir + "/.ariadne-probe-" + std::to_string(::getpid()) + "-" +
                            std::to_string(g_temp_counter++);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) detail::fail(dir, ": cannot write in the output folder (", errno_text(errno), ")");
  ::close(fd);
  ::unlink(probe.c_str());
}

void check_output_file(const std::string& path) {
  std::string dir, base;
  split_output_path(path, &dir, &base);
  prepare_output_dir(dir, false);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0)
    ARIADNE_CHECK(S_ISREG(st.st_mode), path, ": cannot write: the path is ", file_type_name(st.st_mode),
                  ", expected a regular file or a new name");
}

}  // namespace ariadne
