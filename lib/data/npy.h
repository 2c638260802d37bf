#pragma once
// NumPy .npy files (format 1.0-3.0, little-endian, C order) as tensors.
#include <filesystem>

#include "core/tensor.h"

namespace mpq::data {

struct NpyHeader {
  DType dtype = DType::Undefined;
  Shape shape;
  size_t data_offset = 0;
};

// Reads only the header (dtype and shape) to check data before any work starts.
NpyHeader read_npy_header(const std::filesystem::path& path);
Tensor read_npy(const std::filesystem::path& path);
// Writes atomically (temporary file + rename).
void write_npy(const std::filesystem::path& path, const Tensor& t);

}  // namespace mpq::data
