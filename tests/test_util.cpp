#include "test_util.h"

#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ir/onnx_io.h"
#include "ir/onnx_tools.h"
#include "runtime/blas_kernels.h"
#include "runtime/cpu/channel_blocks.h"
#include "runtime/thread_pool.h"
#include "runtime/cpu/conv_onednn.h"
#include "runtime/executor.h"

namespace mpq::test {

fs::path source_dir() {
  const char* env = std::getenv("MPQ_SOURCE_DIR");
  return env && *env ? fs::path(env) : fs::path(MPQ_SOURCE_DIR);
}
// $MPQ_TESTDATA / $MPQ_SOURCE_DIR: the GPU bundle's copies (scripts/gpu_bundle.sh), on machines
// where neither the Debian package nor the source tree exists.
fs::path testdata_dir() {
  const char* env = std::getenv("MPQ_TESTDATA");
  return env && *env ? fs::path(env) : fs::path(MPQ_TESTDATA_DIR);
}
fs::path mpq_binary() { return MPQ_BINARY; }

TempDir::TempDir(const std::string& tag) {
  std::random_device rd;
  path_ = fs::temp_directory_path() / fmt::format("{}-{}-{:08x}", tag, ::getpid(), rd());
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

namespace {
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}
std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

CommandResult run_mpq(const std::vector<std::string>& args) {
  TempDir tmp("mpq-cmd");
  std::string cmd = shell_quote(mpq_binary().string());
  for (const auto& a : args) cmd += " " + shell_quote(a);
  cmd += " >" + shell_quote((tmp / "out").string()) + " 2>" + shell_quote((tmp / "err").string()) + " </dev/null";
  int status = std::system(cmd.c_str());
  CommandResult r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) r.exit_code = 128 + WTERMSIG(status);
  r.out = slurp(tmp / "out");
  r.err = slurp(tmp / "err");
  return r;
}

Tensor random_tensor(const Shape& shape, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t(DType::Float32, shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

ir::Model load_test_model(const std::string& name) {
  // The GPU bundle carries its test models without a source tree ($MPQ_TEST_MODELS).
  fs::path path = source_dir() / "tests/models" / name;
  if (const char* env = std::getenv("MPQ_TEST_MODELS"); env && *env && fs::exists(fs::path(env) / name))
    path = fs::path(env) / name;
  ir::Model m = ir::load_model(path.string());
  ir::infer_shapes(m);
  return m;
}

rt::Feeds random_feeds(const ir::Model& m, uint32_t seed) {
  rt::Feeds feeds;
  for (const ir::Value* in : m.graph->required_inputs()) {
    Shape s;
    for (const auto& d : in->type.dims) s.push_back(d.known() ? d.value : 2);
    if (in->type.elem == DType::Int64) {
      Tensor t(DType::Int64, s);
      for (int64_t i = 0; i < t.numel(); ++i)
        t.data<int64_t>()[i] = in->name() == "attention_mask" ? 1 : static_cast<int64_t>((i * 7 + seed) % 50);
      feeds[in->name()] = t;
    } else {
      feeds[in->name()] = random_tensor(s, seed);
    }
    ++seed;
  }
  return feeds;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.get_double(i) - b.get_double(i)));
  return m;
}

double rel_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double d = a.get_double(i) - b.get_double(i);
    num += d * d;
    den += b.get_double(i) * b.get_double(i);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-12);
}

void write_model(const ir::Model& m, const fs::path& path) { ir::save_model(m, path); }

int count_ops(const ir::Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node->op_type == op;
  return n;
}

int count_ops(const ir::Model& m, const std::string& op) { return count_ops(*m.graph, op); }

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

ir::Value* add_qdq(ir::Graph& g, ir::Value* v, const std::string& name, float scale, bool uint8, int zero_point) {
  ir::Value* s = g.add_initializer(name + "_s", Tensor::from<float>({}, {scale}));
  ir::Value* z = uint8 ? g.add_initializer(name + "_z", Tensor::from<uint8_t>({}, {static_cast<uint8_t>(zero_point)}))
                       : g.add_initializer(name + "_z", Tensor::from<int8_t>({}, {static_cast<int8_t>(zero_point)}));
  ir::Value* q = g.add_value(name + "_q");
  g.add_node("QuantizeLinear", {v, s, z}, {q}, name + "_quant");
  ir::Value* dq = g.add_value(name + "_dq");
  g.add_node("DequantizeLinear", {q, s, z}, {dq}, name + "_dequant");
  return dq;
}

std::vector<Tensor> run_model(const ir::Model& m, const rt::Feeds& feeds, int threads) {
  rt::ExecOptions options;
  options.threads = threads;
  rt::Executor exec(m, options);
  return exec.run(feeds);
}

std::vector<Tensor> run_node(const std::string& op, const std::vector<Tensor>& inputs,
                             const std::vector<ir::Attribute>& attrs, size_t n_outputs, int opset, int threads,
                             const std::string& domain) {
  ir::Model m;
  m.set_opset("", opset);
  if (!domain.empty()) m.set_opset(domain, 1);
  ir::Graph* g = m.graph.get();
  std::vector<ir::Value*> ins;
  rt::Feeds feeds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      ins.push_back(nullptr);
      continue;
    }
    std::string name = "in" + std::to_string(i);
    ir::Value* v = g->add_value(name, ir::ValueType::tensor(inputs[i].dtype(), inputs[i].shape()));
    g->add_input(v);
    ins.push_back(v);
    feeds[name] = inputs[i];
  }
  std::vector<ir::Value*> outs;
  for (size_t i = 0; i < n_outputs; ++i) {
    ir::Value* v = g->add_value("out" + std::to_string(i));
    g->add_output(v);
    outs.push_back(v);
  }
  ir::Node* n = g->add_node(op, ins, outs, "node_under_test", domain);
  for (const auto& a : attrs) n->set_attr(a);
  rt::ExecOptions opt;
  opt.threads = threads;
  rt::Executor ex(m, opt);
  return ex.run(feeds);
}

BlasKernelSwitch::BlasKernelSwitch() {
  if (!rt::cpu::onednn_enabled() || rt::blas_kernels_for_this_cpu() != "SkylakeX") {
    why_ = "oneDNN is off or this CPU has no AVX-512";
    return;
  }
  before_ = rt::ensure_blas_kernels().active;
  if (before_.empty() || strcasecmp(before_.c_str(), "Cooperlake") == 0 ||
      strcasecmp(before_.c_str(), "SapphireRapids") == 0)
    why_ = "OpenBLAS cannot say which kernels run, or runs " + before_ + ", which cannot be selected back by name";
}

BlasKernelSwitch::~BlasKernelSwitch() {
  if (usable()) rt::switch_blas_kernels(before_);
}

bool BlasKernelSwitch::to(const std::string& kernels) {
  return usable() && strcasecmp(rt::switch_blas_kernels(kernels).c_str(), kernels.c_str()) == 0;
}

bool BlasKernelSwitch::restore() { return to(before_); }

Tensor in_channel_layout(const Tensor& plain, int64_t block) {
  if (block == 0) return plain;
  Tensor out(DType::Float32, plain.shape());
  rt::ThreadPool pool(2);  // the conversion on a pool of two, as the executor may run it
  rt::cpu::to_channel_blocks(pool, plain.data<float>(), out.data<float>(), plain.dim(0), plain.dim(1),
                             plain.dim(2) * plain.dim(3), block);
  return out;
}

Tensor from_channel_layout(const Tensor& t, int64_t block) {
  if (block == 0) return t;
  Tensor out(DType::Float32, t.shape());
  rt::ThreadPool pool(1);
  rt::cpu::from_channel_blocks(pool, t.data<float>(), out.data<float>(), t.dim(0), t.dim(1), t.dim(2) * t.dim(3),
                               block);
  return out;
}

rt::cpu::Int8ConvScales int8_conv_scales(int64_t m, uint32_t seed) {
  rt::cpu::Int8ConvScales q;
  q.x_inv = 50.0f;
  q.w_inv.assign(static_cast<size_t>(m), 400.0f);
  q.out.assign(static_cast<size_t>(m), 1.0f / (50.0f * 400.0f));
  const Tensor b = random_tensor({m}, seed, -0.2f, 0.2f);
  for (int64_t i = 0; i < m; ++i) q.bias.push_back(b.data<float>()[i] / q.out[static_cast<size_t>(i)]);
  return q;
}

rt::cpu::DnnlConvShape relu_conv_shape(const ConvGeometry& g, bool residual, int64_t layout,
                                       const rt::cpu::Int8ConvScales* q) {
  rt::cpu::DnnlConvShape s;
  s.n = g.n;
  s.c = g.c;
  s.m = g.m;
  s.ih = g.h;
  s.iw = g.w;
  s.kh = s.kw = g.k;
  s.sh = s.sw = g.stride;
  s.pt = g.pad_top;
  s.pb = g.pad_bottom;
  s.pl = s.pr = g.pad_side;
  s.oh = (g.h + g.pad_top + g.pad_bottom - g.k) / g.stride + 1;
  s.ow = (g.w + 2 * g.pad_side - g.k) / g.stride + 1;
  s.bias = true;
  s.residual = residual;
  s.act = rt::cpu::DnnlAct::Relu;
  s.x_block = s.y_block = layout;
  if (residual) s.z_block = layout;
  s.int8 = q;
  return s;
}

}  // namespace mpq::test
