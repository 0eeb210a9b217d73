// Shared by the fuzz targets: a file path over in-memory bytes, for readers that take a path.
//
// Contract every target checks: on any input a reader returns or throws ariadne::Error. Any other
// exception escapes LLVMFuzzerTestOneInput and libFuzzer reports it as a crash; ASan and UBSan
// (built in, -fno-sanitize-recover) report memory errors, leaks and undefined behaviour.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace ariadne::fuzz {

// An anonymous in-memory file holding `data`, reachable as /proc/self/fd/N (no disk traffic, no
// temporary names to clean up). Closed when the object goes out of scope.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("ariadne-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) throw std::runtime_error("memfd_create failed");
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) throw std::runtime_error("write to memfd failed");
      done += size_t(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace ariadne::fuzz
