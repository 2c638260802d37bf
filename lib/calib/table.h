#pragma once
// The calibration table `mpq calibrate` writes and `mpq quantize --calib` reads: JSON (readable,
// kept in users' repos) and the same content in proto/calibration.proto's binary form, plus
// TensorRT's text calibration cache.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "calib/qparams.h"

namespace mpq::calib {

struct TensorCalib {
  std::string name;
  double min = 0.0;
  double max = 0.0;
  double amax = 0.0;  // threshold chosen by the method
  QParams q;
  std::string method;
  uint64_t count = 0;
  uint64_t nan_count = 0;
  uint64_t inf_count = 0;
};

struct CalibrationTable {
  std::string mpq_version;
  std::string model;
  std::string method;
  double percentile = 0.0;
  uint64_t samples = 0;
  std::string command;
  std::string activation_type = "int8";  // int8 (symmetric) or uint8 (asymmetric)
  bool symmetric = true;
  bool reduce_range = false;
  int histogram_bins = 0;
  std::vector<TensorCalib> tensors;

  const TensorCalib* find(const std::string& name) const;
};

// Writes TABLE (JSON) and, beside it, the binary form with the extension ".pb".
void write_table(const CalibrationTable& t, const std::filesystem::path& json_path);
std::string table_to_json(const CalibrationTable& t);
// Reads a .json or .pb table (by extension); BadInput naming the file on any problem.
CalibrationTable read_table(const std::filesystem::path& path);
// TensorRT calibration cache: "TRT-<version>-EntropyCalibration2", then "name: <hex float32 scale>".
void write_trt_cache(const CalibrationTable& t, const std::filesystem::path& path, const std::string& trt_version = "8601");
// The binary (.pb) path for a JSON table path.
std::filesystem::path binary_table_path(const std::filesystem::path& json_path);

}  // namespace mpq::calib
