#include "calib/calibrator.h"

#include <spdlog/spdlog.h>

#include <unordered_map>

#include "core/error.h"
#include "runtime/executor.h"
#include "runtime/low_precision.h"
#include "runtime/thread_pool.h"

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

namespace {

// Folds activations into per-tensor statistics. The executor calls observe() on its own thread
// between kernels, when the pool is idle; folding each tensor right there would leave all but one
// core idle for that time. So small tensors are only held (the handle shares the buffer: no copy)
// and folded all at once after the run, one tensor per pool task: tensors are independent, so no
// locks. Large ones are folded at once with each pass split over the pool. Held bytes are capped,
// so memory stays bounded by the cap, not by the model's total activation size. With one thread
// there is nothing to overlap: each tensor is folded at once, while it is still in cache.
class ActivationStats {
 public:
  ActivationStats(bool histogram, int bins, rt::ThreadPool& pool) : histogram_(histogram), bins_(bins), pool_(pool) {}

  void observe(const ir::Value& v, const Tensor& t) {
    const DType d = t.dtype();
    if (d != DType::Float32 && d != DType::Float16 && d != DType::BFloat16) return;
    auto it = slot_of_.find(&v);
    if (it == slot_of_.end()) {
      it = slot_of_.emplace(&v, stats_.size()).first;
      stats_.emplace_back(histogram_, bins_);
      names_.push_back(v.name());
      held_in_.push_back(0);
    }
    const size_t slot = it->second;
    Tensor f = d == DType::Float32 ? t : rt::widen_to_float32(t);
    const size_t bytes = static_cast<size_t>(f.numel()) * sizeof(float);
    if (bytes >= kLargeBytes || pool_.size() <= 1 || may_be_overwritten(v)) {
      stats_[slot].add(f.data<float>(), f.numel(), &pool_);
      return;
    }
    // A value seen twice before a flush (not expected within one run) must not be folded by two
    // tasks at once.
    if (held_in_[slot] == generation_) flush();
    held_in_[slot] = generation_;
    held_.push_back({slot, std::move(f)});
    held_bytes_ += bytes;
    if (held_bytes_ >= kMaxHeldBytes) flush();
  }

  // Whether a later kernel may write its output into this value's buffer (FusedConv's residual Z,
  // input 3, when the value dies there; see KernelContext::input_reusable). Holding the handle
  // until the flush would make that kernel copy Z first, which costs more than folding it now.
  static bool may_be_overwritten(const ir::Value& v) {
    for (const ir::Use& u : v.uses())
      if (u.input_index == 3 && u.node->op_type == "FusedConv") return true;
    return false;
  }

  void flush() {
    if (!held_.empty()) {
      pool_.parallel_for(static_cast<int64_t>(held_.size()), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const Held& h = held_[static_cast<size_t>(i)];
          stats_[h.slot].add(h.tensor.data<float>(), h.tensor.numel());
        }
      });
    }
    held_.clear();
    held_bytes_ = 0;
    ++generation_;
  }

  // In first-seen order (graph inputs, then node outputs in execution order).
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<TensorStats>& stats() const { return stats_; }

 private:
  static constexpr size_t kLargeBytes = size_t{1} << 20;    // fold at once, split over the pool
  static constexpr size_t kMaxHeldBytes = size_t{32} << 20;  // cap on activations kept for a flush
  struct Held {
    size_t slot;
    Tensor tensor;
  };
  bool histogram_;
  int bins_;
  rt::ThreadPool& pool_;
  std::unordered_map<const ir::Value*, size_t> slot_of_;
  std::vector<TensorStats> stats_;
  std::vector<std::string> names_;
  std::vector<uint64_t> held_in_;  // generation in which the slot was last held
  uint64_t generation_ = 1;
  std::vector<Held> held_;
  size_t held_bytes_ = 0;
};

}  // namespace

CalibrationTable calibrate(const ir::Model& model, const data::FeedSource& feeds, const CalibOptions& o) {
  const int64_t total = static_cast<int64_t>(feeds.size());
  if (total == 0) fail_input("{}: no feeds to calibrate with", feeds.dir().string());
  return calibrate(model, total, [&](int64_t i) { return feeds.get(static_cast<size_t>(i)); }, o);
}

CalibrationTable calibrate(const ir::Model& model, int64_t count, const std::function<data::Feed(int64_t)>& get,
                           const CalibOptions& o) {
  if (o.activation_type != "int8" && o.activation_type != "uint8")
    fail_input("activation type must be int8 or uint8, got '{}'", o.activation_type);
  if (o.batch_size < 1) fail_input("--batch-size must be at least 1");
  const bool histogram = range_method_info(o.method).needs_histogram;
  rt::ExecOptions eo;
  eo.backend = o.backend;
  eo.threads = o.threads;
  rt::Executor exec(model, eo);

  ActivationStats collected(histogram, o.bins, exec.pool());
  exec.set_observer([&](const ir::Value& v, const Tensor& t) { collected.observe(v, t); });

  int64_t total = count;
  if (o.max_samples >= 0) total = std::min<int64_t>(total, o.max_samples);
  if (total == 0) fail_input("no feeds to calibrate with");
  uint64_t rows = 0;
  for (int64_t i = 0; i < total;) {
    std::vector<data::Feed> batch;
    for (int b = 0; b < o.batch_size && i < total; ++b, ++i) batch.push_back(get(i));
    data::Feed feed = data::concat_feeds(batch);
    rows += static_cast<uint64_t>(feed.rows);
    exec.run(feed.tensors);
    collected.flush();
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
  const auto& names = collected.names();
  const auto& stats = collected.stats();
  // Range searches (entropy, mse) are independent per tensor: one pool task each.
  table.tensors.resize(names.size());
  exec.pool().parallel_for(static_cast<int64_t>(names.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      table.tensors[static_cast<size_t>(i)] = make_tensor_calib(names[static_cast<size_t>(i)], stats[static_cast<size_t>(i)], o);
  });
  for (size_t i = 0; i < names.size(); ++i) {
    const TensorStats& s = stats[i];
    if (s.nan_count || s.inf_count)
      spdlog::warn("tensor '{}': {} NaN and {} inf values were seen and left out of its range", names[i], s.nan_count,
                   s.inf_count);
    if (s.count == 0) spdlog::warn("tensor '{}': no finite values seen; it gets scale 1.0", names[i]);
  }
  return table;
}

}  // namespace mpq::calib
