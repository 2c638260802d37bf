#include "calib/table.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>

#include "calibration.pb.h"
#include "core/error.h"
#include "core/file_io.h"

namespace mpq::calib {

const TensorCalib* CalibrationTable::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::filesystem::path binary_table_path(const std::filesystem::path& json_path) {
  std::filesystem::path p = json_path;
  p.replace_extension(".pb");
  if (p == json_path) p += ".pb";
  return p;
}

std::string table_to_json(const CalibrationTable& t) {
  nlohmann::ordered_json j;
  j["mpq_version"] = t.mpq_version;
  j["model"] = t.model;
  j["method"] = t.method;
  if (t.method == "percentile") j["percentile"] = t.percentile;
  j["samples"] = t.samples;
  j["activation_type"] = t.activation_type;
  j["symmetric"] = t.symmetric;
  j["reduce_range"] = t.reduce_range;
  if (t.histogram_bins) j["histogram_bins"] = t.histogram_bins;
  j["command"] = t.command;
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  for (const TensorCalib& c : t.tensors) {
    nlohmann::ordered_json e;
    e["min"] = c.min;
    e["max"] = c.max;
    e["amax"] = c.amax;
    e["scale"] = c.q.scale;
    e["zero_point"] = c.q.zero_point;
    e["dtype"] = dtype_name(c.q.dtype);
    e["method"] = c.method;
    e["count"] = c.count;
    if (c.nan_count) e["nan_count"] = c.nan_count;
    if (c.inf_count) e["inf_count"] = c.inf_count;
    tensors[c.name] = e;
  }
  j["tensors"] = tensors;
  return j.dump(2) + "\n";
}

namespace {

proto::CalibrationTable to_proto(const CalibrationTable& t) {
  proto::CalibrationTable p;
  p.set_mpq_version(t.mpq_version);
  p.set_model(t.model);
  p.set_method(t.method);
  p.set_percentile(t.percentile);
  p.set_samples(t.samples);
  p.set_command(t.command);
  p.set_activation_type(t.activation_type);
  p.set_symmetric(t.symmetric);
  p.set_reduce_range(t.reduce_range);
  p.set_histogram_bins(t.histogram_bins);
  for (const TensorCalib& c : t.tensors) {
    auto* e = p.add_tensors();
    e->set_name(c.name);
    e->set_min(static_cast<float>(c.min));
    e->set_max(static_cast<float>(c.max));
    e->set_amax(static_cast<float>(c.amax));
    e->set_scale(c.q.scale);
    e->set_zero_point(c.q.zero_point);
    e->set_method(c.method);
    e->set_dtype(dtype_name(c.q.dtype));
    e->set_count(c.count);
    e->set_nan_count(c.nan_count);
    e->set_inf_count(c.inf_count);
  }
  return p;
}

QParams qparams_for(const std::string& dtype, float scale, int32_t zp, bool reduce_range) {
  QParams q;
  q.scale = scale;
  q.zero_point = zp;
  if (dtype == "uint8") {
    q.dtype = DType::UInt8;
    q.qmin = 0;
    q.qmax = reduce_range ? 127 : 255;
  } else {
    q.dtype = DType::Int8;
    q.qmin = reduce_range ? -64 : -128;
    q.qmax = reduce_range ? 63 : 127;
  }
  return q;
}

void check_entry(const std::filesystem::path& path, const TensorCalib& c) {
  if (!(c.q.scale > 0.0f) || !std::isfinite(c.q.scale))
    fail_input("{}: tensor '{}' has an invalid scale {}", path.string(), c.name, c.q.scale);
  if (c.q.zero_point < c.q.qmin || c.q.zero_point > c.q.qmax)
    fail_input("{}: tensor '{}' has zero point {} outside [{}, {}]", path.string(), c.name, c.q.zero_point, c.q.qmin, c.q.qmax);
}

}  // namespace

void write_table(const CalibrationTable& t, const std::filesystem::path& json_path) {
  write_file_atomic(json_path, table_to_json(t));
  proto::CalibrationTable p = to_proto(t);
  std::string bytes;
  p.SerializeToString(&bytes);
  write_file_atomic(binary_table_path(json_path), bytes);
}

CalibrationTable read_table(const std::filesystem::path& path) {
  std::string bytes = read_file_bytes(path);
  CalibrationTable t;
  if (path.extension() == ".pb") {
    proto::CalibrationTable p;
    if (!p.ParseFromString(bytes)) fail_input("{}: not an mpq calibration table (.pb)", path.string());
    t.mpq_version = p.mpq_version();
    t.model = p.model();
    t.method = p.method();
    t.percentile = p.percentile();
    t.samples = p.samples();
    t.command = p.command();
    t.activation_type = p.activation_type();
    t.symmetric = p.symmetric();
    t.reduce_range = p.reduce_range();
    t.histogram_bins = p.histogram_bins();
    for (const auto& e : p.tensors()) {
      TensorCalib c;
      c.name = e.name();
      c.min = e.min();
      c.max = e.max();
      c.amax = e.amax();
      c.q = qparams_for(e.dtype(), e.scale(), e.zero_point(), t.reduce_range);
      c.method = e.method();
      c.count = e.count();
      c.nan_count = e.nan_count();
      c.inf_count = e.inf_count();
      check_entry(path, c);
      t.tensors.push_back(c);
    }
    return t;
  }
  try {
    auto j = nlohmann::json::parse(bytes);
    t.mpq_version = j.value("mpq_version", "");
    t.model = j.value("model", "");
    t.method = j.value("method", "");
    t.percentile = j.value("percentile", 0.0);
    t.samples = j.value("samples", uint64_t(0));
    t.command = j.value("command", "");
    t.activation_type = j.value("activation_type", "int8");
    t.symmetric = j.value("symmetric", true);
    t.reduce_range = j.value("reduce_range", false);
    t.histogram_bins = j.value("histogram_bins", 0);
    if (!j.contains("tensors") || !j["tensors"].is_object())
      fail_input("{}: calibration table has no \"tensors\" object", path.string());
    for (auto it = j["tensors"].begin(); it != j["tensors"].end(); ++it) {
      const auto& e = it.value();
      TensorCalib c;
      c.name = it.key();
      c.min = e.value("min", 0.0);
      c.max = e.value("max", 0.0);
      c.amax = e.value("amax", std::max(std::fabs(c.min), std::fabs(c.max)));
      if (!e.contains("scale")) fail_input("{}: tensor '{}' has no scale", path.string(), c.name);
      c.q = qparams_for(e.value("dtype", t.activation_type), e["scale"].get<float>(), e.value("zero_point", 0),
                        t.reduce_range);
      c.method = e.value("method", t.method);
      c.count = e.value("count", uint64_t(0));
      c.nan_count = e.value("nan_count", uint64_t(0));
      c.inf_count = e.value("inf_count", uint64_t(0));
      check_entry(path, c);
      t.tensors.push_back(c);
    }
  } catch (const nlohmann::json::exception& e) {
    fail_input("{}: not a valid calibration table: {}", path.string(), e.what());
  }
  return t;
}

void write_trt_cache(const CalibrationTable& t, const std::filesystem::path& path, const std::string& trt_version) {
  std::string out = fmt::format("TRT-{}-EntropyCalibration2\n", trt_version);
  for (const TensorCalib& c : t.tensors) {
    // TensorRT's cache stores the symmetric int8 scale (amax / 127) as the hex of its float bits.
    float scale = symmetric_int8(c.amax).scale;
    uint32_t bits;
    std::memcpy(&bits, &scale, 4);
    out += fmt::format("{}: {:08x}\n", c.name, bits);
  }
  write_file_atomic(path, out);
}

}  // namespace mpq::calib
