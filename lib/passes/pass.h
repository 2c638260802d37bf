#pragma once
// Graph passes. Each pass is one file pair named verb_noun, registered once in the pass registry
// (register_all_passes in pass.cpp). Rewrite passes declare the op types they target, run cheap
// checks first (match) and only then change the graph (apply).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace mpq::passes {

struct PassStats {
  int changed = 0;                 // rewrites applied
  std::vector<std::string> notes;  // human-readable: what was changed or skipped, and why
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string name() const = 0;
  // Op types the pass rewrites; empty when it looks at the whole graph.
  virtual std::vector<std::string> target_ops() const { return {}; }
  virtual PassStats run(ir::Model& model) = 0;
};

// Visits every node of the target op types in the top-level graph (a snapshot, so rewrites may
// add and remove nodes), calls match() and, when it holds, apply(). Afterwards the graph is put
// back in topological order and nodes left without consumers are dropped.
class NodeRewritePass : public Pass {
 public:
  PassStats run(ir::Model& model) override;

 protected:
  // Cheap structural checks only; no graph changes.
  virtual bool match(const ir::Model& model, const ir::Node& node) const = 0;
  virtual void apply(ir::Model& model, ir::Node& node, PassStats& stats) = 0;
};

using PassFactory = std::function<std::unique_ptr<Pass>()>;

class PassRegistry {
 public:
  void add(const std::string& name, PassFactory factory);  // rejects duplicates
  std::unique_ptr<Pass> create(const std::string& name) const;
  std::vector<std::string> names() const;
  static const PassRegistry& global();

 private:
  std::vector<std::pair<std::string, PassFactory>> factories_;
};

// The explicit list of registered passes.
void register_all_passes(PassRegistry& registry);

// Runs the named passes in order. With verify=true the IR verifier runs after each pass and a
// problem is an Internal error naming the pass.
std::vector<PassStats> run_passes(ir::Model& model, const std::vector<std::string>& names, bool verify = true);
// Runs one pass object, verifying afterwards when asked.
PassStats run_pass(Pass& pass, ir::Model& model, bool verify = true);

// Helpers shared by passes.
using ir::constant_value;
// Number of consumers of `v`, counting graph-output use and subgraph references.
size_t consumer_count(const ir::Model& model, const ir::Value* v);
// Drops initializers nothing reads any more (not graph inputs or outputs); returns how many.
size_t remove_unused_initializers(ir::Model& model);

}  // namespace mpq::passes
