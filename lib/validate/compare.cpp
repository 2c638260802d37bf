#include "validate/compare.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "runtime/low_precision.h"

namespace mpq::validate {

namespace {

Tensor numeric_as_float32(const Tensor& t) {
  if (dtype_is_float(t.dtype())) return as_float32(t);
  if (t.dtype() == DType::String) fail_unsupported("string tensors cannot be compared numerically");
  return t.cast_to(DType::Float32);
}

bool floatish(DType d) { return d == DType::Float32 || d == DType::Float16 || d == DType::BFloat16 || d == DType::Float64; }

Tensor slice_rows(const Tensor& t, int64_t begin, int64_t count) {
  Shape s = t.shape();
  s[0] = count;
  Tensor out(t.dtype(), s);
  const size_t row_bytes = t.nbytes() / static_cast<size_t>(t.shape()[0]);
  std::memcpy(out.raw_data(), static_cast<const uint8_t*>(t.raw_data()) + static_cast<size_t>(begin) * row_bytes,
              row_bytes * static_cast<size_t>(count));
  return out;
}

// Hands the turn between the reference (a worker thread) and the candidate (the calling thread)
// so that exactly one of them computes at any time; see compare.h.
class Lockstep {
 public:
  enum class Turn { Ref, Cand };

  Lockstep(const LayerMatching& m, int64_t window) : matching_(m), window_(window) {}

  void wait_turn(Turn t) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return turn_ == t; });
  }

  // Reference observer.
  void ref_value(const ir::Value& v, const Tensor& t) {
    if (!matching_.by_ref.count(v.name())) return;
    std::unique_lock<std::mutex> lk(mu_);
    if (cand_failed_) throw Error(ErrorKind::Internal, "candidate failed");  // stop the reference early
    if (cand_done_) return;
    pending_bytes_ += static_cast<int64_t>(t.nbytes());
    pending_[v.name()] = t;  // shares the buffer, which keeps kernels from reusing it (input_reusable)
    peak_ = std::max(peak_, pending_bytes_);
    if (pending_bytes_ >= window_) {
      turn_ = Turn::Cand;
      cv_.notify_all();
      cv_.wait(lk, [&] { return turn_ == Turn::Ref; });
    }
  }

  void ref_finished() {
    std::lock_guard<std::mutex> lk(mu_);
    ref_done_ = true;
    turn_ = Turn::Cand;
    cv_.notify_all();
  }

  // Candidate observer: the reference tensor for `ref_name`, produced on demand; an undefined
  // tensor when the reference never computed it.
  Tensor take(const std::string& ref_name) {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      auto it = pending_.find(ref_name);
      if (it != pending_.end()) {
        Tensor t = std::move(it->second);
        pending_.erase(it);
        pending_bytes_ -= static_cast<int64_t>(t.nbytes());
        return t;
      }
      if (ref_done_) return Tensor();
      turn_ = Turn::Ref;
      cv_.notify_all();
      cv_.wait(lk, [&] { return turn_ == Turn::Cand; });
    }
  }

  void cand_finished(bool failed) {
    std::lock_guard<std::mutex> lk(mu_);
    cand_done_ = true;
    cand_failed_ = failed;
    pending_.clear();
    pending_bytes_ = 0;
    turn_ = Turn::Ref;
    cv_.notify_all();
  }

  int64_t peak_bytes() const { return peak_; }

 private:
  const LayerMatching& matching_;
  const int64_t window_;
  std::mutex mu_;
  std::condition_variable cv_;
  Turn turn_ = Turn::Ref;
  std::unordered_map<std::string, Tensor> pending_;
  int64_t pending_bytes_ = 0;
  int64_t peak_ = 0;
  bool ref_done_ = false;
  bool cand_done_ = false;
  bool cand_failed_ = false;
};

}  // namespace

const OutputResult* CompareResult::labelled_output() const {
  for (const OutputResult& o : outputs)
    if (o.labelled) return &o;
  return nullptr;
}

int64_t for_each_chunk(const data::FeedSource& feeds, int64_t batch_rows, int64_t max_rows,
                       const std::function<void(const Chunk&)>& fn) {
  if (batch_rows < 1) fail_input("--batch-size must be at least 1");
  int64_t row = 0, read = 0;
  for (size_t i = 0; i < feeds.size(); ++i) {
    if (max_rows >= 0 && row >= max_rows) break;
    data::Feed feed = feeds.get(i);
    ++read;
    bool sliceable = feed.rows > 1;
    for (const auto& [name, t] : feed.tensors)
      if (t.rank() < 1 || t.shape()[0] != feed.rows || t.dtype() == DType::String) sliceable = false;
    int64_t take = feed.rows;
    if (max_rows >= 0 && sliceable) take = std::min(take, max_rows - row);
    if (!sliceable || (take <= batch_rows && take == feed.rows)) {
      Chunk c;
      c.tensors = std::move(feed.tensors);
      c.rows = feed.rows;
      c.first_row = row;
      c.feed_id = feed.id;
      fn(c);
      row += feed.rows;
      continue;
    }
    for (int64_t b = 0; b < take; b += batch_rows) {
      const int64_t n = std::min(batch_rows, take - b);
      Chunk c;
      for (const auto& [name, t] : feed.tensors) c.tensors.emplace(name, slice_rows(t, b, n));
      c.rows = n;
      c.first_row = row + b;
      c.feed_id = feed.id;
      fn(c);
    }
    row += take;
  }
  return read;
}

rt::Feeds adapt_feeds(const ir::Model& model, const rt::Feeds& feeds) {
  rt::Feeds out;
  for (const auto& [name, t] : feeds) {
    const ir::Value* v = model.graph->find(name);
    DType want = v && v->type.is_tensor() ? v->type.elem : DType::Undefined;
    if (want == DType::Undefined || want == t.dtype() || !floatish(want) || !floatish(t.dtype())) {
      out.emplace(name, t);
      continue;
    }
    Tensor f = as_float32(t);
    if (want == DType::Float16 || want == DType::BFloat16) out.emplace(name, rt::narrow_from_float32(f, want));
    else out.emplace(name, f.cast_to(want));
  }
  return out;
}

std::vector<size_t> map_outputs(const ir::Model& ref, const ir::Model& cand) {
  std::vector<size_t> idx;
  const auto& co = cand.graph->outputs();
  for (const ir::Value* r : ref.graph->outputs()) {
    auto it = std::find_if(co.begin(), co.end(), [&](const ir::Value* c) { return c->name() == r->name(); });
    if (it == co.end()) {
      std::vector<std::string> names;
      for (const ir::Value* c : co) names.push_back(c->name());
      fail_input("the candidate has no output '{}' (reference output); its outputs are: {}", r->name(),
                 fmt::format("{}", fmt::join(names, ", ")));
    }
    idx.push_back(static_cast<size_t>(it - co.begin()));
  }
  return idx;
}

CompareResult compare_models(const ir::Model& ref, const ir::Model& cand, const data::FeedSource& feeds,
                             const CompareOptions& o) {
  const std::vector<size_t> out_map = map_outputs(ref, cand);
  rt::ExecOptions eo;
  eo.backend = o.backend;
  eo.threads = o.threads;
  rt::Executor ref_exec(ref, eo);
  rt::Executor cand_exec(cand, eo);

  CompareResult res;
  for (const ir::Value* v : ref.graph->outputs()) {
    OutputResult r;
    r.name = v->name();
    res.outputs.push_back(std::move(r));
  }
  const auto& labels = feeds.labels();
  res.have_labels = labels.has_value();
  if (!o.label_output.empty() &&
      std::none_of(res.outputs.begin(), res.outputs.end(), [&](const OutputResult& r) { return r.name == o.label_output; }))
    fail_input("--label-output '{}' is not an output of the reference", o.label_output);

  // Per-layer state.
  LayerMatching matching;
  std::vector<LayerResult> layer_stats;
  std::vector<char> layer_bad;
  std::vector<int64_t> layer_order;
  int64_t next_order = 0;
  if (o.per_layer) {
    matching = match_layers(ref, cand);
    layer_stats.resize(matching.matches.size());
    layer_bad.assign(matching.matches.size(), 0);
    layer_order.assign(matching.matches.size(), -1);
    for (size_t i = 0; i < matching.matches.size(); ++i) {
      const LayerMatch& m = matching.matches[i];
      LayerResult& l = layer_stats[i];
      l.name = m.ref_name;
      l.cand_name = m.cand_name;
      l.node = m.ref_node ? m.ref_node->name : std::string();
      l.op_type = m.ref_node ? m.ref_node->op_type : std::string("input");
      l.graph_input = m.ref_node == nullptr;
    }
    spdlog::debug("per-layer: {} matched tensors, {} reference tensors without a counterpart", matching.matches.size(),
                  matching.unmatched.size());
  }
  int64_t peak = 0;

  int64_t total_rows = feeds.total_rows();
  if (o.max_samples >= 0) total_rows = std::min(total_rows, o.max_samples);
  bool first = true;
  auto on_chunk = [&](const Chunk& chunk) {
    rt::Feeds ref_feeds = adapt_feeds(ref, chunk.tensors);
    rt::Feeds cand_feeds = adapt_feeds(cand, chunk.tensors);
    ref_exec.check_feeds(ref_feeds);
    try {
      cand_exec.check_feeds(cand_feeds);
    } catch (const Error& e) {
      fail_input("candidate: {}", e.what());
    }
    std::vector<Tensor> ref_out, cand_out;
    if (!o.per_layer) {
      ref_out = ref_exec.run(ref_feeds);
      cand_out = cand_exec.run(cand_feeds);
    } else {
      Lockstep ls(matching, o.window_bytes);
      ref_exec.set_observer([&](const ir::Value& v, const Tensor& t) {
        if (first) {
          auto it = matching.by_ref.find(v.name());
          if (it != matching.by_ref.end() && layer_order[it->second] < 0) layer_order[it->second] = next_order++;
        }
        ls.ref_value(v, t);
      });
      cand_exec.set_observer([&](const ir::Value& v, const Tensor& t) {
        auto it = matching.by_cand.find(v.name());
        if (it == matching.by_cand.end()) return;
        const size_t li = it->second;
        Tensor r = ls.take(matching.matches[li].ref_name);
        if (!r.defined() || layer_bad[li]) return;
        if (!floatish(r.dtype()) || !floatish(t.dtype())) {
          layer_bad[li] = 1;  // integer/bool tensors (shapes, indices) are not layers
          return;
        }
        if (r.shape() != t.shape()) {
          layer_bad[li] = 2;  // counted as without a counterpart
          return;
        }
        Tensor a = as_float32(r), b = as_float32(t);
        const double mask = matching.matches[li].mask_threshold;
        if (!std::isinf(mask)) {
          // Leave the attention-mask fill values out (per_layer.h, mask_thresholds).
          const float* ra = a.data<float>();
          const float* cb = b.data<float>();
          std::vector<float> kept_r, kept_c;
          kept_r.reserve(static_cast<size_t>(a.numel()));
          kept_c.reserve(static_cast<size_t>(a.numel()));
          for (int64_t i = 0; i < a.numel(); ++i) {
            if (std::fabs(static_cast<double>(ra[i])) >= mask) {
              ++layer_stats[li].masked;
              continue;
            }
            kept_r.push_back(ra[i]);
            kept_c.push_back(cb[i]);
          }
          layer_stats[li].stats.add(kept_r.data(), kept_c.data(), static_cast<int64_t>(kept_r.size()));
          return;
        }
        layer_stats[li].stats.add(a.data<float>(), b.data<float>(), a.numel());
      });
      std::exception_ptr ref_err;
      std::thread worker([&] {
        ls.wait_turn(Lockstep::Turn::Ref);
        try {
          ref_out = ref_exec.run(ref_feeds);
        } catch (...) {
          ref_err = std::current_exception();
        }
        ls.ref_finished();
      });
      ls.wait_turn(Lockstep::Turn::Cand);
      std::exception_ptr cand_err;
      try {
        cand_out = cand_exec.run(cand_feeds);
      } catch (...) {
        cand_err = std::current_exception();
      }
      ls.cand_finished(cand_err != nullptr);
      worker.join();
      ref_exec.set_observer(nullptr);
      cand_exec.set_observer(nullptr);
      peak = std::max(peak, ls.peak_bytes());
      if (cand_err) std::rethrow_exception(cand_err);
      if (ref_err) std::rethrow_exception(ref_err);
    }

    std::vector<int64_t> chunk_labels;
    if (labels) {
      if (chunk.first_row + chunk.rows > static_cast<int64_t>(labels->size()))
        fail_input("{} labels for at least {} data rows", labels->size(), chunk.first_row + chunk.rows);
      chunk_labels.assign(labels->begin() + chunk.first_row, labels->begin() + chunk.first_row + chunk.rows);
    }
    for (size_t i = 0; i < res.outputs.size(); ++i) {
      OutputResult& r = res.outputs[i];
      const Tensor& a_raw = ref_out.at(i);
      const Tensor& b_raw = cand_out.at(out_map[i]);
      if (a_raw.shape() != b_raw.shape())
        fail_input("output '{}' (feed {}): reference shape {} but candidate shape {}", r.name, chunk.feed_id,
                   shape_str(a_raw.shape()), shape_str(b_raw.shape()));
      Tensor a = numeric_as_float32(a_raw), b = numeric_as_float32(b_raw);
      if (first) {
        r.shape = a_raw.shape();
        r.ref_dtype = a_raw.dtype();
        r.cand_dtype = b_raw.dtype();
        if (floatish(a_raw.dtype()) && class_layout(a.shape(), o.class_axis)) r.top1 = Top1Stats();
      }
      const bool rows_lead = a.rank() >= 1 && a.shape()[0] == chunk.rows;
      if (rows_lead) r.stats.add_rows(a.data<float>(), b.data<float>(), a.numel(), chunk.rows);
      else r.stats.add(a.data<float>(), b.data<float>(), a.numel());
      if (r.top1) {
        auto layout = class_layout(a.shape(), o.class_axis);
        if (!layout) fail_input("output '{}': shape {} no longer holds class scores on axis {}", r.name, shape_str(a.shape()), o.class_axis);
        std::vector<int64_t> rc = argmax_classes(a.data<float>(), *layout);
        std::vector<int64_t> cc = argmax_classes(b.data<float>(), *layout);
        if (r.labelled) r.top1->add_labels(rc, cc, chunk_labels);
        else r.top1->add(rc, cc);
      }
    }
    if (first && labels) {
      // Choose the output the labels refer to: named, or the first with one score row per sample.
      OutputResult* pick = nullptr;
      for (OutputResult& r : res.outputs) {
        if (!o.label_output.empty() ? r.name != o.label_output : false) continue;
        auto layout = class_layout(r.shape, o.class_axis);
        if (r.top1 && layout && layout->positions() == chunk.rows) {
          pick = &r;
          break;
        }
        if (!o.label_output.empty())
          fail_input("labels: output '{}' of shape {} does not hold one class-score row per sample", r.name, shape_str(r.shape));
      }
      if (!pick)
        fail_input("labels are given but no output holds one row of class scores per sample (axis {}); name one with --label-output",
                   o.class_axis);
      pick->labelled = true;
      // The first chunk was folded without labels: count its accuracy now.
      const size_t i = static_cast<size_t>(pick - res.outputs.data());
      Tensor a = numeric_as_float32(ref_out.at(i)), b = numeric_as_float32(cand_out.at(out_map[i]));
      auto layout = *class_layout(a.shape(), o.class_axis);
      Top1Stats t;
      t.add_labels(argmax_classes(a.data<float>(), layout), argmax_classes(b.data<float>(), layout), chunk_labels);
      *pick->top1 = t;
    }
    first = false;
    res.rows += chunk.rows;
    ++res.runs;
    if (o.progress) o.progress(res.rows, total_rows);
  };
  res.feeds = for_each_chunk(feeds, o.batch_rows, o.max_samples, on_chunk);
  if (res.rows == 0) fail_input("{}: no samples to compare", feeds.dir().string());

  if (o.per_layer) {
    PerLayerResult pl;
    pl.jump_db = o.jump_db;
    pl.peak_window_bytes = peak;
    pl.unmatched = matching.unmatched;
    std::vector<LayerResult> inputs;
    for (size_t i = 0; i < layer_stats.size(); ++i) {
      LayerResult& l = layer_stats[i];
      l.order = layer_order[i];
      if (layer_bad[i] == 1) continue;
      pl.masked += l.masked;
      if (layer_bad[i] == 2 || (l.stats.count() == 0 && l.masked == 0)) {
        if (!l.graph_input) pl.unmatched.push_back(l.name);
        continue;
      }
      (l.graph_input ? inputs : pl.layers).push_back(std::move(l));
    }
    std::stable_sort(pl.layers.begin(), pl.layers.end(), [](const LayerResult& a, const LayerResult& b) { return a.order < b.order; });
    rank_layers(ref, pl, inputs);
    res.per_layer = std::move(pl);
  }
  return res;
}

}  // namespace mpq::validate
