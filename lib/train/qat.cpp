#include "train/qat.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <utility>

#include "calib/calibrator.h"
#include "core/file_io.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "passes/fold_constants.h"
#include "passes/fuse_conv_bn.h"
#include "passes/insert_fake_quant.h"
#include "runtime/executor.h"
#include "train/autograd.h"
#include "train/checkpoint.h"
#include "train/dataset.h"
#include "train/grad_scaler.h"
#include "train/grads/grad_util.h"
#include "train/loss.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace mpq::train {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kCheckpointFile = "qat.ckpt";
constexpr const char* kCalibFile = "calibration.json";

uint64_t fnv1a(const std::string& bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// The same preparation `mpq quantize` applies before calibrating: constants folded, BatchNorm folded.
ir::Model prepare(const fs::path& path, std::vector<std::string>& notes) {
  ir::Model m = ir::load_model(path);
  ir::verify_or_throw(m);
  passes::FoldConstants fold;
  const passes::PassStats folded = passes::run_pass(fold, m);
  passes::FuseConvBn fuse;
  const passes::PassStats fused = passes::run_pass(fuse, m);
  if (fused.changed) notes.push_back(fmt::format("folded {} BatchNormalization node(s) into the layers before them", fused.changed));
  if (folded.changed) notes.push_back(fmt::format("folded {} constant expression(s)", folded.changed));
  return m;
}

bool is_classifier_output(const Tensor& t) { return t.rank() == 2 && t.dim(1) > 1; }

// Settings a resumed run must share with the run that wrote the checkpoint.
nlohmann::json run_settings(const QatOptions& o, int64_t total_steps, int64_t batch) {
  const passes::QdqOptions& q = o.quant;
  return {{"weight_bits", q.weight_bits},
          {"per_channel", q.per_channel},
          {"activation_type", q.activation_type},
          {"symmetric", q.symmetric},
          {"reduce_range", q.reduce_range},
          {"exclude_nodes", std::vector<std::string>(q.exclude_nodes.begin(), q.exclude_nodes.end())},
          {"exclude_ops", std::vector<std::string>(q.exclude_ops.begin(), q.exclude_ops.end())},
          {"learn_scales", o.learn_scales},
          {"freeze_ranges_after", o.freeze_ranges_after},
          {"loss", o.loss},
          {"temperature", o.temperature},
          {"steps", total_steps},
          {"batch_size", batch},
          {"lr", o.lr},
          {"optimizer", o.optimizer},
          {"weight_decay", o.weight_decay},
          {"momentum", o.momentum},
          {"warmup", o.warmup},
          {"max_grad_norm", o.max_grad_norm},
          {"amp", amp_name(o.amp)},
          {"seed", o.seed}};
}

struct Groups {
  std::vector<ParamGroup> groups;
  std::vector<size_t> scales;
};

// Weights (rank >= 2) decay; biases, normalisation parameters and step sizes do not; step sizes
// move in log space (optimizer.h), which keeps them positive.
Groups param_groups(const std::vector<Parameter>& params, const std::set<std::string>& scale_names, double wd) {
  Groups g;
  ParamGroup weights{"weights", {}, 1.0, wd, false}, other{"biases", {}, 1.0, 0.0, false};
  ParamGroup scales{"scales", {}, 1.0, 0.0, true};
  for (size_t i = 0; i < params.size(); ++i) {
    if (scale_names.count(params[i].name)) {
      scales.params.push_back(i);
      g.scales.push_back(i);
    } else if (params[i].value.rank() >= 2) {
      weights.params.push_back(i);
    } else {
      other.params.push_back(i);
    }
  }
  for (ParamGroup* p : {&weights, &other, &scales})
    if (!p->params.empty()) g.groups.push_back(*p);
  return g;
}

}  // namespace

QatMetrics evaluate_against(const ir::Model& model, const ir::Model& reference, const fs::path& data, int64_t batch_size,
                            int threads) {
  const RowDataset ds = RowDataset::load(data, reference);
  rt::ExecOptions eo;
  eo.threads = threads;
  rt::Executor a(model, eo), b(reference, eo);
  const int64_t step = ds.batchable() ? std::max<int64_t>(1, batch_size) : 1;
  QatMetrics m;
  m.rows = ds.rows();
  int64_t agree = 0, correct = 0, positions = 0;
  double num = 0.0, den = 0.0;
  for (int64_t r = 0; r < ds.rows(); r += step) {
    const std::vector<int64_t> idx = RowDataset::range(r, std::min(ds.rows(), r + step));
    const rt::Feeds feeds = ds.batch(idx);
    const Tensor y = a.run(feeds).at(0).cast_to(DType::Float32), ref = b.run(feeds).at(0).cast_to(DType::Float32);
    for (int64_t i = 0; i < y.numel(); ++i) {
      const double d = static_cast<double>(y.data<float>()[i]) - ref.data<float>()[i];
      num += d * d;
      den += static_cast<double>(ref.data<float>()[i]) * ref.data<float>()[i];
    }
    if (y.rank() >= 2 && y.dim(1) > 1) {
      agree += top1_agreement(y, ref).correct;
      const Top1 t = top1_agreement(ref, ref);
      positions += t.total;
      if (ds.has_labels() && y.rank() == 2) correct += top1_against_labels(y, ds.labels(idx)).correct;
    }
  }
  m.rel_l2 = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
  if (positions > 0) {
    m.agreement = static_cast<double>(agree) / static_cast<double>(positions);
    if (ds.has_labels()) m.accuracy = static_cast<double>(correct) / static_cast<double>(positions);
  }
  return m;
}

QatResult qat_finetune(const QatOptions& o) {
  QatResult res;
  auto log = [&](const std::string& line) {
    if (o.log) o.log(line);
  };
  if (o.loss != "distill" && o.loss != "ce" && o.loss != "distill+ce")
    fail_input("--loss must be distill, ce or distill+ce, got '{}'", o.loss);
  if (o.optimizer != "adamw" && o.optimizer != "sgd") fail_input("--optimizer must be adamw or sgd, got '{}'", o.optimizer);
  if (o.batch_size < 1) fail_input("--batch-size must be at least 1");
  if (!(o.lr > 0)) fail_input("--lr must be positive");
  // As PyTorch's optimizers refuse a negative decay; a negative norm would flip the gradients.
  if (!(o.weight_decay >= 0)) fail_input("--weight-decay must be 0 or more, got {}", o.weight_decay);
  if (!(o.max_grad_norm >= 0))
    fail_input("--clip-grad-norm must be 0 (no clipping, the default) or more, got {}", o.max_grad_norm);
  if (o.resume && o.checkpoint_dir.empty()) fail_input("--resume needs --checkpoint DIR");
  if (!o.checkpoint_dir.empty() && !fs::is_directory(o.checkpoint_dir)) {
    std::error_code ec;
    fs::create_directories(o.checkpoint_dir, ec);
    if (ec) fail_input("{}: cannot create the checkpoint folder: {}", o.checkpoint_dir.string(), ec.message());
  }
  const uint64_t model_hash = fnv1a(read_file_bytes(o.model));

  // ---- 1. the FP32 model as the export will see it, and its data
  const ir::Model fp32 = prepare(o.model, res.notes);
  const RowDataset train = RowDataset::load(o.data, fp32);
  const bool needs_labels = o.loss != "distill";
  if (needs_labels && !train.has_labels())
    fail_input("{}: --loss {} needs labels (labels.npy or labels.txt beside the data); --loss distill needs none",
               o.data.string(), o.loss);
  const int64_t batch = train.batchable() ? o.batch_size : 1;
  if (!train.batchable() && o.batch_size > 1)
    res.notes.push_back("the model fixes its batch dimension: training one row per step");
  const int64_t steps_per_epoch = (train.rows() + batch - 1) / batch;
  const int64_t total_steps = o.steps > 0 ? o.steps : o.epochs * steps_per_epoch;
  if (total_steps < 1) fail_input("nothing to train: {} rows, {} epoch(s)", train.rows(), o.epochs);
  res.total_steps = total_steps;
  const fs::path ckpt_path = o.checkpoint_dir.empty() ? fs::path() : o.checkpoint_dir / kCheckpointFile;
  const nlohmann::json settings = run_settings(o, total_steps, batch);

  // ---- 2. calibration: a table given, the one a resumed run wrote, or the first rows of --data
  calib::CalibrationTable table;
  std::optional<Checkpoint> resume_from;
  if (o.resume) {
    if (!fs::exists(ckpt_path)) fail_input("{}: no checkpoint to resume from", ckpt_path.string());
    resume_from = Checkpoint::load(ckpt_path);
    const nlohmann::json& meta = resume_from->meta();
    if (meta.value("model_hash", std::string()) != std::to_string(model_hash))
      fail_input("{}: this checkpoint was written for another model ({}), not {}", ckpt_path.string(),
                 meta.value("model", std::string("?")), o.model.string());
    const nlohmann::json saved = meta.value("settings", nlohmann::json::object());
    for (const auto& [key, value] : settings.items())
      if (!saved.contains(key) || saved.at(key) != value)
        fail_input("{}: the checkpoint was written with {} = {}, this run has {}", ckpt_path.string(), key,
                   saved.contains(key) ? saved.at(key).dump() : "nothing", value.dump());
    table = calib::read_table(o.checkpoint_dir / kCalibFile);
    res.calibration_method = table.method + " (from the checkpoint)";
  } else if (!o.calib_table.empty()) {
    table = calib::read_table(o.calib_table);
    res.calibration_method = table.method + " (" + o.calib_table.string() + ")";
  } else {
    calib::CalibOptions co;
    co.method = o.method;
    co.range.percentile = o.percentile;
    co.activation_type = o.quant.activation_type;
    co.threads = o.threads;
    const int64_t rows = std::min(train.rows(), o.calib_samples > 0 ? o.calib_samples : train.rows());
    const int64_t cb = train.batchable() ? 64 : 1;
    log(fmt::format("calibrating on {} row(s) of {} ({})", rows, o.data.string(), calib::range_method_info(o.method).name));
    table = calib::calibrate(fp32, (rows + cb - 1) / cb,
                             [&](int64_t i) { return train.feed(RowDataset::range(i * cb, std::min(rows, (i + 1) * cb))); }, co);
    res.calibration_method = fmt::format("{} on {} row(s)", table.method, rows);
  }
  if (!o.checkpoint_dir.empty() && !o.resume) calib::write_table(table, o.checkpoint_dir / kCalibFile);

  // ---- 3. fake quantization and the training engine
  ir::Model student = fp32.clone();
  passes::FakeQuantReport fq = passes::insert_fake_quant(student, table, o.quant);
  ir::verify_or_throw(student);
  res.report = fq.report;
  std::set<std::string> scale_names(fq.activation_scales.begin(), fq.activation_scales.end());
  scale_names.insert(fq.weight_scales.begin(), fq.weight_scales.end());
  std::vector<std::string> trainable;
  for (const std::string& n : default_trainable(student))
    if (o.learn_scales || !scale_names.count(n)) trainable.push_back(n);
  if (trainable.empty())
    fail_input("{}: nothing to train: the model has no float weights on a path to its outputs", o.model.string());
  AutogradOptions ao;
  ao.threads = o.threads;
  ao.amp = o.amp;
  ao.training = false;  // BatchNorm is folded; any left over keeps its running statistics
  ao.trainable = trainable;
  ao.device = o.device;
  Autograd engine(student, ao);
  Groups groups = param_groups(std::as_const(engine).parameters(), scale_names, o.weight_decay);
  res.trainable_scales = static_cast<int64_t>(groups.scales.size());
  for (const Parameter& p : std::as_const(engine).parameters()) res.trainable_parameters += p.value.numel();
  std::unique_ptr<Optimizer> opt = o.optimizer == "sgd" ? make_sgd(groups.groups, {o.momentum, 0.0, false})
                                                        : make_adamw(groups.groups);
  GradScalerOptions so;
  so.enabled = o.amp == Amp::Fp16;  // BF16 has FP32's range: no scaling, as in PyTorch
  GradScaler scaler(so);
  LrSchedule schedule;
  schedule.base_lr = o.lr;
  schedule.total = total_steps;
  schedule.warmup = o.warmup >= 0 ? o.warmup : std::min<int64_t>(100, total_steps / 20);
  Trainer trainer(engine, *opt, scaler, schedule, o.max_grad_norm);

  int64_t start = 0;
  if (resume_from) {
    for (Parameter& p : engine.parameters()) {
      const Tensor& t = resume_from->get("param/" + p.name);
      if (t.shape() != p.value.shape() || t.dtype() != p.value.dtype())
        fail_input("{}: parameter '{}' is {}{} in the checkpoint, {}{} in the model", ckpt_path.string(), p.name,
                   dtype_name(t.dtype()), shape_str(t.shape()), dtype_name(p.value.dtype()), shape_str(p.value.shape()));
      std::memcpy(p.value.raw_data(), t.raw_data(), t.nbytes());
    }
    opt->load(*resume_from, std::as_const(engine).parameters());
    scaler.load(*resume_from);
    start = resume_from->meta().at("step").get<int64_t>();
    res.first_loss = resume_from->meta().value("first_loss", 0.0);
    log(fmt::format("resuming from {} at step {} of {}", ckpt_path.string(), start, total_steps));
  }
  trainer.set_steps_done(start);
  res.start_step = start;

  auto save_checkpoint = [&](int64_t step) {
    if (ckpt_path.empty()) return;
    Checkpoint c;
    for (const Parameter& p : std::as_const(engine).parameters()) c.put("param/" + p.name, p.value);
    opt->save(c, std::as_const(engine).parameters());
    scaler.save(c);
    c.meta()["step"] = step;
    c.meta()["model"] = o.model.string();
    c.meta()["model_hash"] = std::to_string(model_hash);
    c.meta()["settings"] = settings;
    c.meta()["first_loss"] = res.first_loss;
    c.save(ckpt_path);
  };

  // ---- 4. evaluation before training (the post-training quantized model) and the FP32 reference
  if (!o.eval_data.empty() && !o.resume) {
    res.has_eval = true;
    log(fmt::format("evaluating FP32 and the post-training quantized model on {}", o.eval_data.string()));
    res.fp32 = evaluate_against(fp32, fp32, o.eval_data, 256, o.threads);
    res.before = evaluate_against(student, fp32, o.eval_data, 256, o.threads);
  }

  // ---- 5. training
  rt::ExecOptions teacher_opts;
  teacher_opts.threads = o.threads;
  teacher_opts.backend = o.device;
  rt::Executor teacher(fp32, teacher_opts);
  const bool distill = o.loss != "ce", ce = o.loss != "distill";
  std::vector<char> positive;  // per parameter: a step size, which must stay above 0
  for (const Parameter& p : std::as_const(engine).parameters()) positive.push_back(scale_names.count(p.name) > 0);
  std::vector<int64_t> perm;
  int64_t perm_epoch = -1;
  int64_t bad = 0;
  // MPQ_CUDA_PROFILE=1 (with --device cuda): where a step's wall time goes, to stderr at the end
  // (the training engine's per-op table comes from train/autograd.cpp).
  const char* profile_env = std::getenv("MPQ_CUDA_PROFILE");
  const bool profiling = o.device == rt::BackendKind::CUDA && profile_env && *profile_env && std::string(profile_env) != "0";
  double phase_ms[3] = {0.0, 0.0, 0.0};  // batch, teacher, student step (forward, loss, backward, update, checks)
  const auto t0 = Clock::now();
  int64_t samples = 0;
  for (int64_t step = start; step < total_steps; ++step) {
    if (o.stop_requested && o.stop_requested()) {
      save_checkpoint(step);
      res.interrupted = true;
      res.steps_done = step;
      return res;
    }
    const int64_t epoch = step / steps_per_epoch, pos = step % steps_per_epoch;
    if (epoch != perm_epoch) {
      perm = epoch_permutation(train.rows(), o.seed, epoch);
      perm_epoch = epoch;
    }
    const int64_t lo = pos * batch, hi = std::min(train.rows(), lo + batch);
    const std::vector<int64_t> idx(perm.begin() + lo, perm.begin() + hi);
    const auto b0 = Clock::now();
    const rt::Feeds feeds = train.batch(idx);
    const auto b1 = Clock::now();
    std::vector<Tensor> teacher_out;
    if (distill) teacher_out = teacher.run(feeds);
    const auto b2 = Clock::now();
    const Tensor labels = ce ? train.labels(idx) : Tensor();
    auto loss_fn = [&](const std::vector<Tensor>& outs) {
      LossOutput l;
      l.output_grads.resize(outs.size());
      auto add = [&](size_t j, LossResult r) {
        l.value += r.value;
        l.output_grads[j] = l.output_grads[j].defined() ? grad_util::add(engine.pool(), l.output_grads[j], r.grad) : r.grad;
      };
      if (distill)
        for (size_t j = 0; j < outs.size(); ++j) {
          const Tensor t = teacher_out[j].cast_to(DType::Float32);
          add(j, is_classifier_output(outs[j]) ? kl_distillation(outs[j], t, o.temperature) : mse(outs[j], t));
        }
      if (ce) add(0, cross_entropy(outs[0], labels));
      return l;
    };
    // Frozen ranges: the step sizes' group stops moving (a zero learning rate leaves AdamW's and
    // SGD's momentum without effect, and the group has no weight decay).
    if (o.freeze_ranges_after >= 0 && step >= o.freeze_ranges_after) opt->set_lr_scale("scales", 0.0);
    const StepResult r = trainer.step(feeds, loss_fn);
    samples += hi - lo;
    if (step == 0) res.first_loss = r.loss;
    res.final_loss = r.loss;
    res.losses.push_back(r.loss);
    // A step size that left the positive numbers, or a weight that left the finite ones, means the
    // run has diverged as surely as a run of non-finite losses does. On a device, a flag per
    // parameter comes back and the values only when one is set.
    DeviceUpdate* device = engine.device_update();
    if (!device || device->first_bad_parameter(positive) >= 0)
      for (const Parameter& p : std::as_const(engine).parameters()) {
        const float* v = p.value.data<float>();
        const bool scale = scale_names.count(p.name) > 0;
        for (int64_t i = 0; i < p.value.numel(); ++i)
          if (!std::isfinite(v[i]) || (scale && !(v[i] > 0)))
            fail_input("training diverged at step {}: {} '{}' became {}; lower --lr", step + 1, scale ? "step size" : "parameter",
                       p.name, v[i]);
      }
    // The step's wall time ends here: on a device the divergence flags above waited for the update.
    const auto b3 = Clock::now();
    res.step_ms.push_back(std::chrono::duration<double, std::milli>(b3 - b0).count());
    if (profiling) {
      phase_ms[0] += std::chrono::duration<double, std::milli>(b1 - b0).count();
      phase_ms[1] += std::chrono::duration<double, std::milli>(b2 - b1).count();
      phase_ms[2] += std::chrono::duration<double, std::milli>(b3 - b2).count();
    }
    bad = (r.skipped || !std::isfinite(r.loss)) ? bad + 1 : 0;
    if (bad >= o.max_bad_steps)
      fail_input("training diverged: {} consecutive steps had a non-finite loss or gradient (last loss {}, loss scale {}); "
                 "lower --lr{}",
                 bad, r.loss, r.loss_scale, o.amp == Amp::Off ? "" : " or train with --amp off");
    if (o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0 && step + 1 < total_steps) save_checkpoint(step + 1);
    if (o.progress) {
      QatProgress p;
      p.epoch = epoch + 1;
      p.epochs = (total_steps + steps_per_epoch - 1) / steps_per_epoch;
      p.step = step + 1;
      p.steps = total_steps;
      p.loss = r.loss;
      p.lr = r.lr;
      p.loss_scale = r.loss_scale;
      p.skipped = r.skipped;
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      p.samples_per_second = secs > 0 ? static_cast<double>(samples) / secs : 0.0;
      const double per_step = secs / static_cast<double>(step + 1 - start);
      p.eta_seconds = per_step * static_cast<double>(total_steps - step - 1);
      o.progress(p);
    }
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (profiling && total_steps > start) {
    const double n = static_cast<double>(total_steps - start);
    std::fprintf(stderr, "MPQ_CUDA_PROFILE: per step %.3f ms: batch %.3f, teacher %.3f, student step %.3f ms\n",
                 1000.0 * res.seconds / n, phase_ms[0] / n, phase_ms[1] / n, phase_ms[2] / n);
  }
  res.steps_done = total_steps;
  const int64_t trained = total_steps - start;
  res.seconds_per_epoch = trained > 0 ? res.seconds * static_cast<double>(steps_per_epoch) / static_cast<double>(trained) : 0.0;
  res.skipped_steps = scaler.skipped_steps();
  res.final_loss_scale = scaler.scale();
  res.peak_step_bytes = engine.memory().peak_step_bytes;
  save_checkpoint(total_steps);

  // ---- 6. export: the trained values, the fake quantizers replaced by Q/DQ with the learned scales
  ir::Model trained_fq = student.clone();
  engine.write_back(trained_fq);
  if (res.has_eval) res.after = evaluate_against(trained_fq, fp32, o.eval_data, 256, o.threads);
  ir::Model out = trained_fq.clone();
  const passes::LearnedScales learned = passes::strip_fake_quant(out);
  passes::QdqOptions qo = o.quant;
  qo.activation_qparams = learned.activations;
  qo.weight_scales = learned.weights;
  res.report = passes::insert_qdq(out, table, qo);
  ir::verify_or_throw(out);
  const int wmax = passes::weight_qmax(o.quant);
  out.set_metadata("mpq.version", MPQ_VERSION);
  out.set_metadata("mpq.command", o.command);
  out.set_metadata("mpq.quantization.format", "qdq");
  out.set_metadata("mpq.quantization.method", "qat");
  out.set_metadata("mpq.quantization.calibration_method", table.method);
  out.set_metadata("mpq.quantization.calibration_samples", std::to_string(table.samples));
  out.set_metadata("mpq.quantization.weights", fmt::format("{} symmetric {} in [-{}, {}]{}", o.quant.weight_bits == 4 ? "4-bit" : "int8",
                                                           res.report.per_channel ? "per-channel" : "per-tensor", wmax, wmax,
                                                           o.quant.weight_bits == 4 ? " (stored as int8)" : ""));
  out.set_metadata("mpq.quantization.activations", o.quant.activation_type == "int8" ? "int8 symmetric per-tensor" : "uint8 asymmetric per-tensor");
  out.set_metadata("mpq.qat.steps", std::to_string(total_steps));
  out.set_metadata("mpq.qat.loss", o.loss);
  out.set_metadata("mpq.qat.final_loss", fmt::format("{:.6g}", res.final_loss));
  out.set_metadata("mpq.qat.optimizer", fmt::format("{} lr {} batch {}", o.optimizer, o.lr, batch));
  out.set_metadata("mpq.qat.scales", o.learn_scales ? "learned (LSQ)" : "fixed (calibrated)");
  out.set_metadata("mpq.qat.amp", amp_name(o.amp));
  res.exported = std::move(out);
  return res;
}

}  // namespace mpq::train
