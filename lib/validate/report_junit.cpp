#include "validate/report_junit.h"

#include <fmt/format.h>

#include <sstream>

namespace mpq::validate {

namespace {

// Length of the valid UTF-8 sequence starting at s[i] (0 when invalid).
size_t utf8_length(const std::string& s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  uint32_t cp = 0;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F;
  else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F;
  else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07;
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const unsigned char d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  // Overlong forms, surrogates, beyond Unicode, and U+FFFE/U+FFFF are not XML characters.
  if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000)) return 0;
  if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF || cp == 0xFFFE || cp == 0xFFFF) return 0;
  return n;
}

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&quot;"; break;
        case '\'': out += "&apos;"; break;
        case '\t': out += "&#9;"; break;
        case '\n': out += "&#10;"; break;
        case '\r': out += "&#13;"; break;
        default:
          if (c >= 0x20) out += static_cast<char>(c);
          else out += '?';  // control characters are not allowed in XML 1.0
      }
      ++i;
      continue;
    }
    const size_t n = utf8_length(s, i);
    if (n == 0) {
      out += '?';
      ++i;
    } else {
      out.append(s, i, n);
      i += n;
    }
  }
  return out;
}

namespace {

// Text content of <system-out>: escape as text (newlines kept as they are).
std::string xml_text(const std::string& s) {
  std::string e = xml_escape(s);
  std::string out;
  for (size_t i = 0; i < e.size(); ++i) {
    if (e.compare(i, 5, "&#10;") == 0) {
      out += '\n';
      i += 4;
    } else {
      out += e[i];
    }
  }
  return out;
}

std::string metric_summary(const OutputResult& o) {
  std::string s = fmt::format("cosine={} rel_l2={} snr_db={} max_abs_error={} mean_abs_error={}", format_value(o.stats.cosine()),
                              format_value(o.stats.rel_l2()), format_value(o.stats.snr_db()),
                              format_value(o.stats.max_abs_error()), format_value(o.stats.mean_abs_error()));
  if (o.top1) s += fmt::format(" top1_agreement={}", format_value(o.top1->agreement()));
  if (o.labelled && o.top1)
    s += fmt::format(" reference_accuracy={} candidate_accuracy={} accuracy_drop={}", format_value(o.top1->ref_accuracy()),
                     format_value(o.top1->cand_accuracy()), format_value(o.top1->accuracy_drop()));
  return s;
}

}  // namespace

std::string report_to_junit(const ValidateReport& rep) {
  const CompareResult& r = rep.result;
  const bool no_checks = rep.checks.empty();
  const int tests = no_checks ? 1 : static_cast<int>(rep.checks.size());
  const std::string suite = fmt::format("mpq validate {} vs {}", rep.candidate, rep.reference);
  std::ostringstream x;
  x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  x << fmt::format("<testsuites name=\"mpq validate\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" time=\"0\">\n", tests,
                   rep.failed_checks(), rep.skipped_checks());
  x << fmt::format("  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" time=\"0\">\n", xml_escape(suite),
                   tests, rep.failed_checks(), rep.skipped_checks());
  x << "    <properties>\n";
  auto prop = [&](const std::string& name, const std::string& value) {
    x << fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", xml_escape(name), xml_escape(value));
  };
  prop("reference", rep.reference);
  prop("candidate", rep.candidate);
  prop("data", rep.data);
  prop("samples", std::to_string(r.rows));
  prop("thresholds", rep.thresholds.source.empty() ? "none" : rep.thresholds.source);
  prop("mpq_version", rep.mpq_version);
  for (const OutputResult& o : r.outputs) prop("output." + o.name, metric_summary(o));
  if (r.per_layer && r.per_layer->first_jump)
    prop("per_layer.first_jump", r.per_layer->layers[*r.per_layer->first_jump].name);
  x << "    </properties>\n";

  if (no_checks) {
    x << "    <testcase classname=\"mpq.validate\" name=\"metrics computed (no thresholds given)\" time=\"0\"/>\n";
  }
  for (const Check& c : rep.checks) {
    const std::string classname = "mpq.validate." + c.output;
    const std::string name = fmt::format("{} {} {}", c.key, c.comparison, format_value(c.threshold));
    x << fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"0\"", xml_escape(classname), xml_escape(name));
    if (c.status == Check::Status::Pass) {
      x << "/>\n";
      continue;
    }
    x << ">\n";
    if (c.status == Check::Status::Fail) {
      x << fmt::format("      <failure message=\"{}\" type=\"threshold\">{}</failure>\n", xml_escape(c.message),
                       xml_escape(fmt::format("{} = {}, threshold {} {}", c.metric, format_value(c.value), c.comparison,
                                              format_value(c.threshold))));
    } else {
      x << fmt::format("      <skipped message=\"{}\"/>\n", xml_escape(c.message));
    }
    x << "    </testcase>\n";
  }

  std::string out;
  for (const OutputResult& o : r.outputs) out += fmt::format("output {}: {}\n", o.name, metric_summary(o));
  if (r.per_layer) {
    const PerLayerResult& pl = *r.per_layer;
    out += fmt::format("per-layer SNR, {} compared tensors, worst local SNR first:\n", pl.layers.size());
    for (size_t k = 0; k < pl.ranking.size() && k < 20; ++k) {
      const LayerResult& l = pl.layers[pl.ranking[k]];
      out += fmt::format("  {:>3}. {} ({} {}): snr {} dB, local {} dB\n", k + 1, l.name, l.op_type, l.node, format_db(l.snr_db),
                         format_db(l.local_snr_db));
    }
    if (pl.first_jump) out += fmt::format("error first jumps at: {}\n", pl.layers[*pl.first_jump].name);
  }
  x << "    <system-out>" << xml_text(out) << "</system-out>\n";
  x << "  </testsuite>\n";
  x << "</testsuites>\n";
  return x.str();
}

}  // namespace mpq::validate
