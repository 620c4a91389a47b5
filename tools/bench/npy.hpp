// Minimal NumPy .npy (format 1.0) writer, so any case can be checked outside the library.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "ubep/error.hpp"

namespace ubep::tools {

// descr: "<u2" (bf16 bit patterns), "<f4", "<i4", "<i8".
inline void write_npy(const std::string& path, const void* data, const std::string& descr,
                      const std::vector<int64_t>& shape, size_t elem_bytes) {
  std::string dims;
  size_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dims +=
        std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
    n *= static_cast<size_t>(shape[i]);
  }
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) throw SystemError("cannot write " + path);
  const char magic[] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(magic, sizeof magic);
  const auto len = static_cast<uint16_t>(header.size());
  f.put(static_cast<char>(len & 0xff));
  f.put(static_cast<char>(len >> 8));
  f << header;
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n * elem_bytes));
  if (!f) throw SystemError("write failed: " + path);
}

}  // namespace ubep::tools
