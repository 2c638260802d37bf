#include "calib/calibrator.h"

#include <spdlog/spdlog.h>

#include <unordered_map>

#include "core/error.h"
#include "runtime/executor.h"
#include "runtime/low_precision.h"

namespace mpq::calib {

TensorCalib make_tensor_calib(const std::string& name, const TensorStats& stats, const CalibOptions& o) {
  RangeOptions ro = o.range;
  ro.symmetric = o.activation_type == "int8";
  Range r = compute_range(o.method, stats, ro);
  TensorCalib c;
  c.name = name;
  c.min = r.lo;
  c.max = r.hi;
  c.amax = r.amax;
  c.method = range_method_info(o.method).name;
  c.count = stats.count;
  c.nan_count = stats.nan_count;
  c.inf_count = stats.inf_count;
  c.q = o.activation_type == "uint8" ? asymmetric_uint8(r.lo, r.hi, o.reduce_range) : symmetric_int8(r.amax, o.reduce_range);
  return c;
}

CalibrationTable calibrate(const ir::Model& model, const data::FeedSource& feeds, const CalibOptions& o) {
  if (o.activation_type != "int8" && o.activation_type != "uint8")
    fail_input("activation type must be int8 or uint8, got '{}'", o.activation_type);
  if (o.batch_size < 1) fail_input("--batch-size must be at least 1");
  const bool histogram = range_method_info(o.method).needs_histogram;
  rt::ExecOptions eo;
  eo.backend = o.backend;
  eo.threads = o.threads;
  rt::Executor exec(model, eo);

  // Stats in first-seen order (graph inputs, then node outputs in execution order).
  std::vector<std::string> order;
  std::unordered_map<std::string, TensorStats> stats;
  exec.set_observer([&](const ir::Value& v, const Tensor& t) {
    const DType d = t.dtype();
    if (d != DType::Float32 && d != DType::Float16 && d != DType::BFloat16) return;
    auto it = stats.find(v.name());
    if (it == stats.end()) {
      it = stats.emplace(v.name(), TensorStats(histogram, o.bins)).first;
      order.push_back(v.name());
    }
    if (d == DType::Float32) {
      it->second.add(t.data<float>(), t.numel());
    } else {
      Tensor f = rt::widen_to_float32(t);
      it->second.add(f.data<float>(), f.numel());
    }
  });

  int64_t total = static_cast<int64_t>(feeds.size());
  if (o.max_samples >= 0) total = std::min<int64_t>(total, o.max_samples);
  if (total == 0) fail_input("{}: no feeds to calibrate with", feeds.dir().string());
  uint64_t rows = 0;
  for (int64_t i = 0; i < total;) {
    std::vector<data::Feed> batch;
    for (int b = 0; b < o.batch_size && i < total; ++b, ++i) batch.push_back(feeds.get(static_cast<size_t>(i)));
    data::Feed feed = data::concat_feeds(batch);
    rows += static_cast<uint64_t>(feed.rows);
    exec.run(feed.tensors);
    if (o.progress) o.progress(i, total);
  }

  CalibrationTable table;
  table.method = range_method_info(o.method).name;
  table.percentile = o.range.percentile;
  table.samples = rows;
  table.activation_type = o.activation_type;
  table.symmetric = o.activation_type == "int8";
  table.reduce_range = o.reduce_range;
  table.histogram_bins = histogram ? o.bins : 0;
  for (const std::string& name : order) {
    const TensorStats& s = stats.at(name);
    if (s.nan_count || s.inf_count)
      spdlog::warn("tensor '{}': {} NaN and {} inf values were seen and left out of its range", name, s.nan_count,
                   s.inf_count);
    if (s.count == 0) spdlog::warn("tensor '{}': no finite values seen; it gets scale 1.0", name);
    table.tensors.push_back(make_tensor_calib(name, s, o));
  }
  return table;
}

}  // namespace mpq::calib
