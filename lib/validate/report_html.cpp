#include "validate/report_html.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "validate/report_junit.h"

namespace mpq::validate {

namespace {

std::string esc(const std::string& s) { return xml_escape(s); }

std::string pct(double v) {
  if (v != v) return "n/a";
  return fmt::format("{:.2f}%", 100.0 * v);
}

double finite_or(double v, double fallback) { return std::isfinite(v) ? v : fallback; }

// Axis top for dB charts: a multiple of 10 above every finite value (at least 40).
double db_axis_top(const std::vector<double>& values) {
  double top = 40.0;
  for (double v : values)
    if (std::isfinite(v)) top = std::max(top, v);
  return std::ceil((top + 5.0) / 10.0) * 10.0;
}
double db_axis_bottom(const std::vector<double>& values) {
  double bottom = 0.0;
  for (double v : values)
    if (std::isfinite(v)) bottom = std::min(bottom, v);
  return std::floor(bottom / 10.0) * 10.0;
}

// Horizontal bars: SNR (dB) per output, with each output's min_snr_db threshold as a tick.
std::string output_snr_chart(const ValidateReport& rep) {
  const auto& outs = rep.result.outputs;
  std::vector<double> vals;
  for (const OutputResult& o : outs) vals.push_back(o.stats.snr_db());
  for (const OutputResult& o : outs)
    if (auto t = rep.thresholds.for_output(o.name).min_snr_db) vals.push_back(*t);
  const double top = db_axis_top(vals), bottom = db_axis_bottom(vals);
  const int label_w = 170, plot_w = 560, row_h = 28, pad_top = 30;
  const int h = pad_top + row_h * static_cast<int>(outs.size()) + 30;
  const int w = label_w + plot_w + 90;
  auto xpos = [&](double db) { return label_w + (std::clamp(db, bottom, top) - bottom) / (top - bottom) * plot_w; };
  std::ostringstream s;
  s << fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" "
                   "aria-label=\"SNR per output\">\n",
                   w, h, w, h);
  s << fmt::format("<text x=\"{}\" y=\"18\" font-size=\"13\" font-weight=\"600\" fill=\"#1f2328\">SNR per output (dB; higher is better)</text>\n", label_w);
  for (double g = bottom; g <= top + 1e-9; g += 10.0) {
    const double x = xpos(g);
    s << fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#eaeef2\" stroke-width=\"1\"/>\n", x, pad_top - 4, x,
                     h - 26);
    s << fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"11\" fill=\"#57606a\" text-anchor=\"middle\">{:.0f}</text>\n", x, h - 10, g);
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    const OutputResult& o = outs[i];
    const double snr = o.stats.snr_db();
    const int y = pad_top + static_cast<int>(i) * row_h;
    const auto limit = rep.thresholds.for_output(o.name).min_snr_db;
    const bool fail = snr != snr || (limit && !(snr >= *limit));
    s << fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"#1f2328\" text-anchor=\"end\">{}</text>\n", label_w - 8, y + 17,
                     esc(o.name));
    const double x1 = xpos(finite_or(snr, snr > 0 ? top : bottom));
    s << fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"><title>{}: {} dB</title></rect>\n",
                     label_w, y + 4, std::max(0.0, x1 - label_w), row_h - 8, fail ? "#cf222e" : "#0969da", esc(o.name),
                     format_db(snr));
    s << fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"11\" fill=\"#1f2328\">{}</text>\n", x1 + 5, y + 17,
                     std::isinf(snr) && snr > 0 ? "exact" : format_db(snr));
    if (limit) {
      const double xl = xpos(*limit);
      s << fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#1f2328\" stroke-width=\"2\" stroke-dasharray=\"3,2\"><title>min_snr_db {}</title></line>\n",
                       xl, y + 1, xl, y + row_h - 1, format_value(*limit));
    }
  }
  s << "</svg>\n";
  return s.str();
}

// SNR (line) and local SNR (dots) per layer in execution order; the first jump marked.
std::string layer_snr_chart(const PerLayerResult& pl) {
  std::vector<double> vals;
  for (const LayerResult& l : pl.layers) {
    vals.push_back(l.snr_db);
    vals.push_back(l.local_snr_db);
  }
  const double top = db_axis_top(vals), bottom = db_axis_bottom(vals);
  const int left = 50, right = 20, pad_top = 48, plot_h = 240;
  const int n = static_cast<int>(pl.layers.size());
  const int plot_w = std::max(640, std::min(1200, n * 14));
  const int w = left + plot_w + right, h = pad_top + plot_h + 40;
  auto xpos = [&](size_t i) { return left + (n <= 1 ? plot_w / 2.0 : static_cast<double>(i) / (n - 1) * plot_w); };
  auto ypos = [&](double db) {
    const double v = std::isfinite(db) ? db : (db > 0 ? top : bottom);
    return pad_top + (top - std::clamp(v, bottom, top)) / (top - bottom) * plot_h;
  };
  std::ostringstream s;
  s << fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" "
                   "aria-label=\"SNR per layer\">\n",
                   w, h, w, h);
  s << fmt::format("<text x=\"{}\" y=\"18\" font-size=\"13\" font-weight=\"600\" fill=\"#1f2328\">SNR per layer (dB), execution order</text>\n",
                   left);
  s << fmt::format("<circle cx=\"{}\" cy=\"31\" r=\"3\" fill=\"#0969da\"/><text x=\"{}\" y=\"35\" font-size=\"11\" fill=\"#57606a\">"
                   "SNR of the tensor</text>\n",
                   left + 4, left + 12);
  s << fmt::format("<circle cx=\"{}\" cy=\"31\" r=\"3.5\" fill=\"#bc4c00\"/><text x=\"{}\" y=\"35\" font-size=\"11\" fill=\"#57606a\">"
                   "local SNR (noise the layer adds by itself); points on the top edge are exact</text>\n",
                   left + 124, left + 132);
  for (double g = bottom; g <= top + 1e-9; g += 10.0) {
    const double y = ypos(g);
    s << fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#eaeef2\" stroke-width=\"1\"/>\n", left, y, left + plot_w, y);
    s << fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" fill=\"#57606a\" text-anchor=\"end\">{:.0f}</text>\n", left - 6, y + 4, g);
  }
  s << fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#57606a\" text-anchor=\"middle\">layer (execution order)</text>\n",
                   left + plot_w / 2, h - 8);
  if (pl.first_jump) {
    const double x = xpos(*pl.first_jump);
    s << fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#cf222e\" stroke-width=\"2\" stroke-dasharray=\"5,3\"/>\n", x, pad_top, x, pad_top + plot_h);
    s << fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"12\" font-weight=\"600\" fill=\"#cf222e\">first jump: {}</text>\n", x + 4, pad_top + 12,
                     esc(pl.layers[*pl.first_jump].name));
  }
  std::string points;
  for (size_t i = 0; i < pl.layers.size(); ++i)
    points += fmt::format("{}{:.1f},{:.1f}", i ? " " : "", xpos(i), ypos(pl.layers[i].snr_db));
  if (!points.empty()) s << "<polyline points=\"" << points << "\" fill=\"none\" stroke=\"#0969da\" stroke-width=\"1.5\"/>\n";
  for (size_t i = 0; i < pl.layers.size(); ++i) {
    const LayerResult& l = pl.layers[i];
    s << fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"#0969da\"><title>{} ({}): SNR {} dB</title></circle>\n",
                     xpos(i), ypos(l.snr_db), esc(l.name), esc(l.op_type), format_db(l.snr_db));
    s << fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"#bc4c00\" fill-opacity=\"0.8\"><title>{} ({}): local SNR {} dB</title></circle>\n",
                     xpos(i), ypos(l.local_snr_db), esc(l.name), esc(l.op_type), format_db(l.local_snr_db));
  }
  s << "</svg>\n";
  return s.str();
}

const char* kStyle = R"(body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1f2328;max-width:1280px}
h1{font-size:22px;margin:0 0 8px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{display:inline-block;padding:4px 12px;border-radius:6px;font-weight:600;color:#fff}
.pass{background:#1a7f37}.fail{background:#cf222e}.skip{background:#9a6700}
tr.fail td{background:#ffebe9}tr.skip td{background:#fff8c5}tr.jump td{background:#ffebe9;font-weight:600}
svg{background:#fff;border:1px solid #d0d7de;margin:6px 0;font-family:system-ui,sans-serif}code{font-size:12px})";

}  // namespace

std::string report_to_html(const ValidateReport& rep) {
  const CompareResult& r = rep.result;
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  h << "<title>" << esc(fmt::format("mpq validate: {} vs {}", rep.candidate, rep.reference)) << "</title>\n";
  h << "<style>" << kStyle << "</style>\n</head>\n<body>\n";
  h << "<h1>mpq validate</h1>\n";
  h << fmt::format("<p><span class=\"verdict {}\">{}</span> &nbsp;{} passed, {} failed, {} skipped</p>\n",
                   rep.passed() ? "pass" : "fail", rep.passed() ? "PASSED" : "FAILED", rep.passed_checks(),
                   rep.failed_checks(), rep.skipped_checks());
  h << "<table>\n";
  auto row = [&](const std::string& k, const std::string& v) {
    h << "<tr><th>" << esc(k) << "</th><td><code>" << esc(v) << "</code></td></tr>\n";
  };
  row("reference", rep.reference);
  row("candidate", rep.candidate);
  row("data", rep.data);
  if (!rep.labels.empty()) row("labels", rep.labels);
  row("samples", fmt::format("{} ({} feeds, {} runs)", r.rows, r.feeds, r.runs));
  row("thresholds", rep.thresholds.source.empty() ? "none" : rep.thresholds.source);
  row("mpq", rep.mpq_version);
  h << "</table>\n";

  h << "<h2>Checks</h2>\n";
  if (rep.checks.empty()) {
    h << "<p>No thresholds were given: metrics only.</p>\n";
  } else {
    h << "<table>\n<tr><th>status</th><th>output</th><th>threshold</th><th>metric</th><th>value</th><th>limit</th></tr>\n";
    for (const Check& c : rep.checks) {
      h << fmt::format("<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{} {}</td></tr>\n",
                       status_name(c.status), status_name(c.status), esc(c.output), esc(c.key), esc(c.metric),
                       c.status == Check::Status::Skip ? "n/a" : format_value(c.value), esc(c.comparison),
                       format_value(c.threshold));
    }
    h << "</table>\n";
  }

  h << "<h2>Outputs</h2>\n";
  h << "<table>\n<tr><th>output</th><th>shape</th><th>dtype (ref / cand)</th><th>cosine</th><th>worst-row cosine</th>"
       "<th>rel L2</th><th>SNR dB</th><th>max abs err</th><th>mean abs err</th><th>top-1 agreement</th></tr>\n";
  for (const OutputResult& o : r.outputs) {
    h << fmt::format("<tr><td>{}</td><td>{}</td><td>{} / {}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
                     "<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>\n",
                     esc(o.name), esc(shape_str(o.shape)), dtype_name(o.ref_dtype), dtype_name(o.cand_dtype),
                     format_value(o.stats.cosine()), format_value(o.stats.min_row_cosine()), format_value(o.stats.rel_l2()),
                     format_db(o.stats.snr_db()), format_value(o.stats.max_abs_error()), format_value(o.stats.mean_abs_error()),
                     o.top1 ? pct(o.top1->agreement()) : std::string("n/a"));
  }
  h << "</table>\n";
  if (const OutputResult* lo = r.labelled_output()) {
    h << fmt::format("<p>Accuracy on {} labelled samples (output <code>{}</code>): reference {}, candidate {}, drop {} points.</p>\n",
                     lo->top1->labelled(), esc(lo->name), pct(lo->top1->ref_accuracy()), pct(lo->top1->cand_accuracy()),
                     fmt::format("{:.2f}", 100.0 * lo->top1->accuracy_drop()));
  }
  h << output_snr_chart(rep);

  if (r.per_layer) {
    const PerLayerResult& pl = *r.per_layer;
    h << "<h2>Per layer</h2>\n";
    h << fmt::format("<p>{} tensors compared by name; {} reference tensors have no counterpart in the candidate (folded or "
                     "renamed). ",
                     pl.layers.size(), pl.unmatched.size());
    if (pl.first_jump) {
      const LayerResult& l = pl.layers[*pl.first_jump];
      h << fmt::format("The error first jumps at <b>{}</b> ({} node <code>{}</code>): SNR {} dB after {} dB upstream.",
                       esc(l.name), esc(l.op_type), esc(l.node), format_db(l.snr_db), format_db(l.upstream_snr_db));
    } else {
      h << "No layer adds error.";
    }
    h << "</p>\n";
    if (!pl.layers.empty()) h << layer_snr_chart(pl);
    h << "<table>\n<tr><th>rank</th><th>tensor</th><th>node</th><th>op</th><th>SNR dB</th><th>upstream SNR dB</th>"
         "<th>drop dB</th><th>local SNR dB</th><th>cosine</th><th>max abs err</th></tr>\n";
    for (size_t k = 0; k < pl.ranking.size(); ++k) {
      const size_t i = pl.ranking[k];
      const LayerResult& l = pl.layers[i];
      h << fmt::format("<tr{}><td class=\"num\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
                       "<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>\n",
                       pl.first_jump && *pl.first_jump == i ? " stroke=\"#cf222e\" stroke-width=\"2\" stroke-dasharray=\"5,3\"" : "", k + 1, esc(l.name), esc(l.node),
                       esc(l.op_type), format_db(l.snr_db), format_db(l.upstream_snr_db), format_db(l.drop_db),
                       format_db(l.local_snr_db), format_value(l.stats.cosine()), format_value(l.stats.max_abs_error()));
    }
    h << "</table>\n";
  }
  h << "</body>\n</html>\n";
  return h.str();
}

}  // namespace mpq::validate
