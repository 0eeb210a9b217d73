// ariadne/file.hpp — how every reader opens its input and how every writer replaces its output.
//
// Inputs. A path given as a weights file, GGUF, image, mask, COCO file or .npy array must name a
// regular file. Anything else is refused before open() could block or misread it: a FIFO (open()
// for reading waits for a writer forever), a directory, a character or block device, a socket.
// The path is stat()ed first, then opened with O_NONBLOCK and fstat()ed again (the file may have
// been swapped in between). Errors are ariadne::Error naming the path and what is wrong:
//   "x.gguf: not a regular file (a FIFO)"
//   "w.safetensors: cannot open (No such file or directory)"
//   "loop: cannot open (Too many levels of symbolic links)"
//
// Outputs. write_file_atomic() writes to a temporary file in the destination's folder, fsyncs it,
// and renames it over the destination: a reader sees the old file or the whole new one, never a
// truncated one, and a write that fails (a full disk, a missing folder, the destination being a
// directory) removes the temporary file and leaves an existing destination untouched. Errors name
// the path and the errno text ("out/a.png: cannot write (No space left on device)").
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "ariadne/error.hpp"

namespace ariadne {

// What a path names, for messages: "a regular file", "a directory", "a FIFO", "a character device",
// "a block device", "a socket", "a symbolic link" or "an unknown file type" (from st_mode).
const char* file_type_name(unsigned mode);

// Opens `path` read-only (O_CLOEXEC, blocking mode restored after the checks) and returns the
// descriptor; the caller closes it. Throws as described above. `size` receives st_size when given.
int open_input_file(const std::string& path, uint64_t* size = nullptr);

// The whole file in memory. Throws naming the path for a non-regular file, a read error, or a
// file larger than `max_bytes` (so that a request for its size cannot end in bad_alloc).
std::vector<uint8_t> read_input_file(const std::string& path, uint64_t max_bytes = uint64_t(1) << 34);

// Streams the output into `emit`, which calls `write(data, n)` as often as it likes (each call
// throws naming the path on a short write), into a temporary file next to `path`; then fsync and
// rename over `path` (keeping an existing file's permission bits). Any exception, from `emit` or
// from the file system, removes the temporary file and propagates; `path` is then unchanged.
using WriteFn = std::function<void(const void* data, size_t n)>;
void write_file_atomic(const std::string& path, const std::function<void(const WriteFn& write)>& emit);
void write_file_atomic(const std::string& path, const void* data, size_t n);

// Up-front checks for a command's outputs, before any expensive work: `dir` exists as a directory
// (or is created, with its parents, when create is true) and a file can be created in it; throws
// naming the path ("out: not a directory (a regular file)", "out/sub: cannot create (Permission
// denied)", "out: cannot write in it (Read-only file system)").
void prepare_output_dir(const std::string& dir, bool create = true);
// The same for one output file: its folder passes prepare_output_dir(create = false) and `path`
// itself, when it exists, is a regular file (not a directory, FIFO or device).
void check_output_file(const std::string& path);

// Runs f() and turns what the standard library throws about a path into ariadne::Error naming it:
// a std::filesystem::filesystem_error or std::system_error ("DIR: cannot list (Too many levels of
// symbolic links)") and std::bad_alloc ("x.npy: out of memory"). ariadne::Error passes unchanged.
// Every reader runs inside it; a CLI can wrap its own directory walks the same way.
template <class F>
decltype(auto) with_path_errors(const std::string& path, const char* doing, F&& f) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::filesystem::filesystem_error& e) {
    detail::fail(path, ": cannot ", doing, " (", e.code().message(), ")");
  } catch (const std::system_error& e) {
    detail::fail(path, ": cannot ", doing, " (", e.code().message(), ")");
  } catch (const std::bad_alloc&) {
    detail::fail(path, ": cannot ", doing, " (out of memory)");
  }
}

}  // namespace ariadne
